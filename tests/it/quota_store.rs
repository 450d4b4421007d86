//! The RLQS allocator's accounting (`plexsphere.quota_assign`, through `PgQuotaStore`) against
//! a real PostgreSQL: what every holder may still use never sums over the rule, a shrink
//! counts at the old share until a report proves it arrived, a newcomer gets the share the
//! others give back, a closed stream's share counts until it expires, and the pool pays for
//! every token bucket an Envoy builds full; and the operator's listing of a service's buckets
//! shows each holder's share and what it counts.

use std::time::Duration;

use app::quota_store::PgQuotaStore;
use ratebudget::{Key, Statements};
use service::quota::{
    Allotment, Allotted, BucketHolder, Budget, QuotaSettings, QuotaStore, ShareRequest, Usage,
};
use sqlx::PgPool;
use uuid::Uuid;

/// 100 a second, a burst of 50: shares of 99.5 a second (the reserve is 0.5%), filled each
/// second so a share's tokens are its rate.
fn budget(rate: f64, burst: f64) -> Budget {
    Budget {
        key: Key::from(Uuid::from_u64_pair(0, 7)),
        rule_id: "checkout".into(),
        rate,
        burst,
        fill_seconds: 1,
        shadow: false,
    }
}

/// Short times, so a test lets them pass: a round trip of 20 ms, a TTL of 1 s.
fn settings() -> QuotaSettings {
    QuotaSettings {
        ttl: Duration::from_secs(1),
        max_round_trip: Duration::from_millis(20),
        ..QuotaSettings::default()
    }
}

struct Holders {
    store: PgQuotaStore,
    pool: PgPool,
    budget: Budget,
    settings: QuotaSettings,
}

impl Holders {
    fn new(pool: PgPool, budget: Budget) -> Holders {
        Holders {
            store: PgQuotaStore::new(Statements::new(pool.clone())),
            pool,
            budget,
            settings: settings(),
        }
    }

    async fn report(&self, holder: Uuid, requests: u64, elapsed_s: u64) -> Allotted {
        let usage = Usage { allowed: requests, denied: 0, elapsed: Duration::from_secs(elapsed_s) };
        self.ask(holder, Some(usage)).await
    }

    async fn ask(&self, holder: Uuid, usage: Option<Usage>) -> Allotted {
        let request = ShareRequest {
            service: "shop".into(),
            budget: self.budget.clone(),
            holder: BucketHolder { stream: holder, holder, unsure: false, builds_full: false },
            replica: "replica-a".into(),
            usage,
            settings: self.settings,
        };
        self.store.assign(&request).await.unwrap()
    }

    /// What every holder may still use, summed (rate, burst), and the pool, now.
    async fn counted(&self) -> (f64, f64, f64) {
        sqlx::query_as(
            "SELECT coalesce(sum(plexsphere.quota_counted_rate(s, clock_timestamp())), 0),
                    coalesce(sum(plexsphere.quota_counted_burst(s, clock_timestamp())), 0),
                    (SELECT pool FROM plexsphere.quota_buckets)
             FROM plexsphere.quota_shares s",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

fn tokens(allotted: Allotted) -> (u32, u32) {
    match allotted.decision {
        Allotment::TokenBucket { max_tokens, tokens_per_fill } => (max_tokens, tokens_per_fill),
        other => panic!("not a token bucket: {other:?}"),
    }
}

/// The protocol's time passing: a report or an expiry is told apart from the send it
/// follows only by the time between them.
async fn after(duration: Duration) {
    tokio::time::sleep(duration).await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_lone_newcomer_gets_the_capacity_and_nine_tenths_of_the_burst_paid_from_the_pool(pool: PgPool) {
    let holders = Holders::new(pool, budget(100.0, 50.0));
    let first = holders.report(Uuid::new_v4(), 1, 0).await;
    // 99.5 a second, floored to whole tokens a fill; its part (99 of 99.5) of nine tenths
    // of the 50, floored: 44 at once.
    assert_eq!(tokens(first), (44, 99));
    let (rate, burst, left) = holders.counted().await;
    assert_eq!((rate, burst), (99.0, 44.0));
    assert!((left - 6.0).abs() < 1e-6, "the pool paid for the bucket built full: {left}");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_newcomer_waits_for_the_share_another_gives_back_until_a_report_proves_it_arrived(pool: PgPool) {
    let holders = Holders::new(pool, budget(100.0, 50.0));
    let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
    holders.report(old, 1, 0).await;
    after(Duration::from_millis(50)).await;
    holders.report(old, 500, 1).await;
    // Everything is held: the newcomer is denied, and the holder is shrunk to half...
    assert_eq!(holders.report(new, 1, 0).await.decision, Allotment::Deny);
    after(Duration::from_millis(50)).await;
    let shrunk = tokens(holders.report(old, 500, 1).await);
    assert_eq!(shrunk.1, 49, "half of 99.5, floored");
    // ...which counts at the old share until its next report.
    assert_eq!(holders.ask(new, None).await.decision, Allotment::Deny);
    assert_eq!(holders.counted().await.0, 99.0);
    after(Duration::from_millis(50)).await;
    holders.report(old, 500, 1).await;
    let granted = tokens(holders.report(new, 500, 1).await);
    assert_eq!(granted.1, 49);
    let (rate, burst, left) = holders.counted().await;
    assert!(rate <= 99.5 && burst <= 50.0 && left >= 0.0, "{rate} {burst} {left}");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_report_that_crosses_an_assignment_does_not_prove_it_arrived(pool: PgPool) {
    // A round trip of 2 s: two statements in a row are within it however loaded the machine.
    let mut holders = Holders::new(pool, budget(100.0, 50.0));
    holders.settings.max_round_trip = Duration::from_secs(2);
    holders.settings.ttl = Duration::from_secs(6);
    let round_trip = Duration::from_millis(2100);
    let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
    holders.report(old, 1, 0).await;
    after(round_trip).await;
    holders.report(new, 1, 0).await;
    holders.report(old, 500, 1).await;
    // Within the round trip of that send (a shrink to half), a report may have left before it
    // arrived: it is answered, and the full share it may still be using keeps counting.
    assert_eq!(tokens(holders.report(old, 500, 1).await).1, 49);
    assert_eq!(holders.counted().await.0, 99.0);
    assert_eq!(holders.report(new, 500, 1).await.decision, Allotment::Deny);
    after(round_trip).await;
    holders.report(old, 500, 1).await;
    assert_eq!(tokens(holders.report(new, 500, 1).await).1, 49);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_closed_streams_share_counts_until_what_it_was_sent_expires(pool: PgPool) {
    let holders = Holders::new(pool, budget(100.0, 50.0));
    let (gone, next) = (Uuid::new_v4(), Uuid::new_v4());
    holders.report(gone, 1, 0).await;
    holders.store.close(gone).await.unwrap();
    assert_eq!(holders.report(next, 1, 0).await.decision, Allotment::Deny);
    // Its TTL (1 s) and the round trip pass: the share is free.
    after(Duration::from_millis(1100)).await;
    let granted = tokens(holders.report(next, 1, 0).await);
    assert_eq!(granted.1, 99);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_lowered_rule_grants_nothing_while_what_others_were_sent_under_the_old_one_counts(pool: PgPool) {
    let mut holders = Holders::new(pool, budget(100.0, 50.0));
    let (one, other) = (Uuid::new_v4(), Uuid::new_v4());
    holders.report(one, 1, 0).await;
    after(Duration::from_millis(50)).await;
    holders.report(one, 500, 1).await;
    holders.report(other, 1, 0).await;
    after(Duration::from_millis(50)).await;
    holders.report(one, 500, 1).await;
    after(Duration::from_millis(50)).await;
    holders.report(one, 500, 1).await;
    holders.report(other, 500, 1).await;
    assert!(holders.counted().await.0 > 90.0);
    holders.budget = budget(20.0, 10.0);
    // Pushed at once: each holder's own new share replaces its old one, but what the other
    // was sent under the old rule still counts, and nothing fits under 20 beside it.
    assert_eq!(holders.ask(one, None).await.decision, Allotment::Deny);
    assert_eq!(holders.ask(other, None).await.decision, Allotment::Deny);
    // Reports prove the DENY_ALLs arrived: the old shares stop counting, and each holder gets
    // its part of the new rule once the pool (in debt for what the old shares could use)
    // pays for a bucket.
    let mut granted = Vec::new();
    for _ in 0..50 {
        after(Duration::from_millis(100)).await;
        for holder in [one, other] {
            if let Allotment::TokenBucket { max_tokens, tokens_per_fill } =
                holders.report(holder, 500, 1).await.decision
            {
                granted.push((max_tokens, tokens_per_fill));
            }
        }
        let (rate, burst, _) = holders.counted().await;
        assert!(granted.is_empty() || (rate <= 19.9 + 1e-9 && burst <= 10.0), "{rate} {burst}");
        if granted.len() >= 2 {
            break;
        }
    }
    assert!(granted.len() >= 2, "{granted:?}");
    assert!(
        granted.iter().all(|(max_tokens, tokens_per_fill)| *tokens_per_fill <= 19 && *max_tokens <= 9),
        "{granted:?}"
    );
}

/// Many holders reporting, pushed to and closing in every order, each statement from its own
/// task: after each, what every holder may still use sums within the rule and the pool is
/// never in debt.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn what_every_holder_may_use_never_sums_over_the_rule(pool: PgPool) {
    let holders = std::sync::Arc::new(Holders::new(pool, budget(1000.0, 200.0)));
    let ids: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    let mut tasks = Vec::new();
    for (index, id) in ids.iter().copied().enumerate() {
        let holders = holders.clone();
        tasks.push(tokio::spawn(async move {
            let mut worst = (0.0f64, 0.0f64, f64::INFINITY);
            for step in 0..25u64 {
                let demand = (index as u64 * 37 + step * 101) % 900;
                match (step + index as u64) % 7 {
                    0 => holders.store.close(id).await.unwrap(),
                    1 => drop(holders.ask(id, None).await),
                    2 => drop(holders.report(id, demand, 0).await),
                    _ => drop(holders.report(id, demand, 1).await),
                }
                let (rate, burst, left) = holders.counted().await;
                worst = (worst.0.max(rate), worst.1.max(burst), worst.2.min(left));
                after(Duration::from_millis(10 + (step * 7 + index as u64 * 3) % 30)).await;
            }
            worst
        }));
    }
    for task in tasks {
        let (rate, burst, left) = task.await.unwrap();
        assert!(rate <= 1000.0 * 0.995 + 1e-9, "rates counted {rate}");
        assert!(burst <= 200.0 + 1e-9, "bursts counted {burst}");
        assert!(left >= -1e-9, "pool {left}");
    }
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_bucket_without_demand_for_a_while_is_abandoned_and_comes_back_as_a_newcomer(pool: PgPool) {
    let holders = Holders::new(pool, budget(100.0, 50.0));
    let holder = Uuid::new_v4();
    let idle = |requests| Some(Usage { allowed: requests, denied: 0, elapsed: Duration::from_secs(1) });
    let settings = QuotaSettings { idle_after: Duration::from_millis(100), ..settings() };
    let ask = |usage| ShareRequest {
        service: "shop".into(),
        budget: holders.budget.clone(),
        holder: BucketHolder { stream: holder, holder, unsure: false, builds_full: false },
        replica: "replica-a".into(),
        usage,
        settings,
    };
    holders.store.assign(&ask(Some(Usage { allowed: 1, denied: 0, elapsed: Duration::ZERO }))).await.unwrap();
    after(Duration::from_millis(50)).await;
    // The first report without a request starts the idle time; a request resets it.
    assert!(matches!(
        holders.store.assign(&ask(idle(0))).await.unwrap().decision,
        Allotment::TokenBucket { .. }
    ));
    after(Duration::from_millis(150)).await;
    assert!(matches!(
        holders.store.assign(&ask(idle(3))).await.unwrap().decision,
        Allotment::TokenBucket { .. }
    ));
    after(Duration::from_millis(50)).await;
    holders.store.assign(&ask(idle(0))).await.unwrap();
    after(Duration::from_millis(150)).await;
    assert_eq!(holders.store.assign(&ask(idle(0))).await.unwrap().decision, Allotment::Abandon);
    // What it was sent still counts until it expires; when its Envoy asks again (a first
    // report), it is a newcomer again.
    let (counted, _, pool_before) = holders.counted().await;
    assert!(counted > 0.0);
    let back = holders
        .store
        .assign(&ask(Some(Usage { allowed: 1, denied: 0, elapsed: Duration::ZERO })))
        .await
        .unwrap();
    // Its Envoy erased the bucket: the one it is sent now is built full, and paid for whole.
    let (max_tokens, _) = tokens(back);
    let (_, _, pool_after) = holders.counted().await;
    // (Paid for only its growth, the pool would have lost nothing; it refills meanwhile at
    // what the counted share leaves, a token or so under a loaded machine's delays.)
    assert!(
        pool_after <= pool_before - f64::from(max_tokens) / 2.0,
        "{pool_before} - {max_tokens} -> {pool_after}"
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_operator_listing_shows_each_holder_with_its_share_and_what_it_counts_now(pool: PgPool) {
    // Issue 35 item 5: the operator page lists a service's RLQS buckets with their holders.
    let holders = Holders::new(pool, budget(100.0, 50.0));
    let (first, second) = (Uuid::from_u64_pair(0, 1), Uuid::from_u64_pair(0, 2));
    let first_share = tokens(holders.report(first, 1, 0).await);
    holders.store.close(first).await.unwrap();
    // The closed stream's share still counts, so the newcomer is denied: a share of zero.
    assert_eq!(holders.report(second, 1, 0).await.decision, Allotment::Deny);
    // Another service's bucket, which the listing of this one leaves out.
    let request = ShareRequest {
        service: "billing".into(),
        budget: Budget { key: Key::from(Uuid::from_u64_pair(0, 8)), ..budget(10.0, 5.0) },
        holder: {
            let id = Uuid::new_v4();
            BucketHolder { stream: id, holder: id, unsure: false, builds_full: false }
        },
        replica: "replica-b".into(),
        usage: None,
        settings: settings(),
    };
    holders.store.assign(&request).await.unwrap();

    let listed = holders.store.buckets("shop").await.unwrap();
    assert_eq!(listed.len(), 1, "only the service's own buckets: {listed:?}");
    let bucket = &listed[0];
    assert_eq!(
        (bucket.key, bucket.rule_id.as_str(), bucket.rate, bucket.burst),
        (holders.budget.key, "checkout", 100.0, 50.0)
    );
    assert!((bucket.pool - 6.0).abs() < 1e-6, "the pool paid for the first bucket: {}", bucket.pool);
    let shares: Vec<_> = bucket.holders.iter().map(|holder| holder.holder).collect();
    assert_eq!(shares, [first, second], "{bucket:?}");
    let closed = &bucket.holders[0];
    assert_eq!(
        (closed.replica.as_str(), closed.demand, closed.rate, closed.max_tokens),
        ("replica-a", None, f64::from(first_share.1), f64::from(first_share.0))
    );
    assert_eq!((closed.counted_rate, closed.counted_burst, closed.closed), (99.0, 44.0, true));
    let (sent_at, expires_at) = (closed.sent_at.unwrap(), closed.expires_at.unwrap());
    // Its TTL (1 s) and the round trip (20 ms).
    assert_eq!(expires_at - sent_at, chrono::Duration::milliseconds(1020));
    let denied = &bucket.holders[1];
    assert_eq!(
        (denied.rate, denied.max_tokens, denied.counted_rate, denied.counted_burst, denied.closed),
        (0.0, 0.0, 0.0, 0.0, false)
    );
    assert!(holders.store.buckets("nobody").await.unwrap().is_empty());
}

/// The sweep deletes a share only when nothing can use what it was sent and no accrual reads
/// it, and a bucket only when its pool would be full anyway: a bucket made again, full, then
/// gives nothing away.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_sweep_deletes_only_what_no_longer_counts(pool: PgPool) {
    let holders = Holders::new(pool.clone(), budget(100.0, 50.0));
    let (gone, live) = (Uuid::new_v4(), Uuid::new_v4());
    holders.report(gone, 1, 0).await;
    holders.report(live, 1, 0).await;
    // Two hours on for `gone` and for the bucket's pool, as if time had passed for them.
    sqlx::query(
        "UPDATE plexsphere.quota_shares SET sent_at = sent_at - interval '2 hours',
             expires_at = expires_at - interval '2 hours', reported_at = reported_at - interval '2 hours'
         WHERE holder = $1",
    )
    .bind(gone)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(holders.store.sweep().await.unwrap(), 1);
    let holders_left: Vec<Uuid> =
        sqlx::query_scalar("SELECT holder FROM plexsphere.quota_shares").fetch_all(&pool).await.unwrap();
    assert_eq!(holders_left, vec![live]);
    // The bucket goes with its last share only once its pool would have refilled (50 tokens at
    // 100 a second: half a second) and an hour has passed since its last accrual.
    sqlx::query("DELETE FROM plexsphere.quota_shares").execute(&pool).await.unwrap();
    // Its pool empty a minute ago: not yet (it also waits an hour, for a report meanwhile).
    sqlx::query(
        "UPDATE plexsphere.quota_buckets SET pool = 0, pool_at = clock_timestamp() - interval '1 minute'",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(holders.store.sweep().await.unwrap(), 0);
    sqlx::query("UPDATE plexsphere.quota_buckets SET pool_at = clock_timestamp() - interval '2 hours'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(holders.store.sweep().await.unwrap(), 1);
}
