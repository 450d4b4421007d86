//! The operator page end to end (issue 15, item 2): the `plexsphere` binary serves a fresh
//! database with a Domain, a Node, a rule and some decisions; headless Chromium (Debian's
//! `chromium`, which `.ci/run` installs) loads `/ui` with the operator token in the URL's
//! fragment, runs its script, and the test asserts on the DOM it rendered. The screenshot and
//! the DOM are kept under `target/ui-artefacts/` (or `$CARGO_TARGET_DIR/ui-artefacts/`).
//!
//! Without Chromium the test fails, saying how to install it: a page nobody loaded is not
//! tested.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::process::{database_url, Launch};
use crate::support::replicas::{eventually, OPERATOR_TOKEN};

const CHROMIUM: &str = "chromium";

/// How long one Chromium run may take before it is killed and the test fails.
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(90);

/// Where the screenshot and the DOM are kept for whoever looks at a run.
fn artefacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from);
    let directory = target.join("ui-artefacts");
    std::fs::create_dir_all(&directory).unwrap();
    directory
}

/// Headless Chromium in a profile of its own, as its own process group so that every process
/// it starts (renderer, GPU, zygote) is stopped with it.
struct Chromium {
    profile: PathBuf,
}

impl Chromium {
    fn new() -> Chromium {
        match Command::new(CHROMIUM).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(status) if status.success() => {}
            Ok(status) => panic!("`{CHROMIUM} --version` failed ({status})"),
            Err(error) => panic!(
                "cannot run `{CHROMIUM}` ({error}): the operator page's end-to-end test needs headless \
                 Chromium. Install Debian's package: `apt-get install -y chromium` (.ci/run does)."
            ),
        }
        let profile =
            std::env::temp_dir().join(format!("plexsphere-chromium-{}", uuid::Uuid::new_v4().simple()));
        Chromium { profile }
    }

    /// Runs Chromium on `url` with `arguments` (the output flag), letting the page's script
    /// run for `budget` of virtual time (network fetches pause it, so the API's answers
    /// arrive within it), and returns its standard output.
    async fn run(&self, url: &str, arguments: &[String], budget: Duration) -> String {
        let mut command = Command::new(CHROMIUM);
        command
            .args([
                "--headless",
                // Root in CI has no user namespace sandbox to offer.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--metrics-recording-only",
                "--hide-scrollbars",
                "--window-size=1280,1150",
            ])
            .arg(format!("--user-data-dir={}", self.profile.display()))
            .arg(format!("--virtual-time-budget={}", budget.as_millis()))
            .args(arguments)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let child = command.spawn().unwrap();
        let group = child.id();
        let waited = tokio::task::spawn_blocking(move || child.wait_with_output());
        let output = match tokio::time::timeout(CHROMIUM_DEADLINE, waited).await {
            Ok(output) => output.unwrap().unwrap(),
            Err(_) => {
                kill_group(group);
                panic!("chromium did not finish within {CHROMIUM_DEADLINE:?}");
            }
        };
        // Whatever it left running in its group (a crashed renderer's helpers) goes too.
        kill_group(group);
        assert!(
            output.status.success(),
            "chromium failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// The page's DOM once its script has run.
    async fn dom(&self, url: &str) -> String {
        self.run(url, &["--dump-dom".to_owned()], Duration::from_secs(8)).await
    }

    /// A screenshot of the page once its script has run.
    async fn screenshot(&self, url: &str, to: &Path) {
        let _ = std::fs::remove_file(to);
        self.run(url, &[format!("--screenshot={}", to.display())], Duration::from_secs(8)).await;
        let png =
            std::fs::read(to).unwrap_or_else(|error| panic!("no screenshot at {}: {error}", to.display()));
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 10_000,
            "not a screenshot of a page: {} bytes",
            png.len()
        );
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Ends the process group `group` (Chromium and every process it started), by its id.
fn kill_group(group: u32) {
    let _ =
        Command::new("kill").args(["-s", "KILL", "--", &format!("-{group}")]).stderr(Stdio::null()).status();
}

/// The text of the element that starts at the first `marker` after `within` begins, up to the
/// next `</end>`: enough of a DOM query for markup this test's page writes itself.
#[track_caller]
fn element<'a>(dom: &'a str, within: &str, marker: &str, end: &str) -> &'a str {
    let from = dom.find(within).unwrap_or_else(|| panic!("no {within} in the DOM:\n{dom}"));
    let start = from + dom[from..].find(marker).unwrap_or_else(|| panic!("no {marker} in {within}:\n{dom}"));
    let stop = start + dom[start..].find(end).unwrap_or_else(|| panic!("{marker} never ends:\n{dom}"));
    &dom[start..stop]
}

/// The text content of an element's markup (tags dropped); markup that starts inside a tag
/// (at an attribute) starts after it.
fn text(markup: &str) -> String {
    let mut text = String::new();
    let mut in_tag = !markup.starts_with('<');
    for c in markup.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_operator_page_shows_buckets_decisions_rules_and_the_leader_in_headless_chromium(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let chromium = Chromium::new();
    let service = Launch::serve(&database_url(&connect))
        .knob("PLEXSPHERE_DECIDE_TOKENS", "envoy:ui-test-decide-token-0123456789")
        .knob("PLEXSPHERE_RULE_USAGE_FLUSH_INTERVAL_MS", "100")
        .start()
        .await;
    let api = service.api();

    // A Domain, a Node, a secret, and a rule of the Domain's own: 5 reads, then 1 a second.
    let domain = api.create_domain("acme", None).await;
    let (node, node_token) = api.enrol(&domain, "node-1").await;
    api.put_secret(&domain, "db-password", "hunter2").await;
    let rule =
        json!({ "scope": "secret_read_node", "selector": { "domain": domain }, "rate": 1, "burst": 5 });
    let answer = api.operator(Method::PUT, "/v1/rules/acme-node-reads", Some(rule)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    // Back to back, 8 reads: 5 granted (perhaps a sixth, if a second passed), the rest refused.
    let mut granted = 0;
    for _ in 0..8 {
        if api.get("/v1/secrets/db-password", Some(&node_token)).await.status == StatusCode::OK {
            granted += 1;
        }
    }
    assert!((5..=6).contains(&granted), "{granted} reads granted");
    let batch = b"cpu=0.42 mem=0.61".to_vec();
    let answer = api.request(Method::POST, "/v1/ingest", Some(&node_token), Some(batch)).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:?}");
    // Another service's rule, and three decisions by it: two granted, one refused.
    let directory = json!({ "service": "directory", "api": "GET /v1/users", "selector": { "tenant": "*" }, "rate": 1, "burst": 2 });
    let answer = api.operator(Method::PUT, "/v1/rules/dir-users", Some(directory)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let decide = json!({ "domain": "directory", "descriptors": [{ "entries": [
        { "key": "api", "value": "GET /v1/users" }, { "key": "tenant", "value": "contoso" },
    ]}]});
    for _ in 0..3 {
        let answer = api
            .request(
                Method::POST,
                "/v1/decide",
                Some("ui-test-decide-token-0123456789"),
                Some(decide.to_string().into_bytes()),
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    eventually(Duration::from_secs(20), "the decisions reach the usage rows", || async {
        let usage = api.operator(Method::GET, "/v1/rules/dir-users/usage", None).await;
        usage.body.as_array().is_some_and(|minutes| {
            minutes
                .iter()
                .map(|minute| minute["granted"].as_u64().unwrap() + minute["refused"].as_u64().unwrap())
                .sum::<u64>()
                == 3
        })
    })
    .await;
    // An Envoy's RLQS share of one of the service's buckets, as a replica's stream counts it.
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let quota = app::quota_store::PgQuotaStore::new(ratebudget::Statements::new(pool));
    let envoy = uuid::Uuid::from_u64_pair(0, 42);
    let report = service::quota::ShareRequest {
        service: "directory".into(),
        budget: service::quota::Budget {
            key: ratebudget::Key::from(uuid::Uuid::from_u64_pair(0, 7)),
            rule_id: "dir-users".into(),
            rate: 1.0,
            burst: 2.0,
            fill_seconds: 60,
            shadow: false,
        },
        holder: service::quota::BucketHolder {
            stream: envoy,
            holder: envoy,
            unsure: false,
            builds_full: false,
        },
        replica: "10.0.0.9:8081".into(),
        usage: None,
        settings: service::quota::QuotaSettings::default(),
    };
    service::quota::QuotaStore::assign(&quota, &report).await.unwrap();
    // The only replica leads once its elector has had its first poll.
    eventually(Duration::from_secs(20), "the service leads", || async { api.leader_gauge().await == 1 })
        .await;

    // The token travels in the fragment, which the browser never sends to the server.
    let url = format!("{}/ui#token={OPERATOR_TOKEN}&key={node}&service=directory", api.base());
    let started = Instant::now();
    let dom = chromium.dom(&url).await;
    std::fs::write(artefacts().join("ui-dom.html"), &dom).unwrap();
    eprintln!("chromium rendered the page in {:?}", started.elapsed());

    assert!(dom.contains(r#"data-state="ready""#), "the page did not finish loading:\n{dom}");
    assert!(!dom.contains(OPERATOR_TOKEN), "the token is in the DOM");
    // The leader, and the rules snapshot holding the one rule change.
    assert!(text(element(&dom, r#"id="leader""#, "", "</dd>")).contains("this replica"), "{dom}");
    assert_eq!(text(element(&dom, r#"id="snapshot-version""#, "", "</span>")), "version 2");
    // Decisions by outcome: the Node's reads, counted by this replica.
    let reads = element(&dom, r#"id="decisions""#, r#"<tr data-scope="secret_read_node">"#, "</tr>");
    let granted_cell = element(reads, r#"data-outcome="granted""#, "", "</td>");
    assert_eq!(text(granted_cell), granted.to_string(), "{reads}");
    let refused = ["refused", "precheck_refused"]
        .iter()
        .map(|outcome| {
            let cell = element(reads, &format!(r#"data-outcome="{outcome}""#), "", "</td>");
            text(cell).parse::<u32>().unwrap()
        })
        .sum::<u32>();
    assert_eq!(refused, 8 - granted, "{reads}");
    // The Node's buckets: named, with a level and this replica's history of them.
    let subject = text(element(&dom, r#"id="subject-line""#, "", "</p>"));
    assert!(subject.contains("Node node-1") && subject.contains("Domain acme"), "{subject}");
    let bucket = element(&dom, r#"id="buckets""#, r#"<tr data-scope="secret_read_node">"#, "</tr>");
    assert!(text(bucket).contains("/ 5"), "the burst of the rule: {bucket}");
    assert!(bucket.contains(r#"data-slots="1""#) || bucket.contains(r#"data-slots="2""#), "{bucket}");
    assert!(bucket.contains(r#"<rect class="slot refused""#), "no history drawn: {bucket}");
    let ingest = element(&dom, r#"id="buckets""#, r#"<tr data-scope="ingest_node">"#, "</tr>");
    // 17 bytes spent of 1,048,576, refilled long since at 262,144 a second; one batch granted.
    assert!(text(ingest).contains("/ 1,048,576"), "{ingest}");
    assert_eq!(text(element(ingest, r#"class="num granted""#, "", "</td>")), "1", "{ingest}");
    // The effective rules: the Domain's override governs its Node reads, the knobs the rest.
    let governed = element(&dom, r#"id="rules""#, r#"<tr data-scope="secret_read_node""#, "</tr>");
    assert!(governed.contains(r#"data-rule="acme-node-reads""#), "{governed}");
    assert!(text(governed).contains("domain"), "{governed}");
    let knob = element(&dom, r#"id="rules""#, r#"<tr data-scope="ingest_node""#, "</tr>");
    assert!(text(knob).contains("knob_default"), "{knob}");

    // The service's rules, and what they decided in the last hour, over every replica.
    let row = element(&dom, r#"id="service-rules""#, r#"<tr data-rule="dir-users">"#, "</tr>");
    let row_text = text(row);
    assert!(row_text.contains("GET /v1/users") && row_text.contains("tenant=*"), "{row}");
    assert_eq!(text(element(row, r#"class="num granted""#, "", "</td>")), "2", "{row}");
    assert_eq!(text(element(row, r#"class="num refused""#, "", "</td>")), "1", "{row}");

    // The service's RLQS buckets: the Envoy's share, on its replica.
    let share = element(&dom, r#"id="quota-buckets""#, &format!(r#"data-holder="{envoy}""#), "</tr>");
    let share_text = text(share);
    assert!(share_text.contains("dir-users") && share_text.contains("10.0.0.9:8081"), "{share}");
    assert!(share_text.contains("open") && share_text.contains("new"), "{share}");

    let screenshot = artefacts().join("ui.png");
    chromium.screenshot(&url, &screenshot).await;
    eprintln!("screenshot: {}", screenshot.display());

    // A wrong token shows nothing but the token form again, saying why.
    let dom = chromium.dom(&format!("{}/ui#token=not-the-operator-token&key={node}", api.base())).await;
    assert!(dom.contains(r#"data-state="locked""#), "{dom}");
    assert!(text(&dom).contains("That token was refused (unauthorized)"), "{dom}");
    assert!(!dom.contains("node-1"), "data without the token:\n{dom}");
}
