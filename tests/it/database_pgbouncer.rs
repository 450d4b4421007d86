//! Replicas behind PgBouncer in transaction mode (issue 24): decisions and repositories go
//! through the pooler (`DATABASE_URL`, `PLEXSPHERE_DATABASE_POOLER=transaction`), LISTEN, the
//! leader lock and migrations through a session of their own
//! (`PLEXSPHERE_SESSION_DATABASE_URL`). Four server connections serve every client
//! connection of both replicas, so consecutive transactions of one client land on different
//! server connections, which is what breaks a client that keeps statements prepared.

use std::sync::Arc;
use std::time::Duration;

use app::config::Config;
use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Connection as _;

use crate::support::cluster::{free_port, PrivateCluster};
use crate::support::helpers::instant;
use crate::support::pgbouncer::PgBouncer;
use crate::support::proxy::Proxy;
use crate::support::replicas::{config, eventually, Replica};

/// A replica's configuration with `DATABASE_URL` through `bouncer` and its session URL to
/// the server directly.
fn behind(bouncer: &PgBouncer, connect: &PgConnectOptions, knobs: &[(&str, &str)]) -> Config {
    let mut all =
        vec![("PLEXSPHERE_DATABASE_POOLER", "transaction"), ("PLEXSPHERE_SECRET_READ_NODE_BURST", "5")];
    all.extend_from_slice(knobs);
    let mut config = config(connect, &all);
    *config.database.session_url = connect.clone();
    *config.database.url = connect.clone().host("127.0.0.1").port(bouncer.port());
    config
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn two_replicas_behind_pgbouncer_in_transaction_mode_decide_exactly(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let bouncer = PgBouncer::start(connect.get_host(), connect.get_port(), 4);
    let clock = Arc::new(ManualClock::new(instant()));
    // Three hundred reads at once, each a token lookup, a fetch and a take, through four server
    // connections, beside another test on two cores: the suite's 1 s of database time turned
    // a busy moment into a 500 (once in a full run). What this test checks is exactness
    // through the pooler, so it gives the reads time; nothing here is about the deadline.
    let patient = [("PLEXSPHERE_DATABASE_TIMEOUT_MS", "5000"), ("PLEXSPHERE_DECISION_TIMEOUT_MS", "4000")];
    let a = Replica::start(behind(&bouncer, &connect, &patient), clock.clone()).await;
    let b = Replica::start(behind(&bouncer, &connect, &patient), clock.clone()).await;

    // Ten Nodes, each a burst of five secret reads; thirty reads each, all at once, half
    // through each replica: exactly five granted per Node, the rest refused, nothing failed.
    let domain = a.create_domain("bouncer", Some((100.0, 100.0))).await;
    a.put_secret(&domain, "key", "value").await;
    let mut tokens = Vec::new();
    for node in 0..10 {
        tokens.push(a.enrol(&domain, &format!("n{node}")).await.1);
    }
    let mut reads = Vec::new();
    for (index, token) in tokens.iter().enumerate() {
        for attempt in 0..30 {
            let replica = if (index + attempt) % 2 == 0 { &*a } else { &*b };
            let (replica, token) = (replica.clone(), token.clone());
            reads.push(tokio::spawn(async move {
                (index, replica.get("/v1/secrets/key", Some(&token)).await.status)
            }));
        }
    }
    let mut granted = vec![0; tokens.len()];
    for read in reads {
        let (index, status) = read.await.unwrap();
        match status {
            StatusCode::OK => granted[index] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("a read answered {other}"),
        }
    }
    assert_eq!(granted, vec![5; tokens.len()], "the burst across both replicas, exactly");

    // A rule written through one replica governs the other within a second.
    let rule =
        json!({ "scope": "secret_read_node", "selector": { "domain": domain }, "rate": 1, "burst": 50 });
    let answer = a.operator(Method::PUT, "/v1/rules/bouncer-reads", Some(rule)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    eventually(Duration::from_secs(1), "b decides by the rule written through a", || async {
        let limits = b.operator(Method::GET, &format!("/v1/domains/{domain}/limits"), None).await;
        limits.body["limits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|limit| limit["governed_by"]["rule_id"] == "bouncer-reads")
    })
    .await;

    // What one replica answered as written is committed: the other sees it at once, every
    // time. (The transaction each use of a pooled connection is used to be committed only
    // when sqlx returned the connection, in a task of its own, after the answer.)
    for node in 0..20 {
        let (_, token) = a.enrol(&domain, &format!("seen-{node}")).await;
        assert_eq!(b.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK, "enrolment {node}");
    }

    // A revocation through one replica reaches the other within a second.
    let (node, token) = a.enrol(&domain, "revoked").await;
    assert_eq!(b.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    let revoked = a.operator(Method::DELETE, &format!("/v1/domains/{domain}/nodes/{node}"), None).await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);
    eventually(Duration::from_secs(1), "b refuses the revoked token", || async {
        b.get("/v1/secrets/key", Some(&token)).await.status == StatusCode::UNAUTHORIZED
    })
    .await;

    // One leader, on its session connection.
    eventually(Duration::from_secs(10), "one replica leads", || async {
        a.leadership.is_leader() != b.leadership.is_leader()
    })
    .await;
    for _ in 0..3 {
        tokio::time::sleep(crate::support::replicas::FAST_LEADER.retry).await;
        assert!(a.leadership.is_leader() != b.leadership.is_leader());
    }
    assert_eq!(a.get("/readyz", None).await.status, StatusCode::OK);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_statement_through_the_pooler_answers_only_once_it_is_committed(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Behind a transaction pooler each use of a connection is a transaction the pool opens;
    // sqlx returns a connection in a task of its own, so a COMMIT sent then came after the
    // statement had answered: a write another session could not see yet, nor known to last.
    let bouncer = PgBouncer::start(connect.get_host(), connect.get_port(), 2);
    let through_pooler = connect.clone().host("127.0.0.1").port(bouncer.port()).statement_cache_capacity(0);
    let pooled = ratebudget::through_transaction_pooler(PgPoolOptions::new().max_connections(2), &[])
        .connect_with(through_pooler)
        .await
        .unwrap();
    let statements = ratebudget::Statements::through_transaction_pooler(pooled);
    let direct = options.connect_with(connect).await.unwrap();
    sqlx::query("CREATE TABLE written (n integer PRIMARY KEY)").execute(&direct).await.unwrap();
    for n in 0..200 {
        sqlx::query("INSERT INTO written (n) VALUES ($1)").bind(n).execute(&statements).await.unwrap();
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM written WHERE n = $1")
            .bind(n)
            .fetch_one(&direct)
            .await
            .unwrap();
        assert_eq!(seen, 1, "write {n} answered before it was committed");
        let read: Option<i32> = sqlx::query_scalar("SELECT n FROM written WHERE n = $1")
            .bind(n)
            .fetch_optional(&statements)
            .await
            .unwrap();
        assert_eq!(read, Some(n));
    }
}

/// Makes every COMMIT of a transaction that deleted a row of `table` fail, after the DELETE
/// itself succeeded: a deferred constraint trigger, checked only at COMMIT.
async fn make_commits_that_delete_from_fail(direct: &sqlx::PgPool, table: &str) {
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'this COMMIT fails'; END $$;
         CREATE CONSTRAINT TRIGGER commit_fails AFTER DELETE ON {table}
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit();"
    ))
    .execute(direct)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_reset_through_the_pooler_whose_commit_fails_answers_500_and_is_not_audited(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 32, item 5. The reset ran on the pooled connection's transaction, which the pool
    // committed only when sqlx returned the connection, after the handler had answered: with
    // a COMMIT that failed, the operator got 200 {"existed": true} and a budget.reset audit
    // row, and the bucket was untouched.
    let bouncer = PgBouncer::start(connect.get_host(), connect.get_port(), 2);
    let direct = options.connect_with(connect.clone()).await.unwrap();
    let replica =
        Replica::start(behind(&bouncer, &connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    let domain = replica.create_domain("resets", None).await;
    replica.put_secret(&domain, "key", "value").await;
    let (node, token) = replica.enrol(&domain, "n").await;
    assert_eq!(replica.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    let buckets = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM plexsphere.rate_budgets WHERE bucket_key = $1::uuid",
        )
        .bind(&node)
        .fetch_one(&direct)
        .await
        .unwrap()
    };
    assert_eq!(buckets().await, 1, "the read made the Node's bucket");

    make_commits_that_delete_from_fail(&direct, "plexsphere.rate_budgets").await;
    let reset = replica.operator(Method::DELETE, &format!("/v1/budgets/secret_read_node/{node}"), None).await;
    assert_eq!(reset.status, StatusCode::INTERNAL_SERVER_ERROR, "{reset:?}");
    assert_eq!(buckets().await, 1, "the reset did not happen");
    let audit = replica.operator(Method::GET, "/v1/audit", None).await;
    assert_eq!(audit.status, StatusCode::OK, "{audit:?}");
    let resets =
        audit.body.as_array().unwrap().iter().filter(|entry| entry["action"] == "budget.reset").count();
    assert_eq!(resets, 0, "a reset that did not happen is not audited: {audit:?}");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_named_limiters_reset_through_the_pooler_whose_commit_fails_is_an_error(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 32, item 5, for the named limiters' reset: it too answered before its COMMIT.
    let bouncer = PgBouncer::start(connect.get_host(), connect.get_port(), 2);
    let direct = options.connect_with(connect.clone()).await.unwrap();
    let through_pooler = connect.clone().host("127.0.0.1").port(bouncer.port()).statement_cache_capacity(0);
    let pooled = ratebudget::through_transaction_pooler(PgPoolOptions::new().max_connections(2), &[])
        .connect_with(through_pooler)
        .await
        .unwrap();
    let store = ratebudget::Store::new(pooled).through_transaction_pooler(&[]);
    let limiter = ratebudget::LimiterName::new("login").unwrap();
    let key = ratebudget::NamedKey::of(limiter, b"someone");
    let limit = ratebudget::Limit::new(1.0, 5.0).unwrap();
    let spend = ratebudget::NamedSpend {
        limiter,
        key,
        cells: 1,
        limit,
        enforcement: ratebudget::Enforcement::STRICT,
    };
    let taken = ratebudget::Decider::decide(&store, ratebudget::Take::Named(spend), instant()).await.unwrap();
    assert!(taken.is_granted());
    make_commits_that_delete_from_fail(&direct, "plexsphere.named_limits").await;
    let reset = store.reset_named(limiter, key).await;
    assert!(matches!(reset, Err(ratebudget::Error::Database(_))), "{reset:?}");
    let keys: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.named_limits").fetch_one(&direct).await.unwrap();
    assert_eq!(keys, 1, "the reset did not happen");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_transaction_through_the_pooler_leaves_the_statements_others_prepared_on_its_server(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 32, item 7. Every transaction through the pooler began with DEALLOCATE ALL, on a
    // server connection other clients share: PgBouncer 1.21 and later with
    // max_prepared_statements keeps statements it prepared there for every client, and they
    // were gone under it. Debian's PgBouncer 1.18 prepares none itself, so another client
    // prepares one as it would (under a name of the pooler's kind) on the one server
    // connection, and uses it after this client's repositories and takes ran there.
    let bouncer = PgBouncer::start(connect.get_host(), connect.get_port(), 1);
    let through_pooler = connect.clone().host("127.0.0.1").port(bouncer.port()).statement_cache_capacity(0);
    let mut other = sqlx::PgConnection::connect_with(&through_pooler).await.unwrap();
    sqlx::raw_sql("BEGIN; PREPARE \"PGBOUNCER_1\" AS SELECT 41 + 1; COMMIT")
        .execute(&mut other)
        .await
        .unwrap();

    let pooled = ratebudget::through_transaction_pooler(PgPoolOptions::new().max_connections(1), &[])
        .connect_with(through_pooler)
        .await
        .unwrap();
    let statements = ratebudget::Statements::through_transaction_pooler(pooled.clone());
    for _ in 0..3 {
        let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&statements).await.unwrap();
        assert_eq!(one, 1);
    }
    let store = ratebudget::Store::new(pooled).through_transaction_pooler(&[]);
    let spend = ratebudget::Spend::new(
        ratebudget::Name::new("shared_server").unwrap(),
        ratebudget::Key([3; 16]),
        1.0,
        ratebudget::Limit::new(1.0, 5.0).unwrap(),
    );
    for _ in 0..3 {
        let taken = ratebudget::Decider::decide(&store, ratebudget::Take::Single(spend), instant()).await;
        assert!(taken.unwrap().is_granted());
    }

    let used = sqlx::raw_sql("BEGIN; EXECUTE \"PGBOUNCER_1\"; COMMIT").execute(&mut other).await;
    assert!(used.is_ok(), "the pooler's statement is still on the server connection: {used:?}");
}

#[tokio::test]
async fn a_pooler_repointed_at_a_standby_after_its_clients_connected_decides_nothing_there() {
    // Issue 32, item 7. A new connection refuses a server that cannot take a write, but behind
    // a pooler that check ran on whichever server connection the client's first transaction
    // had: once the pooler's server connections went to a standby (a [databases] host edited,
    // a name it resolves moved), every later transaction ran there, and a take whose refusal
    // the snapshot foresees was answered from the standby's replayed rows.
    let primary = Arc::new(PrivateCluster::start("127.0.0.1", free_port(), None));
    primary.migrate().await;
    let standby = {
        let primary = primary.clone();
        tokio::task::spawn_blocking(move || PrivateCluster::standby_of(&primary, free_port())).await.unwrap()
    };
    let address = |cluster: &PrivateCluster| format!("127.0.0.1:{}", cluster.port()).parse().unwrap();
    // The pooler reaches its server through an address that can move.
    let upstream = Proxy::start(address(&primary)).await;
    let bouncer = PgBouncer::start("127.0.0.1", upstream.address().port(), 1);
    let through_pooler = primary.tcp_options("127.0.0.1").port(bouncer.port()).statement_cache_capacity(0);
    let pooled = ratebudget::through_transaction_pooler(PgPoolOptions::new().max_connections(1), &[])
        .connect_lazy_with(through_pooler);
    let store = ratebudget::Store::new(pooled).through_transaction_pooler(&[]);

    // A pair (decided by a function, which writes nothing on a refusal the snapshot foresees)
    // of a bucket spent dry on the primary and another.
    let limit = ratebudget::Limit::new(0.01, 1.0).unwrap();
    let dry =
        ratebudget::Spend::new(ratebudget::Name::new("dry").unwrap(), ratebudget::Key([5; 16]), 1.0, limit);
    let other = ratebudget::Spend { key: ratebudget::Key([6; 16]), ..dry };
    let now = instant();
    let take = |take| ratebudget::Decider::decide(&store, take, now);
    assert!(take(ratebudget::Take::Single(dry)).await.unwrap().is_granted());
    let refused = take(ratebudget::Take::Pair(dry, other)).await.unwrap();
    assert!(!refused.is_granted(), "refused on the primary: {refused:?}");

    // The standby has replayed the debit; the pooler's server connection goes, and its next
    // one reaches the standby.
    let on_standby =
        PgPoolOptions::new().max_connections(1).connect_with(standby.socket_options()).await.unwrap();
    eventually(Duration::from_secs(10), "the standby replays the debit", || async {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM plexsphere.rate_budgets")
            .fetch_one(&on_standby)
            .await
            .unwrap();
        rows == 1
    })
    .await;
    let closed_before = bouncer.log().matches("closing because").count();
    upstream.retarget(address(&standby));
    eventually(Duration::from_secs(10), "PgBouncer finds its server connection closed", || async {
        bouncer.log().matches("closing because").count() > closed_before
    })
    .await;

    let answer = take(ratebudget::Take::Pair(dry, other)).await;
    assert!(
        matches!(&answer, Err(undecided) if undecided.is_store_failure()
            && ratebudget::cause_chain(undecided).contains("read-only")),
        "a standby decides nothing, not even a refusal: {answer:?}"
    );
}
