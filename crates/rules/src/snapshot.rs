//! Which rule governs a Domain's budget: the rules compiled for resolution, per replica.
//!
//! Precedence, for one scope and one Domain:
//!
//! 1. the Domain's override (a rule selecting `{"domain": "<its id>"}`);
//! 2. else its tier's template (`{"tier": "<its tier>"}`);
//! 3. else an all-Domains rule (`{}`);
//! 4. else no rule: the caller's default (the composition root's knobs).
//!
//! Within a level, the rule of the highest priority wins; of equal priorities, the smallest
//! rule id (so every replica picks the same one). A level with no rule for the scope defers
//! to the next: an override of the secret reads says nothing about ingest.

use std::cmp::Reverse;
use std::collections::HashMap;

use ratebudget::Scope;
use uuid::Uuid;

use crate::{Rule, RuleId, RuleSpec, Selector, Tier};

/// The level a rule governs at, most specific first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// The Domain's own override.
    Domain,
    /// The Domain's tier's template.
    Tier,
    /// Every Domain.
    AllDomains,
}

impl Level {
    /// The level's text: `domain`, `tier` or `all_domains`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Domain => "domain",
            Level::Tier => "tier",
            Level::AllDomains => "all_domains",
        }
    }

    fn of(selector: Selector) -> Level {
        match selector {
            Selector::Domain(_) => Level::Domain,
            Selector::Tier(_) => Level::Tier,
            Selector::AllDomains => Level::AllDomains,
        }
    }
}

/// A rule that governs, and at which level.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved<'a> {
    /// The rule's position in [`Snapshot::rules`]: stable for the snapshot's life, so a caller
    /// can keep things of its own beside each rule.
    pub index: usize,
    /// The rule.
    pub rule: &'a Rule,
    /// The level it governs at.
    pub level: Level,
}

/// Every rule as of one revision, indexed so that resolving a take costs at most three hash
/// lookups. Immutable: a change is a new snapshot.
#[derive(Clone, Debug)]
pub struct Snapshot {
    revision: i64,
    rules: Vec<Rule>,
    /// Per scope and selector, the rules selecting exactly that, winner first.
    ranked: HashMap<(Scope, Selector), Vec<usize>>,
}

impl Snapshot {
    /// Where the rules that may have grown between `older` and this snapshot govern:
    /// (scope, selector) of each, before and after ([`RuleSpec::may_grow`]), so a replica can forget
    /// what it learned of those buckets.
    pub fn grown_since(&self, older: &Snapshot) -> std::collections::HashSet<(Scope, Selector)> {
        use std::collections::{HashMap, HashSet};
        let by_id = |snapshot: &Snapshot| -> HashMap<RuleId, RuleSpec> {
            snapshot.rules().iter().map(|rule| (rule.id.clone(), rule.spec)).collect()
        };
        let (old, new) = (by_id(older), by_id(self));
        let ids: HashSet<&RuleId> = old.keys().chain(new.keys()).collect();
        let mut grown = HashSet::new();
        for id in ids {
            let (before, after) = (old.get(id), new.get(id));
            if RuleSpec::may_grow(before, after) {
                for spec in before.into_iter().chain(after) {
                    grown.insert((spec.scope(), spec.selector()));
                }
            }
        }
        grown
    }

    /// Compiles `rules`, which are the rules as of `revision`.
    pub fn compile(revision: i64, rules: Vec<Rule>) -> Snapshot {
        let mut ranked: HashMap<(Scope, Selector), Vec<usize>> = HashMap::new();
        for (index, rule) in rules.iter().enumerate() {
            ranked.entry((rule.spec.scope(), rule.spec.selector())).or_default().push(index);
        }
        for indices in ranked.values_mut() {
            indices.sort_by_key(|&index| (Reverse(rules[index].spec.priority()), rules[index].id.clone()));
        }
        Snapshot { revision, rules, ranked }
    }

    /// The snapshot of a store no rule was ever written to.
    pub fn empty() -> Snapshot {
        Snapshot::compile(0, Vec::new())
    }

    /// The rules' revision this snapshot holds: how many changes were made before it.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Every rule, in the order [`Resolved::index`] counts.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule that governs `scope` for `domain`, which is in `tier`; `None` when no rule
    /// selects it.
    pub fn resolve(&self, scope: Scope, domain: Uuid, tier: Tier) -> Option<Resolved<'_>> {
        self.candidates(scope, domain, tier).next()
    }

    /// Every rule that selects `scope` for `domain`, in precedence order: the first governs,
    /// the rest are outranked.
    pub fn candidates(&self, scope: Scope, domain: Uuid, tier: Tier) -> impl Iterator<Item = Resolved<'_>> {
        [Selector::Domain(domain), Selector::Tier(tier), Selector::AllDomains]
            .into_iter()
            .filter_map(move |selector| self.ranked.get(&(scope, selector)))
            .flatten()
            .map(|&index| {
                let rule = &self.rules[index];
                Resolved { index, rule, level: Level::of(rule.spec.selector()) }
            })
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::{Actor, RuleDraft, RuleId, Version};

    fn rule(id: &str, scope: Scope, selector: Selector, priority: i64) -> Rule {
        let spec = RuleDraft {
            scope: scope.as_str().into(),
            selector,
            rate: 1.0,
            per_ms: None,
            burst: 1.0,
            algorithm: None,
            mode: None,
            fail_mode: None,
            priority: Some(priority),
        }
        .validate()
        .unwrap();
        Rule {
            id: RuleId::parse(id).unwrap(),
            spec,
            version: Version::new(1).unwrap(),
            created_by: Actor::new("test").unwrap(),
            updated_at: Utc::now(),
        }
    }

    fn sized(id: &str, selector: Selector, rate: f64, burst: f64, priority: i64) -> Rule {
        let mut rule = rule(id, Scope::SecretReadNode, selector, priority);
        rule.spec = RuleDraft {
            scope: "secret_read_node".into(),
            selector,
            rate,
            per_ms: None,
            burst,
            algorithm: None,
            mode: None,
            fail_mode: None,
            priority: Some(priority),
        }
        .validate()
        .unwrap();
        rule
    }

    #[test]
    fn a_rule_may_grow_a_budget_unless_it_stays_where_it_was_and_no_larger() {
        let acme = Uuid::new_v4();
        let before = Snapshot::compile(
            1,
            vec![
                sized("same", Selector::AllDomains, 10.0, 20.0, 0),
                sized("shrinks", Selector::Domain(acme), 10.0, 20.0, 0),
                sized("grows", Selector::Tier(Tier::Premium), 10.0, 20.0, 0),
                sized("moves", Selector::Tier(Tier::Free), 10.0, 20.0, 0),
                sized("goes", Selector::Tier(Tier::Enterprise), 1.0, 1.0, 0),
                sized("reranks", Selector::Tier(Tier::Standard), 1.0, 1.0, 0),
            ],
        );
        let after = Snapshot::compile(
            2,
            vec![
                sized("same", Selector::AllDomains, 10.0, 20.0, 0),
                sized("shrinks", Selector::Domain(acme), 5.0, 10.0, 0),
                sized("grows", Selector::Tier(Tier::Premium), 10.0, 21.0, 0),
                sized("moves", Selector::Domain(acme), 10.0, 20.0, 0),
                sized("reranks", Selector::Tier(Tier::Standard), 1.0, 1.0, 3),
                sized("comes", Selector::AllDomains, 1.0, 1.0, 0),
            ],
        );
        let reads = Scope::SecretReadNode;
        let grown = after.grown_since(&before);
        let expected: std::collections::HashSet<(Scope, Selector)> = [
            Selector::Tier(Tier::Premium),
            Selector::Tier(Tier::Free),
            Selector::Domain(acme),
            Selector::Tier(Tier::Enterprise),
            Selector::Tier(Tier::Standard),
            Selector::AllDomains,
        ]
        .into_iter()
        .map(|selector| (reads, selector))
        .collect();
        assert_eq!(grown, expected);
        // Only the rule that stayed and shrank, and the one that stayed, do not grow.
        let spec = |snapshot: &Snapshot, id: &str| {
            snapshot.rules().iter().find(|rule| rule.id.as_str() == id).unwrap().spec
        };
        assert!(!RuleSpec::may_grow(Some(&spec(&before, "shrinks")), Some(&spec(&after, "shrinks"))));
        assert!(!RuleSpec::may_grow(Some(&spec(&before, "same")), Some(&spec(&after, "same"))));
        assert!(RuleSpec::may_grow(None, Some(&spec(&after, "comes"))));
        assert!(RuleSpec::may_grow(Some(&spec(&before, "goes")), None));
    }

    #[test]
    fn a_rule_gives_its_takes_its_limit_algorithm_mode_and_fail_mode() {
        let mut draft = RuleDraft {
            scope: "access_issuance_domain".into(),
            selector: Selector::AllDomains,
            rate: 2.0,
            per_ms: None,
            burst: 10.0,
            algorithm: Some("GCRA".into()),
            mode: Some("SHADOW".into()),
            fail_mode: Some("STATIC".into()),
            priority: None,
        };
        let policy = draft.clone().validate().unwrap().policy(ratebudget::RuleRef(7));
        assert_eq!(policy.limit, ratebudget::Limit::new(2.0, 10.0).unwrap());
        assert_eq!(policy.algorithm, ratebudget::Algorithm::Gcra);
        assert_eq!(
            policy.enforcement,
            ratebudget::Enforcement {
                mode: ratebudget::Mode::Shadow,
                fail_mode: ratebudget::FailMode::Static,
                rule: Some(ratebudget::RuleRef(7)),
            }
        );
        draft.fail_mode = Some("LOCAL".into());
        assert_eq!(draft.validate().unwrap_err().field, "fail_mode", "a rule's words are the data model's");
    }

    /// The precedence table: for each Domain and tier, which rule governs which scope.
    #[test]
    fn the_override_beats_the_template_beats_all_domains_beats_nothing_and_priority_breaks_ties() {
        let (acme, other) = (Uuid::new_v4(), Uuid::new_v4());
        let reads = Scope::SecretReadNode;
        let snapshot = Snapshot::compile(
            9,
            vec![
                rule("all-low", reads, Selector::AllDomains, 0),
                rule("all-high", reads, Selector::AllDomains, 5),
                rule("premium", reads, Selector::Tier(Tier::Premium), 0),
                rule("premium-urgent", reads, Selector::Tier(Tier::Premium), 7),
                rule("free", reads, Selector::Tier(Tier::Free), -100),
                rule("acme-b", reads, Selector::Domain(acme), 1),
                rule("acme-a", reads, Selector::Domain(acme), 1),
                rule("acme-ingest", Scope::IngestDomain, Selector::Domain(acme), 0),
            ],
        );
        #[track_caller]
        fn check(
            snapshot: &Snapshot,
            scope: Scope,
            domain: Uuid,
            tier: Tier,
            expected: Option<(&str, Level)>,
        ) {
            let got = snapshot.resolve(scope, domain, tier).map(|r| (r.rule.id.as_str(), r.level));
            assert_eq!(got, expected, "{scope} for {domain} in {tier:?}");
        }
        // The override wins at every tier; of two at one priority, the smaller id.
        for tier in Tier::ALL {
            check(&snapshot, reads, acme, tier, Some(("acme-a", Level::Domain)));
        }
        // No override: the tier's template, the highest priority first, however low it is.
        check(&snapshot, reads, other, Tier::Premium, Some(("premium-urgent", Level::Tier)));
        check(&snapshot, reads, other, Tier::Free, Some(("free", Level::Tier)));
        // No template for the tier: the highest all-Domains rule.
        check(&snapshot, reads, other, Tier::Standard, Some(("all-high", Level::AllDomains)));
        check(&snapshot, reads, other, Tier::Enterprise, Some(("all-high", Level::AllDomains)));
        // A rule governs its own scope only; a scope no rule selects has none.
        check(&snapshot, Scope::IngestDomain, acme, Tier::Free, Some(("acme-ingest", Level::Domain)));
        check(&snapshot, Scope::IngestDomain, other, Tier::Free, None);
        check(&snapshot, Scope::SecretReadDomain, acme, Tier::Free, None);

        let order: Vec<&str> =
            snapshot.candidates(reads, acme, Tier::Premium).map(|r| r.rule.id.as_str()).collect();
        assert_eq!(order, ["acme-a", "acme-b", "premium-urgent", "premium", "all-high", "all-low"]);
        assert_eq!(snapshot.revision(), 9);
    }

    #[test]
    fn an_empty_snapshot_governs_nothing() {
        let snapshot = Snapshot::empty();
        assert_eq!(snapshot.resolve(Scope::IngestNode, Uuid::new_v4(), Tier::Standard), None);
        assert_eq!(snapshot.revision(), 0);
    }
}
