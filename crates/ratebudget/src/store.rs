//! The store: every statement that touches `plexsphere.rate_budgets`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use crate::batch::{self, Coalescer, Coalescing, Statement};
use crate::connections::{transaction_begin, TakeConnections, DECISION_SETTINGS};
use crate::error::Failure;
use crate::named::Gcra;
use crate::sides::{self, Sides};
use crate::statements::commit_what_the_pool_opened;
mod charges;

use crate::{
    named, Budget, Decider, Decision, Error, Fill, Grant, InsufficientCapacity, Key, LeaseRequest, Leased,
    Limit, LimiterName, Name, NamedKey, NamedSpend, Refusal, Scope, Spend, Take, Undecided, Which,
};

const DELETE_IDLE: &str = include_str!("../queries/delete_idle.sql");
const BUCKETS: &str = include_str!("../queries/buckets.sql");
const RESET: &str = include_str!("../queries/reset.sql");
const DECIDE_NAMED: &str = include_str!("../queries/decide_named.sql");
const RESET_NAMED: &str = include_str!("../queries/reset_named.sql");
const DELETE_EXPIRED: &str = include_str!("../queries/delete_expired.sql");
const LEASE: &str = include_str!("../queries/lease.sql");

/// The channel [`Store::reset`] and [`Store::reset_named`] notify on; every process's
/// [`Guard`](crate::Guard) must hear of each ([`follow_resets`](crate::follow_resets), or
/// [`Guard::hear_reset`](crate::Guard::hear_reset) from a listener of one's own). The payload
/// is `name:uuid`, or `named:limiter:hex`.
pub const RESET_CHANNEL: &str = "plexsphere_rate_budget_reset";

/// The rate budgets of every scope, in one shared table.
///
/// Takes run on connections of the store's own, opened with the pool's connect options and at
/// most as many as the pool's maximum, because sqlx's pool adds a round trip to every use
/// (see `connections.rs`); the sweep, resets and operator reads use the pool itself, and each
/// commits before it answers, whatever the pool's hooks do (see [`Store::reset`]). Cloning is
/// cheap and clones share both.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    takes: Arc<TakeConnections>,
    coalescer: Arc<Coalescer>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("pool", &self.pool).finish_non_exhaustive()
    }
}

/// One bucket as stored, for operators reading a budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    /// The budget this bucket belongs to: one of this project's scopes ([`Name::scope`]), or
    /// a name of a user's own.
    pub name: Name,
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
    /// run on them, so put per-session settings in the connect options. Each plans its
    /// statements with sequential scans priced out, so that a plan kept from when the table
    /// looked empty still finds rows by key (docs/adr/0035). They are opened only
    /// when takes need them, so a store that only sweeps or reads never opens one. Waiting
    /// for one is bounded by the pool's acquire timeout; the statement itself is not, so a
    /// caller that must answer in bounded time (as the HTTP service does) puts a timeout
    /// around the take, and a cancelled take closes its connection rather than reusing it.
    pub fn new(pool: PgPool) -> Store {
        let takes = Arc::new(TakeConnections::new(pool.clone()));
        let coalescer = Arc::new(Coalescer::new(takes.clone(), Coalescing::DEFAULT));
        Store { takes, pool, coalescer }
    }

    /// This store, for a pool that reaches PostgreSQL through a transaction-mode pooler
    /// (PgBouncer's `pool_mode = transaction`), which may run each transaction of a client
    /// connection on another server connection: each take runs in a transaction of its own,
    /// opened with the decision settings (sequential scans priced out, as [`Store::new`]
    /// says) and `settings` as `SET LOCAL`s (the pooler drops startup parameters, and a
    /// session setting would not follow the client), first refusing a server that cannot
    /// take a write and forgetting the statements sqlx left on the server connection it was
    /// given ([`transaction_begin`](crate::transaction_begin)). The pool must have sqlx's
    /// statement cache off (`statement_cache_capacity(0)`). Two more round trips a take:
    /// behind a pooler, a coalesced call pays them once for all its takes.
    pub fn through_transaction_pooler(mut self, settings: &[(&str, &str)]) -> Store {
        let settings: Vec<_> = DECISION_SETTINGS.iter().chain(settings).copied().collect();
        self.takes = Arc::new(TakeConnections::pooled(self.pool.clone(), transaction_begin(&settings)));
        self.coalescer = Arc::new(Coalescer::new(self.takes.clone(), self.coalescer.coalescing()));
        self
    }

    /// This store, coalescing concurrent takes as `coalescing` says (docs/adr/0006;
    /// [`Coalescing::DEFAULT`] unless told otherwise). Clones made before keep their own.
    pub fn with_coalescing(mut self, coalescing: Coalescing) -> Store {
        self.coalescer = Arc::new(Coalescer::new(self.takes.clone(), coalescing));
        self
    }

    /// How this store coalesces takes.
    pub fn coalescing(&self) -> Coalescing {
        self.coalescer.coalescing()
    }

    /// Takes `cost` tokens from the bucket `(scope, key)`, sized by `budget`, at the caller's
    /// `now`: the reference's API, answering only whether the take was granted.
    ///
    /// `Ok(true)`: the bucket covered the cost and has been debited. `Ok(false)`: it did not,
    /// and nothing was written, so the tokens accrued since its last grant are still there.
    /// [`Decider::decide`] makes the same decision and says more about it.
    ///
    /// A zero cost is granted and a cost above the burst refused without a query.
    ///
    /// # Errors
    /// [`Error::ZeroKey`], [`Error::NegativeCost`] and [`Error::InvalidBudget`] before any
    /// query; [`Error::Database`] when the database did not answer, which is never a refusal
    /// (a failure that is not one of its own statement's, such as the coalesced call it was in
    /// failing, is carried there as the source of an I/O error: this API's error has no other
    /// place for it; [`Decider::decide`] names each).
    pub async fn take(
        &self,
        scope: Scope,
        key: Key,
        cost: f64,
        budget: Budget,
        now: DateTime<Utc>,
    ) -> Result<bool, Error> {
        let limit = Limit::try_from(budget)?;
        let decision = self.decide_take(&Take::Single(Spend::new(scope, key, cost, limit)), now).await?;
        Ok(decision.is_granted())
    }

    /// Decides `take` at the caller's `now`, in one round trip, and debits every bucket of it
    /// or none: [`Decider::decide`], which is how every caller but the reference's
    /// [`Store::take`] asks.
    ///
    /// A missing bucket is minted full. Two concurrent takes on one bucket serialise on its
    /// row, so the last token is granted once. A refusal writes nothing, so the tokens accrued
    /// since the bucket's last grant are still there; one the statement's snapshot already
    /// foresees does not even lock the row (docs/adr/0001).
    ///
    /// `now` is the caller's clock rather than the server's so that limiters driven by an
    /// injected clock can test their refill and refusal branches without sleeping. A `now`
    /// before a bucket's last refill refills nothing and leaves its timestamp alone.
    ///
    /// Without a query: a spend of zero cost is granted (a pair with one free side is a single
    /// take), and a cost above its burst is [`Decision::InsufficientCapacity`]. A take naming
    /// one bucket more than once takes every cost from it, which needs one limit. When several
    /// buckets of a take would refuse, the first in the take's order is reported. A take of
    /// two or more buckets (a pair, or [`Take::Many`] of any number) is one call of
    /// `plexsphere.decide_rate_budget_takes`, alone or coalesced (docs/adr/0038).
    async fn decide_take(&self, take: &Take, now: DateTime<Utc>) -> Result<Decision, Failure> {
        match reduce(take)? {
            Reduced::Answered(decision) => Ok(decision),
            Reduced::Named(spend) => self.decide_named(spend, now).await,
            Reduced::Statement(statement) => Ok(for_take(self.coalescer.decide(statement, now).await?, take)),
        }
    }

    /// Decides `takes` in order, each at its own instant, exactly as one at a time would,
    /// with every take that needs the database in one round trip and one transaction: what
    /// the store's coalescing sends for concurrent callers. For tests and benchmarks that
    /// compare the two.
    ///
    /// # Errors
    /// Per take, as [`Decider::decide`]: bad input before any query; when the call fails,
    /// every take that needed it fails with [`Undecided::CallFailed`], never a refusal.
    #[doc(hidden)]
    pub async fn decide_all(&self, takes: &[(Take, DateTime<Utc>)]) -> Vec<Result<Decision, Undecided>> {
        let mut answers: Vec<Option<Result<Decision, Undecided>>> = Vec::with_capacity(takes.len());
        let mut statements = Vec::new();
        let mut named = Vec::new();
        for (i, (take, now)) in takes.iter().enumerate() {
            answers.push(match reduce(take) {
                Ok(Reduced::Answered(decision)) => Some(Ok(decision)),
                Ok(Reduced::Named(spend)) => {
                    named.push((i, spend, *now));
                    None
                }
                Ok(Reduced::Statement(statement)) => {
                    statements.push((i, statement, *now));
                    None
                }
                Err(error) => Some(Err(Undecided::Store(error))),
            });
        }
        // Named limiters are another table and statement; they are not coalesced.
        for (i, spend, now) in named {
            answers[i] = Some(self.decide_named(spend, now).await.map_err(Undecided::from));
        }
        let sent: Vec<(Statement, DateTime<Utc>)> =
            statements.iter().map(|(_, statement, now)| (statement.clone(), *now)).collect();
        match batch::run(&self.takes, &sent).await {
            Ok(decisions) => {
                for ((i, _, _), decision) in statements.iter().zip(decisions) {
                    answers[*i] = Some(Ok(for_take(decision, &takes[*i].0)));
                }
            }
            Err(failure) => {
                let shared = failure.shared();
                for (i, _, _) in &statements {
                    answers[*i] = Some(Err(shared.one().into()));
                }
            }
        }
        answers.into_iter().map(|answer| answer.expect("every take is answered")).collect()
    }

    /// An idle sweep deleting every bucket last taken from before `before`, batch by batch.
    /// [`IdleSweep::and_expired`] extends it to named limiters' expired keys.
    pub fn sweep_idle(&self, before: DateTime<Utc>) -> IdleSweep<'_> {
        IdleSweep {
            store: self,
            before,
            retained: Vec::new(),
            expired_at: None,
            phase: Phase::Buckets,
            deleted: 0,
        }
    }

    /// Deletes every bucket last taken from before `before` and returns how many it deleted.
    ///
    /// An idle bucket has refilled to full (every [`Limit::new`] refills within
    /// [`IDLE_RETENTION`](crate::IDLE_RETENTION); a name whose budgets take longer needs
    /// [`IdleSweep::retaining`] instead), so deleting it is exactly what the next take would
    /// mint; what this reclaims is the rows of Nodes and Domains that are gone. It
    /// deletes in batches (see [`IdleSweep`]) so no statement holds row locks for long, and
    /// skips rows a take holds.
    ///
    /// # Errors
    /// [`Error::Database`] when a batch fails; the batches before it stay deleted.
    pub async fn delete_idle(&self, before: DateTime<Utc>) -> Result<u64, Error> {
        let mut sweep = self.sweep_idle(before);
        while let Some(batch) = sweep.next_batch().await {
            batch?;
        }
        Ok(sweep.deleted())
    }

    /// How many idle rows one sweep statement deletes: small enough that no statement holds
    /// its row locks for long (BENCHMARKS.md has the figures), large enough that a million
    /// idle rows take a couple of hundred statements.
    pub const DELETE_IDLE_BATCH: u64 = 5_000;

    /// Forgets `key`'s bucket of the budget `name` (a [`Scope`] or a [`Name`]), so the next
    /// take on any replica mints it full, and reports whether it existed: for operators
    /// unblocking a caller. The key of the named limiter of the same name is forgotten with
    /// it, since a policy may decide the budget with GCRA.
    ///
    /// In the same transaction it notifies every replica (`LISTEN`/`NOTIFY`, delivered at
    /// commit), whose guards forget what they knew of the bucket: a reset is the one thing
    /// that adds tokens, and a pre-check must never refuse from a row that is gone.
    ///
    /// It answers only once that transaction is committed, on a pool whose hooks open a
    /// transaction on every connection they hand out (behind a transaction pooler,
    /// [`through_transaction_pooler`](crate::through_transaction_pooler)) too: such a pool
    /// commits when the connection comes back, which sqlx does in a task of its own after the
    /// caller answered, so an operator was told of a reset (and it was audited) that a failed
    /// COMMIT then undid.
    ///
    /// # Errors
    /// [`Error::ZeroKey`] before any query; [`Error::Database`] when the database did not
    /// answer or the COMMIT failed (the bucket may or may not have been reset).
    pub async fn reset(&self, name: impl Into<Name>, key: Key) -> Result<bool, Error> {
        if key.0 == [0; 16] {
            return Err(Error::ZeroKey);
        }
        let name = name.into();
        let mut connection = self.pool.acquire().await?;
        let existed: bool = sqlx::query_scalar(RESET)
            .bind(name.as_str())
            .bind(key.as_uuid())
            .bind(RESET_CHANNEL)
            .bind(&NamedKey::of(name, &key.0).0[..])
            .fetch_one(&mut *connection)
            .await?;
        commit_what_the_pool_opened(&mut connection).await?;
        Ok(existed)
    }

    /// Forgets one key of a named limiter, so its next request finds a full budget, and
    /// reports whether it had a row; every replica's guard hears of it, as for [`Store::reset`].
    ///
    /// Like every statement of the store that changes something, it answers once committed.
    ///
    /// # Errors
    /// [`Error::Database`] when the database did not answer or the COMMIT failed.
    pub async fn reset_named(&self, limiter: LimiterName, key: NamedKey) -> Result<bool, Error> {
        let mut connection = self.pool.acquire().await?;
        let existed: bool = sqlx::query_scalar(RESET_NAMED)
            .bind(limiter.as_str())
            .bind(&key.0[..])
            .bind(RESET_CHANNEL)
            .fetch_one(&mut *connection)
            .await?;
        commit_what_the_pool_opened(&mut connection).await?;
        Ok(existed)
    }

    /// Deletes at most `limit` keys of named limiters whose budget is back to full at `now`
    /// (their TAT has passed: exactly what a missing row means), and returns how many. The
    /// sweep repeats it until a batch comes back short.
    ///
    /// # Errors
    /// [`Error::Database`] when the database did not answer or the COMMIT failed.
    pub async fn delete_expired(&self, limit: u64, now: DateTime<Utc>) -> Result<u64, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut connection = self.pool.acquire().await?;
        let done = sqlx::query(DELETE_EXPIRED)
            .bind(named::micros(now))
            .bind(limit)
            .execute(&mut *connection)
            .await?;
        commit_what_the_pool_opened(&mut connection).await?;
        Ok(done.rows_affected())
    }

    /// Every bucket of `key`, across scopes, as stored (not refilled to now).
    ///
    /// A missing bucket is not a problem: the next take mints it full.
    ///
    /// # Errors
    /// [`Error::Database`] when the database did not answer.
    pub async fn buckets(&self, key: Key) -> Result<Vec<Bucket>, Error> {
        let mut connection = self.pool.acquire().await?;
        let rows = sqlx::query(BUCKETS).bind(key.as_uuid()).fetch_all(&mut *connection).await?;
        // It writes nothing; ending the pool's transaction here only keeps every use alike.
        commit_what_the_pool_opened(&mut connection).await?;
        let mut buckets = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: String = row.try_get("scope")?;
            // The table's CHECK holds every name to the rule Name::new checks.
            let Ok(name) = Name::new(&name) else { continue };
            buckets.push(Bucket {
                name,
                tokens: row.try_get("tokens")?,
                refilled_at: row.try_get("refilled_at")?,
            });
        }
        Ok(buckets)
    }

    /// Closes the store's connections (and its pool): takes and sweeps after this fail with
    /// [`Error::Database`]. For a graceful shutdown; dropping the store closes them abruptly.
    pub async fn close(&self) {
        self.takes.close().await;
    }

    /// How many take connections are in use right now, and how many takes wait for one.
    pub fn connections_in_use_and_waiting(&self) -> (usize, usize) {
        self.takes.usage()
    }
}

/// What a take comes to before the database: an answer, a statement, or a named limiter's.
enum Reduced {
    Answered(Decision),
    Statement(Statement),
    Named(NamedSpend),
}

/// Validates `take` and answers what needs no query ([`sides::of`]): a zero cost is granted
/// (a pair with one free side is a single take of the other), a cost above its burst can
/// never fit, and a bucket named more than once is one side of every cost named for it
/// (which needs one limit).
fn reduce(take: &Take) -> Result<Reduced, Error> {
    if let Take::Named(spend) = take {
        return Ok(Reduced::Named(*spend));
    }
    Ok(match sides::of(take)? {
        Sides::Answered(decision) => Reduced::Answered(decision),
        Sides::Send(sides) => Reduced::Statement(Statement::of(&sides)),
    })
}

/// `decision`, a decision of `take`'s sides, for `take` itself: a grant says what each
/// bucket left at every position that spends from it ([`Grant::spread_over`]).
fn for_take(decision: Decision, take: &Take) -> Decision {
    match decision {
        Decision::Granted(grant) => Decision::Granted(grant.spread_over(take)),
        decision => decision,
    }
}

/// Runs one statement on a task of its own and waits for it.
///
/// A caller that stops waiting (its own deadline passed, or its request was dropped) does not
/// cancel the statement: it runs to its end on its connection, which then goes back to the
/// set. So a connection slot is free exactly when its connection is, a stalled database never
/// sees more connections than the set's size however many callers give up, and no connection
/// is closed mid-protocol just because a client disconnected. The price is that a debit whose
/// statement ends after its caller gave up stands (ARCHITECTURE.md, "Deadlines").
async fn detached<T: Send + 'static>(
    statement: impl std::future::Future<Output = Result<T, sqlx::Error>> + Send + 'static,
) -> Result<T, Failure> {
    match tokio::spawn(statement).await {
        Ok(result) => Ok(result?),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // Only a runtime shutting down cancels the task: nothing will answer any more.
        Err(_) => Err(Failure::Unanswered),
    }
}

impl Store {
    async fn decide_named(&self, spend: NamedSpend, now: DateTime<Utc>) -> Result<Decision, Failure> {
        // A limit GCRA cannot enforce (a burst below one whole cell, a rate it would round):
        // misconfiguration.
        let gcra = Gcra::of(spend.limit).ok_or(Error::InvalidBudget)?;
        if spend.cells == 0 {
            return Ok(Decision::Granted(Grant::FREE));
        }
        if spend.cells > gcra.burst {
            let (cost, burst) = (f64::from(spend.cells), f64::from(gcra.burst));
            return Ok(Decision::InsufficientCapacity(InsufficientCapacity {
                which: Which::First,
                cost,
                burst,
            }));
        }
        let now_us = named::micros(now);
        let takes = self.takes.clone();
        let row: Option<(bool, i64)> = detached(async move {
            let mut lease = takes.lease().await?;
            let row = sqlx::query_as(DECIDE_NAMED)
                .bind(spend.limiter.as_str())
                .bind(&spend.key.0[..])
                .bind(now_us)
                .bind(gcra.t)
                .bind(gcra.tau)
                .bind(i64::from(spend.cells))
                .fetch_optional(lease.connection())
                .await?;
            lease.finish().await?;
            Ok(row)
        })
        .await?;
        Ok(match row {
            Some((true, tat)) => {
                let named = Some((named::instant(tat), gcra.remaining(tat, now_us)));
                Decision::Granted(Grant { named, ..Grant::FREE })
            }
            Some((false, tat)) => Decision::Refused(Refusal {
                which: Which::First,
                retry_after: named::until(now_us, gcra.earliest(tat, spend.cells)),
                judged: None,
                tat: Some(named::instant(tat)),
            }),
            // Lost under the lock: the TAT is unknown, past `now`; a whole interval per cell
            // from now bounds the wait.
            None => Decision::Refused(Refusal {
                which: Which::First,
                retry_after: named::until(now_us, now_us + i64::from(spend.cells) * gcra.t),
                judged: None,
                tat: None,
            }),
        })
    }
}

#[async_trait::async_trait]
impl Decider for Store {
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        Ok(self.decide_take(&take, now).await?)
    }

    /// One statement of its own, never coalesced: a replica leases a bucket at most once per
    /// lease period.
    async fn lease(&self, request: LeaseRequest, now: DateTime<Utc>) -> Result<Option<Leased>, Undecided> {
        Ok(Some(self.lease_bucket(request, now).await?))
    }

    /// [`Store::charge`]: never coalesced, one statement of its own.
    async fn charge(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
        Ok(Some(self.charge_bucket(spend, now).await?))
    }

    /// [`Store::peek`].
    async fn peek(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
        Ok(Some(self.peek_bucket(spend, now).await?))
    }
}

impl Store {
    async fn lease_bucket(&self, request: LeaseRequest, now: DateTime<Utc>) -> Result<Leased, Failure> {
        let LeaseRequest { spend, at_least, at_most, refund, refund_serial } = request;
        spend.validate()?;
        let burst = spend.limit.burst();
        let amounts_valid =
            [at_least, at_most, refund].iter().all(|amount| amount.is_finite() && *amount >= 0.0)
                && at_least <= at_most
                && at_most <= burst
                && refund <= burst
                && refund_serial >= 0;
        if !amounts_valid {
            return Err(Error::NegativeCost.into());
        }
        let takes = self.takes.clone();
        let row: (f64, f64, i64, f64, DateTime<Utc>) = detached(async move {
            let mut lease = takes.lease().await?;
            let row = sqlx::query_as(LEASE)
                .bind(spend.name.as_str())
                .bind(spend.key.as_uuid())
                .bind(at_least)
                .bind(at_most)
                .bind(refund)
                .bind(refund_serial)
                .bind(spend.limit.per_second())
                .bind(burst)
                .bind(now)
                .fetch_one(lease.connection())
                .await?;
            lease.finish().await?;
            Ok(row)
        })
        .await?;
        let (leased, refunded, serial, tokens, refilled_at) = row;
        Ok(Leased { leased, refunded, serial, row: Fill { tokens, refilled_at } })
    }
}

/// An idle sweep in progress: [`IdleSweep::next_batch`] deletes one batch of at most
/// [`Store::DELETE_IDLE_BATCH`] rows, idle buckets first and then, if asked for, named
/// limiters' expired keys, each until a batch comes back short.
///
/// This is the one sweep loop: [`Store::delete_idle`] runs it to the end, the service's
/// leader runs it with a deadline per batch and stops between batches when it loses
/// leadership, and the sweep benchmark times each batch.
#[derive(Debug)]
pub struct IdleSweep<'a> {
    store: &'a Store,
    before: DateTime<Utc>,
    /// Names whose buckets are idle only before an earlier instant of their own.
    retained: Vec<(Name, DateTime<Utc>)>,
    expired_at: Option<DateTime<Utc>>,
    phase: Phase,
    deleted: u64,
}

/// What an [`IdleSweep`] deletes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Buckets,
    NamedKeys,
    Done,
}

impl IdleSweep<'_> {
    /// Keeps `name`'s buckets unless last taken from before `before` (an instant at or before
    /// the sweep's own; a later one is the sweep's): for a name whose budgets take longer than
    /// [`IDLE_RETENTION`](crate::IDLE_RETENTION) to refill ([`Limit::for_any_period`]), the
    /// longest refill any of them takes before now, so that every bucket deleted is full.
    pub fn retaining(mut self, name: impl Into<Name>, before: DateTime<Utc>) -> Self {
        self.retained.push((name.into(), before.min(self.before)));
        self
    }

    /// Also deletes the keys of named limiters whose budget is back to full at `now`, after
    /// the idle buckets.
    pub fn and_expired(mut self, now: DateTime<Utc>) -> Self {
        self.expired_at = Some(now);
        self
    }

    /// Deletes the next batch and returns how many rows it deleted; `None` once every phase
    /// came back short (or a batch failed), which means nothing idle or expired is left.
    ///
    /// A batch skips rows a take holds (`SKIP LOCKED`), so the sweep never waits on a take.
    pub async fn next_batch(&mut self) -> Option<Result<u64, Error>> {
        let phase = self.phase;
        // Done unless this batch comes back full; a cancelled or failed batch ends the sweep.
        self.phase = Phase::Done;
        let limit = i64::try_from(Store::DELETE_IDLE_BATCH).unwrap_or(i64::MAX);
        let statement = match (phase, self.expired_at) {
            (Phase::Done, _) | (Phase::NamedKeys, None) => return None,
            (Phase::Buckets, _) => sqlx::query(DELETE_IDLE)
                .bind(self.before)
                .bind(limit)
                .bind(self.retained.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>())
                .bind(self.retained.iter().map(|(_, before)| *before).collect::<Vec<_>>()),
            (Phase::NamedKeys, Some(now)) => sqlx::query(DELETE_EXPIRED).bind(named::micros(now)).bind(limit),
        };
        // A batch counts as deleted once it is committed (see `Store::reset`).
        let result = async {
            let mut connection = self.store.pool.acquire().await?;
            let done = statement.execute(&mut *connection).await?;
            commit_what_the_pool_opened(&mut connection).await?;
            Ok::<_, sqlx::Error>(done)
        }
        .await;
        Some(match result {
            Ok(done) => {
                let batch = done.rows_affected();
                self.deleted += batch;
                self.phase = match phase {
                    _ if batch == Store::DELETE_IDLE_BATCH => phase,
                    Phase::Buckets if self.expired_at.is_some() => Phase::NamedKeys,
                    _ => Phase::Done,
                };
                Ok(batch)
            }
            Err(error) => Err(Error::Database(error)),
        })
    }

    /// How many rows the sweep has deleted so far.
    pub fn deleted(&self) -> u64 {
        self.deleted
    }
}
