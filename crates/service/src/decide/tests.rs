use super::*;

#[test]
fn a_limit_is_said_in_the_smallest_unit_in_which_it_is_whole() {
    let said = |per_second: f64| {
        let limit = Limit::new(per_second, 1.0).unwrap();
        let current = CurrentLimit::of("r", limit);
        (current.requests_per_unit, current.unit)
    };
    assert_eq!(said(50.0), (50, Unit::Second));
    assert_eq!(said(1.0 / 60.0), (1, Unit::Minute));
    assert_eq!(said(2.5), (150, Unit::Minute));
    assert_eq!(said(1.0 / 3600.0 * 7.0), (7, Unit::Hour));
    // 1/13 a second is no whole number in any unit: rounded down in the smallest unit that
    // holds a request (it was 0 a SECOND, which tells Envoy nothing is admitted).
    assert_eq!(said(1.0 / 13.0), (4, Unit::Minute));
    // 1/7 a second is a whole 86,400 a week.
    assert_eq!(said(1.0 / 7.0), (86_400, Unit::Week));
    // 1,000 a week, written as a day's fraction: a whole 1,000 a WEEK.
    assert_eq!(said(1000.0 / (7.0 * 86_400.0)), (1000, Unit::Week));
}

#[test]
fn a_bucket_is_its_service_the_rules_api_and_the_attributes_it_names() {
    let contoso = [("tenant", "contoso")];
    let key = runtime_key("directory", "r", Some("GET /v1/users"), &contoso);
    assert_eq!(key, runtime_key("directory", "r", Some("GET /v1/users"), &contoso));
    assert_ne!(key, runtime_key("billing", "r", Some("GET /v1/users"), &contoso));
    assert_ne!(
        key,
        runtime_key("directory", "r", None, &contoso),
        "a rule for every API is one bucket across them"
    );
    assert_ne!(key, runtime_key("directory", "r", Some("GET /v1/users"), &[("tenant", "fabrikam")]));
    // Length prefixes: moving a boundary between key and value is another bucket.
    assert_ne!(runtime_key("s", "r", None, &[("ab", "c")]), runtime_key("s", "r", None, &[("a", "bc")]));
    // An API named `*` is not the same as no API named.
    assert_ne!(runtime_key("s", "r", Some("*"), &[]), runtime_key("s", "r", None, &[]));
    // Each rule its own buckets.
    assert_ne!(runtime_key("s", "a", None, &[("t", "x")]), runtime_key("s", "b", None, &[("t", "x")]));
    assert_eq!(key.as_uuid().as_u64_pair().0, 0, "64 bits");
}

mod service {
    use std::sync::Mutex;

    use chrono::Utc;
    use ratebudget::{Decider, LeaseRequest, Leased, ManualClock, Refusal};
    use rules::{Rule, Services, Snapshot};

    use super::super::*;
    use crate::budgets::{Precheck, RuleBudgets};
    use crate::defaults::{DefaultBudget, DefaultBudgets};

    /// A store that refuses every take's second bucket (or its only one) and remembers what
    /// it was asked: the decide service's own logic, without a database.
    #[derive(Debug, Default)]
    struct Refusing(Mutex<Vec<Take>>);

    #[async_trait::async_trait]
    impl Decider for Refusing {
        async fn decide(&self, take: Take, _: DateTime<Utc>) -> Result<Decision, Undecided> {
            let which = if take.len() >= 2 { Which::Second } else { Which::First };
            self.0.lock().unwrap().push(take);
            Ok(Decision::Refused(Refusal {
                which,
                retry_after: Duration::from_secs(1),
                judged: None,
                tat: None,
            }))
        }

        async fn lease(&self, _: LeaseRequest, _: DateTime<Utc>) -> Result<Option<Leased>, Undecided> {
            Ok(None)
        }
    }

    #[derive(Debug)]
    struct NoPrecheck;

    impl Precheck for NoPrecheck {
        fn forget(&self, _: ratebudget::Name, _: Key) {}
        fn forget_every_bucket_of(&self, _: ratebudget::Name) {}
        fn remembered_buckets(&self) -> u64 {
            0
        }
    }

    fn rule(id: &str, api: &str, selector: &[(&str, &str)], rate: f64) -> Rule {
        crate::fixtures::rule(id, crate::fixtures::service_spec(Some(api), selector, rate, None, rate))
    }

    struct Decided {
        service: DecideService,
        store: Arc<Refusing>,
        heard: Arc<Mutex<Vec<(String, Outcome)>>>,
        ruled: Arc<Mutex<Vec<(String, Verdict)>>>,
    }

    struct Hearing(Arc<Mutex<Vec<(String, Outcome)>>>, Arc<Mutex<Vec<(String, Verdict)>>>);

    impl DecideObserver for Hearing {
        fn decided(&self, service: &str, outcome: Outcome, _: Duration) {
            self.0.lock().unwrap().push((service.to_owned(), outcome));
        }

        fn ruled(&self, _: &str, rule: &str, verdict: Verdict) {
            self.1.lock().unwrap().push((rule.to_owned(), verdict));
        }
    }

    fn decided() -> Decided {
        let defaults = DefaultBudgets::try_from_fn(|_| {
            Ok::<_, ()>(DefaultBudget {
                limit: Limit::new(1.0, 1.0).unwrap(),
                fail_mode: ratebudget::FailMode::Closed,
            })
        })
        .unwrap();
        let budgets = Arc::new(RuleBudgets::new(defaults, Arc::new(NoPrecheck), rules::RuleRefs::default()));
        budgets.install_rules(Snapshot::compile(
            1,
            vec![
                rule("per-tenant", "*", &[("tenant", "*")], 5.0),
                rule("per-user", "*", &[("user", "*")], 2.0),
                rule("per-region", "*", &[("region", "*")], 2.0),
            ],
        ));
        budgets.install_tiers(access::TierDirectory { revision: 0, tiers: Vec::new() });
        let store = Arc::new(Refusing::default());
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(Utc::now()));
        let spender = Spender::new(store.clone(), clock.clone(), budgets.clone());
        let heard = Arc::new(Mutex::new(Vec::new()));
        let ruled = Arc::new(Mutex::new(Vec::new()));
        let service =
            DecideService::new(budgets, spender, clock, Arc::new(Hearing(heard.clone(), ruled.clone())));
        Decided { service, store, heard, ruled }
    }

    fn request(descriptors: &[&[(&str, &str)]]) -> Request {
        Request {
            service: "directory".into(),
            descriptors: descriptors
                .iter()
                .map(|entries| Descriptor {
                    entries: entries
                        .iter()
                        .map(|(key, value)| Entry { key: (*key).to_owned(), value: (*value).to_owned() })
                        .collect(),
                    hits_addend: None,
                    limit: None,
                })
                .collect(),
            hits_addend: 0,
        }
    }

    #[tokio::test]
    async fn two_governed_descriptors_are_one_pair_keyed_by_what_each_rule_names() {
        let decided = decided();
        let answer = decided
            .service
            .decide(
                &Services::AllButOwn,
                &request(&[&[("tenant", "contoso"), ("sku", "x1")], &[("user", "alice")]]),
            )
            .await
            .unwrap();
        assert_eq!(answer.overall, Code::OverLimit);
        assert_eq!(answer.statuses[0].code, Code::Ok, "the first bucket was not the one refused");
        assert_eq!(answer.statuses[1].code, Code::OverLimit);
        assert_eq!(answer.statuses[1].current_limit.as_ref().unwrap().rule_id, "per-user");
        assert!(answer.headers.contains(&("retry-after", "1".to_owned())));
        let takes = decided.store.0.lock().unwrap().clone();
        let [Take::Pair(first, second)] = takes.as_slice() else { panic!("one pair: {takes:?}") };
        assert_eq!(
            first.key,
            runtime_key("directory", "per-tenant", None, &[("tenant", "contoso")]),
            "sku is not named"
        );
        assert_eq!(second.key, runtime_key("directory", "per-user", None, &[("user", "alice")]));
        assert_eq!(*decided.heard.lock().unwrap(), [("directory".to_owned(), Outcome::OverLimit)]);
        // Per rule: the refused one over its limit; the other, whose bucket the refusal left
        // unread, within it.
        assert_eq!(
            *decided.ruled.lock().unwrap(),
            [("per-tenant".to_owned(), Verdict::WithinLimit), ("per-user".to_owned(), Verdict::OverLimit)]
        );
    }

    #[tokio::test]
    async fn every_governed_descriptor_is_one_take_in_the_requests_order_and_answered_at_its_own_position() {
        // Issue 34, item 3: more than two governed descriptors were over the limit with
        // nothing asked; now they are one take of as many buckets, all or nothing.
        let decided = decided();
        let answer = decided
            .service
            .decide(
                &Services::AllButOwn,
                &request(&[&[("tenant", "a")], &[("user", "b")], &[("colour", "red")], &[("region", "eu")]]),
            )
            .await
            .unwrap();
        let takes = decided.store.0.lock().unwrap().clone();
        let [Take::Many(spends)] = takes.as_slice() else { panic!("one take of many: {takes:?}") };
        let keys: Vec<Key> = spends.iter().map(|spend| spend.key).collect();
        assert_eq!(
            keys,
            [
                runtime_key("directory", "per-tenant", None, &[("tenant", "a")]),
                runtime_key("directory", "per-user", None, &[("user", "b")]),
                runtime_key("directory", "per-region", None, &[("region", "eu")]),
            ],
            "the ungoverned descriptor costs nothing"
        );
        // The store refused the take's second bucket: the user's descriptor, and only it.
        assert_eq!(answer.overall, Code::OverLimit);
        let codes: Vec<Code> = answer.statuses.iter().map(|status| status.code).collect();
        assert_eq!(codes, [Code::Ok, Code::OverLimit, Code::Ok, Code::Ok]);
        assert_eq!(answer.statuses[3].current_limit.as_ref().unwrap().rule_id, "per-region");
        assert_eq!(
            *decided.ruled.lock().unwrap(),
            [
                ("per-tenant".to_owned(), Verdict::WithinLimit),
                ("per-user".to_owned(), Verdict::OverLimit),
                ("per-region".to_owned(), Verdict::WithinLimit),
            ]
        );
    }

    #[tokio::test]
    async fn an_ungoverned_request_costs_no_statement_and_an_unknown_service_is_other() {
        let decided = decided();
        let mut unknown = request(&[&[("tenant", "a")]]);
        unknown.service = "no such service, not even a valid name".into();
        let answer = decided.service.decide(&Services::AllButOwn, &unknown).await.unwrap();
        assert_eq!(answer.overall, Code::Ok);
        assert_eq!(answer.statuses[0].current_limit, None);
        assert!(decided.store.0.lock().unwrap().is_empty());
        assert_eq!(*decided.heard.lock().unwrap(), [("other".to_owned(), Outcome::Ok)]);
    }

    #[tokio::test]
    async fn a_cost_above_every_burst_reaches_the_take_whole() {
        let decided = decided();
        let mut huge = request(&[&[("tenant", "a")]]);
        huge.descriptors[0].hits_addend = Some(u64::MAX);
        decided.service.decide(&Services::AllButOwn, &huge).await.unwrap();
        let takes = decided.store.0.lock().unwrap().clone();
        let [Take::Single(spend)] = takes.as_slice() else { panic!("{takes:?}") };
        assert!(spend.cost > Limit::MAX_BURST, "never rounded down into a bucket: {}", spend.cost);
    }

    #[tokio::test]
    async fn only_a_message_without_a_domain_or_with_an_empty_descriptor_is_invalid() {
        let decided = decided();
        let mut no_domain = request(&[&[("tenant", "a")]]);
        no_domain.service = String::new();
        let empty = request(&[&[("tenant", "a")], &[]]);
        for malformed in [no_domain, empty] {
            let refused = decided.service.decide(&Services::AllButOwn, &malformed).await.unwrap_err();
            assert!(matches!(refused, DecideError::Invalid { .. }), "{refused:?}");
        }
        assert!(decided.store.0.lock().unwrap().is_empty());
        let heard = decided.heard.lock().unwrap().clone();
        assert_eq!(
            heard,
            [("other".to_owned(), Outcome::Invalid), ("directory".to_owned(), Outcome::Invalid)],
            "counted, not decided"
        );
        assert!(decided.ruled.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_caller_asking_for_a_service_its_token_does_not_name_is_forbidden_and_spends_nothing() {
        let decided = decided();
        let only = Services::Only(vec!["billing".to_owned()].into());
        let refused = decided.service.decide(&only, &request(&[&[("tenant", "a")]])).await.unwrap_err();
        assert!(matches!(refused, DecideError::Forbidden { .. }), "{refused:?}");
        let mut own = request(&[&[("tenant", "a")]]);
        own.service = rules::OWN_SERVICE.into();
        assert!(matches!(
            decided.service.decide(&Services::AllButOwn, &own).await,
            Err(DecideError::Forbidden { .. })
        ));
        assert!(decided.store.0.lock().unwrap().is_empty());
        assert_eq!(decided.heard.lock().unwrap()[0].1, Outcome::Forbidden);
    }
}
