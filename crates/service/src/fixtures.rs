//! Rules for the unit tests, built as a writer's draft would be.

use chrono::Utc;
use ratebudget::Scope;
use rules::{Actor, Rule, RuleDraft, RuleId, RuleSpec, Selector, ServiceDraft, Version};

/// A rule of our own: `rate` a second, a burst of `rate`.
pub(crate) fn own_spec(scope: Scope, selector: Selector, rate: f64) -> RuleSpec {
    draft(None, scope.as_str(), selector, rate, None, rate)
}

/// Another service's (`directory`) rule for `api` (`None`: every API) with `selector`:
/// `rate` per `per_ms` (a second when `None`), a burst of `burst`.
pub(crate) fn service_spec(
    api: Option<&str>,
    selector: &[(&str, &str)],
    rate: f64,
    per_ms: Option<i64>,
    burst: f64,
) -> RuleSpec {
    let service = ServiceDraft {
        service: "directory".into(),
        api: api.map(str::to_owned),
        selector: selector.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect(),
    };
    draft(Some(service), "", Selector::AllDomains, rate, per_ms, burst)
}

fn draft(
    service: Option<ServiceDraft>,
    scope: &str,
    selector: Selector,
    rate: f64,
    per_ms: Option<i64>,
    burst: f64,
) -> RuleSpec {
    RuleDraft {
        service,
        scope: scope.into(),
        selector,
        rate,
        per_ms,
        burst,
        algorithm: None,
        mode: None,
        fail_mode: None,
        priority: None,
        charge: None,
    }
    .validate()
    .unwrap()
}

/// `spec` as rule `id` at `version`.
pub(crate) fn rule_at(id: &str, spec: RuleSpec, version: i64, actor: &Actor) -> Rule {
    Rule {
        id: RuleId::parse(id).unwrap(),
        spec,
        version: Version::new(version).unwrap(),
        created_by: actor.clone(),
        updated_at: Utc::now(),
    }
}

/// `spec` as rule `id`, at version 1, written by `test`.
pub(crate) fn rule(id: &str, spec: RuleSpec) -> Rule {
    rule_at(id, spec, 1, &Actor::new("test").unwrap())
}
