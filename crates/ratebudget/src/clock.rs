//! The clock a limiter reads `now` from.
//!
//! Takes are decided at the caller's `now`, not the database's, so that limiters can be driven
//! by an injected clock: the composition root binds [`SystemClock`], and tests bind a
//! [`ManualClock`] and move it to exercise refills and refusals without sleeping.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

/// Where a limiter gets the instant it decides at.
pub trait Clock: Send + Sync + Debug {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that stands still until it is moved; clones share one instant.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock { now: Arc::new(Mutex::new(start)) }
    }

    /// Moves the clock forward by `by` (backward when `by` is negative).
    pub fn advance(&self, by: chrono::Duration) {
        *self.lock() += by;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DateTime<Utc>> {
        // A panic while holding this lock cannot leave the instant half-written.
        self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.lock()
    }
}
