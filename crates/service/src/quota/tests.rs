//! The allocator's rules resolution and what it sends, with the store mocked: the accounting
//! itself is the store's, tested against PostgreSQL (`tests/it/quota.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratebudget::{Key, Limit};
use rules::{RuleDraft, ServiceDraft, Snapshot};

use super::*;
use crate::budgets::Precheck;
use crate::defaults::{DefaultBudget, DefaultBudgets};

mockall::mock! {
    Store {}
    #[async_trait]
    impl QuotaStore for Store {
        async fn assign(&self, request: &ShareRequest) -> Result<Allotted, BoxError>;
        async fn close(&self, holder: Uuid) -> Result<(), BoxError>;
        async fn sweep(&self) -> Result<u64, BoxError>;
        async fn buckets(&self, service: &str) -> Result<Vec<QuotaBucket>, BoxError>;
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

#[derive(Default)]
struct Heard {
    shadow: Mutex<Vec<(String, u64)>>,
    failed: Mutex<u32>,
}

impl QuotaObserver for Heard {
    fn reported(&self, _: &str, _: Usage) {}
    fn assigned(&self, _: &str, _: Option<Assignment>) {}
    fn shadow_refused(&self, _: &str, rule: &str, refused: u64) {
        self.shadow.lock().unwrap().push((rule.to_owned(), refused));
    }
    fn failed(&self, _: &str) {
        *self.failed.lock().unwrap() += 1;
    }
}

/// `checkout`'s rule for every API, keyed by API and tenant: 100 a second, a burst of 100.
fn checkout_rule(mode: Option<&str>) -> rules::Rule {
    let service = ServiceDraft {
        service: "checkout".into(),
        api: Some("*".into()),
        selector: [("tenant".to_owned(), "*".to_owned())].into_iter().collect(),
    };
    let spec = RuleDraft {
        service: Some(service),
        scope: String::new(),
        selector: rules::Selector::AllDomains,
        rate: 100.0,
        per_ms: Some(1000),
        burst: 100.0,
        algorithm: None,
        mode: mode.map(str::to_owned),
        fail_mode: None,
        priority: None,
        charge: None,
    }
    .validate()
    .unwrap();
    crate::fixtures::rule("checkout-rule", spec)
}

/// A holder of its own stream.
fn holder() -> BucketHolder {
    let stream = Uuid::new_v4();
    BucketHolder { stream, holder: stream, unsure: false, builds_full: false }
}

fn bucket(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
}

fn service_with(store: MockStore, heard: Arc<Heard>, rules: Vec<rules::Rule>) -> QuotaService {
    let defaults = DefaultBudgets::try_from_fn(|_| {
        Ok::<_, ()>(DefaultBudget {
            limit: Limit::new(1.0, 1.0).unwrap(),
            fail_mode: ratebudget::FailMode::Closed,
        })
    })
    .unwrap();
    let budgets = Arc::new(RuleBudgets::new(defaults, Arc::new(NoPrecheck), rules::RuleRefs::default()));
    budgets.install_rules(Snapshot::compile(1, rules));
    QuotaService::new(budgets, Arc::new(store), heard, QuotaSettings::default(), "replica-a")
}

fn granted(max_tokens: u32, tokens_per_fill: u32) -> Allotted {
    Allotted {
        decision: Allotment::TokenBucket { max_tokens, tokens_per_fill },
        prior_rate: 10.0,
        prior_burst: 5.0,
    }
}

#[tokio::test]
async fn a_bucket_no_rule_governs_is_allowed_for_long_without_a_statement() {
    let mut store = MockStore::new();
    store.expect_assign().never();
    let quota = service_with(store, Arc::default(), vec![checkout_rule(None)]);
    let assigned = quota.assign("checkout", &bucket(&[("region", "eu")]), holder(), None).await.unwrap();
    assert_eq!(assigned, Some(Assignment::AllowAll { ttl: QuotaSettings::default().ungoverned_ttl }));
}

#[tokio::test]
async fn a_governed_bucket_gets_the_stores_share_as_a_token_bucket_filled_each_minute() {
    let mut store = MockStore::new();
    store
        .expect_assign()
        .withf(|request| {
            request.budget.rate == 100.0
                && request.budget.burst == 100.0
                && request.budget.fill_seconds == 60
                && request.usage.is_some_and(|usage| usage.allowed == 7)
        })
        .returning(|_| Ok(granted(12, 3000)));
    let quota = service_with(store, Arc::default(), vec![checkout_rule(None)]);
    let usage = Usage { allowed: 7, denied: 3, elapsed: Duration::from_secs(5) };
    let id = bucket(&[("api", "POST /pay"), ("tenant", "acme")]);
    let assigned = quota.assign("checkout", &id, holder(), Some(usage)).await;
    assert_eq!(
        assigned.unwrap(),
        Some(Assignment::TokenBucket {
            max_tokens: 12,
            tokens_per_fill: 3000,
            fill_interval: Duration::from_secs(60),
            ttl: Duration::from_secs(12),
        })
    );
}

#[tokio::test]
async fn a_bucket_id_is_keyed_by_what_its_rule_names_as_should_rate_limit_keys_it() {
    let quota = service_with(MockStore::new(), Arc::default(), vec![checkout_rule(None)]);
    let governed = |pairs: &[(&str, &str)]| match quota.govern("checkout", &bucket(pairs)).unwrap() {
        Governance::Budget(budget) => budget.key,
        other => panic!("not a budget: {other:?}"),
    };
    let acme = governed(&[("api", "POST /pay"), ("tenant", "acme")]);
    // An entry the rule does not name does not split its bucket; a value it names does.
    assert_eq!(acme, governed(&[("api", "POST /pay"), ("tenant", "acme"), ("user", "u1")]));
    assert_ne!(acme, governed(&[("api", "POST /pay"), ("tenant", "globex")]));
    let entries = [("api", "POST /pay"), ("tenant", "acme")]
        .map(|(key, value)| crate::decide::Entry { key: key.to_owned(), value: value.to_owned() });
    let compiled = quota.budgets.compiled_rules().unwrap();
    let should_rate_limit =
        crate::decide::governing_bucket(&compiled.snapshot, "checkout", &entries).unwrap();
    assert_eq!(acme, should_rate_limit.key);
}

#[tokio::test]
async fn a_store_that_cannot_answer_sends_nothing_and_is_counted() {
    let mut store = MockStore::new();
    store.expect_assign().returning(|_| Err("connection refused".into()));
    let heard = Arc::new(Heard::default());
    let quota = service_with(store, heard.clone(), vec![checkout_rule(None)]);
    let id = bucket(&[("api", "POST /pay"), ("tenant", "acme")]);
    let assigned = quota.assign("checkout", &id, holder(), None).await;
    assert!(matches!(assigned, Err(QuotaError::Store(_))), "{assigned:?}");
    assert_eq!(*heard.failed.lock().unwrap(), 1);
}

#[tokio::test]
async fn a_shadow_rule_allows_all_and_counts_what_the_share_would_have_refused() {
    let mut store = MockStore::new();
    // The share in force allowed 10 a second and 5 at once: 55 over 5 s, of the 80 allowed.
    store.expect_assign().returning(|_| Ok(granted(5, 600)));
    let heard = Arc::new(Heard::default());
    let quota = service_with(store, heard.clone(), vec![checkout_rule(Some("SHADOW"))]);
    let usage = Usage { allowed: 80, denied: 0, elapsed: Duration::from_secs(5) };
    let id = bucket(&[("api", "POST /pay"), ("tenant", "acme")]);
    let assigned = quota.assign("checkout", &id, holder(), Some(usage)).await;
    assert_eq!(assigned.unwrap(), Some(Assignment::AllowAll { ttl: Duration::from_secs(12) }));
    assert_eq!(heard.shadow.lock().unwrap().as_slice(), &[("checkout-rule".to_owned(), 25)]);
}

#[tokio::test]
async fn a_caller_may_only_ask_for_the_services_its_token_names() {
    let quota = service_with(MockStore::new(), Arc::default(), Vec::new());
    let only = rules::Services::Only(vec!["checkout".to_owned()].into());
    assert!(quota.permit(&only, "checkout").is_ok());
    assert!(matches!(quota.permit(&only, "billing"), Err(QuotaError::Forbidden { .. })));
}

#[test]
fn a_goodbye_keeps_the_strategy_and_expires_at_once() {
    let bucket = Assignment::TokenBucket {
        max_tokens: 4,
        tokens_per_fill: 60,
        fill_interval: Duration::from_secs(60),
        ttl: Duration::from_secs(12),
    };
    let goodbye = Assignment::TokenBucket {
        max_tokens: 4,
        tokens_per_fill: 60,
        fill_interval: Duration::from_secs(60),
        ttl: Duration::ZERO,
    };
    assert_eq!(bucket.expiring_now(), goodbye);
    assert_eq!(bucket.rate(), Some(1.0));
}

#[tokio::test]
async fn the_operator_listing_is_the_stores_for_the_service_asked_and_its_failure_a_store_error() {
    // Issue 35 item 5: the operator page lists a service's RLQS buckets.
    let listed = QuotaBucket {
        key: Key::from(Uuid::from_u64_pair(0, 7)),
        rule_id: "checkout-rule".into(),
        rate: 100.0,
        burst: 100.0,
        pool: 10.0,
        pool_at: chrono::DateTime::UNIX_EPOCH,
        holders: Vec::new(),
    };
    let mut store = MockStore::new();
    let answer = listed.clone();
    store
        .expect_buckets()
        .withf(|service| service == "checkout")
        .times(1)
        .returning(move |_| Ok(vec![answer.clone()]));
    store.expect_buckets().withf(|service| service == "billing").times(1).returning(|_| Err("down".into()));
    let quota = service_with(store, Arc::default(), Vec::new());
    assert_eq!(quota.buckets("checkout").await.unwrap(), vec![listed]);
    assert!(matches!(quota.buckets("billing").await, Err(QuotaError::Store(_))));
}
