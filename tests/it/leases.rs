//! Leases for hot buckets (docs/adr/0034): replicas that lease a hot bucket and grant from
//! memory never admit more than the budget in any window, give back what they did not grant,
//! and lose a forgotten lease's tokens rather than grant them twice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use ratebudget::{
    Decider, Decision, Guard, Key, LeaseRequest, Leased, Limit, Name, Observer, Source, Spend, Store, Take,
    Undecided,
};
use sqlx::PgPool;

use crate::support::helpers::{instant, key};

/// Counts what the guards decided from leases and what leases took and gave back.
#[derive(Debug, Default)]
struct Leasing {
    leased_grants: AtomicU64,
    leases: AtomicU64,
    /// Tokens taken by leases and credited back, in millionths.
    leased_micros: AtomicU64,
    refunded_micros: AtomicU64,
}

impl Observer for Leasing {
    fn decided(
        &self,
        _: &Take,
        _: DateTime<Utc>,
        outcome: Result<(&Decision, Source), &Undecided>,
        _: StdDuration,
    ) {
        if let Ok((Decision::Granted(_), Source::Lease)) = outcome {
            self.leased_grants.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn abandoned(&self, _: &Take, _: StdDuration) {}
    fn store_failing(&self, _: bool) {}
    fn leased(&self, _: Name, leased: &Leased) {
        if leased.leased > 0.0 {
            self.leases.fetch_add(1, Ordering::Relaxed);
        }
        self.leased_micros.fetch_add((leased.leased * 1e6) as u64, Ordering::Relaxed);
        self.refunded_micros.fetch_add((leased.refunded * 1e6) as u64, Ordering::Relaxed);
    }
}

fn leasing_guard(pool: &PgPool, observer: Arc<Leasing>, period: StdDuration) -> Guard {
    Guard::builder(Store::new(pool.clone()))
        .decision_timeout(StdDuration::from_secs(5))
        .leases(period)
        .observer(observer)
        .build()
}

/// The most grants any window [A, B] of `granted` (instants, sorted) holds beyond what the
/// bucket allows in it, `burst + rate × (B − A)`; positive means over the budget.
fn worst_window(granted: &[DateTime<Utc>], limit: Limit) -> f64 {
    let mut worst = f64::NEG_INFINITY;
    for (first, start) in granted.iter().enumerate() {
        for (last, end) in granted.iter().enumerate().skip(first) {
            let seconds = (*end - *start).num_microseconds().unwrap() as f64 / 1e6;
            let allowed = limit.burst() + limit.per_second() * seconds;
            worst = worst.max((last - first + 1) as f64 - allowed);
        }
    }
    worst
}

/// Three replicas take from one bucket at once, tick after tick of the shared clock: first
/// saturating it, then lightly, then saturating again, with leases given back between.
async fn three_replicas_take(
    pool: &PgPool,
    limit: Limit,
    ticks: i64,
    takes_per_tick: impl Fn(i64) -> usize,
) -> (Vec<DateTime<Utc>>, Arc<Leasing>) {
    let observer = Arc::new(Leasing::default());
    let replicas: Vec<Guard> =
        (0..3).map(|_| leasing_guard(pool, observer.clone(), StdDuration::from_millis(20))).collect();
    let spend = Spend::new(Name::new("hot_tenant").unwrap(), key(), 1.0, limit);
    let start = instant();
    let granted = Arc::new(Mutex::new(Vec::new()));
    for tick in 0..ticks {
        let now = start + Duration::milliseconds(2 * tick);
        let takes = (0..takes_per_tick(tick)).flat_map(|_| replicas.iter()).map(|replica| {
            let granted = granted.clone();
            async move {
                if replica.decide(Take::Single(spend), now).await.unwrap().is_granted() {
                    granted.lock().unwrap().push(now);
                }
            }
        });
        futures::future::join_all(takes).await;
        if takes_per_tick(tick) == 0 && takes_per_tick(tick - 1) > 0 {
            // A pause: three lease periods without a take, so each replica's demand cools and
            // its leases go back, as the binary's task gives them back every period. (A lease
            // of a bucket still hot is kept: only time cools a bucket.)
            tokio::time::sleep(StdDuration::from_millis(60)).await;
            for replica in &replicas {
                replica.return_leases(now).await;
            }
        }
    }
    let mut granted = std::mem::take(&mut *granted.lock().unwrap());
    granted.sort();
    (granted, observer)
}

fn report(what: &str, granted: &[DateTime<Utc>], leasing: &Leasing, worst: f64) {
    eprintln!(
        "{what}: {} grants, {} from leases, {} leases, {:.1} tokens leased, {:.1} given back; worst window {worst:.3} over",
        granted.len(),
        leasing.leased_grants.load(Ordering::Relaxed),
        leasing.leases.load(Ordering::Relaxed),
        leasing.leased_micros.load(Ordering::Relaxed) as f64 / 1e6,
        leasing.refunded_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn leased_grants_from_three_replicas_never_exceed_the_budget_in_any_window(pool: PgPool) {
    // 10 tokens a tick: below it, leases serve most takes; above it, the bucket runs dry and
    // each lease is what is left; a pause, and leases go back; lightly; a pause; saturated.
    let limit = Limit::new(5000.0, 100.0).unwrap();
    let (granted, leasing) = three_replicas_take(&pool, limit, 700, |tick| match tick {
        0..200 => 3,
        200..400 => 6,
        400 => 0,
        401..500 => usize::from(tick % 3 == 0),
        500 => 0,
        _ => 6,
    })
    .await;
    let worst = worst_window(&granted, limit);
    report("5000/s, burst 100", &granted, &leasing, worst);
    assert!(worst <= 1e-6, "a window admitted {worst} more than the budget");
    // The test is about leases: they were taken, granted from and given back.
    assert!(leasing.leased_grants.load(Ordering::Relaxed) > 1000);
    assert!(leasing.refunded_micros.load(Ordering::Relaxed) > 0);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_saturated_leased_bucket_admits_its_budget_and_never_more(pool: PgPool) {
    // Ten times what the bucket refills, from three replicas: one-at-a-time decisions would
    // grant the burst and then the refill, exactly; leases may lose a little, never add.
    let limit = Limit::new(100.0, 20.0).unwrap();
    let (granted, leasing) = three_replicas_take(&pool, limit, 600, |_| 4).await;
    let worst = worst_window(&granted, limit);
    report("100/s, burst 20, saturated", &granted, &leasing, worst);
    assert!(worst <= 1e-6, "a window admitted {worst} more than the budget");
    let exact = limit.burst() + limit.per_second() * 599.0 * 0.002;
    assert!(
        granted.len() as f64 >= exact * 0.95,
        "{} grants of the {exact} one at a time would make",
        granted.len()
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_refund_of_a_lease_made_before_another_is_forfeited_and_of_the_latest_credited(pool: PgPool) {
    // Burst 10, 1 a second. Y leases 5, then X leases the other 5. Were Y's 5 credited back,
    // the bucket would hold 8 three seconds later while X still held 5 it may grant (its row
    // held 0 then, so 3 by now): 13 admitted at one instant, over the burst.
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 10.0).unwrap();
    let spend = Spend::new(Name::new("refunds").unwrap(), key(), 1.0, limit);
    let lease = |at_least: f64, refund: f64, refund_serial: i64, now: DateTime<Utc>| {
        let store = store.clone();
        async move {
            let request = LeaseRequest { spend, at_least, at_most: at_least, refund, refund_serial };
            store.lease(request, now).await.unwrap().unwrap()
        }
    };
    let start = instant();
    let y = lease(5.0, 0.0, 0, start).await;
    let x = lease(5.0, 0.0, 0, start).await;
    assert_eq!((y.leased, x.leased), (5.0, 5.0));
    assert!(x.serial > y.serial);
    let stale = lease(0.0, 5.0, y.serial, start).await;
    assert_eq!((stale.leased, stale.refunded), (0.0, 0.0), "a refund of an earlier lease is forfeited");
    let later = start + Duration::seconds(3);
    let take = |cost: f64| Take::Single(Spend { cost, ..spend });
    assert!(!store.decide(take(4.0), later).await.unwrap().is_granted(), "the bucket holds 3, not 8");
    // The latest lease's refund goes back, capped at the burst.
    let returned = lease(0.0, 5.0, x.serial, later).await;
    assert_eq!(returned.refunded, 5.0);
    assert!(store.decide(take(8.0), later).await.unwrap().is_granted());
}

/// Leases `spend`'s bucket through `store` at `now`: between `at_least` and `at_most`
/// tokens, after giving back `refund` of the lease numbered `refund_serial`.
async fn lease_at(
    store: &Store,
    spend: Spend,
    (at_least, at_most): (f64, f64),
    (refund, refund_serial): (f64, i64),
    now: DateTime<Utc>,
) -> Leased {
    let request = LeaseRequest { spend, at_least, at_most, refund, refund_serial };
    store.lease(request, now).await.unwrap().unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_refund_of_a_lease_of_a_row_a_reset_deleted_is_not_credited_to_the_minted_rows_lease(pool: PgPool) {
    // Issue 32, item 6. Numbered per row, a bucket's leases started again at 1 once a reset
    // deleted its row: Y's lease of the old row and X's of the new one were both number 1, and
    // Y (not having heard of the reset yet) gave back its lease under that number, credited to
    // the new row, whose holder X did not count those tokens (burst 100: the row read 100
    // while X still held 24 it could grant).
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 100.0).unwrap();
    let spend = Spend::new(Name::new("reset_leases").unwrap(), key(), 1.0, limit);
    let now = instant();
    let y = lease_at(&store, spend, (25.0, 25.0), (0.0, 0), now).await;
    assert_eq!(y.leased, 25.0);
    assert!(store.reset(spend.name, spend.key).await.unwrap());
    let x = lease_at(&store, spend, (24.0, 24.0), (0.0, 0), now).await;
    assert_eq!(x.leased, 24.0);
    let stale = lease_at(&store, spend, (0.0, 0.0), (25.0, y.serial), now).await;
    assert_eq!(stale.refunded, 0.0, "a refund of the deleted row's lease is forfeited");
    let take = |cost: f64| Take::Single(Spend { cost, ..spend });
    assert!(store.decide(take(76.0), now).await.unwrap().is_granted());
    assert!(!store.decide(take(1.0), now).await.unwrap().is_granted(), "the row holds what X left it, 76");
    assert_ne!(x.serial, y.serial, "a lease of the minted row is never numbered as one of the row before it");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_lease_given_back_after_its_rule_was_lowered_refills_nothing_at_the_old_limit(pool: PgPool) {
    // Issue 32, item 6. A lease of a bucket that cooled goes back under the limit it was
    // leased under (the guard forgets a lease only when a budget may grow), and the refund
    // refilled the row at that limit's rate: here 50 tokens where the current rule gives 0.5.
    let store = Store::new(pool.clone());
    let leased_under = Limit::new(100.0, 100.0).unwrap();
    let current = Limit::new(1.0, 100.0).unwrap();
    let spend = Spend::new(Name::new("lowered_rule").unwrap(), key(), 1.0, leased_under);
    let start = instant();
    let leased = lease_at(&store, spend, (100.0, 100.0), (0.0, 0), start).await;
    assert_eq!(leased.leased, 100.0, "the whole bucket, leased");
    // The holder granted 90 of it; the rule was lowered; half a second later the other 10 go back.
    let later = start + Duration::milliseconds(500);
    let returned =
        lease_at(&store, Spend { cost: 0.0, ..spend }, (0.0, 0.0), (10.0, leased.serial), later).await;
    assert_eq!(returned.refunded, 10.0);
    // Under the current rule the bucket holds what was given back and half a second at 1 a
    // second: 10.5.
    let take = |cost: f64| Take::Single(Spend { cost, limit: current, ..spend });
    assert!(store.decide(take(10.0), later).await.unwrap().is_granted());
    assert!(!store.decide(take(1.0), later).await.unwrap().is_granted(), "0.5 left, not 40.5");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_reset_or_a_changed_limit_ends_a_replicas_lease_at_once(pool: PgPool) {
    let observer = Arc::new(Leasing::default());
    let guard = leasing_guard(&pool, observer.clone(), StdDuration::from_secs(60));
    let limit = Limit::new(1000.0, 1000.0).unwrap();
    let spend = Spend::new(Name::new("revoked").unwrap(), key(), 1.0, limit);
    let now = instant();
    // Enough takes in one period to make the bucket hot, then a lease, then grants from it.
    for _ in 0..400 {
        guard.decide(Take::Single(spend), now).await.unwrap();
    }
    let leased_before = observer.leased_grants.load(Ordering::Relaxed);
    assert!(leased_before > 100, "{leased_before} grants from the lease");
    assert!(!guard.leased_buckets().is_empty());

    guard.forget(spend.name, spend.key);
    assert!(guard.leased_buckets().is_empty(), "a reset forgets the lease");
    guard.decide(Take::Single(spend), now).await.unwrap();
    assert_eq!(observer.leased_grants.load(Ordering::Relaxed), leased_before, "the next take asks the store");

    // A lease made under one limit grants nothing under another.
    for _ in 0..400 {
        guard.decide(Take::Single(spend), now).await.unwrap();
    }
    let leased = observer.leased_grants.load(Ordering::Relaxed);
    let lowered = Spend { limit: Limit::new(10.0, 10.0).unwrap(), ..spend };
    guard.decide(Take::Single(lowered), now).await.unwrap();
    assert_eq!(observer.leased_grants.load(Ordering::Relaxed), leased);
}

/// A lease of a bucket that cooled goes back at the next return, once, and the bucket holds
/// what was not granted from it; a lease the pre-check forgot (a reset) is not given back.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_cooled_buckets_lease_goes_back_once_and_a_forgotten_one_not_at_all(pool: PgPool) {
    let period = StdDuration::from_millis(500);
    let guard = leasing_guard(&pool, Arc::new(Leasing::default()), period);
    // 1,000 a second: a lease asks for at least a tenth of a period's refill, 50 tokens, at
    // most a quarter of the burst.
    let limit = Limit::new(1000.0, 1000.0).unwrap();
    let now = instant();
    let tokens = |key: Key| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, f64>("SELECT tokens FROM plexsphere.rate_budgets WHERE bucket_key = $1")
                .bind(key.as_uuid())
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let (cooling, forgotten) = (key(), key());
    for bucket in [cooling, forgotten] {
        let spend = Spend::new(Name::new("returned").unwrap(), bucket, 1.0, limit);
        // The first take goes to the store; the second finds the bucket hot and leases 50,
        // one of them its own; the third is granted from the lease.
        for _ in 0..3 {
            assert!(guard.decide(Take::Single(spend), now).await.unwrap().is_granted());
        }
        assert_eq!(tokens(bucket).await, 1000.0 - 1.0 - 50.0);
    }
    assert_eq!(guard.leased_buckets().len(), 2);
    guard.forget(Name::new("returned").unwrap(), forgotten);

    // Nothing goes back while the lease lasts: ask until the cooled one's period is over.
    let returned = std::cell::Cell::new(0.0);
    crate::support::replicas::eventually(
        StdDuration::from_secs(10),
        "the cooled lease goes back",
        || async {
            returned.set(guard.return_leases(now).await);
            returned.get() > 0.0
        },
    )
    .await;
    assert_eq!(returned.get(), 48.0, "what the lease did not grant");
    assert_eq!(tokens(cooling).await, 1000.0 - 3.0, "the bucket less the three grants");
    assert_eq!(tokens(forgotten).await, 1000.0 - 1.0 - 50.0, "a forgotten lease is forfeited");
    assert!(guard.leased_buckets().is_empty());
    assert_eq!(guard.return_leases(now).await, 0.0, "a lease goes back once");
}
