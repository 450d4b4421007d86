//! The statements a call sends (take.sql, the function for takes of several buckets, the
//! batch functions of one shape), and how the rows they return read as decisions.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::Statement;
use crate::connections::TakeConnections;
use crate::error::Failure;
use crate::{Decision, Fill, Grant, Key, Name, Refusal, Spend, Which};

const TAKE: &str = include_str!("../../queries/take.sql");
const DECIDE_TAKES: &str = include_str!("../../queries/decide_takes.sql");
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
        [(statement, now)] => vec![run_one(lease.connection(), statement.clone(), *now).await?],
        _ => run_many(lease.connection(), statements).await?,
    };
    lease.finish().await?;
    Ok(decisions)
}

/// One take, as take.sql or the function for takes of several buckets.
async fn run_one(
    connection: &mut PgConnection,
    statement: Statement,
    now: DateTime<Utc>,
) -> Result<Decision, Failure> {
    match statement {
        Statement::Single((which, spend)) => {
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
        Statement::Many(_) => {
            let statements = [(statement, now)];
            let mut decisions = run_takes(connection, &statements).await?;
            decisions.pop().ok_or_else(|| Failure::Malformed("the takes function answered no take".into()))
        }
    }
}

/// Many takes, in order, in one call: of the function made for the call's shape when it has
/// one (migrations/0014), else of `plexsphere.decide_rate_budget_takes`.
async fn run_many(
    connection: &mut PgConnection,
    statements: &[(Statement, DateTime<Utc>)],
) -> Result<Vec<Decision>, Failure> {
    let n = statements.len();
    let singles: Option<Vec<(Which, Spend)>> = statements
        .iter()
        .map(|(statement, _)| match statement {
            Statement::Single(side) => Some(*side),
            Statement::Many(_) => None,
        })
        .collect();
    let Some(singles) = singles else {
        return run_takes(connection, statements).await;
    };
    let buckets: HashSet<(Name, Key)> = singles.iter().map(|(_, spend)| (spend.name, spend.key)).collect();
    // One bucket, or distinct keys (not only distinct (scope, key): that function finds a
    // take by its key). Both functions take the same parameters after the buckets.
    let distinct_keys = singles.iter().map(|(_, spend)| spend.key).collect::<HashSet<_>>().len() == n;
    if buckets.len() != 1 && !distinct_keys {
        return run_takes(connection, statements).await;
    }
    let spends: Vec<Spend> = singles.iter().map(|(_, spend)| *spend).collect();
    let nows: Vec<DateTime<Utc>> = statements.iter().map(|(_, now)| *now).collect();
    let query = if buckets.len() == 1 {
        sqlx::query_as::<_, BatchRow>(DECIDE_BATCH_OF_ONE_BUCKET)
            .bind(spends[0].name.as_str())
            .bind(spends[0].key.as_uuid())
    } else {
        sqlx::query_as::<_, BatchRow>(DECIDE_BATCH_OF_DISTINCT_BUCKETS)
            .bind(spends.iter().map(|spend| spend.name.as_str()).collect::<Vec<_>>())
            .bind(spends.iter().map(|spend| spend.key.as_uuid()).collect::<Vec<_>>())
    };
    let rows = query
        .bind(spends.iter().map(|spend| spend.cost).collect::<Vec<_>>())
        .bind(spends.iter().map(|spend| spend.limit.per_second()).collect::<Vec<_>>())
        .bind(spends.iter().map(|spend| spend.limit.burst()).collect::<Vec<_>>())
        .bind(&nows)
        .fetch_all(&mut *connection)
        .await?;
    if rows.len() != n || rows.iter().enumerate().any(|(i, row)| row.take != i as i32 + 1) {
        return Err(Failure::Malformed(format!(
            "a coalesced take function answered {} rows for {n} takes, out of order",
            rows.len()
        )));
    }
    rows.into_iter()
        .zip(singles)
        .zip(&nows)
        .map(|((row, (which, spend)), now)| {
            let fill = |tokens: Option<f64>, refilled_at: Option<DateTime<Utc>>| {
                Some(Fill { tokens: tokens?, refilled_at: refilled_at? })
            };
            let judged = fill(row.first_tokens, row.first_refilled_at);
            match (row.refused, judged) {
                (0, fill) => Ok(Decision::Granted(Grant::of(fill.map(|fill| (which, fill))))),
                (1, judged) => Ok(refused(spend, which, judged, *now)),
                (refused, judged) => Err(Failure::Malformed(format!(
                    "a coalesced take function answered refused = {refused} with {judged:?} for a single take"
                ))),
            }
        })
        .collect()
}

/// Any call (takes of several buckets, repeated buckets), or one take of several buckets, as
/// `plexsphere.decide_rate_budget_takes`: the distinct buckets of the call, each take's sides
/// (bucket, cost, rate, burst) in order, flattened, and each take's instant.
async fn run_takes(
    connection: &mut PgConnection,
    statements: &[(Statement, DateTime<Utc>)],
) -> Result<Vec<Decision>, Failure> {
    // The distinct buckets. The function locks them in PostgreSQL's (scope, bucket_key) order,
    // the order of every take function; this map only numbers them (Scope's own order is not
    // the text order).
    let mut buckets: BTreeMap<(Name, Key), i32> = BTreeMap::new();
    for (statement, _) in statements {
        for (_, spend) in statement.sides() {
            buckets.insert((spend.name, spend.key), 0);
        }
    }
    for (position, index) in buckets.values_mut().enumerate() {
        *index = position as i32 + 1;
    }
    let scopes: Vec<&str> = buckets.keys().map(|(scope, _)| scope.as_str()).collect();
    let keys: Vec<uuid::Uuid> = buckets.keys().map(|(_, key)| key.as_uuid()).collect();
    let sides = statements.iter().map(|(statement, _)| statement.sides().len()).sum();
    let (mut side_take, mut side_bucket) = (Vec::with_capacity(sides), Vec::with_capacity(sides));
    let (mut side_cost, mut side_rate, mut side_burst) =
        (Vec::with_capacity(sides), Vec::with_capacity(sides), Vec::with_capacity(sides));
    for (take, (statement, _)) in statements.iter().enumerate() {
        for (_, spend) in statement.sides() {
            side_take.push(take as i32 + 1);
            side_bucket.push(buckets[&(spend.name, spend.key)]);
            side_cost.push(spend.cost);
            side_rate.push(spend.limit.per_second());
            side_burst.push(spend.limit.burst());
        }
    }
    let nows: Vec<DateTime<Utc>> = statements.iter().map(|(_, now)| *now).collect();
    let rows: Vec<SideRow> = sqlx::query_as(DECIDE_TAKES)
        .bind(&scopes)
        .bind(&keys)
        .bind(&side_take)
        .bind(&side_bucket)
        .bind(&side_cost)
        .bind(&side_rate)
        .bind(&side_burst)
        .bind(&nows)
        .fetch_all(connection)
        .await?;
    if rows.len() != sides || rows.iter().zip(&side_take).any(|(row, take)| row.take != *take) {
        return Err(Failure::Malformed(format!(
            "the takes function answered {} rows for {sides} sides, out of order",
            rows.len()
        )));
    }
    let mut rows = rows.into_iter();
    statements
        .iter()
        .map(|(statement, now)| {
            let sides = statement.sides();
            let rows: Vec<SideRow> = rows.by_ref().take(sides.len()).collect();
            decision(sides, &rows, *now)
        })
        .collect()
}

/// What `plexsphere.decide_rate_budget_takes` answers for one side of a take: the take's
/// number, its answer (0 granted, `k` its `k`-th side refused, the same on each of its sides),
/// and the side's row as debited, or (on the refused side) as judged.
#[derive(sqlx::FromRow, Debug)]
struct SideRow {
    take: i32,
    refused: i32,
    row_tokens: Option<f64>,
    row_refilled_at: Option<DateTime<Utc>>,
}

impl SideRow {
    fn fill(&self) -> Option<Fill> {
        Some(Fill { tokens: self.row_tokens?, refilled_at: self.row_refilled_at? })
    }
}

/// The decision the rows of one take's `sides` state.
fn decision(sides: &[(Which, Spend)], rows: &[SideRow], now: DateTime<Utc>) -> Result<Decision, Failure> {
    let malformed = |what: String| Failure::Malformed(format!("the takes function answered {what}"));
    let refused_side = rows.first().map_or(-1, |row| row.refused);
    if rows.iter().any(|row| row.refused != refused_side) {
        return Err(malformed("two answers for one take".into()));
    }
    match usize::try_from(refused_side) {
        Ok(0) => {
            let fills = sides.iter().zip(rows).map(|((which, _), row)| Some((*which, row.fill()?)));
            let fills: Option<Vec<(Which, Fill)>> = fills.collect();
            let fills = fills.ok_or_else(|| malformed("a grant without the row it left".into()))?;
            Ok(Decision::Granted(Grant::of(fills)))
        }
        Ok(side) if side <= sides.len() => {
            let (which, spend) = sides[side - 1];
            Ok(refused(spend, which, rows[side - 1].fill(), now))
        }
        _ => Err(malformed(format!("refused = {refused_side} for a take of {} buckets", sides.len()))),
    }
}

/// What the batch functions of one bucket and of distinct buckets answer for one take.
#[derive(sqlx::FromRow, Debug)]
struct BatchRow {
    take: i32,
    refused: i16,
    first_tokens: Option<f64>,
    first_refilled_at: Option<DateTime<Utc>>,
}

/// A grant naming `which`, with what it left.
fn granted(which: Which, fill: Fill) -> Decision {
    Decision::Granted(Grant::of([(which, fill)]))
}

/// The refusal of `spend` by a bucket judged as `judged` (unknown when a concurrent take won
/// under the lock: the wait is then bounded by an empty bucket's).
fn refused(spend: Spend, which: Which, judged: Option<Fill>, now: DateTime<Utc>) -> Decision {
    let basis = judged.unwrap_or(Fill { tokens: 0.0, refilled_at: now });
    let retry_after = spend.limit.time_to_cover(basis, spend.cost, now);
    Decision::Refused(Refusal { which, retry_after, judged, tat: None })
}
