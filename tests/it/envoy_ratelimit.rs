//! plexsphere as a drop-in for envoyproxy/ratelimit (issue 34): its configuration files applied
//! as they are (`plexsphere rules apply`, `PLEXSPHERE_RULES_DIR`), refused for what it
//! refuses with nothing changed, and its answers over Envoy's protocol (through the
//! independent Python grpcio client, `support::grpc`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ratebudget::ManualClock;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::grpc;
use crate::support::helpers::instant;
use crate::support::process::{database_url, BINARY};
use crate::support::replicas::{config, eventually, Replica};

const DECIDE_TOKEN: &str = "envoy-decide-token-0123456789";

async fn service(connect: &PgConnectOptions, knobs: &[(&str, &str)]) -> Replica {
    let token = format!("envoy:{DECIDE_TOKEN}");
    let mut all =
        vec![("PLEXSPHERE_DECIDE_TOKENS", token.as_str()), ("PLEXSPHERE_GRPC_LISTEN", "127.0.0.1:0")];
    all.extend_from_slice(knobs);
    Replica::start(config(connect, &all), Arc::new(ManualClock::new(instant()))).await
}

/// A directory of its own under the system's temporary one, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let path = std::env::temp_dir().join(format!("plexsphere-envoy-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    fn write(&self, name: &str, text: &str) -> &Scratch {
        std::fs::write(self.0.join(name), text).unwrap();
        self
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MESSAGING: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

/// Every rule as it stands: id, version, and its row's content as text.
async fn rules_as_stored(pool: &PgPool) -> Vec<(String, i64, String)> {
    sqlx::query_as(
        "SELECT rule_id, version, concat_ws('|', service, descriptor::text, source, rate, per_ms, burst, mode) \
         FROM plexsphere.rules ORDER BY rule_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

async fn apply(connect: &PgConnectOptions, paths: &[&Path], prune: bool, dry_run: bool) -> String {
    let paths: Vec<PathBuf> = paths.iter().map(|path| path.to_path_buf()).collect();
    let prune = if prune { rules::Prune::SameDomains } else { rules::Prune::Nothing };
    let mut printed = Vec::new();
    app::cli::apply_rules(connect.clone(), &paths, prune, dry_run, &mut printed).await.unwrap();
    String::from_utf8(printed).unwrap()
}

fn one(domain: &str, entries: &[(&str, &str)]) -> Value {
    let entries: Vec<Value> = entries.iter().map(|(key, value)| json!([key, value])).collect();
    json!({ "token": DECIDE_TOKEN, "domain": domain, "descriptors": [{ "entries": entries }] })
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn applying_files_prints_each_change_is_idempotent_prunes_is_audited_and_every_replica_hears(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool.connect_with(connect.clone()).await.unwrap();
    let replica = service(&connect, &[]).await;
    let grpc_at = replica.grpc.unwrap();
    let files = Scratch::new();
    files.write("messaging.yaml", MESSAGING);

    let dry = apply(&connect, &[&files.0], false, true).await;
    assert_eq!(dry.matches("created ").count(), 2, "{dry}");
    assert!(dry.contains("dry run: 2 change(s) would be made, none was"), "{dry}");
    assert!(rules_as_stored(&pool).await.is_empty(), "a dry run writes nothing");

    let first = apply(&connect, &[&files.0], false, false).await;
    assert!(
        first.contains("messaging.message_type_marketing.to_number from messaging.yaml (version 1)"),
        "{first}"
    );
    // Every replica hears of it as of a PUT: within a second, by notification.
    let marketing = one("messaging", &[("message_type", "marketing"), ("to_number", "2061111111")]);
    eventually(Duration::from_secs(1), "the replica decides by the applied files", || async {
        let answer = grpc::call(grpc_at, marketing.clone()).await;
        answer["response"]["statuses"][0]["current_limit"]
            == json!({ "name": "", "requests_per_unit": 5, "unit": "DAY" })
    })
    .await;

    // Decisions are counted under the path as envoyproxy/ratelimit's stats keys name it.
    let metrics = replica.get("/metrics", None).await.body.as_str().unwrap_or_default().to_owned();
    assert!(
        metrics.contains(
            "plexsphere_decide_rule_decisions_total{service=\"messaging\",rule=\"messaging.message_type_marketing.to_number\",verdict=\"within_limit\"}"
        ),
        "{metrics}"
    );

    let stored = rules_as_stored(&pool).await;
    let again = apply(&connect, &[&files.0.join("messaging.yaml")], true, false).await;
    assert_eq!(again.matches("unchanged ").count(), 2, "{again}");
    assert!(again.contains("0 change(s) made"), "{again}");
    assert_eq!(rules_as_stored(&pool).await, stored, "the same files change nothing, however named");

    // The marketing limit goes, the per-number one changes: replaced, and with --prune deleted.
    files.write(
        "messaging.yaml",
        "domain: messaging\ndescriptors:\n  - key: to_number\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    );
    let kept = apply(&connect, &[&files.0], false, false).await;
    assert!(kept.contains("replaced  messaging.to_number"), "{kept}");
    assert!(!kept.contains("deleted"), "without --prune nothing is deleted: {kept}");
    let pruned = apply(&connect, &[&files.0], true, false).await;
    assert!(pruned.contains("deleted   messaging.message_type_marketing.to_number"), "{pruned}");
    assert_eq!(rules_as_stored(&pool).await.len(), 1);

    // Each change is a version in the rule's history and an audit entry of the command line.
    let audited: Vec<(String, String)> = sqlx::query_as(
        "SELECT actor, action FROM plexsphere.audit_events WHERE rule_id IS NOT NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let actions: Vec<&str> = audited.iter().map(|(_, action)| action.as_str()).collect();
    assert_eq!(actions, ["rule.put", "rule.put", "rule.put", "rule.delete"]);
    assert!(audited.iter().all(|(actor, _)| actor == "<cli>"));
    let history: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.rule_versions").fetch_one(&pool).await.unwrap();
    assert_eq!(history, 4);

    // GET /v1/rules says how each rule matches and where it came from.
    let listed = replica.operator(reqwest::Method::GET, "/v1/rules?service=messaging", None).await;
    let rule = &listed.body[0];
    assert_eq!(rule["matching"], "descriptor_path", "{listed:?}");
    assert_eq!(rule["source"], "messaging.yaml");
    assert_eq!(rule["descriptor"]["stats_key"], "messaging.to_number");
    assert_eq!(rule["descriptor"]["rate_limit"], json!({ "requests_per_unit": 10, "unit": "HOUR" }));
}

/// Item 1: each file envoyproxy/ratelimit refuses (examples/envoy-ratelimit/refused/, one case
/// each) is refused, naming the file and the descriptor path; the command exits non-zero and
/// nothing of any file is applied, not even a good file's change beside it.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_refused_file_is_named_with_its_descriptor_path_and_nothing_of_any_file_is_applied(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool.connect_with(connect.clone()).await.unwrap();
    let fixtures = workspace().join("examples/envoy-ratelimit/refused");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("expected.json")).unwrap()).unwrap();
    let cases = expected["cases"].as_object().unwrap();
    assert!(cases.len() >= 11, "a case per refusal");
    for (case, expected) in cases {
        let files = Scratch::new();
        files.write("messaging.yaml", MESSAGING);
        apply(&connect, &[&files.0], false, false).await;
        let before = rules_as_stored(&pool).await;
        // The good file changes too: none of it may land when another file is refused.
        files.write(
            "messaging.yaml",
            "domain: messaging\ndescriptors:\n  - key: to_number\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        for file in expected["files"].as_array().unwrap() {
            let file = file.as_str().unwrap();
            files.write(file, &std::fs::read_to_string(fixtures.join(file)).unwrap());
        }
        let output = std::process::Command::new(BINARY)
            .args(["rules", "apply", "--prune"])
            .arg(&files.0)
            .env("DATABASE_URL", database_url(&connect))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{case}: {stderr}");
        let file = expected["refused_file"].as_str().unwrap();
        let named = match expected["path"].as_str() {
            Some(path) => format!("{file}: {path}: "),
            None => format!("{file}: "),
        };
        assert!(stderr.contains(&named), "{case}: names {named:?}: {stderr}");
        assert!(stderr.contains(expected["error"].as_str().unwrap()), "{case}: {stderr}");
        assert_eq!(rules_as_stored(&pool).await, before, "{case}: nothing changed");
        sqlx::query("DELETE FROM plexsphere.rules").execute(&pool).await.unwrap();
    }
}

/// Item 1: the leader applies `PLEXSPHERE_RULES_DIR` at start and within seconds of a change,
/// laid out as Kubernetes mounts a ConfigMap (visible links into a hidden `..data` that is
/// swapped whole); a refused file is counted and changes nothing.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_leader_applies_a_mounted_configmap_and_each_change_to_it(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool.connect_with(connect.clone()).await.unwrap();
    let mount = Scratch::new();
    let version = |name: &str, text: &str| {
        let data = mount.0.join(name);
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("config.yaml"), text).unwrap();
        // The kubelet's swap: a new link, renamed over `..data` in one step.
        let link = mount.0.join("..data_tmp");
        std::os::unix::fs::symlink(name, &link).unwrap();
        std::fs::rename(&link, mount.0.join("..data")).unwrap();
    };
    version("..2026_12_04_01", MESSAGING);
    std::os::unix::fs::symlink("..data/config.yaml", mount.0.join("config.yaml")).unwrap();

    let directory = mount.0.display().to_string();
    let replica = service(
        &connect,
        &[("PLEXSPHERE_RULES_DIR", directory.as_str()), ("PLEXSPHERE_RULES_DIR_INTERVAL_MS", "200")],
    )
    .await;
    eventually(Duration::from_secs(10), "the leader applies the directory", || async {
        rules_as_stored(&pool).await.len() == 2
    })
    .await;
    let stored = rules_as_stored(&pool).await;
    assert!(stored.iter().all(|(_, _, row)| row.contains("|config.yaml|")), "{stored:?}");

    version("..2026_12_04_02", "domain: messaging\ndescriptors:\n  - key: to_number\n    rate_limit: {unit: minute, requests_per_unit: 7}\n");
    eventually(Duration::from_secs(5), "the change is applied, with prune", || async {
        let stored = rules_as_stored(&pool).await;
        stored.len() == 1 && stored[0].1 == 2
    })
    .await;
    let grpc_at = replica.grpc.unwrap();
    eventually(Duration::from_secs(2), "the replica decides by it", || async {
        let answer = grpc::call(grpc_at, one("messaging", &[("to_number", "1")])).await;
        answer["response"]["statuses"][0]["current_limit"]["requests_per_unit"] == 7
    })
    .await;

    let applied = rules_as_stored(&pool).await;
    version("..2026_12_04_03", "domain: messaging\ndescriptors:\n  - key: to_number\n    rate_limit: {unit: minute}\n    typo: true\n");
    eventually(Duration::from_secs(5), "the refusal is counted", || async {
        let metrics = replica.get("/metrics", None).await.body.as_str().unwrap_or_default().to_owned();
        metrics.contains("plexsphere_rules_dir_applies_total{outcome=\"refused\"} 1")
    })
    .await;
    assert_eq!(rules_as_stored(&pool).await, applied, "a refused file changes nothing");
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.audit_events WHERE actor = '<rules-dir>'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audited, 4, "two created, one replaced, one deleted");
}

/// Acceptance: every example of envoyproxy/ratelimit's README "Configuration" section
/// (examples/envoy-ratelimit/, each applied on its own since several share a domain) is answered
/// as its README says: the code, limit and remaining count of each descriptor, checked through
/// the Python grpcio client by tests/grpc/envoy_examples.py.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn every_example_of_envoyproxy_ratelimits_readme_is_answered_as_it_says(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool.connect_with(connect.clone()).await.unwrap();
    let replica = service(&connect, &[]).await;
    let grpc_at = replica.grpc.unwrap().to_string();
    let examples = workspace().join("examples/envoy-ratelimit");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 16, "examples 1 to 11, several of two or three files");
    let check = |name: String| {
        let grpc_at = grpc_at.clone();
        async move {
            grpc::script(
                "tests/grpc/envoy_examples.py",
                &["--fresh", &name],
                &[("PLEXSPHERE_GRPC", grpc_at.as_str()), ("PLEXSPHERE_DECIDE_TOKEN", DECIDE_TOKEN)],
            )
            .await
        }
    };
    // The script finds a difference: before its rules are applied, example 1 is answered
    // otherwise than its README says.
    let (passed, printed) = check("01-mongo_cps".into()).await;
    assert!(!passed, "the check must fail without the example's rules: {printed}");
    for file in files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        apply(&connect, &[&file], true, false).await;
        let revision: i64 = sqlx::query_scalar("SELECT revision FROM plexsphere.rule_revision")
            .fetch_one(&pool)
            .await
            .unwrap();
        eventually(Duration::from_secs(2), "the replica holds the example's rules", || async {
            replica.gauge("plexsphere_rules_snapshot_version").await >= revision
        })
        .await;
        let (passed, printed) = check(name.clone()).await;
        assert!(passed, "{name}:\n{printed}");
        assert!(printed.contains(" 0 failed"), "{name}: {printed}");
    }
}

/// Item 2: `quota_mode` descriptors make a request OVER_LIMIT only when every one of them is
/// over (a quota descriptor that is over stays OVER_LIMIT in its status); all or nothing still
/// holds: an over request debits no bucket, and one that passes debits none that is over.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn quota_mode_descriptors_refuse_only_when_all_of_them_are_over(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let replica = service(&connect, &[]).await;
    let grpc_at = replica.grpc.unwrap();
    let files = Scratch::new();
    files.write(
        "quotas.yaml",
        "
domain: quotas
descriptors:
  - key: user
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: team
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 100}
",
    );
    apply(&connect, &[&files.0], false, false).await;
    let request = |descriptors: &[(&str, &str)]| {
        let descriptors: Vec<Value> =
            descriptors.iter().map(|(key, value)| json!({ "entries": [[key, value]] })).collect();
        json!({ "token": DECIDE_TOKEN, "domain": "quotas", "descriptors": descriptors })
    };
    let all = request(&[("user", "u"), ("team", "t"), ("route", "r")]);
    eventually(Duration::from_secs(2), "the replica holds the file", || async {
        grpc::call(grpc_at, request(&[("route", "probe")])).await["response"]["statuses"][0]["current_limit"]
            ["requests_per_unit"]
            == 100
    })
    .await;
    let answers = grpc::calls(grpc_at, json!([all, all, all, all])).await;
    let codes = |answer: &Value| -> Vec<String> {
        let statuses = answer["response"]["statuses"].as_array().unwrap();
        let mut codes = vec![answer["response"]["overall_code"].as_str().unwrap().to_owned()];
        codes.extend(statuses.iter().map(|status| status["code"].as_str().unwrap().to_owned()));
        codes
    };
    let remaining =
        |answer: &Value, index: usize| answer["response"]["statuses"][index]["limit_remaining"].clone();
    assert_eq!(codes(&answers[0]), ["OK", "OK", "OK", "OK"]);
    assert_eq!(codes(&answers[1]), ["OK", "OK", "OK", "OK"]);
    // The user's quota is spent; the team's still has room: OK, the user's status over.
    assert_eq!(codes(&answers[2]), ["OK", "OVER_LIMIT", "OK", "OK"], "{}", answers[2]);
    assert_eq!(remaining(&answers[2], 0), 0);
    assert_eq!(remaining(&answers[2], 1), 0, "the team's last token");
    assert_eq!(remaining(&answers[2], 2), 97);
    // Both quotas spent: the request is over, and the route's bucket is not debited.
    assert_eq!(codes(&answers[3]), ["OVER_LIMIT", "OVER_LIMIT", "OVER_LIMIT", "OK"], "{}", answers[3]);
    let route = grpc::call(grpc_at, request(&[("route", "r")])).await;
    assert_eq!(remaining(&route, 0), 96, "the refused request took nothing from the route: {route}");
}

/// Item 4 with item 2: a check (a descriptor's own `hits_addend` of 0) of a `quota_mode`
/// descriptor counts as that descriptor, spending nothing: over, it refuses the request only
/// when every quota-mode descriptor is, and then before anything is spent.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_check_of_a_quota_mode_descriptor_refuses_only_with_every_other_quota(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let replica = service(&connect, &[]).await;
    let grpc_at = replica.grpc.unwrap();
    let files = Scratch::new();
    files.write(
        "quotas.yaml",
        "
domain: quotas
descriptors:
  - key: user
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: team
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 100}
",
    );
    apply(&connect, &[&files.0], false, false).await;
    let request = |descriptors: &[(&str, u64)]| {
        let descriptors: Vec<Value> = descriptors
            .iter()
            .map(|(key, hits)| json!({ "entries": [[key, key]], "hits_addend": hits }))
            .collect();
        json!({ "token": DECIDE_TOKEN, "domain": "quotas", "descriptors": descriptors })
    };
    eventually(Duration::from_secs(2), "the replica holds the file", || async {
        grpc::call(grpc_at, request(&[("team", 0)])).await["response"]["statuses"][0]["current_limit"]
            ["requests_per_unit"]
            == 3
    })
    .await;
    let codes = |answer: &Value| -> Vec<String> {
        let statuses = answer["response"]["statuses"].as_array().unwrap();
        let mut codes = vec![answer["response"]["overall_code"].as_str().unwrap().to_owned()];
        codes.extend(statuses.iter().map(|status| status["code"].as_str().unwrap().to_owned()));
        codes
    };
    let remaining =
        |answer: &Value, index: usize| answer["response"]["statuses"][index]["limit_remaining"].clone();
    let answers = grpc::calls(
        grpc_at,
        json!([
            // The user's whole quota.
            request(&[("user", 2)]),
            // Its check is over, the team's is not: OK.
            request(&[("user", 0), ("team", 0)]),
            // Its check over and no other quota: over, the route not spent.
            request(&[("user", 0), ("route", 1)]),
            // Its check over, the team's take granted: OK, the team and the route spent.
            request(&[("user", 0), ("team", 1), ("route", 1)]),
            request(&[("team", 2)]),
            // Both over: over, and the route not spent.
            request(&[("user", 0), ("team", 1), ("route", 1)]),
            request(&[("route", 0)]),
        ]),
    )
    .await;
    assert_eq!(codes(&answers[0]), ["OK", "OK"]);
    assert_eq!(codes(&answers[1]), ["OK", "OVER_LIMIT", "OK"], "{}", answers[1]);
    assert_eq!(remaining(&answers[1], 1), 3, "a check spends nothing");
    assert_eq!(codes(&answers[2]), ["OVER_LIMIT", "OVER_LIMIT", "OK"], "{}", answers[2]);
    let headers = answers[2]["response"]["response_headers_to_add"].as_array().unwrap();
    assert!(headers.iter().any(|header| header[0] == "retry-after"), "{}", answers[2]);
    assert_eq!(codes(&answers[3]), ["OK", "OVER_LIMIT", "OK", "OK"], "{}", answers[3]);
    assert_eq!((remaining(&answers[3], 1), remaining(&answers[3], 2)), (json!(2), json!(99)));
    assert_eq!(codes(&answers[4]), ["OK", "OK"]);
    assert_eq!(codes(&answers[5]), ["OVER_LIMIT", "OVER_LIMIT", "OVER_LIMIT", "OK"], "{}", answers[5]);
    assert_eq!(remaining(&answers[6], 0), 99, "the refused requests took nothing from the route");
}
