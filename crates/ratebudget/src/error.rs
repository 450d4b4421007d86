//! The errors a take or a sweep can return.

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

/// Why a take was not decided: the store failed or was not asked. Never a refusal.
///
/// [`Error`] is the store's own answer (bad input, or the database); the rest come from the
/// [`Guard`](crate::Guard) in front of it, whose scopes fail closed.
#[derive(Debug, thiserror::Error)]
pub enum Undecided {
    /// The store answered with an error: bad input, or the database could not answer.
    #[error(transparent)]
    Store(#[from] Error),
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
