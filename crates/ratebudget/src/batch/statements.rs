//! The statements a call sends (take.sql, the pair function, the batch functions), and how
//! the rows they return read as decisions.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::{sides, Statement};
use crate::connections::TakeConnections;
use crate::error::Failure;
use crate::{Decision, Fill, Grant, Key, Name, Refusal, Spend, Which};

const TAKE: &str = include_str!("../../queries/take.sql");
const DECIDE_PAIR: &str = include_str!("../../queries/decide_pair.sql");
const DECIDE_BATCH: &str = include_str!("../../queries/decide_batch.sql");
const DECIDE_BATCH_OF_ONE_BUCKET: &str = include_str!("../../queries/decide_batch_of_one_bucket.sql");
const DECIDE_BATCH_OF_DISTINCT_BUCKETS: &str =
    include_str!("../../queries/decide_batch_of_distinct_buckets.sql");

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
    lease.finish().await?;
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
fn refused(spend: Spend, which: Which, judged: Option<Fill>, now: DateTime<Utc>) -> Decision {
    let basis = judged.unwrap_or(Fill { tokens: 0.0, refilled_at: now });
    let retry_after = spend.limit.time_to_cover(basis, spend.cost, now);
    Decision::Refused(Refusal { which, retry_after, judged, tat: None })
}
