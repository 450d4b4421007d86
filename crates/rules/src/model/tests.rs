use super::*;

fn draft() -> RuleDraft {
    RuleDraft {
        service: None,
        scope: "secret_read_node".into(),
        selector: Selector::AllDomains,
        rate: 10.0,
        per_ms: None,
        burst: 20.0,
        algorithm: None,
        mode: None,
        fail_mode: None,
        priority: None,
        charge: None,
    }
}

#[track_caller]
fn rejects(draft: RuleDraft, field: &str) {
    let shown = format!("{draft:?}");
    let error = draft.validate().unwrap_err();
    assert_eq!(error.field, field, "{shown}: {error}");
}

#[test]
fn a_draft_takes_the_defaults_and_sizes_its_limit_per_second() {
    let spec = RuleDraft { per_ms: Some(60_000), rate: 600.0, ..draft() }.validate().unwrap();
    assert_eq!(spec.limit(), Limit::new(10.0, 20.0).unwrap());
    assert_eq!(
        (spec.algorithm(), spec.mode(), spec.fail_mode(), spec.priority()),
        (Algorithm::TokenBucket, Mode::Enforce, FailMode::Closed, 0)
    );
    assert_eq!(draft().validate().unwrap().per_ms(), 1000);
}

#[test]
fn every_bad_field_is_named() {
    rejects(RuleDraft { scope: "secret_read_cluster".into(), ..draft() }, "scope");
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e13] {
        rejects(RuleDraft { rate, ..draft() }, "rate");
    }
    for per_ms in [0, -5, 86_400_001] {
        rejects(RuleDraft { per_ms: Some(per_ms), ..draft() }, "per_ms");
    }
    for burst in [0.0, 0.5, f64::NAN, 1e16, 36_001.0] {
        rejects(RuleDraft { burst, ..draft() }, "burst");
    }
    // One token a minute refills a burst of 61 in 61 minutes: past the sweep's hour.
    rejects(RuleDraft { rate: 1.0, per_ms: Some(60_000), burst: 61.0, ..draft() }, "burst");
    rejects(RuleDraft { algorithm: Some("LEAKY".into()), ..draft() }, "algorithm");
    rejects(RuleDraft { algorithm: Some("GCRA".into()), ..draft() }, "algorithm");
    rejects(RuleDraft { mode: Some("enforce".into()), ..draft() }, "mode");
    rejects(RuleDraft { fail_mode: Some("LOCAL".into()), ..draft() }, "fail_mode");
    rejects(RuleDraft { priority: Some(1 << 31), ..draft() }, "priority");
}

#[test]
fn gcra_governs_issuance_only() {
    let issuance =
        RuleDraft { scope: "access_issuance_domain".into(), algorithm: Some("GCRA".into()), ..draft() };
    assert_eq!(issuance.validate().unwrap().algorithm(), Algorithm::Gcra);
}

#[test]
fn a_gcra_rule_names_a_rate_gcra_cannot_enforce_within_one_percent() {
    // GCRA counts whole microseconds: 7e5 a second would be enforced as 5e5 (or, rounded to
    // the nearest, as 1e6), so it is refused naming the rate; 5e5 divides 1e6 and is exact.
    let gcra = |rate: f64| RuleDraft {
        service: None,
        scope: "access_issuance_domain".into(),
        algorithm: Some("GCRA".into()),
        rate,
        burst: 100.0,
        ..draft()
    };
    rejects(gcra(7e5), "rate");
    assert!(gcra(5e5).validate().is_ok());
    // The token bucket has no such grain.
    assert!(RuleDraft { scope: "access_issuance_domain".into(), rate: 7e5, burst: 100.0, ..draft() }
        .validate()
        .is_ok());
}

#[test]
fn the_refill_rule_is_limits_own_comparison() {
    // The boundary case that once passed Rust and tripped a CHECK: the comparison must be
    // exactly `burst <= per_second * 3600`, with per_second computed as the CHECK computes it.
    let (rate, burst) = (544.7026188767409, 1960929.4279562673);
    let accepted = RuleDraft { rate, burst, ..draft() }.validate().is_ok();
    assert_eq!(accepted, burst <= rate * 3600.0);
    assert_eq!(accepted, Limit::new(rate, burst).is_ok());
    // A rate per second is the rate as given, to the last bit: a Domain's old issuance policy
    // becomes a rule that passes exactly when the policy did.
    let spec = RuleDraft { rate: 0.1, burst: 360.0, ..draft() }.validate().unwrap();
    assert_eq!(spec.limit().per_second(), 0.1);
}

#[test]
fn selectors_are_all_domains_a_tier_or_a_domain() {
    let id = Uuid::new_v4();
    let text = id.to_string();
    assert_eq!(Selector::from_pairs([]), Ok(Selector::AllDomains));
    assert_eq!(Selector::from_pairs([("tier", "premium")]), Ok(Selector::Tier(Tier::Premium)));
    assert_eq!(Selector::from_pairs([("domain", text.as_str())]), Ok(Selector::Domain(id)));
    let nil = Uuid::nil().to_string();
    for bad in [
        vec![("tier", "gold")],
        vec![("domain", "not-a-uuid")],
        vec![("domain", nil.as_str())],
        vec![("tenant", "acme")],
        vec![("tier", "free"), ("domain", text.as_str())],
    ] {
        assert_eq!(Selector::from_pairs(bad.clone()).unwrap_err().field, "selector", "{bad:?}");
    }
}

#[test]
fn rule_ids_are_path_segments() {
    for good in ["a", "dir-users-contoso", "premium.secret_reads", &"x".repeat(128)] {
        assert!(RuleId::parse(good).is_ok(), "{good}");
    }
    for bad in ["", "-leading", "has space", "slash/inside", "é", &"x".repeat(129)] {
        assert_eq!(RuleId::parse(bad).unwrap_err().field, "rule_id", "{bad:?}");
    }
    let domain = Uuid::new_v4();
    assert!(RuleId::parse(RuleId::issuance_override(domain).as_str()).is_ok());
}

#[test]
fn an_etag_is_the_version_in_quotes_and_a_weak_one_never_matches() {
    let three = Version::new(3).unwrap();
    assert_eq!(three.etag(), "\"3\"");
    assert_eq!(Version::from_etag(&three.etag()), Ok(three));
    for bad in ["3", "W/\"3\"", "\"\"", "\"-1\"", "\"0\"", "\"+3\"", "*", "\"99999999999999999999\""] {
        assert_eq!(Version::from_etag(bad).unwrap_err().field, "version", "{bad:?}");
    }
}

#[test]
fn text_forms_read_back() {
    for algorithm in Algorithm::ALL {
        assert_eq!(parse_algorithm(algorithm.as_str()), Ok(*algorithm));
    }
    for mode in Mode::ALL {
        assert_eq!(parse_mode(mode.as_str()), Ok(*mode));
    }
    for fail_mode in FailMode::ALL {
        assert_eq!(parse_fail_mode(fail_mode.as_str()), Ok(*fail_mode));
    }
    // The rules' words are ratebudget's, one vocabulary: the fallback's mode is STATIC.
    assert_eq!(FailMode::Static.as_str(), "STATIC");
    for tier in Tier::ALL {
        assert_eq!(Tier::parse(tier.as_str()), Some(tier));
    }
}

#[test]
fn actors_are_names_without_control_characters() {
    assert!(Actor::new("operator").is_ok());
    for bad in [String::new(), "a\nb".into(), "x".repeat(201)] {
        assert_eq!(Actor::new(bad.clone()).unwrap_err().field, "created_by", "{bad:?}");
    }
}

/// Issue 34, item 5: another service's rule may refill over a day, a week, a year; our own
/// keep the sweep's hour.
#[test]
fn a_services_rule_may_take_up_to_a_year_and_a_day_to_refill_and_ours_an_hour() {
    let service = |rate: f64, per_ms: i64, burst: f64| RuleDraft {
        service: Some(crate::ServiceDraft {
            service: "directory".into(),
            api: None,
            selector: vec![("tenant".into(), "*".into())],
        }),
        rate,
        per_ms: Some(per_ms),
        burst,
        ..draft()
    };
    let daily = service(1000.0, 86_400_000, 1000.0).validate().unwrap();
    assert_eq!(daily.limit().refill_time().as_secs(), 86_400);
    // A year's quota, written per day.
    assert!(service(1000.0 / 365.0, 86_400_000, 1000.0).validate().is_ok());
    assert_eq!(service(1.0, 86_400_000, 367.0).validate().unwrap_err().field, "burst");
    rejects(RuleDraft { rate: 1000.0, per_ms: Some(86_400_000), burst: 1000.0, ..draft() }, "burst");
}

/// Issue 34, item 4: another service's rule may charge its costs always (a token budget);
/// ours charge only what a bucket covers.
#[test]
fn only_a_services_rule_may_charge_always() {
    let service = |charge: Option<&str>| RuleDraft {
        service: Some(crate::ServiceDraft {
            service: "llm".into(),
            api: None,
            selector: vec![("tenant".into(), "*".into())],
        }),
        charge: charge.map(str::to_owned),
        ..draft()
    };
    assert_eq!(service(None).validate().unwrap().charge(), Charge::WhenCovered);
    assert_eq!(service(Some("WHEN_COVERED")).validate().unwrap().charge(), Charge::WhenCovered);
    assert_eq!(service(Some("ALWAYS")).validate().unwrap().charge(), Charge::Always);
    rejects(service(Some("always")), "charge");
    assert_eq!(draft().validate().unwrap().charge(), Charge::WhenCovered);
    rejects(RuleDraft { charge: Some("ALWAYS".into()), ..draft() }, "charge");
    for charge in [Charge::WhenCovered, Charge::Always] {
        assert_eq!(Charge::from_text(charge.as_str()), Some(charge));
    }
}
