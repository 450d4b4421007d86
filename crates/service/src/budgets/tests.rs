use std::sync::Mutex;

use ratebudget::{Budgets as _, FailMode, Limit};

use super::*;
use crate::defaults::DefaultBudget;
use crate::fixtures;

fn defaults() -> DefaultBudgets {
    DefaultBudgets::try_from_fn(|_| {
        Ok::<_, ()>(DefaultBudget { limit: Limit::new(1.0, 5.0).unwrap(), fail_mode: FailMode::Static })
    })
    .unwrap()
}

/// A guard that records what it was told to forget.
#[derive(Debug, Default)]
struct Forgetting {
    forgotten: Mutex<Vec<(Name, Option<Key>)>>,
}

impl Precheck for Forgetting {
    fn forget(&self, name: Name, key: Key) {
        self.forgotten.lock().unwrap().push((name, Some(key)));
    }

    fn forget_every_bucket_of(&self, name: Name) {
        self.forgotten.lock().unwrap().push((name, None));
    }

    fn remembered_buckets(&self) -> u64 {
        7
    }
}

fn own_rule(id: &str, scope: Scope, selector: Selector, rate: f64) -> Rule {
    fixtures::rule(id, fixtures::own_spec(scope, selector, rate))
}

fn budgets(guard: Arc<dyn Precheck>) -> RuleBudgets {
    RuleBudgets::new(defaults(), guard, RuleRefs::default())
}

#[test]
fn access_and_rules_name_the_same_four_tiers() {
    assert_eq!(access::Tier::ALL.len(), rules::Tier::ALL.len());
    for tier in access::Tier::ALL {
        assert_eq!(rules_tier(tier).as_str(), tier.as_str());
    }
}

#[test]
fn nothing_is_decided_until_both_rules_and_tiers_are_loaded() {
    let budgets = budgets(Arc::new(Forgetting::default()));
    let domain = Key::from(Uuid::new_v4());
    assert!(budgets.policy(Scope::SecretReadDomain, domain).is_err());
    budgets.install_rules(Snapshot::empty());
    assert!(budgets.policy(Scope::SecretReadDomain, domain).is_err(), "tiers not loaded yet");
    assert!(!budgets.loaded());
    budgets.install_tiers(access::TierDirectory { revision: 0, tiers: Vec::new() });
    assert!(budgets.loaded());
    assert_eq!(
        budgets.policy(Scope::SecretReadDomain, domain).unwrap(),
        defaults().policy(Scope::SecretReadDomain)
    );
}

#[test]
fn a_domain_is_sized_by_its_override_else_its_tiers_template_else_the_default() {
    let budgets = budgets(Arc::new(Forgetting::default()));
    let (acme, premium, plain) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let reads = Scope::SecretReadDomain;
    budgets.install_rules(Snapshot::compile(
        2,
        vec![
            own_rule("acme", reads, Selector::Domain(acme), 100.0),
            own_rule("premium", reads, Selector::Tier(rules::Tier::Premium), 50.0),
        ],
    ));
    budgets.install_tiers(access::TierDirectory {
        revision: 1,
        tiers: vec![(acme.into(), access::Tier::Premium), (premium.into(), access::Tier::Premium)],
    });
    let rate = |domain: Uuid| budgets.policy(reads, domain.into()).unwrap().limit.per_second();
    assert_eq!(rate(acme), 100.0);
    assert_eq!(rate(premium), 50.0);
    assert_eq!(rate(plain), 1.0, "the default");
    assert!(budgets.policy(reads, premium.into()).unwrap().enforcement.rule.is_some());
    assert_eq!(budgets.policy(Scope::IngestNode, acme.into()).unwrap(), defaults().policy(Scope::IngestNode));

    let (revision, explained) = budgets.explain(acme, access::Tier::Premium).unwrap();
    assert_eq!(revision, 2);
    let reads_explained = explained.iter().find(|explained| explained.scope == reads).unwrap();
    assert_eq!(
        reads_explained.governed_by.as_ref().map(|(level, rule)| (*level, rule.id.as_str())),
        Some((Level::Domain, "acme"))
    );
    assert_eq!(reads_explained.outranked.len(), 1);
}

#[test]
fn an_older_snapshot_is_never_installed_over_a_newer_one() {
    let budgets = budgets(Arc::new(Forgetting::default()));
    budgets.install_rules(Snapshot::compile(5, Vec::new()));
    budgets.install_rules(Snapshot::compile(
        4,
        vec![own_rule("late", Scope::IngestNode, Selector::AllDomains, 9.0)],
    ));
    assert_eq!(budgets.compiled_rules().unwrap().snapshot.revision(), 5);
    assert_eq!(budgets.reading().snapshot_version, 5);
    assert_eq!(budgets.reading().precheck_buckets, 7);
}

#[test]
fn a_budget_that_may_grow_is_forgotten_and_one_that_shrinks_is_not() {
    let guard = Arc::new(Forgetting::default());
    let budgets = budgets(guard.clone());
    let acme = Uuid::new_v4();
    let reads = Scope::SecretReadDomain;
    budgets.install_rules(Snapshot::compile(1, vec![own_rule("acme", reads, Selector::Domain(acme), 10.0)]));
    budgets.install_tiers(access::TierDirectory { revision: 0, tiers: Vec::new() });
    assert!(guard.forgotten.lock().unwrap().is_empty(), "the first load forgets nothing");
    // Shrinks: nothing to forget (what the pre-check learned under more still refuses rightly).
    budgets.install_rules(Snapshot::compile(2, vec![own_rule("acme", reads, Selector::Domain(acme), 5.0)]));
    assert!(guard.forgotten.lock().unwrap().is_empty());
    // Grows: acme's own bucket of that scope, and only that.
    budgets.install_rules(Snapshot::compile(3, vec![own_rule("acme", reads, Selector::Domain(acme), 50.0)]));
    assert_eq!(*guard.forgotten.lock().unwrap(), [(reads.name(), Some(Key::from(acme)))]);
    // A Domain that moves tier may grow in every scope: per-Domain scopes forget its bucket,
    // per-Node scopes everything (the guard does not know which Nodes are its).
    guard.forgotten.lock().unwrap().clear();
    budgets.install_tiers(access::TierDirectory {
        revision: 1,
        tiers: vec![(acme.into(), access::Tier::Premium)],
    });
    let forgotten = guard.forgotten.lock().unwrap().clone();
    for scope in Scope::ALL {
        let expected =
            if scope.is_per_domain() { (scope.name(), Some(Key::from(acme))) } else { (scope.name(), None) };
        assert!(forgotten.contains(&expected), "{scope}: {forgotten:?}");
    }
}

#[test]
fn a_service_rule_that_may_grow_forgets_every_service_bucket() {
    let guard = Arc::new(Forgetting::default());
    let budgets = budgets(guard.clone());
    let rule = |rate: f64| {
        fixtures::rule("directory", fixtures::service_spec(None, &[("tenant", "*")], rate, None, rate))
    };
    budgets.install_rules(Snapshot::compile(1, vec![rule(1.0)]));
    budgets.install_rules(Snapshot::compile(2, vec![rule(2.0)]));
    assert_eq!(*guard.forgotten.lock().unwrap(), [(service_buckets(), None)]);
    assert!(budgets.has_service_rules("directory"));
    assert!(!budgets.has_service_rules("billing"));
}

/// Issue 34, item 5: the sweep keeps another service's buckets until its slowest rule has
/// refilled them, and a year and a day before it knows the rules.
#[test]
fn the_sweep_keeps_a_services_buckets_for_its_slowest_refill() {
    let budgets = budgets(Arc::new(Forgetting::default()));
    let overrides = (override_buckets(), ratebudget::Limit::MAX_REFILL_TIME);
    assert_eq!(
        budgets.retained(Duration::from_secs(60)),
        [(service_buckets(), ratebudget::Limit::MAX_REFILL_TIME), overrides]
    );
    let service_rule = |id: &str, rate: f64, per_ms: u32, burst: f64| {
        fixtures::rule(id, fixtures::service_spec(None, &[], rate, Some(per_ms.into()), burst))
    };
    // Within the hour, ours and theirs: nothing kept longer.
    budgets.install_rules(Snapshot::compile(
        1,
        vec![
            own_rule("ours", Scope::IngestNode, Selector::AllDomains, 1.0),
            service_rule("fast", 10.0, 1000, 10.0),
        ],
    ));
    assert_eq!(
        budgets.retained(Duration::from_secs(60)),
        [overrides],
        "only the overrides, which follow no rule"
    );
    budgets.install_rules(Snapshot::compile(
        2,
        vec![
            service_rule("fast", 10.0, 1000, 10.0),
            service_rule("daily", 1000.0, 86_400_000, 1000.0),
            service_rule("weekly", 7.0, 86_400_000, 49.0),
        ],
    ));
    assert_eq!(
        budgets.retained(Duration::from_secs(60)),
        [(service_buckets(), Duration::from_secs(7 * 86_400)), overrides]
    );
    // A snapshot not confirmed current lately does not say how slow the rules are.
    assert_eq!(
        budgets.retained(Duration::ZERO),
        [(service_buckets(), ratebudget::Limit::MAX_REFILL_TIME), overrides],
        "kept a year and a day"
    );
}
