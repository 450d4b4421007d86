//! The store: every statement that touches `plexsphere.rate_budgets`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use crate::connections::TakeConnections;
use crate::{Budget, Error, Key, Scope, Spend};

const TAKE: &str = include_str!("../queries/take.sql");
const TAKE_PAIR: &str = include_str!("../queries/take_pair.sql");
const DELETE_IDLE: &str = include_str!("../queries/delete_idle.sql");
const BUCKETS: &str = include_str!("../queries/buckets.sql");

/// The rate budgets of every scope, in one shared table.
///
/// Takes run on connections of the store's own, opened with the pool's connect options and at
/// most as many as the pool's maximum, because sqlx's pool adds a round trip to every use
/// (see `connections.rs`); the sweep and operator reads use the pool itself. Cloning is cheap
/// and clones share both.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    takes: Arc<TakeConnections>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("pool", &self.pool).finish_non_exhaustive()
    }
}

/// What a two-budget take decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairDecision {
    /// Both buckets covered their cost and both were debited.
    Granted,
    /// The first bucket could not cover its cost; neither was debited.
    FirstRefused,
    /// The second bucket could not cover its cost; neither was debited.
    SecondRefused,
}

/// One bucket as stored, for operators reading a budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    /// The budget this bucket belongs to.
    pub scope: Scope,
    /// What was left when the bucket was last brought up to date.
    pub tokens: f64,
    /// When that was; the next take refills from this instant.
    pub refilled_at: DateTime<Utc>,
}

impl Store {
    /// A store on `pool`, which must have the workspace's migrations applied.
    ///
    /// Takes run on connections of the store's own, opened from the pool's connect options and
    /// at most as many as its maximum; the pool's hooks (`after_connect` and the like) do not
    /// run on them, so put per-session settings in the connect options. Waiting for one of
    /// them is bounded by the pool's acquire timeout; the statement itself is not, so a caller
    /// that must answer in bounded time (as the HTTP service does) puts a timeout around the
    /// take, and a cancelled take closes its connection rather than reusing it.
    pub fn new(pool: PgPool) -> Store {
        Store { takes: Arc::new(TakeConnections::new(pool.clone())), pool }
    }

    /// Takes `cost` tokens from the bucket `(scope, key)`, sized by `budget`, at the caller's
    /// `now`.
    ///
    /// `Ok(true)`: the bucket covered the cost and has been debited. `Ok(false)`: it did not,
    /// and nothing was written, so the tokens accrued since its last grant are still there.
    /// A missing bucket is minted full. Two concurrent takes on one bucket serialise on its
    /// row, so the last token is granted once.
    ///
    /// `now` is the caller's clock rather than the server's so that limiters driven by an
    /// injected clock can test their refill and refusal branches without sleeping. A `now`
    /// before the bucket's last refill refills nothing and leaves its timestamp alone.
    ///
    /// A zero cost is granted and a cost above the burst refused without a query.
    ///
    /// # Errors
    /// [`Error::ZeroKey`], [`Error::NegativeCost`] and [`Error::InvalidBudget`] before any
    /// query; [`Error::Database`] when the database did not answer, which is never a refusal.
    pub async fn take(
        &self,
        scope: Scope,
        key: Key,
        cost: f64,
        budget: Budget,
        now: DateTime<Utc>,
    ) -> Result<bool, Error> {
        let spend = Spend { scope, key, cost, budget }.validate()?;
        if let Some(decided) = spend.decided_without_query() {
            return Ok(decided);
        }
        self.take_validated(spend, now).await
    }

    /// Takes from two buckets all-or-nothing, in one round trip: both are debited or neither.
    ///
    /// This is for a request that spends two budgets, such as a secret read (the Node's and
    /// its Domain's). Concurrent pairs and single takes on a shared bucket never overspend it.
    /// When both buckets would refuse, the first is reported.
    ///
    /// A spend of zero cost is left out (it is granted), so a pair with one free side is a
    /// single take. Naming one bucket twice takes both costs from it, which needs one budget.
    ///
    /// # Errors
    /// As [`Store::take`], for either spend; [`Error::InvalidBudget`] also when one bucket is
    /// named twice with two different budgets.
    pub async fn take_pair(
        &self,
        first: Spend,
        second: Spend,
        now: DateTime<Utc>,
    ) -> Result<PairDecision, Error> {
        let first = first.validate()?;
        let second = second.validate()?;
        let granted_or = |refused, granted: bool| {
            if granted {
                PairDecision::Granted
            } else {
                refused
            }
        };

        if (first.scope, first.key) == (second.scope, second.key) {
            if first.budget != second.budget {
                return Err(Error::InvalidBudget);
            }
            let both = Spend { cost: first.cost + second.cost, ..first };
            let granted = match both.decided_without_query() {
                Some(decided) => decided,
                None => self.take_validated(both, now).await?,
            };
            return Ok(granted_or(PairDecision::FirstRefused, granted));
        }

        match (first.decided_without_query(), second.decided_without_query()) {
            (Some(false), _) => return Ok(PairDecision::FirstRefused),
            (_, Some(false)) => return Ok(PairDecision::SecondRefused),
            (Some(true), Some(true)) => return Ok(PairDecision::Granted),
            (Some(true), None) => {
                let granted = self.take_validated(second, now).await?;
                return Ok(granted_or(PairDecision::SecondRefused, granted));
            }
            (None, Some(true)) => {
                let granted = self.take_validated(first, now).await?;
                return Ok(granted_or(PairDecision::FirstRefused, granted));
            }
            (None, None) => {}
        }

        let mut lease = self.takes.lease().await?;
        let outcome: i16 = sqlx::query(TAKE_PAIR)
            .bind(first.scope.as_str())
            .bind(first.key.as_uuid())
            .bind(first.cost)
            .bind(first.budget.per_second)
            .bind(first.budget.burst)
            .bind(second.scope.as_str())
            .bind(second.key.as_uuid())
            .bind(second.cost)
            .bind(second.budget.per_second)
            .bind(second.budget.burst)
            .bind(now)
            .fetch_one(lease.connection())
            .await?
            .try_get(0)?;
        lease.release();
        match outcome {
            0 => Ok(PairDecision::Granted),
            1 => Ok(PairDecision::FirstRefused),
            2 => Ok(PairDecision::SecondRefused),
            other => Err(Error::Database(sqlx::Error::Protocol(format!(
                "take_rate_budget_pair returned {other}, expected 0, 1 or 2"
            )))),
        }
    }

    /// Deletes every bucket last taken from before `before` and returns how many it deleted.
    ///
    /// An idle bucket has refilled to full, so deleting it is exactly what the next take would
    /// mint; what this reclaims is the rows of Nodes and Domains that are gone. It deletes in
    /// batches of [`Store::DELETE_IDLE_BATCH`] so no statement holds row locks for long, and
    /// skips rows a take holds.
    ///
    /// # Errors
    /// [`Error::Database`] when a batch fails; the batches before it stay deleted.
    pub async fn delete_idle(&self, before: DateTime<Utc>) -> Result<u64, Error> {
        let mut deleted = 0;
        loop {
            let batch = self.delete_idle_batch(before, Self::DELETE_IDLE_BATCH).await?;
            deleted += batch;
            if batch < Self::DELETE_IDLE_BATCH {
                return Ok(deleted);
            }
        }
    }

    /// How many idle rows one sweep statement deletes: small enough that no statement holds
    /// its row locks for long (BENCHMARKS.md has the figures), large enough that a million
    /// idle rows take a couple of hundred statements.
    pub const DELETE_IDLE_BATCH: u64 = 5_000;

    /// Deletes at most `limit` buckets last taken from before `before`, in one statement, and
    /// returns how many it deleted. [`Store::delete_idle`] repeats it until a batch comes back
    /// short; a caller that wants to pace a sweep can drive it itself.
    ///
    /// # Errors
    /// [`Error::Database`] when the database did not answer.
    pub async fn delete_idle_batch(&self, before: DateTime<Utc>, limit: u64) -> Result<u64, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let result = sqlx::query(DELETE_IDLE).bind(before).bind(limit).execute(&self.pool).await?;
        Ok(result.rows_affected())
    }

    /// Every bucket of `key`, across scopes, as stored (not refilled to now).
    ///
    /// A missing bucket is not a problem: the next take mints it full.
    ///
    /// # Errors
    /// [`Error::Database`] when the database did not answer; [`Error::UnknownScope`] if a row
    /// holds a scope this build does not know (a newer replica's migration).
    pub async fn buckets(&self, key: Key) -> Result<Vec<Bucket>, Error> {
        let rows = sqlx::query(BUCKETS).bind(key.as_uuid()).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let scope: String = row.try_get("scope")?;
                Ok(Bucket {
                    scope: scope.parse()?,
                    tokens: row.try_get("tokens")?,
                    refilled_at: row.try_get("refilled_at")?,
                })
            })
            .collect()
    }

    /// Closes the store's connections (and its pool): takes and sweeps after this fail with
    /// [`Error::Database`]. For a graceful shutdown; dropping the store closes them abruptly.
    pub async fn close(&self) {
        self.takes.close().await;
    }

    async fn take_validated(&self, spend: Spend, now: DateTime<Utc>) -> Result<bool, Error> {
        let mut lease = self.takes.lease().await?;
        let granted = sqlx::query(TAKE)
            .bind(spend.scope.as_str())
            .bind(spend.key.as_uuid())
            .bind(spend.cost)
            .bind(spend.budget.per_second)
            .bind(spend.budget.burst)
            .bind(now)
            .fetch_one(lease.connection())
            .await?
            .try_get(0)?;
        lease.release();
        Ok(granted)
    }
}
