//! Coalesced takes: client-side group commit.
//!
//! A take costs a round trip and a commit; the row work is cheap (PERF-NOTES.md: one statement
//! taking from 16 buckets ran 5.4 times the takes a second of 16 single statements). So while
//! a call is on the wire, concurrent takes wait in a queue, and when it returns the queue goes
//! as the next call: `plexsphere.decide_rate_budget_batch` (migrations/0009), which decides
//! them in order exactly as one at a time, or, for a call of single takes all of one bucket or
//! all of distinct keys, a function made for that shape which decides the same in fewer steps
//! (migrations/0014). There is no timer: a lone take is sent at once, as itself (take.sql or
//! the pair function), and pays only a task hand-off.
//!
//! The calls run on tasks of their own ("drivers"), each looping while the queue is not
//! empty: one while the queue is short, more (up to `max_in_flight`) once a quarter of a
//! call's worth waits. A take of a bucket already on the wire waits for the next call rather than
//! race it to the row lock. A caller waits for its answer on a channel; one whose
//! deadline passes stops waiting and nobody else notices: its take, if not yet sent, is
//! dropped from the queue, and if already sent is decided with the rest of its call.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use tokio::sync::oneshot;

use crate::connections::TakeConnections;
use crate::error::Failure;
use crate::{Decision, Fill, Grant, Key, Name, Refusal, Spend, Which};

const TAKE: &str = include_str!("../queries/take.sql");
const DECIDE_PAIR: &str = include_str!("../queries/decide_pair.sql");
const DECIDE_BATCH: &str = include_str!("../queries/decide_batch.sql");
const DECIDE_BATCH_OF_ONE_BUCKET: &str = include_str!("../queries/decide_batch_of_one_bucket.sql");
const DECIDE_BATCH_OF_DISTINCT_BUCKETS: &str =
    include_str!("../queries/decide_batch_of_distinct_buckets.sql");

/// A take that needs the database, as sent: one bucket, or two all-or-nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Statement {
    /// One bucket; `which` is the position its answers name (a pair with a free side is a
    /// single take of its other side).
    Single { spend: Spend, which: Which },
    /// Two distinct buckets.
    Pair { first: Spend, second: Spend },
}

/// How many takes one call may carry, and how many calls may be on the wire at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalescing {
    /// The most takes in one call; 1 sends every take as its own statement.
    pub max_batch: usize,
    /// The most calls on the wire at once, each on a connection of its own.
    pub max_in_flight: usize,
}

impl Coalescing {
    /// What a store does unless told otherwise: up to 64 takes a call (PERF-NOTES.md: 79k
    /// takes a second at 64 a statement on this machine), and a second call beside the first
    /// when a quarter of a call's worth is waiting (one call per core of the database's
    /// machine here; BENCHMARKS.md section 6 has the figures).
    pub const DEFAULT: Coalescing = Coalescing { max_batch: 64, max_in_flight: 2 };

    /// Every take its own statement, at once: the store before coalescing, for comparison.
    pub const OFF: Coalescing = Coalescing { max_batch: 1, max_in_flight: usize::MAX };

    /// How many takes must wait before a call goes beside one already on the wire.
    fn second_call_after(self) -> usize {
        (self.max_batch / 4).max(1)
    }
}

/// One queued take and where its answer goes.
struct Queued {
    statement: Statement,
    now: DateTime<Utc>,
    answer: oneshot::Sender<Result<Decision, Failure>>,
}

struct State {
    queue: VecDeque<Queued>,
    drivers: usize,
    /// The buckets of the calls on the wire. A take of one of them waits for the next call
    /// instead of going in a call of its own beside it: that call would only wait for the row
    /// lock and the commit of the first, one hot bucket's takes would go as many small calls
    /// each paying a commit under the lock, and they are worth more together (BENCHMARKS.md
    /// section 6: one hot bucket at 16 callers, 11,995 takes a second before this rule,
    /// 20,717 with it).
    in_flight: HashSet<(Name, Key)>,
}

impl State {
    /// The next call: the queued takes in order, at most `max_batch`, without those whose
    /// caller stopped waiting (a take whose caller stopped waiting is not sent: its request was
    /// already answered without it, and under a slow database this is what lets the queue
    /// drain instead of spending budgets for requests nobody waits on). A take of a bucket on
    /// the wire stays queued, and so does every later take of any of its buckets, so each
    /// bucket's takes are still decided in queue order.
    fn next_batch(&mut self, max_batch: usize) -> Vec<Queued> {
        let mut batch = Vec::with_capacity(self.queue.len().min(max_batch));
        let mut held_back: Vec<Queued> = Vec::new();
        let mut blocked: HashSet<(Name, Key)> = HashSet::new();
        while batch.len() < max_batch {
            let Some(queued) = self.queue.pop_front() else { break };
            if queued.answer.is_closed() {
                continue;
            }
            let buckets = buckets(queued.statement);
            if buckets
                .iter()
                .flatten()
                .any(|bucket| self.in_flight.contains(bucket) || blocked.contains(bucket))
            {
                blocked.extend(buckets.into_iter().flatten());
                held_back.push(queued);
            } else {
                batch.push(queued);
            }
        }
        for queued in held_back.into_iter().rev() {
            self.queue.push_front(queued);
        }
        batch
    }
}

/// The buckets a take debits.
fn buckets(statement: Statement) -> [Option<(Name, Key)>; 2] {
    sides(statement).map(|side| side.map(|spend| (spend.name, spend.key)))
}

/// The queue and its drivers.
pub(crate) struct Coalescer {
    takes: Arc<TakeConnections>,
    coalescing: Coalescing,
    state: Mutex<State>,
}

impl Coalescer {
    pub(crate) fn new(takes: Arc<TakeConnections>, coalescing: Coalescing) -> Coalescer {
        let coalescing = Coalescing {
            max_batch: coalescing.max_batch.max(1),
            max_in_flight: coalescing.max_in_flight.max(1),
        };
        Coalescer {
            takes,
            coalescing,
            state: Mutex::new(State { queue: VecDeque::new(), drivers: 0, in_flight: HashSet::new() }),
        }
    }

    pub(crate) fn coalescing(&self) -> Coalescing {
        self.coalescing
    }

    /// Decides `statement` at `now`, in a call with whatever else is queued when a driver
    /// next sends one.
    pub(crate) async fn decide(
        self: &Arc<Self>,
        statement: Statement,
        now: DateTime<Utc>,
    ) -> Result<Decision, Failure> {
        let (answer, answered) = oneshot::channel();
        let start_driver = {
            let mut state = self.lock();
            state.queue.push_back(Queued { statement, now, answer });
            // With nothing on the wire the take goes at once. Otherwise it waits for a call to
            // return, unless a quarter of a call's worth is waiting: a second call beside the
            // first pays when the database has room for it, and one started for a take or two
            // splits the queue into small calls that each pay a commit (at 64 callers on random
            // keys, 18.9k takes/s when only a whole call's worth started one, 28.8k at a
            // quarter, 24.8k at an eighth). A take of a bucket on the wire goes in the call
            // after it: its driver sends it.
            let start = state.drivers == 0
                || (state.drivers < self.coalescing.max_in_flight
                    && state.queue.len() >= self.coalescing.second_call_after()
                    && !buckets(statement).iter().flatten().any(|bucket| state.in_flight.contains(bucket)));
            if start {
                state.drivers += 1;
            }
            start
        };
        if start_driver {
            tokio::spawn(self.clone().drive());
        }
        // A driver answers every take it pops, or its task panicked or the runtime is ending.
        answered.await.unwrap_or(Err(Failure::Unanswered))
    }

    /// Sends the queue, call after call, until nothing in it can go. The check for "nothing"
    /// and the driver count change under one lock, so a take queued meanwhile is always picked
    /// up: by this driver, or by the one whose call holds its bucket.
    async fn drive(self: Arc<Self>) {
        let mut on_the_wire = OnTheWire { coalescer: &self, buckets: Vec::new() };
        loop {
            let batch = {
                let mut state = self.lock();
                // The last call's buckets count as on the wire until this driver has picked
                // the next call, so the takes its callers queued meanwhile wait for it rather
                // than start a call beside it.
                for bucket in on_the_wire.buckets.drain(..) {
                    state.in_flight.remove(&bucket);
                }
                let batch = state.next_batch(self.coalescing.max_batch);
                if batch.is_empty() {
                    state.drivers -= 1;
                    return;
                }
                on_the_wire.buckets =
                    batch.iter().flat_map(|queued| buckets(queued.statement)).flatten().collect();
                state.in_flight.extend(on_the_wire.buckets.iter().copied());
                batch
            };
            let statements: Vec<(Statement, DateTime<Utc>)> =
                batch.iter().map(|queued| (queued.statement, queued.now)).collect();
            match run(&self.takes, &statements).await {
                Ok(decisions) => {
                    for (queued, decision) in batch.into_iter().zip(decisions) {
                        // A caller that stopped waiting dropped its receiver; nothing to do.
                        let _ = queued.answer.send(Ok(decision));
                    }
                }
                // A take sent alone failed by its own statement.
                Err(failure) if batch.len() == 1 => {
                    if let Some(queued) = batch.into_iter().next() {
                        let _ = queued.answer.send(Err(failure));
                    }
                }
                Err(failure) => {
                    let shared = failure.shared();
                    for queued in batch {
                        let _ = queued.answer.send(Err(shared.one()));
                    }
                }
            }
            // One turn of the runtime before the next call: the callers just answered run,
            // and those that take again (the next request of a busy connection) join it
            // instead of waiting a whole call behind it. Not a timer: nothing waits when no
            // task is ready, and a lone take never comes here before it is sent.
            tokio::task::yield_now().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Between statements the queue and the count are whole; a panic cannot tear them.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The buckets of a driver's last call, in `State::in_flight` until the driver picks its next
/// call. Dropped with buckets still in it, the driver ended without going back to its loop:
/// it panicked, or its task was dropped mid-call (the runtime shutting down). It then takes
/// them out and ends the driver, starting another when takes are left and a runtime can run
/// it, so no take waits on a call that will never return.
struct OnTheWire<'a> {
    coalescer: &'a Arc<Coalescer>,
    buckets: Vec<(Name, Key)>,
}

impl Drop for OnTheWire<'_> {
    fn drop(&mut self) {
        if self.buckets.is_empty() && !std::thread::panicking() {
            // The driver's own end: it emptied `buckets` and counted itself out under the lock.
            return;
        }
        let mut state = self.coalescer.lock();
        for bucket in &self.buckets {
            state.in_flight.remove(bucket);
        }
        state.drivers -= 1;
        if !state.queue.is_empty() && state.drivers < self.coalescer.coalescing.max_in_flight {
            // `tokio::spawn` panics outside a runtime, and a panic while unwinding aborts.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                state.drivers += 1;
                runtime.spawn(self.coalescer.clone().drive());
            }
        }
    }
}

/// A call's failure, for each of its takes: every take of a failed call fails with the call's
/// cause, never a refusal. `sqlx::Error` is not `Clone`, so the takes share it.
pub(crate) enum SharedFailure {
    Call(Arc<sqlx::Error>),
    Malformed(String),
    Unanswered,
}

impl Failure {
    /// This failure, for every take of its call.
    pub(crate) fn shared(self) -> SharedFailure {
        match self {
            Failure::Database(error) => SharedFailure::Call(Arc::new(error)),
            Failure::Call(error) => SharedFailure::Call(error),
            Failure::Malformed(what) => SharedFailure::Malformed(what),
            // Never: bad input is refused before a call is made.
            Failure::Input(error) => SharedFailure::Malformed(error.to_string()),
            Failure::Unanswered => SharedFailure::Unanswered,
        }
    }
}

impl SharedFailure {
    /// One take's failure.
    pub(crate) fn one(&self) -> Failure {
        match self {
            SharedFailure::Call(error) => Failure::Call(error.clone()),
            SharedFailure::Malformed(what) => Failure::Malformed(what.clone()),
            SharedFailure::Unanswered => Failure::Unanswered,
        }
    }
}

/// Decides `statements` in order on one leased connection, in one round trip: as themselves
/// when there is one, as the batch function when there are more.
pub(crate) async fn run(
    takes: &Arc<TakeConnections>,
    statements: &[(Statement, DateTime<Utc>)],
) -> Result<Vec<Decision>, Failure> {
    let mut lease = takes.lease().await?;
    let decisions = match statements {
        [] => Vec::new(),
        [(statement, now)] => vec![run_one(lease.connection(), *statement, *now).await?],
        _ => run_many(lease.connection(), statements).await?,
    };
    lease.release();
    Ok(decisions)
}

/// One take, as take.sql or the pair function.
async fn run_one(
    connection: &mut PgConnection,
    statement: Statement,
    now: DateTime<Utc>,
) -> Result<Decision, Failure> {
    match statement {
        Statement::Single { spend, which } => {
            let row: Option<(bool, f64, DateTime<Utc>)> = sqlx::query_as(TAKE)
                .bind(spend.name.as_str())
                .bind(spend.key.as_uuid())
                .bind(spend.cost)
                .bind(spend.limit.per_second())
                .bind(spend.limit.burst())
                .bind(now)
                .fetch_optional(connection)
                .await?;
            Ok(match row {
                Some((true, tokens, refilled_at)) => granted(which, Fill { tokens, refilled_at }),
                Some((false, tokens, refilled_at)) => {
                    refused(spend, which, Some(Fill { tokens, refilled_at }), now)
                }
                None => refused(spend, which, None, now),
            })
        }
        Statement::Pair { first, second } => {
            let row: Row = sqlx::query_as(DECIDE_PAIR)
                .bind(first.name.as_str())
                .bind(first.key.as_uuid())
                .bind(first.cost)
                .bind(first.limit.per_second())
                .bind(first.limit.burst())
                .bind(second.name.as_str())
                .bind(second.key.as_uuid())
                .bind(second.cost)
                .bind(second.limit.per_second())
                .bind(second.limit.burst())
                .bind(now)
                .fetch_one(connection)
                .await?;
            row.decision(Some(first), Some(second), now)
        }
    }
}

/// Many takes, in order, in one call: of the function made for the call's shape when it has
/// one (migrations/0014), else of `plexsphere.decide_rate_budget_batch`.
async fn run_many(
    connection: &mut PgConnection,
    statements: &[(Statement, DateTime<Utc>)],
) -> Result<Vec<Decision>, Failure> {
    // The distinct buckets. The functions lock them in PostgreSQL's (scope, bucket_key) order,
    // the pair's; this map only numbers them (Scope's own order is not the text order).
    let mut buckets: BTreeMap<(Name, Key), i32> = BTreeMap::new();
    for (statement, _) in statements {
        for spend in sides(*statement).into_iter().flatten() {
            buckets.insert((spend.name, spend.key), 0);
        }
    }
    let n = statements.len();
    let singles: Option<Vec<Spend>> = statements
        .iter()
        .map(|(statement, _)| match statement {
            Statement::Single { spend, .. } => Some(*spend),
            Statement::Pair { .. } => None,
        })
        .collect();
    let nows: Vec<DateTime<Utc>> = statements.iter().map(|(_, now)| *now).collect();
    let rows = match singles {
        // One bucket, or distinct keys (not only distinct (scope, key): that function finds a
        // take by its key). Both functions take the same parameters after the buckets.
        Some(spends)
            if buckets.len() == 1
                || spends.iter().map(|spend| spend.key).collect::<HashSet<_>>().len() == n =>
        {
            let query = if buckets.len() == 1 {
                sqlx::query_as::<_, BatchRow>(DECIDE_BATCH_OF_ONE_BUCKET)
                    .bind(spends[0].name.as_str())
                    .bind(spends[0].key.as_uuid())
            } else {
                sqlx::query_as::<_, BatchRow>(DECIDE_BATCH_OF_DISTINCT_BUCKETS)
                    .bind(spends.iter().map(|spend| spend.name.as_str()).collect::<Vec<_>>())
                    .bind(spends.iter().map(|spend| spend.key.as_uuid()).collect::<Vec<_>>())
            };
            query
                .bind(spends.iter().map(|spend| spend.cost).collect::<Vec<_>>())
                .bind(spends.iter().map(|spend| spend.limit.per_second()).collect::<Vec<_>>())
                .bind(spends.iter().map(|spend| spend.limit.burst()).collect::<Vec<_>>())
                .bind(&nows)
                .fetch_all(&mut *connection)
                .await?
        }
        _ => run_general(connection, statements, &mut buckets, &nows).await?,
    };
    let rows: Vec<(i32, Row)> = rows.into_iter().map(|row| (row.take, row.row)).collect();
    if rows.len() != n || rows.iter().enumerate().any(|(i, (take, _))| *take != i as i32 + 1) {
        return Err(Failure::Malformed(format!(
            "a coalesced take function answered {} rows for {n} takes, out of order",
            rows.len()
        )));
    }
    rows.into_iter()
        .zip(statements)
        .map(|((_, row), (statement, now))| match *statement {
            Statement::Single { spend, which } => {
                // A single take is sent as its first side; its answers name `which`.
                let row = row.moved_to(which);
                let (first, second) =
                    if which == Which::First { (Some(spend), None) } else { (None, Some(spend)) };
                row.decision(first, second, *now)
            }
            Statement::Pair { first, second } => row.decision(Some(first), Some(second), *now),
        })
        .collect()
}

/// Any call, pairs and repeated buckets included, as `plexsphere.decide_rate_budget_batch`.
async fn run_general(
    connection: &mut PgConnection,
    statements: &[(Statement, DateTime<Utc>)],
    buckets: &mut BTreeMap<(Name, Key), i32>,
    nows: &[DateTime<Utc>],
) -> Result<Vec<BatchRow>, sqlx::Error> {
    for (position, index) in buckets.values_mut().enumerate() {
        *index = position as i32 + 1;
    }
    let scopes: Vec<&str> = buckets.keys().map(|(scope, _)| scope.as_str()).collect();
    let keys: Vec<uuid::Uuid> = buckets.keys().map(|(_, key)| key.as_uuid()).collect();
    let index = |spend: &Spend| buckets[&(spend.name, spend.key)];

    let n = statements.len();
    let (mut first_bucket, mut first_cost, mut first_rate, mut first_burst) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut second_bucket, mut second_cost, mut second_rate, mut second_burst) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for (statement, _) in statements {
        let [first, second] = sides(*statement);
        let first = first.expect("every statement has a first side");
        first_bucket.push(index(&first));
        first_cost.push(first.cost);
        first_rate.push(first.limit.per_second());
        first_burst.push(first.limit.burst());
        second_bucket.push(second.as_ref().map(index));
        second_cost.push(second.map(|spend| spend.cost));
        second_rate.push(second.map(|spend| spend.limit.per_second()));
        second_burst.push(second.map(|spend| spend.limit.burst()));
    }
    sqlx::query_as::<_, BatchRow>(DECIDE_BATCH)
        .bind(&scopes)
        .bind(&keys)
        .bind(&first_bucket)
        .bind(&first_cost)
        .bind(&first_rate)
        .bind(&first_burst)
        .bind(&second_bucket)
        .bind(&second_cost)
        .bind(&second_rate)
        .bind(&second_burst)
        .bind(nows)
        .fetch_all(connection)
        .await
}

/// A statement's sides as the batch function takes them: the first, and the second of a pair.
fn sides(statement: Statement) -> [Option<Spend>; 2] {
    match statement {
        Statement::Single { spend, .. } => [Some(spend), None],
        Statement::Pair { first, second } => [Some(first), Some(second)],
    }
}

/// What the pair and batch functions answer for one take.
#[derive(sqlx::FromRow, Debug)]
struct Row {
    refused: i16,
    first_tokens: Option<f64>,
    first_refilled_at: Option<DateTime<Utc>>,
    second_tokens: Option<f64>,
    second_refilled_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow, Debug)]
struct BatchRow {
    take: i32,
    #[sqlx(flatten)]
    row: Row,
}

impl Row {
    /// A single take sent as a first side, whose answers must name `which`.
    fn moved_to(self, which: Which) -> Row {
        match which {
            Which::First => self,
            Which::Second => Row {
                refused: if self.refused == 1 { 2 } else { self.refused },
                first_tokens: None,
                first_refilled_at: None,
                second_tokens: self.first_tokens,
                second_refilled_at: self.first_refilled_at,
            },
        }
    }

    /// The decision this row states for a take whose sides are `first` and `second`.
    fn decision(
        self,
        first: Option<Spend>,
        second: Option<Spend>,
        now: DateTime<Utc>,
    ) -> Result<Decision, Failure> {
        let fill = |tokens: Option<f64>, refilled_at: Option<DateTime<Utc>>| {
            Some(Fill { tokens: tokens?, refilled_at: refilled_at? })
        };
        let first_fill = fill(self.first_tokens, self.first_refilled_at);
        let second_fill = fill(self.second_tokens, self.second_refilled_at);
        match (self.refused, first, second) {
            (0, _, _) => Ok(Decision::Granted(Grant { first: first_fill, second: second_fill, named: None })),
            (1, Some(first), _) => Ok(refused(first, Which::First, first_fill, now)),
            (2, _, Some(second)) => Ok(refused(second, Which::Second, second_fill, now)),
            (other, _, _) => Err(Failure::Malformed(format!(
                "a take function answered refused = {other}; this build knows 0, 1 and 2"
            ))),
        }
    }
}

/// A grant naming `which`, with what it left.
fn granted(which: Which, fill: Fill) -> Decision {
    let (first, second) = if which == Which::First { (Some(fill), None) } else { (None, Some(fill)) };
    Decision::Granted(Grant { first, second, named: None })
}

/// The refusal of `spend` by a bucket judged as `judged` (unknown when a concurrent take won
/// under the lock: the wait is then bounded by an empty bucket's).
pub(crate) fn refused(spend: Spend, which: Which, judged: Option<Fill>, now: DateTime<Utc>) -> Decision {
    let basis = judged.unwrap_or(Fill { tokens: 0.0, refilled_at: now });
    let retry_after = spend.limit.time_to_cover(basis, spend.cost, now);
    Decision::Refused(Refusal { which, retry_after, judged, tat: None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Limit;
    use crate::Scope;

    fn spend(scope: Scope, key: u128) -> Spend {
        Spend::new(scope, Key::from(uuid::Uuid::from_u128(key)), 1.0, Limit::new(1.0, 10.0).unwrap())
    }

    fn single(key: u128) -> Statement {
        Statement::Single { spend: spend(Scope::IngestNode, key), which: Which::First }
    }

    fn pair(node: u128, domain: u128) -> Statement {
        Statement::Pair { first: spend(Scope::IngestNode, node), second: spend(Scope::IngestDomain, domain) }
    }

    /// A state whose queue holds `statements` in order (each with a caller still waiting, its
    /// receiver returned) and whose calls on the wire hold `in_flight`.
    fn state(
        statements: &[Statement],
        in_flight: &[Statement],
    ) -> (State, Vec<oneshot::Receiver<Result<Decision, Failure>>>) {
        let mut receivers = Vec::new();
        let queue = statements
            .iter()
            .map(|statement| {
                let (answer, answered) = oneshot::channel();
                receivers.push(answered);
                Queued { statement: *statement, now: Utc::now(), answer }
            })
            .collect();
        let in_flight = in_flight.iter().flat_map(|statement| buckets(*statement)).flatten().collect();
        (State { queue, drivers: 1, in_flight }, receivers)
    }

    fn keys(queued: &[Queued]) -> Vec<[Option<(Name, Key)>; 2]> {
        queued.iter().map(|queued| buckets(queued.statement)).collect()
    }

    #[test]
    fn a_call_takes_the_queue_in_order_up_to_its_maximum() {
        let (mut state, _callers) = state(&[single(1), single(2), single(1), single(3)], &[]);
        let batch = state.next_batch(3);
        assert_eq!(keys(&batch), keys_of(&[single(1), single(2), single(1)]));
        assert_eq!(keys(state.queue.make_contiguous()), keys_of(&[single(3)]));
    }

    #[test]
    fn takes_of_a_bucket_on_the_wire_wait_and_so_do_later_takes_of_their_buckets() {
        // Node 1 is on the wire: its takes wait, and the pair (1, 9) waiting makes the later
        // pair (8, 9) wait behind it for domain 9. The pair (7, 9) came before them, so it
        // goes, and so do node 2 and node 7, which nothing waiting touches.
        let queue = [single(1), pair(7, 9), single(2), pair(1, 9), pair(8, 9), single(7)];
        let (mut state, _callers) = state(&queue, &[single(1)]);
        let batch = state.next_batch(64);
        assert_eq!(keys(&batch), keys_of(&[pair(7, 9), single(2), single(7)]));
        assert_eq!(keys(state.queue.make_contiguous()), keys_of(&[single(1), pair(1, 9), pair(8, 9)]));
    }

    #[test]
    fn a_take_whose_caller_stopped_waiting_is_not_sent() {
        let (mut state, mut callers) = state(&[single(1), single(2), single(3)], &[]);
        callers[1].close();
        let batch = state.next_batch(64);
        assert_eq!(keys(&batch), keys_of(&[single(1), single(3)]));
        assert!(state.queue.is_empty());
    }

    #[test]
    fn when_everything_waits_for_the_wire_the_call_is_empty_and_the_queue_intact() {
        let (mut state, _callers) = state(&[single(1), single(1)], &[single(1)]);
        assert!(state.next_batch(64).is_empty());
        assert_eq!(state.queue.len(), 2);
    }

    fn keys_of(statements: &[Statement]) -> Vec<[Option<(Name, Key)>; 2]> {
        statements.iter().map(|statement| buckets(*statement)).collect()
    }
}
