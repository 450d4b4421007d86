//! How long a call may wait for the database, the same way on every transport.
//!
//! Every request or gRPC call gets `PLEXSPHERE_DATABASE_TIMEOUT_MS` of database time in all,
//! shared by its calls (authenticating a Node, then reading a secret, say), so no call waits
//! for the database longer than that. Time spent receiving a body does not count. The pool's
//! acquire timeout bounds waiting for a connection; this bounds everything after it too, such
//! as a statement stuck behind a lock or a network that went silent.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    /// What is left of the current call's database time (see [`DatabaseTime::bounded`]).
    static LEFT: Cell<Duration>;
}

/// A call's database time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatabaseTime {
    timeout: Duration,
}

/// A call ran out of database time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the database did not answer within {} ms while {during}", .after.as_millis())]
pub struct OutOfDatabaseTime {
    /// What the call was doing.
    pub during: &'static str,
    /// The whole call's database time.
    pub after: Duration,
}

impl DatabaseTime {
    /// `timeout` of database time per call.
    pub fn new(timeout: Duration) -> DatabaseTime {
        DatabaseTime { timeout }
    }

    /// A call's whole database time.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `call`, a whole request or gRPC call, with its own database time, which the
    /// [`DatabaseTime::bounded`] steps inside it share.
    pub async fn scope<F: Future>(&self, call: F) -> F::Output {
        LEFT.scope(Cell::new(self.timeout), call).await
    }

    /// Runs one step that may wait on the database, within what is left of its call's
    /// database time (all of it outside a [`DatabaseTime::scope`]).
    ///
    /// # Errors
    /// [`OutOfDatabaseTime`] when the time ran out first; the step is dropped.
    pub async fn bounded<T>(
        &self,
        during: &'static str,
        step: impl Future<Output = T>,
    ) -> Result<T, OutOfDatabaseTime> {
        let left = LEFT.try_with(Cell::get).unwrap_or(self.timeout);
        let started = Instant::now();
        let outcome = tokio::time::timeout(left, step).await;
        let _ = LEFT.try_with(|time| time.set(left.saturating_sub(started.elapsed())));
        outcome.map_err(|_| OutOfDatabaseTime { during, after: self.timeout })
    }
}

#[cfg(test)]
mod tests;
