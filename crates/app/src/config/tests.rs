use super::*;

const REQUIRED: [(&str, &str); 2] =
    [(DATABASE_URL, "postgres://postgres@127.0.0.1:5432/postgres"), (OPERATOR_TOKEN, "0123456789abcdef0123")];

fn parse(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let knobs = Knobs::from_pairs(REQUIRED.iter().chain(pairs).copied()).expect("knobs parse");
    Config::from_knobs(&knobs)
}

#[track_caller]
fn rejects(pairs: &[(&str, &str)], knob: &str) {
    let error = parse(pairs).unwrap_err();
    assert_eq!(error.knob, knob, "{error}");
}

#[test]
fn defaults_refill_to_full_in_the_documented_seconds() {
    let config = parse(&[]).unwrap();
    let seconds = |limit: Limit| limit.refill_time().as_secs_f64();
    assert_eq!(seconds(config.limits.secret_read_node), 2.0);
    assert_eq!(seconds(config.limits.secret_read_domain), 2.0);
    assert_eq!(seconds(config.limits.access_issuance), 5.0);
    assert_eq!(seconds(config.limits.ingest_node), 4.0);
    assert_eq!(seconds(config.limits.ingest_domain), 4.0);
    assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(config.sweep_interval, Duration::from_secs(3600));
}

#[test]
fn knobs_override_the_defaults() {
    let config = parse(&[
        (SECRET_READ_NODE_PER_SECOND, "2.5"),
        (SECRET_READ_NODE_BURST, "5"),
        (SWEEP_INTERVAL_SECS, "60"),
        (LISTEN, "0.0.0.0:9000"),
    ])
    .unwrap();
    assert_eq!(config.limits.secret_read_node, Limit::new(2.5, 5.0).unwrap());
    assert_eq!(config.sweep_interval, Duration::from_secs(60));
    assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
}

#[test]
fn invalid_knobs_are_named() {
    rejects(&[(OPERATOR_TOKEN, "short")], OPERATOR_TOKEN);
    rejects(&[(DATABASE_URL, "mysql://x")], DATABASE_URL);
    rejects(&[(ACCESS_ISSUANCE_PER_SECOND, "0")], ACCESS_ISSUANCE_PER_SECOND);
    rejects(&[(ACCESS_ISSUANCE_PER_SECOND, "NaN")], ACCESS_ISSUANCE_PER_SECOND);
    rejects(&[(SECRET_READ_DOMAIN_BURST, "0.5")], SECRET_READ_DOMAIN_BURST);
    rejects(&[(SWEEP_INTERVAL_SECS, "0")], SWEEP_INTERVAL_SECS);
    rejects(&[(LISTEN, "localhost")], LISTEN);
    rejects(&[(DATABASE_TIMEOUT_MS, "0")], DATABASE_TIMEOUT_MS);
    rejects(&[(INGEST_NODE_BYTES_BURST, "1000")], INGEST_NODE_BYTES_BURST);
    // Rates so large that refill arithmetic would overflow float8 in the database.
    rejects(&[(INGEST_DOMAIN_BYTES_PER_SECOND, "1e300")], INGEST_DOMAIN_BYTES_PER_SECOND);
    // 20 reads at one every ten minutes: over an hour to refill.
    rejects(&[(SECRET_READ_NODE_PER_SECOND, "0.0016")], SECRET_READ_NODE_BURST);
    rejects(&[(HTTP_HEADER_TIMEOUT_MS, "0")], HTTP_HEADER_TIMEOUT_MS);
    rejects(&[(HTTP_BODY_TIMEOUT_MS, "99")], HTTP_BODY_TIMEOUT_MS);
    rejects(&[(HTTP_MAX_CONNECTIONS, "0")], HTTP_MAX_CONNECTIONS);
    // A request deadline at or below the database's would hide the database's own 500.
    rejects(&[(HTTP_REQUEST_TIMEOUT_MS, "3000")], HTTP_REQUEST_TIMEOUT_MS);
    rejects(&[(SHUTDOWN_GRACE_SECS, "3601")], SHUTDOWN_GRACE_SECS);
    rejects(&[(MAX_CLOCK_SKEW_MS, "5")], MAX_CLOCK_SKEW_MS);
}

#[test]
fn http_limits_and_clock_bound_have_bounded_defaults() {
    let config = parse(&[]).unwrap();
    assert_eq!(
        config.http,
        HttpLimits {
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(15),
            max_connections: 1024,
        }
    );
    assert_eq!(config.shutdown_grace, Duration::from_secs(15));
    assert_eq!(config.max_clock_skew, Duration::from_secs(1));
}

#[test]
fn values_that_do_not_parse_are_named_by_the_parser() {
    let error = Knobs::from_pairs(REQUIRED.iter().chain(&[(SECRET_READ_DOMAIN_BURST, "lots")]).copied())
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("secret-read-domain-burst") && error.contains("lots"), "{error}");
    let missing = Knobs::from_pairs([(DATABASE_URL, "postgres://x/y")]).err().unwrap().to_string();
    assert!(missing.contains("operator-token"), "{missing}");
}

#[test]
fn every_budget_must_refill_within_the_sweeps_retention_by_the_stores_rule() {
    let config = parse(&[(ACCESS_ISSUANCE_PER_SECOND, "0.01"), (ACCESS_ISSUANCE_BURST, "36")]).unwrap();
    assert_eq!(config.limits.access_issuance, Limit::new(0.01, 36.0).unwrap());
    rejects(&[(ACCESS_ISSUANCE_PER_SECOND, "0.01"), (ACCESS_ISSUANCE_BURST, "36.5")], ACCESS_ISSUANCE_BURST);
}

#[test]
fn every_knob_has_a_variable_and_help_lists_them_all() {
    let names = Knobs::names();
    assert!(names.len() >= 17, "{names:?}");
    let help = Knobs::augment_args(clap::Command::new("serve")).render_long_help().to_string();
    for name in &names {
        assert!(help.contains(name.as_str()), "{name} is missing from --help");
    }
}

#[test]
fn debug_does_not_show_the_operator_token_or_the_database_password() {
    let config = parse(&[(DATABASE_URL, "postgres://app:pa55word@db.internal:5433/plexsphere")]).unwrap();
    let shown = format!("{config:?}");
    assert!(!shown.contains("0123456789abcdef0123"), "{shown}");
    assert!(!shown.contains("pa55word"), "{shown}");
    assert!(shown.contains("db.internal"), "{shown}");
}

#[test]
fn rule_knobs_are_bounded_and_fail_modes_may_be_open() {
    let config = parse(&[(INGEST_NODE_FAIL_MODE, "open"), (RULES_POLL_INTERVAL_MS, "250")]).unwrap();
    assert_eq!(config.fail_modes[&Scope::IngestNode], FailMode::Open);
    assert_eq!(config.fail_modes[&Scope::IngestDomain], FailMode::Closed);
    assert_eq!(config.rules_poll_interval, Duration::from_millis(250));
    assert_eq!(config.rule_usage_flush_interval, Duration::from_secs(10));
    rejects(&[(RULES_POLL_INTERVAL_MS, "99")], RULES_POLL_INTERVAL_MS);
    rejects(&[(RULE_USAGE_FLUSH_INTERVAL_MS, "600001")], RULE_USAGE_FLUSH_INTERVAL_MS);
}
