//! The leader killed (SIGKILL) and the leader silently partitioned from the database, with the
//! production timing: another replica leads within 15 s, and a partitioned leader stops
//! claiming leadership before anyone else can take it (issue 12, items 3 and 4; docs/adr/0003).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::cluster::PrivateCluster;
use crate::support::netns::Namespace;
use crate::support::process::{database_url, Launch, ServiceProcess};

/// What the issue allows for a new leader, and for a cut-off one to stop claiming.
const WITHIN: Duration = Duration::from_secs(15);

/// The instant a process logged the first line containing `needle`, waiting up to `within`.
async fn logged_at(process: &mut ServiceProcess, needle: &str, within: Duration) -> DateTime<Utc> {
    let line = process.wait_for_log(needle, within).await;
    line.split_whitespace().next().unwrap().parse().unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_leader_killed_with_sigkill_is_replaced_within_15_s(_: PgPoolOptions, connect: PgConnectOptions) {
    let url = database_url(&connect);
    let mut first = Launch::serve(&url).start().await;
    first.wait_for_log("became leader", Duration::from_secs(10)).await;
    let mut second = Launch::serve(&url).start().await;

    first.signal("KILL");
    let killed = Instant::now();
    second.wait_for_log("became leader", WITHIN).await;
    let takeover = killed.elapsed();
    eprintln!("leader killed with SIGKILL: a new leader after {takeover:?}");
    assert!(takeover < WITHIN);
    second.signal("TERM");
    assert!(second.exited_within(Duration::from_secs(10)).await.is_some());
}

#[tokio::test]
async fn a_silently_partitioned_leader_steps_down_and_another_leads_within_15_s() {
    // Declared first, dropped last: everything inside it is gone by then.
    let Some(namespace) = Namespace::create() else { return };
    let port = 5432;
    let cluster = PrivateCluster::start("127.0.0.1,127.0.0.2,127.0.0.3", port, Some(namespace.name()));
    cluster.migrate().await;
    // Each replica reaches the database at an address of its own inside the namespace.
    let url = |host: &str| database_url(&cluster.tcp_options(host));
    let mut leader = Launch::serve(&url("127.0.0.2")).inside(namespace.name()).start().await;
    leader.wait_for_log("became leader", Duration::from_secs(10)).await;
    let mut follower = Launch::serve(&url("127.0.0.3")).inside(namespace.name()).start().await;

    // Every packet between the leader and the database is dropped from now on: no reset, no
    // ICMP, as when a switch dies.
    namespace.partition("127.0.0.2", port);
    let cut = Utc::now();
    let stepped_down = logged_at(&mut leader, "lost leadership", WITHIN).await;
    let took_over = logged_at(&mut follower, "became leader", WITHIN).await;
    let (down, over) = ((stepped_down - cut).to_std().unwrap(), (took_over - cut).to_std().unwrap());
    eprintln!(
        "silent partition of the leader: it stopped claiming after {down:?}, another led after {over:?}"
    );
    assert!(down < WITHIN && over < WITHIN, "{down:?} {over:?}");
    // Never two leaders: the old one had stepped down before the server freed the lock.
    assert!(stepped_down < took_over, "{stepped_down} vs {took_over}");
    let gauge = |process: &ServiceProcess| {
        let metrics = namespace.output(&["curl", "-s", &format!("http://{}/metrics", process.address())]);
        metrics.lines().find_map(|line| line.strip_prefix("plexsphere_leader ").map(str::to_owned))
    };
    assert_eq!(gauge(&leader).as_deref(), Some("0"));
    assert_eq!(gauge(&follower).as_deref(), Some("1"));
    namespace.heal();
}
