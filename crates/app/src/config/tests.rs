use super::*;
use ratebudget::FailMode;

/// Base64 of 32 bytes of 0x11.
const KEY: &str = "ERERERERERERERERERERERERERERERERERERERERERE=";
/// Base64 of 32 bytes of 0x22.
const OLD_KEY: &str = "IiIiIiIiIiIiIiIiIiIiIiIiIiIiIiIiIiIiIiIiIiI=";

const REQUIRED: [(&str, &str); 3] = [
    (DATABASE_URL, "postgres://postgres@127.0.0.1:5432/postgres"),
    (OPERATOR_TOKEN, "0123456789abcdef0123"),
    (SECRETS_KEY, KEY),
];

fn parse(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let knobs = Knobs::from_pairs(REQUIRED.iter().chain(pairs).copied()).expect("knobs parse");
    Config::from_knobs(&knobs)
}

/// The required knobs but the operator token, which the operator tests give their own way.
fn parse_without_operator_token(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let required = REQUIRED.iter().filter(|(knob, _)| *knob != OPERATOR_TOKEN);
    let knobs = Knobs::from_pairs(required.chain(pairs).copied()).expect("knobs parse");
    Config::from_knobs(&knobs)
}

/// `pairs` are refused, naming `knob`: by its value parser (a value out of the knob's range,
/// which `--help` shows) or by [`Config::from_knobs`] (a value that conflicts with another).
#[track_caller]
fn rejects(pairs: &[(&str, &str)], knob: &str) {
    match Knobs::from_pairs(REQUIRED.iter().chain(pairs).copied()) {
        Err(parser) => {
            let message = parser.to_string();
            assert!(message.contains(&format!("<{knob}>")), "{message}");
        }
        Ok(knobs) => {
            let error = Config::from_knobs(&knobs).unwrap_err();
            assert_eq!(error.knob, knob, "{error}");
        }
    }
}

#[test]
fn defaults_refill_to_full_in_the_documented_seconds() {
    let config = parse(&[]).unwrap();
    let seconds = |limit: Limit| limit.refill_time().as_secs_f64();
    assert_eq!(seconds(config.budgets.defaults.of(Scope::SecretReadNode).limit), 2.0);
    assert_eq!(seconds(config.budgets.defaults.of(Scope::SecretReadDomain).limit), 2.0);
    assert_eq!(seconds(config.budgets.defaults.of(Scope::AccessIssuanceDomain).limit), 5.0);
    assert_eq!(seconds(config.budgets.defaults.of(Scope::IngestNode).limit), 4.0);
    assert_eq!(seconds(config.budgets.defaults.of(Scope::IngestDomain).limit), 4.0);
    assert_eq!(config.http.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(config.budgets.sweep_interval, Duration::from_secs(3600));
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
    assert_eq!(config.budgets.defaults.of(Scope::SecretReadNode).limit, Limit::new(2.5, 5.0).unwrap());
    assert_eq!(config.budgets.sweep_interval, Duration::from_secs(60));
    assert_eq!(config.http.listen, "0.0.0.0:9000".parse().unwrap());
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
    rejects(&[(TAKE_BATCH_MAX, "0")], TAKE_BATCH_MAX);
    rejects(&[(TAKE_BATCH_MAX, "1025")], TAKE_BATCH_MAX);
    rejects(&[(SECRET_CACHE_CAPACITY, "10000001")], SECRET_CACHE_CAPACITY);
    rejects(&[(DECISION_TIMEOUT_MS, "9")], DECISION_TIMEOUT_MS);
    // GCRA counts whole microseconds: 7e5 failures a second would be enforced as 5e5.
    rejects(&[(AUTH_FAILURE_PER_SECOND, "700000"), (AUTH_FAILURE_BURST, "20")], AUTH_FAILURE_PER_SECOND);
}

#[test]
fn a_take_gives_up_on_the_store_before_the_request_gives_up_on_the_take() {
    // At or above the request's database deadline, a take would be dropped mid-wait and its
    // fail mode would never decide it.
    for (decision, database) in [("3000", "3000"), ("5000", "3000")] {
        let error = parse(&[(DECISION_TIMEOUT_MS, decision), (DATABASE_TIMEOUT_MS, database)]).unwrap_err();
        assert_eq!(error.knob, DECISION_TIMEOUT_MS);
        let message = error.to_string();
        assert!(message.contains(DATABASE_TIMEOUT_MS) && message.contains(DECISION_TIMEOUT_MS), "{message}");
    }
    let config = parse(&[(DECISION_TIMEOUT_MS, "2999"), (DATABASE_TIMEOUT_MS, "3000")]).unwrap();
    assert_eq!(config.budgets.decision_timeout, Duration::from_millis(2999));
}

#[test]
fn http_limits_and_clock_bound_have_bounded_defaults() {
    let config = parse(&[]).unwrap();
    assert_eq!(
        config.http,
        HttpConfig {
            listen: "127.0.0.1:8080".parse().unwrap(),
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(15),
            max_connections: 1024,
        }
    );
    assert_eq!(config.shutdown_grace, Duration::from_secs(15));
    assert_eq!(config.budgets.max_clock_skew, Duration::from_secs(1));
}

#[test]
fn values_that_do_not_parse_are_named_by_the_parser() {
    let error = Knobs::from_pairs(REQUIRED.iter().chain(&[(SECRET_READ_DOMAIN_BURST, "lots")]).copied())
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("secret-read-domain-burst") && error.contains("lots"), "{error}");
}

#[test]
fn a_missing_database_url_names_the_variable_and_the_tests_default_is_nobodys_choice() {
    // Issue 21: clap named only --database-url; and .cargo/config.toml's default for the tests
    // reached `cargo run` too, so serve connected to a database nobody named.
    let knobs =
        Knobs::from_pairs([(SECRETS_KEY, KEY), (OPERATOR_TOKEN, "operator-token-0123456789")]).unwrap();
    let missing = Config::from_knobs(&knobs).unwrap_err();
    assert_eq!(missing.knob, DATABASE_URL);
    assert!(missing.to_string().contains("DATABASE_URL: is required"), "{missing}");
    let default = "postgres://postgres@127.0.0.1:5432/postgres?application_name=plexsphere-tests-default";
    let error = parse(&[(DATABASE_URL, default)]).unwrap_err();
    assert_eq!(error.knob, DATABASE_URL);
    assert!(error.to_string().contains("is not set"), "{error}");
    // The same database named by its user is fine.
    assert!(parse(&[(DATABASE_URL, "postgres://postgres@127.0.0.1:5432/postgres")]).is_ok());
    // The repository's own file carries exactly that mark.
    let cargo_config = include_str!("../../../../.cargo/config.toml");
    assert!(cargo_config.contains(default), "{cargo_config}");
}

#[test]
fn every_budget_must_refill_within_the_sweeps_retention_by_the_stores_rule() {
    let config = parse(&[(ACCESS_ISSUANCE_PER_SECOND, "0.01"), (ACCESS_ISSUANCE_BURST, "36")]).unwrap();
    assert_eq!(
        config.budgets.defaults.of(Scope::AccessIssuanceDomain).limit,
        Limit::new(0.01, 36.0).unwrap()
    );
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
fn the_secrets_key_is_required_and_must_be_32_bytes_of_base64() {
    let missing =
        Knobs::from_pairs(REQUIRED.iter().copied().filter(|(knob, _)| *knob != SECRETS_KEY)).unwrap();
    let error = Config::from_knobs(&missing).unwrap_err();
    assert_eq!(error.knob, SECRETS_KEY);
    assert!(error.to_string().contains("openssl rand -base64 32"), "{error}");
    for bad in ["", "not base64!", "c2hvcnQ=", "ERERERERERERERERERERERERERERERERERERERERERE"] {
        rejects(&[(SECRETS_KEY, bad)], SECRETS_KEY);
    }
    rejects(&[(SECRETS_OLD_KEYS, &format!("{OLD_KEY},short"))], SECRETS_OLD_KEYS);
}

#[test]
fn old_keys_are_a_comma_separated_list_and_open_what_they_sealed() {
    let config = parse(&[(SECRETS_OLD_KEYS, &format!(" {OLD_KEY} ,,{KEY}"))]).unwrap();
    let current = secrets::SecretsKey::from_base64(KEY).unwrap();
    let old = secrets::SecretsKey::from_base64(OLD_KEY).unwrap();
    assert_eq!(config.secrets.keyring.current_key_id(), current.id());
    let domain = secrets::DomainId::from(uuid::Uuid::new_v4());
    let name = secrets::SecretName::parse("n").unwrap();
    let value = secrets::SecretValue::new("v").unwrap();
    let sealed = secrets::Keyring::new(old, []).seal(domain, &name, &value);
    assert_eq!(config.secrets.keyring.open(domain, &name, &secrets::StoredValue::Sealed(sealed)), Ok(value));
}

#[test]
fn a_key_knob_error_never_repeats_the_key() {
    let almost = &KEY[..40];
    for (knob, value) in [(SECRETS_KEY, almost.to_owned()), (SECRETS_OLD_KEYS, format!("{OLD_KEY},{almost}"))]
    {
        let error = parse(&[(knob, &value)]).unwrap_err().to_string();
        assert!(!error.contains(almost) && !error.contains(OLD_KEY), "{error}");
    }
    let shown = format!("{:?}", parse(&[(SECRETS_OLD_KEYS, OLD_KEY)]).unwrap());
    assert!(!shown.contains(KEY) && !shown.contains(OLD_KEY), "{shown}");
}

#[track_caller]
fn operators(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let config = parse_without_operator_token(pairs).unwrap();
    config
        .auth
        .operators
        .into_iter()
        .map(|operator| (operator.name.as_str().to_owned(), operator.token.to_string()))
        .collect()
}

#[test]
fn operator_tokens_are_named_and_the_single_token_is_the_operator() {
    let alice = "alice-token-0123456789";
    let bob = "bob-token-0123456789:with-a-colon";
    assert_eq!(
        operators(&[(OPERATOR_TOKENS, &format!(" alice:{alice} , bob:{bob},"))]),
        [("alice".to_owned(), alice.to_owned()), ("bob".to_owned(), bob.to_owned())]
    );
    assert_eq!(operators(&[(OPERATOR_TOKEN, alice)]), [("operator".to_owned(), alice.to_owned())]);
    assert_eq!(
        operators(&[(OPERATOR_TOKEN, alice), (OPERATOR_TOKENS, &format!("bob:{bob}"))]),
        [("operator".to_owned(), alice.to_owned()), ("bob".to_owned(), bob.to_owned())]
    );
}

#[test]
fn unusable_operator_tokens_are_refused_naming_the_knob_never_the_token() {
    let base = |pairs: &[(&'static str, &'static str)]| -> ConfigError {
        parse_without_operator_token(pairs).unwrap_err()
    };
    assert_eq!(base(&[]).knob, OPERATOR_TOKENS);
    for (pairs, knob) in [
        (&[(OPERATOR_TOKEN, "short")][..], OPERATOR_TOKEN),
        (&[(OPERATOR_TOKENS, "alice:short")], OPERATOR_TOKENS),
        (&[(OPERATOR_TOKENS, "no-colon-token-0123456789")], OPERATOR_TOKENS),
        (&[(OPERATOR_TOKENS, "al ice:0123456789abcdef")], OPERATOR_TOKENS),
        (&[(OPERATOR_TOKENS, ":0123456789abcdef")], OPERATOR_TOKENS),
        (&[(OPERATOR_TOKENS, "a:0123456789abcdef,a:fedcba9876543210")], OPERATOR_TOKENS),
        (&[(OPERATOR_TOKENS, "a:0123456789abcdef,b:0123456789abcdef")], OPERATOR_TOKENS),
        (
            &[(OPERATOR_TOKEN, "0123456789abcdef"), (OPERATOR_TOKENS, "operator:fedcba9876543210")],
            OPERATOR_TOKENS,
        ),
    ] {
        let error = base(pairs);
        assert_eq!(error.knob, knob, "{pairs:?}: {error}");
        let shown = error.to_string();
        assert!(!shown.contains("0123456789abcdef") && !shown.contains("short"), "{shown}");
    }
}

#[test]
fn rule_knobs_are_bounded_and_fail_modes_may_be_open() {
    let config = parse(&[(INGEST_NODE_FAIL_MODE, "open"), (RULES_POLL_INTERVAL_MS, "250")]).unwrap();
    assert_eq!(config.budgets.defaults.of(Scope::IngestNode).fail_mode, FailMode::Open);
    assert_eq!(config.budgets.defaults.of(Scope::IngestDomain).fail_mode, FailMode::Closed);
    assert_eq!(config.budgets.rules_poll_interval, Duration::from_millis(250));
    assert_eq!(config.budgets.rule_usage_flush_interval, Duration::from_secs(10));
    rejects(&[(RULES_POLL_INTERVAL_MS, "99")], RULES_POLL_INTERVAL_MS);
    rejects(&[(RULE_USAGE_FLUSH_INTERVAL_MS, "600001")], RULE_USAGE_FLUSH_INTERVAL_MS);
}

#[test]
fn the_otlp_export_is_off_by_default_and_pushes_to_the_collectors_metrics_path() {
    assert_eq!(parse(&[]).unwrap().otlp, None);
    let config = parse(&[(OTLP_ENDPOINT, "http://127.0.0.1:4318/")]).unwrap();
    assert_eq!(
        config.otlp,
        Some(OtlpConfig {
            metrics_url: "http://127.0.0.1:4318/v1/metrics".to_owned(),
            interval: Duration::from_secs(60),
        })
    );
    let config = parse(&[(OTLP_ENDPOINT, "http://collector:4318"), (OTLP_INTERVAL_MS, "500")]).unwrap();
    assert_eq!(config.otlp.unwrap().interval, Duration::from_millis(500));
}

#[test]
fn an_otlp_endpoint_that_is_not_a_plain_http_url_is_refused_by_name() {
    for endpoint in ["https://collector:4318", "collector:4318", "http://", "not a url", "http://c:4318/?a=b"]
    {
        rejects(&[(OTLP_ENDPOINT, endpoint)], OTLP_ENDPOINT);
    }
    for interval in ["0", "99", "3600001"] {
        rejects(&[(OTLP_ENDPOINT, "http://collector:4318"), (OTLP_INTERVAL_MS, interval)], OTLP_INTERVAL_MS);
    }
}

#[test]
fn the_fallback_fail_mode_is_static_as_in_the_rules_and_local_still_reads() {
    // Issue 22: one name for the fallback's mode everywhere; the knob's old spelling works.
    for spelling in ["static", "local"] {
        let config = parse(&[(SECRET_READ_NODE_FAIL_MODE, spelling)]).unwrap();
        assert_eq!(
            config.budgets.defaults.of(Scope::SecretReadNode).fail_mode,
            FailMode::Static,
            "{spelling}"
        );
    }
}

#[test]
fn trusted_proxies_are_addresses_or_ranges() {
    assert_eq!(parse_trusted_proxies(" 10.0.0.1 , fd00::/8").unwrap().len(), 2);
    assert!(parse_trusted_proxies("10.0.0.1, nonsense").unwrap_err().contains("nonsense"));
    assert!(parse_trusted_proxies("").unwrap().is_empty());
    rejects(&[(TRUSTED_PROXIES, "10.0.0.1, nonsense")], TRUSTED_PROXIES);
}

#[test]
fn help_shows_each_ranged_knobs_range_as_its_parser_enforces_it() {
    // Issue 22: a knob's range is written once, in its value parser; its help says it.
    let help = Knobs::augment_args(clap::Command::new("plexsphere")).render_long_help().to_string();
    for (knob, below, lowest, highest, above) in [
        (DATABASE_TIMEOUT_MS, "49", "50", "60000", "60001"),
        (TAKE_BATCH_MAX, "0", "1", "1024", "1025"),
        (MAX_CLOCK_SKEW_MS, "9", "10", "60000", "60001"),
        (HTTP_BODY_TIMEOUT_MS, "99", "100", "600000", "600001"),
    ] {
        assert!(help.contains(&format!("({lowest} to {highest}")), "{knob}: {help}");
        rejects(&[(knob, below)], knob);
        rejects(&[(knob, above)], knob);
    }
}

/// Issue 32: a decide token names the services it decides for, or every service but ours.
#[test]
fn a_decide_token_decides_for_the_services_it_names_or_every_service_but_ours() {
    let config = parse(&[(
        DECIDE_TOKENS,
        "envoy:envoy-token-0123456789, edge:edge-token-0123456789:directory|billing.v2",
    )])
    .unwrap();
    let callers: Vec<(&str, &Services)> =
        config.auth.decide_callers.iter().map(|caller| (caller.name.as_str(), &caller.services)).collect();
    assert_eq!(
        callers,
        [
            ("envoy", &Services::AllButOwn),
            ("edge", &Services::Only(vec!["directory".to_owned(), "billing.v2".to_owned()].into())),
        ]
    );
    for refused in [
        "edge:edge-token-0123456789:plexsphere",
        "edge:edge-token-0123456789:directory|directory",
        "edge:edge-token-0123456789:",
        "edge:edge-token-0123456789:direct ory",
        "edge",
    ] {
        rejects(&[(DECIDE_TOKENS, refused)], DECIDE_TOKENS);
    }
}
