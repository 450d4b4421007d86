//! Coalesced takes decide exactly as one at a time, fail as one at a time, and never let one
//! caller's impatience cancel another's decision; one at a time, every take (of one bucket,
//! two or many) decides exactly as a model of the buckets in Rust.

use std::collections::HashMap;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use proptest::prelude::*;
use ratebudget::{
    Coalescing, Decider, Decision, Error, Fill, Key, Limit, Scope, Spend, Store, Take, Undecided, Which,
};
use sqlx::PgPool;

use crate::support::helpers::{instant, key, sessions_wait_on_a_lock, FreshDatabase};

/// Every bucket's row, in key order, for comparing two databases' end states.
async fn rows(pool: &PgPool) -> Vec<(String, uuid::Uuid, f64, DateTime<Utc>)> {
    sqlx::query_as("SELECT scope, bucket_key, tokens, refilled_at FROM plexsphere.rate_budgets ORDER BY scope, bucket_key")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// One take of a random workload, over `keys` (few, so that keys run hot).
#[derive(Clone, Debug)]
struct Step {
    first: (usize, f64),
    second: Option<(usize, f64)>,
    micros: i64,
    /// Whether each side is sized by its bucket's other limit (a rule changed between two
    /// callers' takes, say): a faster rate and a smaller burst.
    other_limit: (bool, bool),
    /// More buckets of the same take, after the first two (a request's descriptors): a take
    /// of up to nine, all or nothing, often naming a bucket twice. Each with its cost and
    /// whether it is sized by its bucket's other limit.
    more: Vec<(usize, f64, bool)>,
}

fn step(keys: usize) -> impl Strategy<Value = Step> {
    let cost = prop_oneof![Just(1.0), 0.0f64..5.0, Just(0.0), 6.0f64..9.0];
    // Forward, standing still, or back (a caller whose clock is behind).
    let micros = prop_oneof![4 => 0i64..300_000, 2 => Just(0i64), 1 => -200_000i64..0];
    let other_limit = prop_oneof![3 => Just(false), 1 => Just(true)];
    // A bucket of a take of many named twice with two limits is bad input (both stores
    // refuse it alike); rarely, so that most such takes are decided.
    let rarely_other = prop_oneof![15 => Just(false), 1 => Just(true)];
    let small = prop_oneof![3 => Just(1.0), 1 => 0.0f64..3.0, 1 => Just(0.0)];
    let more = prop_oneof![
        3 => Just(Vec::new()),
        2 => prop::collection::vec((0..keys, small, rarely_other), 1..8),
    ];
    (
        0..keys,
        cost.clone(),
        prop::option::of((0..keys, cost)),
        micros,
        (other_limit.clone(), other_limit),
        more,
    )
        .prop_map(|(bucket, cost, second, micros, other_limit, more)| Step {
            first: (bucket, cost),
            second,
            micros,
            other_limit,
            more,
        })
}

/// What a round's queue looks like. The store sends single takes all of one bucket, and single
/// takes of distinct buckets, to functions of their own (migrations/0014); any other queue to
/// the general one. All must decide as one take at a time.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Single takes, pairs and takes of many buckets.
    Mixed,
    /// Only takes of many buckets (two to nine, often one bucket twice).
    Many,
    OneBucket,
    DistinctBuckets,
    /// Pairs of one hot bucket and a bucket no other take of the call touches (a Node's
    /// reads, each with another Domain's): where the general function's foresight once
    /// refused a pair whose hot side an earlier take at a later instant, or a faster rate,
    /// had left covered (issue 20, item 3).
    LonelyPairs,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        4 => Just(Shape::Mixed),
        2 => Just(Shape::Many),
        2 => Just(Shape::OneBucket),
        2 => Just(Shape::DistinctBuckets),
        1 => Just(Shape::LonelyPairs),
    ]
}

/// The buckets: the first half Node-scoped, the rest Domain-scoped, each with its own limit.
/// The last has the first's key under its other scope, as a Node's id names several of its
/// buckets: a call holding both is not a call of distinct keys.
fn buckets(limits: &[Limit]) -> Vec<(Scope, Key, Limit)> {
    let half = limits.len() / 2;
    let mut buckets: Vec<(Scope, Key, Limit)> = limits
        .iter()
        .enumerate()
        .map(|(i, limit)| {
            (if i < half { Scope::SecretReadNode } else { Scope::SecretReadDomain }, key(), *limit)
        })
        .collect();
    let first_key = buckets[0].1;
    if let Some(last) = buckets.last_mut().filter(|_| half > 0) {
        last.1 = first_key;
    }
    buckets
}

/// A bucket's other limit: two and a half times the rate, three quarters of the burst (at
/// least 1), so it still refills within the hour.
fn other(limit: Limit) -> Limit {
    Limit::new(limit.per_second() * 2.5, (limit.burst() * 0.75).max(1.0)).unwrap()
}

/// Takes in queue order, each with its caller's instant.
type Queue = Vec<(Take, DateTime<Utc>)>;

fn queue(buckets: &[(Scope, Key, Limit)], steps: &[Step]) -> Queue {
    let spend = |(bucket, cost): (usize, f64), other_limit: bool| {
        let (scope, key, limit) = buckets[bucket];
        let limit = if other_limit { other(limit) } else { limit };
        Spend::new(scope, key, cost, limit)
    };
    let mut now = instant();
    steps
        .iter()
        .map(|step| {
            now += Duration::microseconds(step.micros);
            let take = match step.second {
                _ if !step.more.is_empty() => {
                    let first_two = [
                        Some((step.first, step.other_limit.0)),
                        step.second.map(|second| (second, step.other_limit.1)),
                    ];
                    let more = step.more.iter().map(|(bucket, cost, other)| ((*bucket, *cost), *other));
                    Take::many(
                        first_two
                            .into_iter()
                            .flatten()
                            .chain(more)
                            .map(|(side, other)| spend(side, other))
                            .collect::<Vec<_>>(),
                    )
                }
                Some(second) => {
                    Take::Pair(spend(step.first, step.other_limit.0), spend(second, step.other_limit.1))
                }
                None => Take::Single(spend(step.first, step.other_limit.0)),
            };
            (take, now)
        })
        .collect()
}

/// The buckets as a model holds them: each bucket's row, or none before its first grant.
type Rows = HashMap<(Scope, Key), Fill>;

/// A decision as these tests compare it: what each position of a grant left, a refusal's
/// position, wait and judged row, or a cost that never fits.
#[derive(Debug, PartialEq)]
enum Compared {
    Granted(Vec<Option<Fill>>),
    Refused(Which, StdDuration, Option<Fill>),
    Never(Which, f64, f64),
}

fn compared(take: &Take, decision: &Decision) -> Compared {
    match decision {
        Decision::Granted(grant) => {
            Compared::Granted(take.spends().map(|(which, _)| grant.remaining(which)).collect())
        }
        Decision::Refused(refusal) => Compared::Refused(refusal.which, refusal.retry_after, refusal.judged),
        Decision::InsufficientCapacity(never) => Compared::Never(never.which, never.cost, never.burst),
    }
}

/// `take` at `now`, decided by a model of the buckets in `rows` (and applied to them), as the
/// store decides one take at a time: a cost above its burst never fits (the first such
/// position); each bucket is one side of every cost the take names for it, in position
/// order, answered at the first of its positions that costs something (two limits for it are
/// bad input); free sides are not looked at; the first side, in the order of the take's first
/// spend of its bucket, that its bucket does not cover (refilled to `now` by `Limit::level`)
/// refuses with that bucket's row, and otherwise every side is debited.
fn model(rows: &mut Rows, take: &Take, now: DateTime<Utc>) -> Result<Compared, Error> {
    let spends: Vec<(Which, Spend)> = take.spends().collect();
    if let Some((which, spend)) = spends.iter().find(|(_, spend)| spend.cost > spend.limit.burst()) {
        return Ok(Compared::Never(*which, spend.cost, spend.limit.burst()));
    }
    // (bucket, position answered, summed cost, limit), in the order first named.
    type Side = ((Scope, Key), Option<Which>, f64, Limit);
    let mut sides: Vec<Side> = Vec::new();
    for (which, spend) in &spends {
        let bucket = (Scope::of_name(spend.name).unwrap(), spend.key);
        match sides.iter_mut().find(|side| side.0 == bucket) {
            Some(side) if side.3 != spend.limit => return Err(Error::InvalidBudget),
            Some(side) => {
                side.2 += spend.cost;
                if side.1.is_none() && spend.cost != 0.0 {
                    side.1 = Some(*which);
                }
            }
            None => sides.push((bucket, (spend.cost != 0.0).then_some(*which), spend.cost, spend.limit)),
        }
    }
    if let Some((_, which, cost, limit)) = sides.iter().find(|(_, _, cost, limit)| *cost > limit.burst()) {
        return Ok(Compared::Never(which.unwrap(), *cost, limit.burst()));
    }
    sides.retain(|(_, _, cost, _)| *cost != 0.0);
    let mut left = Vec::new();
    for (bucket, which, cost, limit) in &sides {
        let row = rows.get(bucket).copied();
        let level = row.map_or(limit.burst(), |row| limit.level(row, now));
        if level < *cost {
            let judged = row.expect("a bucket without a row is full, and no cost is above its burst");
            return Ok(Compared::Refused(
                which.unwrap(),
                limit.time_to_cover(judged, *cost, now),
                Some(judged),
            ));
        }
        let refilled_at = row.map_or(now, |row| row.refilled_at.max(now));
        left.push((*bucket, Fill { tokens: level - cost, refilled_at }));
    }
    rows.extend(left.iter().copied());
    Ok(Compared::Granted(
        spends
            .iter()
            .map(|(_, spend)| {
                let bucket = (Scope::of_name(spend.name).unwrap(), spend.key);
                (spend.cost != 0.0)
                    .then(|| left.iter().find(|(at, _)| *at == bucket).map(|(_, fill)| *fill))
                    .flatten()
            })
            .collect(),
    ))
}

#[test]
fn a_coalesced_queue_decides_exactly_as_one_take_at_a_time_in_its_order_and_as_the_model() {
    // Issue 34, item 3: takes of any number of buckets (up to nine here, often naming one
    // twice) in every shape of call, against the same takes one at a time, and those against
    // a model of the buckets in Rust.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (batched_db, batched_pool) = runtime.block_on(FreshDatabase::create());
    let (single_db, single_pool) = runtime.block_on(FreshDatabase::create());
    let batched = Store::new(batched_pool.clone());
    let one_at_a_time = Store::new(single_pool.clone()).with_coalescing(Coalescing::OFF);
    let config = ProptestConfig { cases: 96, ..ProptestConfig::default() };
    proptest!(config, |(
        limits in prop::collection::vec((0.5f64..20.0, 1.0f64..8.0), 2..6),
        rounds in prop::collection::vec((shape(), prop::collection::vec(step(5), 1..40)), 1..4),
    )| {
        let limits: Vec<Limit> = limits.into_iter().map(|(rate, burst)| Limit::new(rate, burst).unwrap()).collect();
        let buckets = buckets(&limits);
        let keys = buckets.len();
        let mut modelled = Rows::new();
        for (shape, steps) in rounds {
            let hot = steps[0].first.0 % keys;
            let steps: Vec<Step> = steps
                .into_iter()
                .enumerate()
                .filter_map(|(i, mut step)| {
                    match shape {
                        Shape::Mixed | Shape::Many => {
                            step.first.0 %= keys;
                            step.second = step.second.map(|(bucket, cost)| (bucket % keys, cost));
                            step.more.iter_mut().for_each(|(bucket, _, _)| *bucket %= keys);
                            if let Shape::Many = shape {
                                // Costs that several sides of one bucket still fit in, mostly.
                                step.first.1 /= 4.0;
                                step.second = step.second.map(|(bucket, cost)| (bucket, cost / 4.0));
                                step.more.iter_mut().for_each(|(_, cost, _)| *cost /= 3.0);
                                if step.more.is_empty() {
                                    step.more.push(((step.first.0 + i) % keys, 0.5, false));
                                }
                            }
                        }
                        Shape::OneBucket => {
                            step.first.0 = hot;
                            step.second = None;
                            step.more.clear();
                        }
                        Shape::DistinctBuckets if i < keys => {
                            step.first.0 = (hot + i) % keys;
                            step.second = None;
                            step.more.clear();
                        }
                        Shape::DistinctBuckets => return None,
                        Shape::LonelyPairs => {
                            // Single takes and pairs of the hot bucket, the pairs' other side a
                            // bucket of their own (past `keys`), and the clock going back every
                            // other take, as the instants of callers that read their clocks
                            // before they queued.
                            step.first.0 = keys;
                            step.second = step.second.map(|(_, cost)| (keys + 1 + i, cost));
                            step.more.clear();
                            step.micros = if i % 2 == 1 { -step.micros.abs() } else { step.micros.abs() };
                        }
                    }
                    Some(step)
                })
                .collect();
            // For lonely pairs, a fresh hot bucket (at `keys`), spent to empty by a take of
            // its own before the call, and the pairs' buckets, fresh each round: Domains no
            // other take names.
            let mut round_buckets = buckets.clone();
            round_buckets.push((Scope::IngestNode, key(), limits[0]));
            round_buckets.extend(steps.iter().map(|_| (Scope::IngestDomain, key(), limits[0])));
            if let Shape::LonelyPairs = shape {
                let (scope, hot, limit) = round_buckets[keys];
                let empty = Take::Single(Spend::new(scope, hot, limit.burst(), limit));
                for store in [&batched, &one_at_a_time] {
                    prop_assert!(runtime.block_on(store.decide(empty.clone(), instant())).unwrap().is_granted());
                }
                model(&mut modelled, &empty, instant()).unwrap();
            }
            let queue = queue(&round_buckets, &steps);
            let together = runtime.block_on(batched.decide_all(&queue));
            for (i, ((take, now), coalesced)) in queue.iter().zip(together).enumerate() {
                let single = runtime.block_on(one_at_a_time.decide(take.clone(), *now));
                let modelled = model(&mut modelled, take, *now);
                match (coalesced, single, modelled) {
                    (Ok(coalesced), Ok(single), Ok(modelled)) => {
                        prop_assert_eq!(&coalesced, &single, "take {}", i);
                        prop_assert_eq!(compared(take, &single), modelled, "take {}: {:?}", i, take);
                    }
                    (
                        Err(Undecided::Store(Error::InvalidBudget)),
                        Err(Undecided::Store(Error::InvalidBudget)),
                        Err(Error::InvalidBudget),
                    ) => {}
                    (coalesced, single, modelled) => prop_assert!(false, "take {}: {:?} against {:?} and the model's {:?}", i, coalesced, single, modelled),
                }
            }
            prop_assert_eq!(runtime.block_on(rows(&batched_pool)).len(), runtime.block_on(rows(&single_pool)).len());
        }
        // Same keys, two databases: the rows must be equal too, to the bit.
        let (a, b) = (runtime.block_on(rows(&batched_pool)), runtime.block_on(rows(&single_pool)));
        let strip = |rows: Vec<(String, uuid::Uuid, f64, DateTime<Utc>)>| -> Vec<_> {
            rows.into_iter().filter(|(_, key, _, _)| buckets.iter().any(|(_, k, _)| k.as_uuid() == *key)).collect()
        };
        let mut modelled: Vec<_> = modelled
            .into_iter()
            .map(|((scope, key), fill)| (scope.as_str().to_owned(), key.as_uuid(), fill.tokens, fill.refilled_at))
            .collect();
        modelled.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
        prop_assert_eq!(strip(a.clone()), strip(b));
        prop_assert_eq!(strip(a), strip(modelled));
    });
    runtime.block_on(batched_db.drop_database(batched_pool));
    runtime.block_on(single_db.drop_database(single_pool));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_hot_keys_queue_is_one_call_and_one_row_update(pool: PgPool) {
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 50.0).unwrap();
    let hot = key();
    let queue: Vec<_> =
        (0..60).map(|_| (Take::Single(Spend::new(Scope::IngestNode, hot, 1.0, limit)), instant())).collect();
    // Count the row writes with a trigger of this test's own database.
    for statement in [
        "CREATE TABLE writes (op text NOT NULL)",
        "CREATE FUNCTION count_write() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO writes VALUES (TG_OP); RETURN NULL; END $$",
        "CREATE TRIGGER counted AFTER INSERT OR UPDATE ON plexsphere.rate_budgets FOR EACH ROW EXECUTE FUNCTION count_write()",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let decisions = store.decide_all(&queue).await;
    let granted = decisions.iter().filter(|decision| decision.as_ref().unwrap().is_granted()).count();
    assert_eq!(granted, 50, "the burst, then refusals, in order");
    assert!(decisions[..50].iter().all(|d| d.as_ref().unwrap().is_granted()));
    let tokens: f64 =
        sqlx::query_scalar("SELECT tokens FROM plexsphere.rate_budgets").fetch_one(&pool).await.unwrap();
    assert_eq!(tokens, 0.0);
    // Minted once, written once, for sixty takes.
    let writes = || async {
        sqlx::query_scalar::<_, String>("SELECT op FROM writes ORDER BY op").fetch_all(&pool).await.unwrap()
    };
    assert_eq!(writes().await, ["INSERT", "UPDATE"]);

    // The row exists now, so the calls of this bucket no longer mint (migrations/0014): ten
    // seconds refill ten tokens, and twenty takes are one more row update.
    let later = instant() + Duration::seconds(10);
    let queue: Vec<_> =
        (0..20).map(|_| (Take::Single(Spend::new(Scope::IngestNode, hot, 1.0, limit)), later)).collect();
    let decisions = store.decide_all(&queue).await;
    let granted: Vec<bool> =
        decisions.iter().map(|decision| decision.as_ref().unwrap().is_granted()).collect();
    assert_eq!(granted, [[true; 10], [false; 10]].concat());
    assert_eq!(writes().await, ["INSERT", "UPDATE", "UPDATE"]);

    // Twenty more at the same instant: the snapshot foresees every refusal, so the call neither
    // writes nor locks the row; it is decided while another transaction holds that lock.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM plexsphere.rate_budgets FOR UPDATE").execute(&mut *holder).await.unwrap();
    let decisions = tokio::time::timeout(StdDuration::from_secs(30), store.decide_all(&queue))
        .await
        .expect("a call of foreseen refusals waited on the row lock");
    assert!(decisions.iter().all(|decision| !decision.as_ref().unwrap().is_granted()));
    holder.rollback().await.unwrap();
    assert_eq!(writes().await, ["INSERT", "UPDATE", "UPDATE"]);
}

/// Each shape of call goes to its own function: with that function sabotaged (renamed away),
/// a call of that shape fails, each of its takes with `Error::Database` naming the function,
/// never a refusal, while calls of the other shapes are still decided.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_call_that_fails_fails_each_of_its_takes_and_never_refuses(pool: PgPool) {
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 5.0).unwrap();
    let hot = key();
    // The hot bucket has a row, so its calls do not hand over to the general function to mint it.
    assert!(store
        .decide(Take::Single(Spend::new(Scope::IngestNode, hot, 1.0, limit)), instant())
        .await
        .unwrap()
        .is_granted());
    let single = |key, cost| (Take::Single(Spend::new(Scope::IngestNode, key, cost, limit)), instant());
    let shapes: [(&str, Queue); 3] = [
        (
            "decide_rate_budget_batch_of_one_bucket",
            vec![single(hot, 1.0), single(hot, 0.0), single(hot, 1.0), single(hot, 9.0)],
        ),
        (
            "decide_rate_budget_batch_of_distinct_buckets",
            vec![single(key(), 1.0), single(key(), 0.0), single(key(), 2.0), single(key(), 9.0)],
        ),
        ("decide_rate_budget_takes", {
            // A pair, and one of its buckets again: neither shape.
            let (node, domain) = (key(), key());
            let pair = Take::Pair(
                Spend::new(Scope::IngestNode, node, 1.0, limit),
                Spend::new(Scope::IngestDomain, domain, 1.0, limit),
            );
            vec![(pair, instant()), single(key(), 0.0), single(node, 2.0), single(key(), 9.0)]
        }),
    ];
    for (sabotaged, _) in &shapes {
        sqlx::query(&format!("ALTER FUNCTION plexsphere.{sabotaged} RENAME TO gone"))
            .execute(&pool)
            .await
            .unwrap();
        for (function, queue) in &shapes {
            let answers = store.decide_all(queue).await;
            // What needs no query is answered whatever happens to the call.
            assert!(answers[1].as_ref().unwrap().is_granted());
            assert!(matches!(answers[3], Ok(Decision::InsufficientCapacity(_))));
            if function == sabotaged {
                for answer in [&answers[0], &answers[2]] {
                    let Err(error @ Undecided::CallFailed(_)) = answer else {
                        panic!("{function}: {answer:?}")
                    };
                    let chain = ratebudget::cause_chain(error);
                    assert!(chain.contains(&format!("plexsphere.{function}(")), "{chain}");
                }
            } else {
                assert!(
                    answers[0].is_ok() && answers[2].is_ok(),
                    "{function} with {sabotaged} gone: {answers:?}"
                );
            }
        }
        sqlx::query(&format!("ALTER FUNCTION plexsphere.gone RENAME TO {sabotaged}"))
            .execute(&pool)
            .await
            .unwrap();
    }
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_caller_that_stops_waiting_cancels_nobody_elses_decision(pool: PgPool) {
    let store = Store::new(pool.clone()).with_coalescing(Coalescing { max_batch: 64, max_in_flight: 1 });
    let limit = Limit::new(1.0, 10.0).unwrap();
    let bucket = key();
    let take = Take::Single(Spend::new(Scope::IngestNode, bucket, 1.0, limit));
    let tokens = || async {
        sqlx::query_scalar::<_, f64>("SELECT tokens FROM plexsphere.rate_budgets")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // Mint the bucket, then hold its row so the next call waits on the lock.
    assert!(store.decide(take.clone(), instant()).await.unwrap().is_granted());
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM plexsphere.rate_budgets FOR UPDATE").execute(&mut *holder).await.unwrap();

    // The only call allowed on the wire gives up while it waits on the held row...
    let on_the_wire = tokio::spawn({
        let (store, take) = (store.clone(), take.clone());
        async move { tokio::time::timeout(StdDuration::from_secs(30), store.decide(take, instant())).await }
    });
    sessions_wait_on_a_lock(&pool, 1).await;
    on_the_wire.abort();
    assert!(on_the_wire.await.unwrap_err().is_cancelled());
    // ...while two callers queue behind it, and one more queues and gives up.
    let queued: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn({
                let (store, take) = (store.clone(), take.clone());
                async move { store.decide(take, instant()).await }
            })
        })
        .collect();
    let impatient =
        tokio::time::timeout(StdDuration::from_millis(50), store.decide(take.clone(), instant())).await;
    assert!(impatient.is_err(), "it waited behind the held row");
    holder.commit().await.unwrap();

    for caller in queued {
        assert!(caller.await.unwrap().unwrap().is_granted());
    }
    // The call already sent is decided whole, its abandoned take included (docs/adr/0006);
    // the take abandoned in the queue was never sent. So three were spent beside the first.
    crate::support::replicas::eventually(StdDuration::from_secs(5), "the queued takes land", || async {
        tokens().await == 6.0
    })
    .await;
    // And nothing more lands later.
    assert!(store.decide(take, instant()).await.unwrap().is_granted());
    assert_eq!(tokens().await, 5.0);
}

/// Coalesced calls, pair functions and single takes from several stores (replicas) on the
/// same Node and Domain buckets, all at once: every lock is taken in the one global order (a
/// distinct-bucket call's mints after its UPDATE are the one exception, docs/adr/0036, and
/// these buckets exist once minted), so none of them may fail, deadlocked or otherwise. (PostgreSQL breaks a deadlock after
/// `deadlock_timeout` by failing one of its transactions, which would surface here as
/// `Error::Database`.)
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn concurrent_calls_pairs_and_takes_of_many_from_several_replicas_never_deadlock(pool: PgPool) {
    let limit = Limit::new(1_000_000.0, 1_000_000.0).unwrap();
    let domains = [key(), key()];
    let nodes: Vec<Key> = (0..8).map(|_| key()).collect();
    let replicas = [
        Store::new(pool.clone()),
        Store::new(pool.clone()),
        Store::new(pool.clone()).with_coalescing(Coalescing::OFF),
    ];
    let mut callers = Vec::new();
    for caller in 0..48usize {
        let store = replicas[caller % replicas.len()].clone();
        let nodes = nodes.clone();
        callers.push(tokio::spawn(async move {
            for round in 0..25usize {
                let node = nodes[(caller + round) % nodes.len()];
                let domain = domains[(caller / 3 + round) % domains.len()];
                let node_side = Spend::new(Scope::SecretReadNode, node, 1.0, limit);
                let domain_side = Spend::new(Scope::SecretReadDomain, domain, 1.0, limit);
                // Both orders of naming the sides, single takes, and takes of many buckets
                // (another node and both domains, in either order) interleaved.
                let other_node =
                    Spend::new(Scope::SecretReadNode, nodes[(caller + round + 3) % nodes.len()], 1.0, limit);
                let other_domain = Spend::new(
                    Scope::SecretReadDomain,
                    domains[(caller / 3 + round + 1) % domains.len()],
                    1.0,
                    limit,
                );
                let take = match round % 5 {
                    0 => Take::Pair(node_side, domain_side),
                    1 => Take::Pair(domain_side, node_side),
                    2 => Take::many([domain_side, node_side, other_domain, other_node]),
                    3 => Take::many([other_node, other_domain, node_side, domain_side]),
                    _ => Take::Single(domain_side),
                };
                store.decide(take, instant()).await?;
            }
            Ok::<(), Undecided>(())
        }));
    }
    for caller in callers {
        caller.await.unwrap().expect("a take failed");
    }
    let spent: f64 = sqlx::query_scalar("SELECT sum(1000000 - tokens) FROM plexsphere.rate_budgets")
        .fetch_one(&pool)
        .await
        .unwrap();
    // Every take was granted: a pair debits two buckets, a take of many four, a single one.
    let debits_per_caller: usize = (0..25usize).map(|round| [2, 2, 4, 4, 1][round % 5]).sum();
    assert_eq!(spent.round(), (48 * debits_per_caller) as f64);
}

/// Several stores (replicas) spending the same buckets at once, two coalescing their callers'
/// takes into calls of one hot bucket and two into calls of distinct buckets (each shape's own
/// function since migrations/0014), and one store sending every take alone: each bucket grants
/// exactly what it holds, whoever's call wins its row lock, and nothing fails.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn replicas_spending_the_same_buckets_grant_each_token_once(pool: PgPool) {
    // Every take at one instant: nothing refills, so a bucket grants its burst and no more.
    let limit = Limit::new(1.0, 40.0).unwrap();
    let hot = key();
    let spread: Vec<Key> = (0..16).map(|_| key()).collect();
    // Hot and spread callers on stores of their own, so that each coalescing store's calls
    // have one shape (a store serving both would mostly send mixed calls to the general
    // function); one store sends every take alone, from both kinds of caller.
    let hot_replicas = [Store::new(pool.clone()), Store::new(pool.clone())];
    let spread_replicas = [Store::new(pool.clone()), Store::new(pool.clone())];
    let alone = Store::new(pool.clone()).with_coalescing(Coalescing::OFF);
    let mut callers = Vec::new();
    for caller in 0..48usize {
        let store = match (caller % 2, caller % 6) {
            (_, 0 | 1) => alone.clone(),
            (0, _) => hot_replicas[caller % 4 / 2].clone(),
            _ => spread_replicas[caller % 4 / 2].clone(),
        };
        let spread = spread.clone();
        callers.push(tokio::spawn(async move {
            let mut granted = Vec::new();
            for round in 0..20usize {
                // Half the callers on the hot bucket, half each on a bucket of its own per round.
                let bucket = if caller % 2 == 0 { hot } else { spread[(caller / 2 + round) % spread.len()] };
                let take = Take::Single(Spend::new(Scope::IngestNode, bucket, 1.0, limit));
                if store.decide(take, instant()).await?.is_granted() {
                    granted.push(bucket);
                }
            }
            Ok::<Vec<Key>, Undecided>(granted)
        }));
    }
    let mut granted = std::collections::HashMap::<Key, usize>::new();
    for caller in callers {
        for bucket in caller.await.unwrap().expect("a take failed") {
            *granted.entry(bucket).or_default() += 1;
        }
    }
    // 24 callers x 20 takes on the hot bucket: its burst, once. The spread buckets get 25 to 35
    // takes each, all within their burst: every one granted.
    assert_eq!(granted[&hot], 40, "the hot bucket grants its burst once");
    for (i, bucket) in spread.iter().enumerate() {
        let takes = (0..48usize)
            .filter(|caller| caller % 2 == 1)
            .flat_map(|caller| (0..20usize).map(move |round| (caller / 2 + round) % 16))
            .filter(|index| *index == i)
            .count();
        assert_eq!(granted.get(bucket).copied().unwrap_or(0), takes, "spread bucket {i}");
    }
    let left: f64 = sqlx::query_scalar("SELECT tokens FROM plexsphere.rate_budgets WHERE bucket_key = $1")
        .bind(hot.as_uuid())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(left < 1.0, "the hot bucket is spent: {left}");
}

/// The sweep deletes a bucket's row while a call of that bucket's takes waits for its lock
/// (the row was there in the call's snapshot): the call decides against a bucket minted
/// afresh, full, as the takes one at a time would after the sweep, not against the deleted
/// row's level.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_bucket_swept_while_its_call_waits_is_minted_afresh(pool: PgPool) {
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 10.0).unwrap();
    let bucket = key();
    let take = Take::Single(Spend::new(Scope::IngestNode, bucket, 1.0, limit));
    // Nine of ten spent: one token left in the row.
    let spend_nine: Vec<_> = (0..9).map(|_| (take.clone(), instant())).collect();
    assert!(store
        .decide_all(&spend_nine)
        .await
        .iter()
        .all(|decision| decision.as_ref().unwrap().is_granted()));

    let mut sweeper = pool.begin().await.unwrap();
    sqlx::query("DELETE FROM plexsphere.rate_budgets").execute(&mut *sweeper).await.unwrap();
    let call = tokio::spawn({
        let (store, take) = (store.clone(), take.clone());
        async move {
            store.decide_all(&[(take.clone(), instant()), (take.clone(), instant()), (take, instant())]).await
        }
    });
    sessions_wait_on_a_lock(&pool, 1).await;
    sweeper.commit().await.unwrap();

    // Against the deleted row only the first would be granted; against a fresh bucket, all.
    let decisions = call.await.unwrap();
    assert!(decisions.iter().all(|decision| decision.as_ref().unwrap().is_granted()), "{decisions:?}");
    let tokens: f64 =
        sqlx::query_scalar("SELECT tokens FROM plexsphere.rate_budgets").fetch_one(&pool).await.unwrap();
    assert_eq!(tokens, 7.0);
}

/// The same for a call of distinct buckets, which grants through one UPDATE of the rows that
/// exist first: the sweep deletes one bucket's row while that UPDATE waits for its lock, the
/// UPDATE finds no row to grant from, and the call mints the bucket afresh instead of refusing
/// its take; the other bucket is debited once.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_bucket_swept_while_a_call_of_distinct_buckets_waits_is_minted_afresh(pool: PgPool) {
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 10.0).unwrap();
    let (kept, swept) = (key(), key());
    let take = move |bucket| Take::Single(Spend::new(Scope::IngestNode, bucket, 1.0, limit));
    // Both rows down to one token.
    let spend_nine: Vec<_> =
        (0..9).flat_map(|_| [(take(kept), instant()), (take(swept), instant())]).collect();
    assert!(store
        .decide_all(&spend_nine)
        .await
        .iter()
        .all(|decision| decision.as_ref().unwrap().is_granted()));

    let mut sweeper = pool.begin().await.unwrap();
    sqlx::query("DELETE FROM plexsphere.rate_budgets WHERE bucket_key = $1")
        .bind(swept.as_uuid())
        .execute(&mut *sweeper)
        .await
        .unwrap();
    let call = tokio::spawn({
        let store = store.clone();
        async move { store.decide_all(&[(take(kept), instant()), (take(swept), instant())]).await }
    });
    sessions_wait_on_a_lock(&pool, 1).await;
    sweeper.commit().await.unwrap();

    let decisions = call.await.unwrap();
    assert!(decisions.iter().all(|decision| decision.as_ref().unwrap().is_granted()), "{decisions:?}");
    let tokens = |bucket: Key| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, f64>("SELECT tokens FROM plexsphere.rate_budgets WHERE bucket_key = $1")
                .bind(bucket.as_uuid())
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(tokens(kept).await, 0.0, "the kept bucket's last token, granted once");
    assert_eq!(tokens(swept).await, 9.0, "the swept bucket, minted full and debited");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_take_later_in_a_call_at_an_earlier_instant_is_not_foreseen_short(pool: PgPool) {
    // Issue 20, item 3. The general function foresaw a take refused when the snapshot could
    // not cover it at the take's own instant; but take 1, at a later instant, leaves the row
    // refilled up to that instant, which covers take 2. Take 2 was refused, blaming its other
    // bucket, which is full; one at a time grants it.
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 10.0).unwrap();
    let (a1, b2) = (key(), key());
    let t = instant();
    sqlx::query("INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at) VALUES ('ingest_node', $1, 0, $2)")
        .bind(a1.as_uuid())
        .bind(t)
        .execute(&pool)
        .await
        .unwrap();
    let node = |cost| Spend::new(Scope::IngestNode, a1, cost, limit);
    let queue = [
        (Take::Single(node(0.1)), t + Duration::seconds(2)),
        (
            Take::Pair(node(1.6), Spend::new(Scope::IngestDomain, b2, 1.0, limit)),
            t + Duration::milliseconds(1500),
        ),
    ];
    let decisions = store.decide_all(&queue).await;
    let Ok(Decision::Granted(grant)) = &decisions[1] else { panic!("{decisions:?}") };
    let left = |which| grant.remaining(which).unwrap().tokens;
    assert!((left(ratebudget::Which::First) - 0.3).abs() < 1e-9, "{grant:?}");
    assert_eq!(left(ratebudget::Which::Second), 9.0);

    // The same with a faster rate on the first take: it refills more than the second's rate
    // would have.
    let (a1, b2) = (key(), key());
    sqlx::query("INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at) VALUES ('ingest_node', $1, 0, $2)")
        .bind(a1.as_uuid())
        .bind(t)
        .execute(&pool)
        .await
        .unwrap();
    let fast = Limit::new(4.0, 10.0).unwrap();
    let at = t + Duration::seconds(1);
    let queue = [
        (Take::Single(Spend::new(Scope::IngestNode, a1, 0.1, fast)), at),
        (
            Take::Pair(
                Spend::new(Scope::IngestNode, a1, 2.0, limit),
                Spend::new(Scope::IngestDomain, b2, 1.0, limit),
            ),
            at,
        ),
    ];
    let decisions = store.decide_all(&queue).await;
    assert!(matches!(decisions[1], Ok(Decision::Granted(_))), "3.9 left covers 2: {decisions:?}");
}
