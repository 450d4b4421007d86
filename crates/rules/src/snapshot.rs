//! Which rule governs a request: the rules compiled for resolution, per replica, by one path
//! for this project's own budgets and for every other service's.
//!
//! A request is a service, an API and attributes from general to specific (Envoy's
//! descriptor entries). Among the rules of that service whose API is the request's or `*` and
//! whose selector pairs are all among its attributes ([`Pattern::Any`] matching any value of
//! its attribute):
//!
//! 1. the rule naming the most specific attribute (the latest position) wins; a rule with an
//!    empty selector names none and comes after every rule that names one;
//! 2. then, of rules whose most specific attribute is the same, one naming it with an exact
//!    value over one naming it `*` (so a tenant's own override beats a template every tenant
//!    inherits, `{"sku": "premium", "tenant": "*"}`);
//! 3. then a rule naming the API over one for `*`;
//! 4. then the higher priority;
//! 5. then the smaller rule id (so every replica picks the same one).
//!
//! The governing rule also says what keys its bucket ([`Snapshot::keyed_by`]): each attribute
//! it names, with the value the request has for it. An attribute named with a value keys one
//! bucket; one named `*` keys a bucket per value (as envoyproxy/ratelimit's descriptor key
//! without a value does); an attribute the rule does not name never splits its bucket, so a
//! caller cannot buy a fresh bucket by varying what the rule ignores. The API keys the bucket
//! only when the rule names one: a rule for `*` is one budget across every API, as a rule
//! that names no attribute is one budget across every value.
//!
//! No rule matching: the request is unlimited (for this project's own budgets, the caller's
//! default, the composition root's knobs). This project's own takes are the service
//! [`OWN_SERVICE`](crate::OWN_SERVICE), the scope as the API and the attributes `tier` then
//! `domain`, which makes the precedence a Domain's override, else its tier's template, else
//! an all-Domains rule; a level with no rule for the scope defers to the next, so an override
//! of the secret reads says nothing about ingest.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use ratebudget::Scope;
use uuid::Uuid;

use crate::{Pattern, Target};
use crate::{Rule, RuleId, RuleSpec, Selector, Tier, OWN_SERVICE};

/// The level an own rule governs at, most specific first.
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

/// An own rule that governs, and at which level.
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

/// A rule that matches a request, as [`Snapshot::matching`] ranks it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matched<'a> {
    /// The rule's position in [`Snapshot::rules`].
    pub index: usize,
    /// The rule.
    pub rule: &'a Rule,
    /// The position of the most specific attribute its selector names; `None` for an empty
    /// selector.
    pub position: Option<usize>,
    /// Whether it names the attribute at `position` with an exact value (rather than `*`):
    /// `false` for an empty selector.
    pub exact_at_position: bool,
    /// Whether it names the request's API (rather than `*`).
    pub names_the_api: bool,
}

/// A rule as the index holds it: its service, API and selector pairs, as text.
#[derive(Clone, Debug)]
struct Compiled {
    pairs: Vec<(Arc<str>, Pattern)>,
}

/// One API's rules (or `*`'s), indexed by the first pair of their selectors.
#[derive(Clone, Debug, Default)]
struct ApiRules {
    /// Rules whose selector is empty.
    unconditional: Vec<usize>,
    /// Per attribute: rules whose first pair is it, with `*`, and with each value.
    by_attribute: HashMap<Arc<str>, AttributeRules>,
}

#[derive(Clone, Debug, Default)]
struct AttributeRules {
    any_value: Vec<usize>,
    by_value: HashMap<Arc<str>, Vec<usize>>,
}

impl ApiRules {
    fn add(&mut self, index: usize, pairs: &[(Arc<str>, Pattern)]) {
        match pairs.first() {
            None => self.unconditional.push(index),
            Some((attribute, pattern)) => {
                let rules = self.by_attribute.entry(attribute.clone()).or_default();
                match pattern {
                    Pattern::Any => rules.any_value.push(index),
                    Pattern::Exactly(value) => rules.by_value.entry(value.clone()).or_default().push(index),
                }
            }
        }
    }
}

/// One node of a service's file tree: the rule that ends there, if any, and its children.
#[derive(Clone, Debug, Default)]
struct Node {
    rule: Option<usize>,
    /// Children naming a key and an exact value.
    exact: HashMap<(Arc<str>, Arc<str>), usize>,
    /// Children whose value is a wildcard, in the file's order: key, pattern, node.
    wildcards: Vec<(u32, Arc<str>, Arc<str>, usize)>,
    /// Children naming a key and no value.
    key_only: HashMap<Arc<str>, usize>,
}

impl Node {
    fn has_children(&self) -> bool {
        !(self.exact.is_empty() && self.wildcards.is_empty() && self.key_only.is_empty())
    }
}

/// A service's rules from files, as the tree envoyproxy/ratelimit walks: node 0 is the
/// domain's root.
#[derive(Clone, Debug, Default)]
struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    fn add(&mut self, index: usize, path: &[crate::PathEntry]) {
        if self.nodes.is_empty() {
            self.nodes.push(Node::default());
        }
        let mut at = 0;
        for entry in path {
            let fresh = self.nodes.len();
            let node = &mut self.nodes[at];
            let child = match &entry.value {
                None => *node.key_only.entry(entry.key.clone()).or_insert(fresh),
                Some(value) if entry.is_wildcard() => {
                    match node
                        .wildcards
                        .iter()
                        .find(|(_, key, pattern, _)| *key == entry.key && pattern == value)
                    {
                        Some((_, _, _, child)) => *child,
                        None => {
                            node.wildcards.push((entry.order, entry.key.clone(), value.clone(), fresh));
                            node.wildcards.sort_by_key(|(order, ..)| *order);
                            fresh
                        }
                    }
                }
                Some(value) => *node.exact.entry((entry.key.clone(), value.clone())).or_insert(fresh),
            };
            if child == fresh {
                self.nodes.push(Node::default());
            }
            at = child;
        }
        self.nodes[at].rule = Some(index);
    }

    /// envoyproxy/ratelimit's walk: at each entry, the child naming its key and value, else
    /// the first wildcard whose pattern its value matches, else the child naming its key
    /// alone; no backtracking. The rule at the node of the last entry, if the walk gets there.
    fn walk(&self, entries: &[(&str, &str)]) -> Option<usize> {
        let mut at = self.nodes.first()?;
        for (position, (key, value)) in entries.iter().enumerate() {
            let next = at
                .exact
                .get(&(Arc::from(*key), Arc::from(*value)))
                .or_else(|| {
                    at.wildcards
                        .iter()
                        .find(|(_, named, pattern, _)| {
                            &**named == *key && crate::wildcard_matches(pattern, value)
                        })
                        .map(|(.., child)| child)
                })
                .or_else(|| at.key_only.get(*key))?;
            let node = &self.nodes[*next];
            if position + 1 == entries.len() {
                return node.rule;
            }
            if !node.has_children() {
                return None;
            }
            at = node;
        }
        None
    }
}

/// One service's rules.
#[derive(Clone, Debug, Default)]
struct ServiceRules {
    by_api: HashMap<Arc<str>, ApiRules>,
    any_api: ApiRules,
    /// Its rules from files.
    tree: Tree,
    /// Every rule of the service, in [`Snapshot::service_rules`]' order.
    listed: Vec<usize>,
}

/// Every rule as of one revision, indexed so that resolving a request costs a few hash
/// lookups per attribute. Immutable: a change is a new snapshot.
#[derive(Clone, Debug)]
pub struct Snapshot {
    revision: i64,
    rules: Vec<Rule>,
    compiled: Vec<Compiled>,
    services: HashMap<Arc<str>, ServiceRules>,
}

impl Snapshot {
    /// Where the own rules that may have grown between `older` and this snapshot govern:
    /// (scope, selector) of each, before and after ([`RuleSpec::may_grow`]), so a replica can
    /// forget what it learned of those buckets.
    pub fn grown_since(&self, older: &Snapshot) -> std::collections::HashSet<(Scope, Selector)> {
        let mut grown = std::collections::HashSet::new();
        for (before, after) in changed(older, self) {
            if RuleSpec::may_grow(before, after) {
                for spec in before.into_iter().chain(after) {
                    if let Target::Own { scope, selector } = spec.target() {
                        grown.insert((*scope, *selector));
                    }
                }
            }
        }
        grown
    }

    /// The services some rule of which may have grown between `older` and this snapshot: a
    /// service's buckets are keyed by its requests, so a replica forgets what it learned of
    /// all of them.
    pub fn services_grown_since(&self, older: &Snapshot) -> std::collections::HashSet<String> {
        let mut grown = std::collections::HashSet::new();
        for (before, after) in changed(older, self) {
            if RuleSpec::may_grow(before, after) {
                for spec in before.into_iter().chain(after) {
                    if !matches!(spec.target(), Target::Own { .. }) {
                        grown.insert(spec.target().service().to_owned());
                    }
                }
            }
        }
        grown
    }

    /// Compiles `rules`, which are the rules as of `revision`.
    pub fn compile(revision: i64, rules: Vec<Rule>) -> Snapshot {
        let compiled: Vec<Compiled> = rules
            .iter()
            .map(|rule| Compiled {
                pairs: rule
                    .spec
                    .target()
                    .pairs()
                    .into_iter()
                    .map(|(attribute, pattern)| (Arc::<str>::from(attribute), pattern))
                    .collect(),
            })
            .collect();
        let mut services: HashMap<Arc<str>, ServiceRules> = HashMap::new();
        for (index, rule) in rules.iter().enumerate() {
            let target = rule.spec.target();
            let service = services.entry(target.service().into()).or_default();
            service.listed.push(index);
            if let Target::Descriptor(descriptor) = target {
                service.tree.add(index, &descriptor.path);
                continue;
            }
            let api_rules = match target.api() {
                Some(api) => service.by_api.entry(api.into()).or_default(),
                None => &mut service.any_api,
            };
            api_rules.add(index, &compiled[index].pairs);
        }
        for service in services.values_mut() {
            // Named APIs first, then the more attributes named, then priority, then id.
            service.listed.sort_by_key(|&index| {
                let rule = &rules[index];
                (
                    rule.spec.target().api().is_none(),
                    Reverse(compiled[index].pairs.len()),
                    Reverse(rule.spec.priority()),
                    rule.id.clone(),
                )
            });
        }
        Snapshot { revision, rules, compiled, services }
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

    /// Whether `service` has rules: one hash lookup, for every decision.
    pub fn has_service(&self, service: &str) -> bool {
        self.services.contains_key(service)
    }

    /// The services that have rules (this project's own among them when it has any).
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(|service| &**service)
    }

    /// Every rule of `service`: named APIs before `*`, then the more attributes named, then
    /// the higher priority, then the smaller id. (Which one governs a request is
    /// [`Snapshot::matching`]'s, by the attributes the request has.)
    pub fn service_rules(&self, service: &str) -> Vec<&Rule> {
        self.services
            .get(service)
            .map(|rules| rules.listed.iter().map(|&index| &self.rules[index]).collect())
            .unwrap_or_default()
    }

    /// The rule of `service`'s files that governs a descriptor of `entries` (every entry, in
    /// order, `api` among them), walked as envoyproxy/ratelimit walks its configuration to the
    /// descriptor's full depth; `None` when the walk finds no rule there.
    /// With the rule, its position in [`Snapshot::rules`] (its policy's too).
    pub fn walk(&self, service: &str, entries: &[(&str, &str)]) -> Option<(usize, &Rule)> {
        let index = self.services.get(service)?.tree.walk(entries)?;
        Some((index, &self.rules[index]))
    }

    /// Every rule of `service` that matches a request for `api` with `attributes` (each an
    /// attribute and its value, general to specific), in precedence order (see the module
    /// documentation): the first governs, the rest are outranked.
    pub fn matching(
        &self,
        service: &str,
        api: Option<&str>,
        attributes: &[(&str, &str)],
    ) -> Vec<Matched<'_>> {
        let Some(rules) = self.services.get(service) else { return Vec::new() };
        let mut found: Vec<Matched<'_>> = Vec::new();
        let named = api.and_then(|api| rules.by_api.get(api));
        for (api_rules, names_the_api) in [(named, true), (Some(&rules.any_api), false)] {
            let Some(api_rules) = api_rules else { continue };
            let by_first_pair = attributes.iter().filter_map(|(attribute, value)| {
                let rules = api_rules.by_attribute.get(*attribute)?;
                Some(rules.any_value.iter().chain(rules.by_value.get(*value).into_iter().flatten()))
            });
            for &index in api_rules.unconditional.iter().chain(by_first_pair.flatten()) {
                if found.iter().any(|matched| matched.index == index) {
                    continue;
                }
                if let Some((position, exact_at_position)) = self.position(index, attributes) {
                    found.push(Matched {
                        index,
                        rule: &self.rules[index],
                        position,
                        exact_at_position,
                        names_the_api,
                    });
                }
            }
        }
        found.sort_by(|a, b| {
            b.position
                .cmp(&a.position)
                .then(b.exact_at_position.cmp(&a.exact_at_position))
                .then(b.names_the_api.cmp(&a.names_the_api))
                .then(b.rule.spec.priority().cmp(&a.rule.spec.priority()))
                .then_with(|| a.rule.id.cmp(&b.rule.id))
        });
        found
    }

    /// What keys rule `index`'s bucket for a request with `attributes` (which it matches):
    /// each attribute its selector names, in the selector's (sorted) order, with the value of
    /// the attribute it matched (the latest of that name whose value its pattern matches, as
    /// [`Snapshot::matching`] finds it). Attributes it does not name are not in it, so they
    /// never split its bucket. `None` when the rule does not match.
    pub fn keyed_by<'s, 'a>(
        &'s self,
        index: usize,
        attributes: &[(&'a str, &'a str)],
    ) -> Option<Vec<(&'s str, &'a str)>> {
        self.compiled[index]
            .pairs
            .iter()
            .map(|(attribute, pattern)| {
                let (_, value) = attributes
                    .iter()
                    .rev()
                    .find(|(name, value)| *name == &**attribute && pattern.matches(value))?;
                Some((&**attribute, *value))
            })
            .collect()
    }

    /// Whether rule `index`'s selector pairs are all among `attributes`: `None` if not, else
    /// the position of the most specific attribute it names (`None` when it names none) and
    /// whether it names that attribute with an exact value.
    fn position(&self, index: usize, attributes: &[(&str, &str)]) -> Option<(Option<usize>, bool)> {
        let mut most_specific: Option<(usize, bool)> = None;
        for (attribute, pattern) in &self.compiled[index].pairs {
            let at = attributes
                .iter()
                .rposition(|(name, value)| *name == &**attribute && pattern.matches(value))?;
            let exact = matches!(pattern, Pattern::Exactly(_));
            if most_specific.is_none_or(|(latest, _)| at > latest) {
                most_specific = Some((at, exact));
            }
        }
        Some((most_specific.map(|(at, _)| at), most_specific.is_some_and(|(_, exact)| exact)))
    }

    /// The own rule that governs `scope` for `domain`, which is in `tier`; `None` when no rule
    /// selects it.
    pub fn resolve(&self, scope: Scope, domain: Uuid, tier: Tier) -> Option<Resolved<'_>> {
        self.candidates(scope, domain, tier).next()
    }

    /// Every own rule that selects `scope` for `domain`, in precedence order: the first
    /// governs, the rest are outranked.
    pub fn candidates(&self, scope: Scope, domain: Uuid, tier: Tier) -> impl Iterator<Item = Resolved<'_>> {
        let mut text = Uuid::encode_buffer();
        let domain = &*domain.hyphenated().encode_lower(&mut text);
        let attributes = [("tier", tier.as_str()), ("domain", domain)];
        self.matching(OWN_SERVICE, Some(scope.as_str()), &attributes).into_iter().filter_map(|matched| {
            let Target::Own { selector, .. } = matched.rule.spec.target() else { return None };
            Some(Resolved { index: matched.index, rule: matched.rule, level: Level::of(*selector) })
        })
    }
}

/// Each rule id's content in `older` and in `newer` (either absent), for the ids in either.
fn changed<'a>(
    older: &'a Snapshot,
    newer: &'a Snapshot,
) -> Vec<(Option<&'a RuleSpec>, Option<&'a RuleSpec>)> {
    let by_id = |snapshot: &'a Snapshot| -> HashMap<&'a RuleId, &'a RuleSpec> {
        snapshot.rules().iter().map(|rule| (&rule.id, &rule.spec)).collect()
    };
    let (old, new) = (by_id(older), by_id(newer));
    let ids: std::collections::BTreeSet<&RuleId> = old.keys().chain(new.keys()).copied().collect();
    ids.into_iter().map(|id| (old.get(id).copied(), new.get(id).copied())).collect()
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::{Actor, RuleDraft, RuleId, Version};

    fn rule(id: &str, scope: Scope, selector: Selector, priority: i64) -> Rule {
        let spec = RuleDraft {
            service: None,
            scope: scope.as_str().into(),
            selector,
            rate: 1.0,
            per_ms: None,
            burst: 1.0,
            algorithm: None,
            mode: None,
            fail_mode: None,
            priority: Some(priority),
            charge: None,
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
            service: None,
            scope: "secret_read_node".into(),
            selector,
            rate,
            per_ms: None,
            burst,
            algorithm: None,
            mode: None,
            fail_mode: None,
            priority: Some(priority),
            charge: None,
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
            snapshot.rules().iter().find(|rule| rule.id.as_str() == id).unwrap().spec.clone()
        };
        assert!(!RuleSpec::may_grow(Some(&spec(&before, "shrinks")), Some(&spec(&after, "shrinks"))));
        assert!(!RuleSpec::may_grow(Some(&spec(&before, "same")), Some(&spec(&after, "same"))));
        assert!(RuleSpec::may_grow(None, Some(&spec(&after, "comes"))));
        assert!(RuleSpec::may_grow(Some(&spec(&before, "goes")), None));
    }

    #[test]
    fn a_rule_gives_its_takes_its_limit_algorithm_mode_and_fail_mode() {
        let mut draft = RuleDraft {
            service: None,
            scope: "access_issuance_domain".into(),
            selector: Selector::AllDomains,
            rate: 2.0,
            per_ms: None,
            burst: 10.0,
            algorithm: Some("GCRA".into()),
            mode: Some("SHADOW".into()),
            fail_mode: Some("STATIC".into()),
            priority: None,
            charge: None,
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

    fn service_rule(id: &str, api: &str, selector: &[(&str, &str)], priority: i64) -> Rule {
        let spec = RuleDraft {
            service: Some(crate::ServiceDraft {
                service: "directory".into(),
                api: Some(api.into()),
                selector: selector
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                    .collect(),
            }),
            scope: String::new(),
            selector: Selector::AllDomains,
            rate: 1.0,
            per_ms: None,
            burst: 1.0,
            algorithm: None,
            mode: None,
            fail_mode: None,
            priority: Some(priority),
            charge: None,
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

    /// Another service's precedence: the latest attribute named, then a named API, then
    /// priority, then the smaller id; `*` matches any value; every pair must be there.
    #[test]
    fn a_services_request_is_governed_by_the_most_specific_attribute_then_api_then_priority_then_id() {
        let snapshot = Snapshot::compile(
            3,
            vec![
                service_rule("everything", "*", &[], 0),
                service_rule("users-any-sku", "GET /v1/users", &[("sku", "*")], 0),
                service_rule("any-premium", "*", &[("sku", "premium")], 0),
                service_rule("users-premium", "GET /v1/users", &[("sku", "premium")], 0),
                service_rule("users-premium-urgent", "GET /v1/users", &[("sku", "premium")], 5),
                service_rule("tenant-b", "*", &[("tenant", "contoso")], 0),
                service_rule("tenant-a", "*", &[("tenant", "contoso")], 0),
                service_rule("eu-premium", "GET /v1/groups", &[("region", "eu"), ("sku", "premium")], 0),
            ],
        );
        let winner = |api: &str, attributes: &[(&str, &str)]| {
            let matched = snapshot.matching("directory", Some(api), attributes);
            matched.first().map(|matched| matched.rule.id.as_str().to_owned())
        };
        let users = "GET /v1/users";
        assert_eq!(winner(users, &[("sku", "premium"), ("tenant", "contoso")]).as_deref(), Some("tenant-a"));
        assert_eq!(
            winner(users, &[("sku", "premium"), ("tenant", "fabrikam")]).as_deref(),
            Some("users-premium-urgent")
        );
        assert_eq!(winner(users, &[("sku", "free")]).as_deref(), Some("users-any-sku"));
        assert_eq!(winner("GET /v1/orders", &[("sku", "premium")]).as_deref(), Some("any-premium"));
        assert_eq!(winner("GET /v1/groups", &[("sku", "premium")]).as_deref(), Some("any-premium"));
        assert_eq!(
            winner("GET /v1/groups", &[("region", "eu"), ("sku", "premium")]).as_deref(),
            Some("eu-premium")
        );
        // An attribute's position, not the selector's order, makes it specific.
        assert_eq!(
            winner("GET /v1/groups", &[("sku", "premium"), ("region", "eu")]).as_deref(),
            Some("eu-premium")
        );
        assert_eq!(winner("GET /v1/orders", &[("colour", "blue")]).as_deref(), Some("everything"));
        // Another service, or our own, shares nothing with it.
        assert!(snapshot.matching("billing", Some(users), &[("sku", "premium")]).is_empty());
        assert_eq!(snapshot.resolve(Scope::IngestNode, Uuid::new_v4(), Tier::Premium), None);
        let listed: Vec<&str> =
            snapshot.service_rules("directory").iter().map(|rule| rule.id.as_str()).collect();
        assert_eq!(listed[0], "eu-premium", "named APIs first, the more attributes first: {listed:?}");
        assert_eq!(listed.len(), 8);
    }

    /// Issue 32: among rules naming the same latest attribute, an exact value outranks `*`,
    /// before the API and priority; so a tenant's override beats the template every tenant
    /// inherits whatever their priorities and APIs.
    #[test]
    fn an_exact_value_outranks_a_wildcard_at_the_same_attribute() {
        let snapshot = Snapshot::compile(
            4,
            vec![
                service_rule(
                    "premium-per-tenant",
                    "GET /v1/users",
                    &[("sku", "premium"), ("tenant", "*")],
                    9,
                ),
                service_rule("contoso", "*", &[("tenant", "contoso")], 0),
                service_rule("premium-shared", "GET /v1/users", &[("sku", "premium")], 0),
            ],
        );
        let winner = |attributes: &[(&str, &str)]| {
            let matched = snapshot.matching("directory", Some("GET /v1/users"), attributes);
            matched.first().map(|matched| matched.rule.id.as_str().to_owned())
        };
        assert_eq!(winner(&[("sku", "premium"), ("tenant", "contoso")]).as_deref(), Some("contoso"));
        assert_eq!(
            winner(&[("sku", "premium"), ("tenant", "fabrikam")]).as_deref(),
            Some("premium-per-tenant")
        );
        // No tenant: only the shared premium rule matches.
        assert_eq!(winner(&[("sku", "premium")]).as_deref(), Some("premium-shared"));
        // The latest attribute still comes first: with the entries the other way round, the
        // rules naming `sku` exactly outrank Contoso's, and priority decides between them.
        assert_eq!(
            winner(&[("tenant", "contoso"), ("sku", "premium")]).as_deref(),
            Some("premium-per-tenant")
        );
    }

    /// Issue 32: the governing rule says what keys its bucket. The reproduction: Contoso's
    /// override keyed by every entry gave `sku=x1` .. `sku=x6` a fresh bucket each.
    #[test]
    fn a_rule_keys_its_bucket_by_the_attributes_it_names_and_no_others() {
        let snapshot = Snapshot::compile(
            5,
            vec![
                service_rule("contoso", "GET /v1/users", &[("tenant", "contoso")], 0),
                service_rule("premium-per-tenant", "*", &[("tenant", "*"), ("sku", "premium")], 0),
                service_rule("everything", "*", &[], 0),
            ],
        );
        let keyed = |attributes: &[(&str, &str)]| {
            let matched = snapshot.matching("directory", Some("GET /v1/users"), attributes);
            let first = matched.first().unwrap();
            let keyed: Vec<(String, String)> = snapshot
                .keyed_by(first.index, attributes)
                .unwrap()
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect();
            (first.rule.id.as_str().to_owned(), keyed)
        };
        let pair = |key: &str, value: &str| (key.to_owned(), value.to_owned());
        for sku in ["basic", "x1", "x6"] {
            assert_eq!(
                keyed(&[("sku", sku), ("tenant", "contoso")]),
                ("contoso".into(), vec![pair("tenant", "contoso")]),
                "an entry the rule ignores does not split its bucket"
            );
        }
        // A wildcard keys a bucket per value; an exact pair one bucket; sorted by attribute.
        assert_eq!(
            keyed(&[("region", "eu"), ("sku", "premium"), ("tenant", "fabrikam")]),
            ("premium-per-tenant".into(), vec![pair("sku", "premium"), pair("tenant", "fabrikam")])
        );
        // Of an attribute given twice, the latest whose value the pattern matches.
        assert_eq!(
            keyed(&[("tenant", "a"), ("sku", "premium"), ("tenant", "b")]),
            ("premium-per-tenant".into(), vec![pair("sku", "premium"), pair("tenant", "b")])
        );
        assert_eq!(keyed(&[("colour", "blue")]), ("everything".into(), vec![]));
        // A rule that does not match keys nothing.
        let contoso = snapshot.rules().iter().position(|rule| rule.id.as_str() == "contoso").unwrap();
        assert_eq!(snapshot.keyed_by(contoso, &[("tenant", "fabrikam")]), None);
    }

    #[test]
    fn an_empty_snapshot_governs_nothing() {
        let snapshot = Snapshot::empty();
        assert_eq!(snapshot.resolve(Scope::IngestNode, Uuid::new_v4(), Tier::Standard), None);
        assert_eq!(snapshot.revision(), 0);
    }
}
