//! The errors a take or a sweep can return.

use std::sync::Arc;

/// Why a call could not be answered.
///
/// Every variant but [`Error::Database`] is returned before any query, so bad input never
/// writes anything. None of them is a refusal: a refusal is `Ok(false)`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text is not one of the five scopes the table's CHECK allows.
    #[error("unknown rate-budget scope {0:?}")]
    UnknownScope(String),
    /// The all-zero key names no Node or Domain; it is what an uninitialised id looks like.
    #[error("rate-budget key is all zeroes")]
    ZeroKey,
    /// A cost that is negative or NaN would credit the bucket or poison its arithmetic.
    #[error("rate-budget cost is negative or not a number")]
    NegativeCost,
    /// The rate or burst is not finite or is negative, or the burst is zero.
    #[error("rate budget is invalid: rate and burst must be finite and non-negative, burst above zero")]
    InvalidBudget,
    /// The database did not answer. The budget was not evaluated; this is not a refusal.
    #[error("rate-budget store could not answer")]
    Database(#[source] sqlx::Error),
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::Database(error)
    }
}

/// Why the store gave a take no decision, inside the crate. Callers see [`Undecided`], and the
/// reference's API ([`Store::take`](crate::Store::take)) sees [`Error`].
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad input, refused before any query.
    Input(Error),
    /// The take's own statement failed.
    Database(sqlx::Error),
    /// The coalesced call the take was in failed; every take of the call shares the cause.
    Call(Arc<sqlx::Error>),
    /// A decision function answered what this build cannot read.
    Malformed(String),
    /// The task deciding the take ended before it answered (the runtime shutting down).
    Unanswered,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Input(error)
    }
}

impl From<sqlx::Error> for Failure {
    fn from(error: sqlx::Error) -> Self {
        Failure::Database(error)
    }
}

impl From<Failure> for Undecided {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Input(error) => Undecided::Store(error),
            Failure::Database(error) => Undecided::Store(Error::Database(error)),
            Failure::Call(error) => Undecided::CallFailed(error),
            Failure::Malformed(what) => Undecided::Malformed(what),
            Failure::Unanswered => Undecided::Unanswered,
        }
    }
}

impl From<Failure> for Error {
    /// The reference's five-variant error has one for a store that could not answer, holding a
    /// `sqlx::Error`: a failure that is not one is carried as the source of an I/O error there.
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Input(error) => error,
            Failure::Database(error) => Error::Database(error),
            other => Error::Database(sqlx::Error::Io(std::io::Error::other(Undecided::from(other)))),
        }
    }
}

/// Why a take was not decided: the store failed or was not asked. Never a refusal.
///
/// [`Error`] is the store's own answer (bad input, or the database); the rest come from the
/// [`Guard`](crate::Guard) in front of it, whose scopes fail closed.
#[derive(Debug, thiserror::Error)]
pub enum Undecided {
    /// The store answered with an error: bad input, or the database could not answer.
    #[error(transparent)]
    Store(#[from] Error),
    /// The coalesced call the take was decided in failed: the call's cause, which every take
    /// of the call shares.
    #[error("the coalesced call this take was in failed")]
    CallFailed(#[source] Arc<sqlx::Error>),
    /// A decision function answered what this build cannot read (a newer replica's migration,
    /// say).
    #[error("the rate-budget store answered what this build cannot read: {0}")]
    Malformed(String),
    /// The task deciding the take ended before it answered (the runtime shutting down).
    #[error("the take was never answered: the task deciding it ended")]
    Unanswered,
    /// The store did not answer within the decision timeout.
    #[error("the rate-budget store did not answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// The store has been failing, so it was not asked (its circuit is open).
    #[error("the rate-budget store is failing, so it was not asked")]
    StoreFailing,
    /// A layer in front of the store declined to decide (the caller's clock cannot be
    /// trusted, say); the cause says why.
    #[error("the take was not decided")]
    Declined(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Undecided {
    /// Whether this says the store could not answer, rather than that the take was bad input.
    pub fn is_store_failure(&self) -> bool {
        !matches!(
            self,
            Undecided::Store(
                Error::UnknownScope(_) | Error::ZeroKey | Error::NegativeCost | Error::InvalidBudget
            )
        )
    }
}

/// `error` and each of its sources on one line, `what failed: why: why`: how every crate of
/// the workspace writes a failure into a log line.
pub fn cause_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Some errors (sqlx's database error among them) already print their source's text;
        // saying it twice makes the line harder to read, not more complete.
        if !chain.ends_with(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = cause.source();
    }
    chain
}
