//! The Grafana dashboard (`deploy/grafana/plexsphere.json`, issue 15, item 3) cannot rot
//! silently: every metric its PromQL names is one a running replica exports, under the name
//! Prometheus stores it by, and every label it groups or filters by is one those metrics
//! carry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ratebudget::ManualClock;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::helpers::instant;
use crate::support::replicas::{config, eventually, Replica};

const DASHBOARD: &str = include_str!("../../deploy/grafana/plexsphere.json");

/// Labels Prometheus adds to every series it scrapes, which the service never exports itself.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Every PromQL expression of the dashboard: the panels' targets (rows nest panels) and the
/// template variables' queries.
fn expressions(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            for (key, value) in object {
                match (key.as_str(), value) {
                    ("expr" | "definition", Value::String(expression)) => found.push(expression.clone()),
                    ("query", Value::String(expression)) if expression.contains('(') => {
                        found.push(expression.clone())
                    }
                    _ => expressions(value, found),
                }
            }
        }
        Value::Array(values) => values.iter().for_each(|value| expressions(value, found)),
        _ => {}
    }
}

/// One piece of PromQL, as far as this test reads it.
#[derive(Debug, PartialEq)]
enum Token {
    /// A name: a metric, a function, a keyword or a label.
    Name(String),
    /// A quoted string (a label's value or a regex), skipped whole.
    Text,
    /// Anything else, one character at a time.
    Punct(char),
}

fn tokens(expression: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = expression.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let mut name = c.to_string();
            while let Some(&next) =
                chars.peek().filter(|c| c.is_ascii_alphanumeric() || **c == '_' || **c == ':')
            {
                name.push(next);
                chars.next();
            }
            tokens.push(Token::Name(name));
        } else if c == '"' {
            while let Some(next) = chars.next() {
                match next {
                    '\\' => {
                        chars.next();
                    }
                    '"' => break,
                    _ => {}
                }
            }
            tokens.push(Token::Text);
        } else if c == '$' {
            // A Grafana variable ($__rate_interval, $instance): not PromQL's.
            while chars.peek().is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_') {
                chars.next();
            }
        } else if !c.is_whitespace() {
            tokens.push(Token::Punct(c));
        }
    }
    tokens
}

/// What one expression names: its metrics, each with the labels its selector matches on, and
/// the labels it groups by (`by (...)`, `label_values(metric, label)`).
#[derive(Debug, Default)]
struct Named {
    metrics: BTreeMap<String, BTreeSet<String>>,
    grouped_by: BTreeSet<String>,
}

fn read(expression: &str) -> Named {
    let tokens = tokens(expression);
    let mut named = Named::default();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Name(name) if name.starts_with("plexsphere_") => {
                let matchers = named.metrics.entry(name.clone()).or_default();
                if tokens.get(i + 1) == Some(&Token::Punct('{')) {
                    // `{label op "value", ...}`: the name before each operator is a label.
                    let mut j = i + 2;
                    while j < tokens.len() && tokens[j] != Token::Punct('}') {
                        if let (Token::Name(label), Some(Token::Punct('=' | '!'))) =
                            (&tokens[j], tokens.get(j + 1))
                        {
                            matchers.insert(label.clone());
                        }
                        j += 1;
                    }
                    i = j;
                }
            }
            Token::Name(keyword) if keyword == "by" || keyword == "without" => {
                let mut j = i + 2;
                while j < tokens.len() && tokens[j] != Token::Punct(')') {
                    if let Token::Name(label) = &tokens[j] {
                        named.grouped_by.insert(label.clone());
                    }
                    j += 1;
                }
                i = j;
            }
            Token::Name(function) if function == "label_values" => {
                if let Some(Token::Name(label)) = tokens.get(i + 4) {
                    named.grouped_by.insert(label.clone());
                }
            }
            _ => {}
        }
        i += 1;
    }
    named
}

/// What `/metrics` exports: every series name Prometheus stores (a counter `x` as `x_total`, a
/// histogram as `x_bucket`, `x_sum` and `x_count`), and the labels each carries.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(declaration) = line.strip_prefix("# TYPE ") {
            let mut words = declaration.split_whitespace();
            let (name, kind) = (words.next().unwrap(), words.next().unwrap());
            let names = match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => {
                    ["_bucket", "_sum", "_count"].iter().map(|suffix| format!("{name}{suffix}")).collect()
                }
                _ => vec![name.to_owned()],
            };
            for name in names {
                series.entry(name).or_default();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap();
            let labels = series.entry(line[..name_end].to_owned()).or_default();
            if line[name_end..].starts_with('{') {
                let close = line.find('}').unwrap();
                for pair in line[name_end + 1..close].split(',') {
                    labels.insert(pair.split('=').next().unwrap().to_owned());
                }
            }
        }
    }
    series
}

#[test]
fn the_dashboard_reader_finds_metrics_labels_and_groupings() {
    let named = read(
        r#"histogram_quantile(0.99, sum by (scope, le) (rate(plexsphere_x_bucket{instance=~"$instance", scope!="a{b}"}[$__rate_interval]))) / plexsphere_y"#,
    );
    assert_eq!(
        named.metrics,
        BTreeMap::from([
            ("plexsphere_x_bucket".to_owned(), BTreeSet::from(["instance".to_owned(), "scope".to_owned()])),
            ("plexsphere_y".to_owned(), BTreeSet::new()),
        ])
    );
    assert_eq!(named.grouped_by, BTreeSet::from(["scope".to_owned(), "le".to_owned()]));
    let named = read("label_values(plexsphere_leader, instance)");
    assert_eq!(named.grouped_by, BTreeSet::from(["instance".to_owned()]));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn every_metric_and_label_the_grafana_dashboard_queries_is_one_the_service_exports(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "plexsphere-rate-budgets");
    let mut found = Vec::new();
    expressions(&dashboard, &mut found);
    assert!(found.len() >= 20, "only {} expressions found", found.len());

    // A replica that has decided, refused, failed an authentication and swept, so that every
    // labelled family has a series to read labels from.
    let decide_token = "grafana-decide-token-0123456789";
    let knobs = [("PLEXSPHERE_DECIDE_TOKENS", "envoy:grafana-decide-token-0123456789")];
    let replica = Replica::start(config(&connect, &knobs), Arc::new(ManualClock::new(instant()))).await;
    let domain = replica.create_domain("acme", None).await;
    let (_, token) = replica.enrol(&domain, "node-1").await;
    replica.put_secret(&domain, "k", "v").await;
    for _ in 0..25 {
        replica.get("/v1/secrets/k", Some(&token)).await;
    }
    assert_eq!(replica.get("/v1/secrets/k", Some("psn_wrong")).await.status, StatusCode::UNAUTHORIZED);
    // And has decided for another service, by a rule (issue 34: the decide panels).
    let rule =
        serde_json::json!({ "service": "directory", "selector": { "tenant": "*" }, "rate": 1, "burst": 1 });
    let put = replica.operator(reqwest::Method::PUT, "/v1/rules/directory-tenants", Some(rule)).await;
    assert!(put.status.is_success(), "{put:?}");
    let decide = serde_json::json!({ "domain": "directory", "descriptors": [{ "entries": [{ "key": "tenant", "value": "a" }] }] });
    for _ in 0..2 {
        let answer = replica
            .request(
                reqwest::Method::POST,
                "/v1/decide",
                Some(decide_token),
                Some(decide.to_string().into_bytes()),
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    eventually(Duration::from_secs(10), "the leader swept once", || async {
        replica
            .get("/metrics", None)
            .await
            .body
            .as_str()
            .unwrap()
            .contains("plexsphere_rate_budget_sweeps_total{")
    })
    .await;
    let text = replica.get("/metrics", None).await.body.as_str().unwrap().to_owned();
    replica.stop().await;
    let exported = exported(&text);
    let every_label: BTreeSet<&str> =
        exported.values().flatten().map(String::as_str).chain(TARGET_LABELS).collect();

    let mut used = BTreeSet::new();
    for expression in &found {
        let named = read(expression);
        assert!(!named.metrics.is_empty(), "names no plexsphere metric: {expression}");
        for (metric, matched) in &named.metrics {
            let labels = exported
                .get(metric)
                .unwrap_or_else(|| panic!("{metric} is not exported (in {expression}); /metrics:\n{text}"));
            for label in matched {
                assert!(
                    labels.contains(label) || TARGET_LABELS.contains(&label.as_str()),
                    "{metric} has no label {label} (in {expression}); it has {labels:?}"
                );
            }
            used.insert(metric.clone());
        }
        for label in &named.grouped_by {
            assert!(every_label.contains(label.as_str()), "no metric has a label {label} (in {expression})");
        }
    }
    // What the issue asks the dashboard to show.
    for metric in [
        "plexsphere_rate_budget_decisions_total",
        "plexsphere_rate_budget_take_duration_seconds_bucket",
        "plexsphere_rate_budget_fallback_active",
        "plexsphere_rate_budget_precheck_buckets",
        "plexsphere_leader",
        "plexsphere_clock_offset_seconds",
        "plexsphere_decide_decisions_total",
        "plexsphere_decide_duration_seconds_bucket",
        "plexsphere_decide_rule_decisions_total",
    ] {
        assert!(used.contains(metric), "the dashboard does not show {metric}");
    }
    assert!(found.iter().any(|expression| expression.contains("histogram_quantile(0.99")));
}
