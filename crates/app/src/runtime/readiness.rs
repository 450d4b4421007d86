//! Whether this replica's database answers as a writable primary, probed at most once a
//! second whatever asks: what `/readyz` tells a load balancer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;

/// Whether the database answered, as of the last probe: `/readyz` is unauthenticated, so
/// it must not be a way to make every request cost a round trip. A probe is made at most once
/// a [`Readiness::FRESH_FOR`]; callers meanwhile (and while it runs) get its answer.
#[derive(Clone)]
pub struct Readiness {
    pool: PgPool,
    timeout: Duration,
    last: Arc<tokio::sync::Mutex<Option<Probe>>>,
}

/// When the database was last probed, and what it answered.
type Probe = (Instant, Result<(), String>);

impl Readiness {
    /// How long a probe's answer is served before the next probe.
    pub const FRESH_FOR: Duration = Duration::from_secs(1);

    /// Probes `pool`, each probe bounded by `timeout`.
    pub fn new(pool: PgPool, timeout: Duration) -> Readiness {
        Readiness { pool, timeout, last: Arc::default() }
    }

    /// `Ok` when the database answered the last probe, made now if the last is stale.
    ///
    /// # Errors
    /// Why the database did not answer, as text for the log.
    pub async fn check(&self) -> Result<(), String> {
        // One prober at a time; the others wait for its answer rather than probe too.
        let mut last = self.last.lock().await;
        if let Some((at, answer)) = &*last {
            if at.elapsed() < Self::FRESH_FOR {
                return answer.clone();
            }
        }
        // A standby (or a primary demoted to one) answers, but every write fails: a replica
        // talking to it decides nothing, and must not be sent traffic until it reaches a
        // writable primary again (after a failover).
        let probe = sqlx::query_scalar::<_, bool>(
            "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'",
        )
        .fetch_one(&self.pool);
        let answer = match tokio::time::timeout(self.timeout, probe).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err("the database is read-only (a standby, or in recovery)".to_owned()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("the database did not answer in time".to_owned()),
        };
        *last = Some((Instant::now(), answer.clone()));
        answer
    }
}
