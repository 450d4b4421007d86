//! Clock discipline: every replica decides on the database's time, not its own.
//!
//! Every multi-replica user of the crate needs it: decide at [`DatabaseClock`]'s `now` and
//! build the [`Guard`](crate::Guard) with its [`ClockStatus`] ([`GuardBuilder::trusted_only`](crate::GuardBuilder::trusted_only)),
//! and the guard declines every take while the clock cannot be trusted. [`SystemClock`](crate::SystemClock)
//! is for a single process, or for tests.
//!
//! A take is decided at the caller's `now`, and the bucket row keeps the `refilled_at` of the
//! last take. A replica whose clock ran ahead would move `refilled_at` into everybody else's
//! future (their takes see no time pass, so the bucket stops refilling for them), and a leader
//! whose clock ran ahead would sweep buckets that are not yet full. So the replica measures the
//! database's clock (`SELECT clock_timestamp()`, the best of a few round trips) at start and
//! every [`CHECK_INTERVAL`], anchors it to its own monotonic clock, and decides at
//! `database time at the anchor + monotonic time since`. Stepping the wall clock (NTP, an
//! operator, libfaketime) then changes nothing; only the monotonic clock's rate matters.
//!
//! The corrected clock's error is bounded by half the anchoring round trip plus
//! [`DRIFT_PER_SECOND`] times the anchor's age. While that bound is above
//! `PLEXSPHERE_MAX_CLOCK_SKEW_MS` (no anchor yet, a round trip too slow to anchor within the
//! bound, or an anchor too old), the replica does not decide: budgets answer 500 and `/readyz`
//! 503. docs/adr/0015 explains why it corrects rather than only refusing.
//!
//! The measured offset (database time minus this replica's wall clock, in seconds) is
//! exported as `plexsphere_clock_offset_seconds`.

use std::future::Future;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::Clock;

/// How often a replica measures its offset once it has an anchor.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// How often it tries while it has none (at start, or while the database does not answer).
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The largest rate at which two monotonic clocks are assumed to drift apart: 500 ppm, the
/// fastest rate at which NTP slews a clock, five times a free-running crystal's tolerance.
pub const DRIFT_PER_SECOND: f64 = 500e-6;

/// How long one measurement may take; a silent network must not stall the loop.
const MEASURE_TIMEOUT: Duration = Duration::from_secs(3);

/// Round trips per measurement; the one with the shortest round trip anchors the clock.
const SAMPLES: usize = 3;

/// The database's time at one instant of this process's monotonic clock.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    database_at: DateTime<Utc>,
    at: Instant,
    /// Half the round trip that measured it: the error of `database_at` itself.
    uncertainty: Duration,
}

impl Anchor {
    fn error_bound(&self, now: Instant) -> Duration {
        self.uncertainty + now.saturating_duration_since(self.at).mul_f64(DRIFT_PER_SECOND)
    }
}

#[derive(Debug)]
struct Discipline {
    anchor: RwLock<Option<Anchor>>,
    max_skew: Duration,
}

impl Discipline {
    fn anchor(&self) -> Option<Anchor> {
        // An anchor is written whole; a panic elsewhere cannot leave it half-written.
        *self.anchor.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The database-disciplined clock: what limiters and the sweep read `now` from.
#[derive(Clone, Debug)]
pub struct DatabaseClock {
    discipline: Arc<Discipline>,
}

impl DatabaseClock {
    /// A clock on `pool`'s database, trusted only while its error is within `max_skew`, and its
    /// status; its measuring loop ([`run`]) runs on the current tokio runtime until every clone
    /// of the clock is dropped. The clock is untrusted until the first measurement.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(pool: PgPool, max_skew: Duration) -> (DatabaseClock, ClockStatus) {
        let (clock, status) = disciplined(max_skew);
        let weak = Arc::downgrade(&clock.discipline);
        tokio::spawn(measure_while_held(weak, pool));
        (clock, status)
    }

    /// Whether decisions may be taken on this clock now.
    pub fn status(&self) -> ClockStatus {
        ClockStatus { discipline: Some(self.discipline.clone()) }
    }
}

impl Clock for DatabaseClock {
    fn now(&self) -> DateTime<Utc> {
        match self.discipline.anchor() {
            Some(anchor) => {
                let since = Instant::now().saturating_duration_since(anchor.at);
                anchor.database_at + chrono::TimeDelta::from_std(since).unwrap_or(chrono::TimeDelta::MAX)
            }
            // Nothing is decided before the first anchor (the status says untrusted); the
            // wall clock is only what a caller that asks anyway sees.
            None => Utc::now(),
        }
    }
}

/// [`run`] for a clock that measures while anyone but the loop holds it.
async fn measure_while_held(discipline: Weak<Discipline>, pool: PgPool) {
    let Some(strong) = discipline.upgrade() else { return };
    let clock = DatabaseClock { discipline: strong };
    // The loop holds one clone itself: it stops once that is the last.
    let unheld = async {
        loop {
            tokio::time::sleep(RETRY_INTERVAL).await;
            if discipline.strong_count() <= 1 {
                return;
            }
        }
    };
    run(clock, pool, |_| {}, unheld).await;
}

/// Why this replica does not decide right now.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedClock {
    /// The database's clock has not been measured yet.
    #[error("the clock has not been measured against the database's yet")]
    NotMeasured,
    /// The corrected clock's error bound is above `PLEXSPHERE_MAX_CLOCK_SKEW_MS`.
    #[error("the clock's error bound of {bound:?} is above the allowed {max_skew:?}")]
    TooUncertain {
        /// The current error bound.
        bound: Duration,
        /// `PLEXSPHERE_MAX_CLOCK_SKEW_MS`.
        max_skew: Duration,
    },
}

/// Whether decisions may be taken on this replica's clock; cheap to clone.
#[derive(Clone, Debug)]
pub struct ClockStatus {
    discipline: Option<Arc<Discipline>>,
}

impl ClockStatus {
    /// A status that is always trusted, for a clock a test drives.
    pub fn always_trusted() -> ClockStatus {
        ClockStatus { discipline: None }
    }

    /// `Ok` when the clock's error is within the bound.
    ///
    /// # Errors
    /// [`UntrustedClock`] when it is not, or is unknown.
    pub fn check(&self) -> Result<(), UntrustedClock> {
        let Some(discipline) = &self.discipline else { return Ok(()) };
        let anchor = discipline.anchor().ok_or(UntrustedClock::NotMeasured)?;
        let bound = anchor.error_bound(Instant::now());
        if bound > discipline.max_skew {
            return Err(UntrustedClock::TooUncertain { bound, max_skew: discipline.max_skew });
        }
        Ok(())
    }

    /// Waits until the clock is trusted (its first measurement, at start), at most `within`.
    ///
    /// # Errors
    /// [`UntrustedClock`], why it still is not, after `within`.
    pub async fn trusted_within(&self, within: Duration) -> Result<(), UntrustedClock> {
        let deadline = Instant::now() + within;
        loop {
            match self.check() {
                Ok(()) => return Ok(()),
                Err(untrusted) if Instant::now() >= deadline => return Err(untrusted),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// The most this replica's corrected clock may be off: the margin the sweep leaves.
    pub fn max_skew(&self) -> Duration {
        self.discipline.as_ref().map_or(Duration::ZERO, |discipline| discipline.max_skew)
    }
}

/// A new disciplined clock (unmeasured, so untrusted until [`run`] anchors it) and its status.
pub fn disciplined(max_skew: Duration) -> (DatabaseClock, ClockStatus) {
    let discipline = Arc::new(Discipline { anchor: RwLock::new(None), max_skew });
    (DatabaseClock { discipline: discipline.clone() }, ClockStatus { discipline: Some(discipline) })
}

/// Measures the database's clock at once and then every [`CHECK_INTERVAL`] (every
/// [`RETRY_INTERVAL`] while measurements fail or leave the clock untrusted), telling
/// `measured` each offset (database minus wall clock, in seconds), until `shutdown`.
pub async fn run(
    clock: DatabaseClock,
    pool: PgPool,
    mut measured: impl FnMut(f64) + Send,
    shutdown: impl Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    let status = ClockStatus { discipline: Some(clock.discipline.clone()) };
    // One line per spell of failing or untrusted measurements, not one per retry.
    let (mut failing, mut untrusted_logged) = (false, false);
    loop {
        let measurement = tokio::time::timeout(MEASURE_TIMEOUT, measure(&pool))
            .await
            .unwrap_or(Err(MeasureError::TimedOut(MEASURE_TIMEOUT)));
        let wait = match measurement {
            Ok(sample) => {
                if failing {
                    tracing::info!("the database's clock answers again");
                    failing = false;
                }
                measured(sample.offset_seconds);
                adopt(&clock.discipline, sample);
                match status.check() {
                    Ok(()) => {
                        if untrusted_logged {
                            tracing::info!("the clock is trusted again; deciding");
                            untrusted_logged = false;
                        }
                        CHECK_INTERVAL
                    }
                    // Measured, but not well enough to decide with: try again soon.
                    Err(untrusted) => {
                        if !untrusted_logged {
                            tracing::warn!(%untrusted, "the clock cannot be trusted; not deciding");
                            untrusted_logged = true;
                        }
                        RETRY_INTERVAL
                    }
                }
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(error = %crate::cause_chain(&error), "cannot measure the database's clock; retrying");
                    failing = true;
                }
                RETRY_INTERVAL
            }
        };
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One measurement: the anchor it offers and the wall-clock offset it saw.
#[derive(Clone, Copy, Debug)]
struct Sample {
    anchor: Anchor,
    offset_seconds: f64,
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
enum MeasureError {
    #[error("the database failed")]
    Database(#[from] sqlx::Error),
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
}

async fn measure(pool: &PgPool) -> Result<Sample, MeasureError> {
    let mut connection = pool.acquire().await?;
    let mut best: Option<Sample> = None;
    for _ in 0..SAMPLES {
        let (sent, sent_wall) = (Instant::now(), Utc::now());
        let database_at: DateTime<Utc> =
            sqlx::query_scalar("SELECT clock_timestamp()").fetch_one(&mut *connection).await?;
        let round_trip = sent.elapsed();
        // The database read its clock somewhere within the round trip: assume the middle,
        // which is off by at most half of it.
        let uncertainty = round_trip / 2;
        let wall_at_middle = sent_wall + chrono::TimeDelta::from_std(uncertainty).unwrap_or_default();
        let sample = Sample {
            anchor: Anchor { database_at, at: sent + uncertainty, uncertainty },
            offset_seconds: (database_at - wall_at_middle).as_seconds_f64(),
        };
        if best.is_none_or(|best| sample.anchor.uncertainty < best.anchor.uncertainty) {
            best = Some(sample);
        }
    }
    Ok(best.expect("at least one sample"))
}

/// Replaces the anchor when the new one is at least as good as what the old one has become.
fn adopt(discipline: &Discipline, sample: Sample) {
    let mut anchor = discipline.anchor.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    let better = match *anchor {
        None => true,
        Some(old) => sample.anchor.uncertainty <= old.error_bound(Instant::now()),
    };
    if better {
        *anchor = Some(sample.anchor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(database_at: DateTime<Utc>, at: Instant, uncertainty_ms: u64) -> Sample {
        Sample {
            anchor: Anchor { database_at, at, uncertainty: Duration::from_millis(uncertainty_ms) },
            offset_seconds: 0.0,
        }
    }

    #[test]
    fn an_unmeasured_clock_is_not_trusted_and_a_measured_one_is() {
        let (clock, status) = disciplined(Duration::from_millis(100));
        assert!(matches!(status.check(), Err(UntrustedClock::NotMeasured)));
        let database_at = Utc::now() + chrono::TimeDelta::seconds(30);
        adopt(&clock.discipline, sample(database_at, Instant::now(), 2));
        status.check().unwrap();
        // The corrected clock follows the database's, 30 s from the wall clock.
        let off = (clock.now() - Utc::now()).as_seconds_f64();
        assert!((29.9..30.1).contains(&off), "{off}");
    }

    #[test]
    fn an_anchor_too_uncertain_for_the_bound_stops_decisions() {
        let (clock, status) = disciplined(Duration::from_millis(100));
        adopt(&clock.discipline, sample(Utc::now(), Instant::now(), 150));
        assert!(matches!(status.check(), Err(UntrustedClock::TooUncertain { .. })));
        // A better measurement replaces it.
        adopt(&clock.discipline, sample(Utc::now(), Instant::now(), 1));
        status.check().unwrap();
        // A worse one does not.
        adopt(&clock.discipline, sample(Utc::now(), Instant::now(), 150));
        status.check().unwrap();
    }

    #[test]
    fn an_anchor_ages_out_at_the_drift_rate() {
        let (clock, status) = disciplined(Duration::from_millis(100));
        // 90 ms of drift at 500 ppm takes 180 s: an anchor that old with 20 ms of its own
        // uncertainty is past a 100 ms bound.
        let Some(then) = Instant::now().checked_sub(Duration::from_secs(180)) else { return };
        adopt(&clock.discipline, sample(Utc::now(), then, 20));
        assert!(matches!(status.check(), Err(UntrustedClock::TooUncertain { .. })));
    }

    #[test]
    fn a_given_clock_is_always_trusted() {
        ClockStatus::always_trusted().check().unwrap();
        assert_eq!(ClockStatus::always_trusted().max_skew(), Duration::ZERO);
    }
}
