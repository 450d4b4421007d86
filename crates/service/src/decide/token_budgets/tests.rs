//! Token budgets through the decide service, on a store in memory that decides, charges and
//! reads as the ratebudget store does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::TimeDelta;

use chrono::{DateTime, TimeZone, Utc};
use ratebudget::{
    Clock, Decider, Decision, Fill, Key, ManualClock, Name, Refusal, Spend, Spender, Take, Undecided,
};
use rules::{Actor, Rule, RuleDraft, RuleId, ServiceDraft, Services, Snapshot, Version};

use super::super::{
    Answer, Code, DecideError, DecideObserver, DecideService, Descriptor, Entry, Outcome, Request, Verdict,
};
use crate::budgets::{Precheck, RuleBudgets};
use crate::defaults::{DefaultBudget, DefaultBudgets};

/// Rows as `rate_budgets` holds them, decided, charged and read by the statements' arithmetic.
#[derive(Debug, Default)]
struct Ledger {
    rows: Mutex<HashMap<(Name, Key), Fill>>,
    takes: Mutex<Vec<Take>>,
    failing: AtomicBool,
}

impl Ledger {
    fn row(&self, spend: &Spend, now: DateTime<Utc>) -> Fill {
        let rows = self.rows.lock().unwrap();
        rows.get(&(spend.name, spend.key))
            .copied()
            .unwrap_or(Fill { tokens: spend.limit.burst(), refilled_at: now })
    }

    fn write(&self, spend: &Spend, fill: Fill) {
        self.rows.lock().unwrap().insert((spend.name, spend.key), fill);
    }

    fn fail(&self) -> Result<(), Undecided> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(Undecided::Malformed("the store is down".into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Decider for Ledger {
    /// Refuses what the bucket cannot cover; a take it would grant is the integration tests'
    /// (`tests/it/decide.rs`): a grant is the store's to build.
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        self.fail()?;
        self.takes.lock().unwrap().push(take.clone());
        for (which, spend) in take.spends() {
            let fill = self.row(&spend, now);
            if spend.limit.level(fill, now) < spend.cost {
                let retry_after = spend.limit.time_to_cover(fill, spend.cost, now);
                return Ok(Decision::Refused(Refusal { which, retry_after, judged: Some(fill), tat: None }));
            }
        }
        panic!("a take this ledger would grant: {take:?}")
    }

    async fn charge(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
        self.fail()?;
        let fill = self.row(&spend, now);
        let left = spend.limit.level(fill, now) - spend.cost;
        let from = fill.refilled_at.max(now);
        let charged = if left >= 0.0 {
            Fill { tokens: left, refilled_at: from }
        } else {
            let micros = (-left / spend.limit.per_second() * 1e6).round() as i64;
            Fill { tokens: 0.0, refilled_at: from + chrono::TimeDelta::microseconds(micros) }
        };
        self.write(&spend, charged);
        Ok(Some(charged))
    }

    async fn peek(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
        self.fail()?;
        Ok(Some(self.row(&spend, now)))
    }
}

#[derive(Debug)]
struct NoPrecheck;

impl Precheck for NoPrecheck {
    fn forget(&self, _: Name, _: Key) {}
    fn forget_every_bucket_of(&self, _: Name) {}
    fn remembered_buckets(&self) -> u64 {
        0
    }
}

#[derive(Default)]
struct Heard(Mutex<Vec<(String, Verdict)>>);

impl DecideObserver for Heard {
    fn decided(&self, _: &str, _: Outcome, _: Duration) {}

    fn ruled(&self, _: &str, rule: &str, verdict: Verdict) {
        self.0.lock().unwrap().push((rule.to_owned(), verdict));
    }
}

/// A rule of service `llm`, per tenant: `per_minute` tokens a minute, a burst of as many.
fn rule(id: &str, api: &str, per_minute: f64, charge: &str, mode: &str) -> Rule {
    let spec = RuleDraft {
        service: Some(ServiceDraft {
            service: "llm".into(),
            api: Some(api.into()),
            selector: vec![("tenant".into(), "*".into())],
        }),
        scope: String::new(),
        selector: rules::Selector::AllDomains,
        rate: per_minute,
        per_ms: Some(60_000),
        burst: per_minute,
        algorithm: None,
        mode: Some(mode.into()),
        fail_mode: None,
        priority: None,
        charge: Some(charge.into()),
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

struct Service {
    service: DecideService,
    ledger: Arc<Ledger>,
    clock: Arc<ManualClock>,
    heard: Arc<Heard>,
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()
}

/// Rules: `tokens` (the LLM's tokens, 1000 a minute, charged ALWAYS), `requests` (100 a
/// minute, charged when covered), `shadow` (1 a minute, SHADOW).
fn service() -> Service {
    let defaults = DefaultBudgets::try_from_fn(|_| {
        Ok::<_, ()>(DefaultBudget {
            limit: ratebudget::Limit::new(1.0, 1.0).unwrap(),
            fail_mode: ratebudget::FailMode::Closed,
        })
    })
    .unwrap();
    let budgets = Arc::new(RuleBudgets::new(defaults, Arc::new(NoPrecheck), rules::RuleRefs::default()));
    budgets.install_rules(Snapshot::compile(
        1,
        vec![
            rule("tokens", "tokens", 1000.0, "ALWAYS", "ENFORCE"),
            rule("requests", "requests", 100.0, "WHEN_COVERED", "ENFORCE"),
            rule("shadow", "shadow", 1.0, "WHEN_COVERED", "SHADOW"),
        ],
    ));
    budgets.install_tiers(access::TierDirectory { revision: 0, tiers: Vec::new() });
    let ledger = Arc::new(Ledger::default());
    let clock = Arc::new(ManualClock::new(now()));
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let spender = Spender::new(ledger.clone(), dyn_clock.clone(), budgets.clone());
    let heard = Arc::new(Heard::default());
    Service { service: DecideService::new(budgets, spender, dyn_clock, heard.clone()), ledger, clock, heard }
}

/// A request of `llm` for tenant `acme`: one descriptor per (api, hits_addend).
fn request(descriptors: &[(&str, Option<u64>)]) -> Request {
    Request {
        service: "llm".into(),
        descriptors: descriptors
            .iter()
            .map(|(api, hits)| Descriptor {
                entries: vec![
                    Entry { key: "api".into(), value: (*api).into() },
                    Entry { key: "tenant".into(), value: "acme".into() },
                ],
                hits_addend: *hits,
                limit: None,
            })
            .collect(),
        hits_addend: 0,
    }
}

impl Service {
    /// Empties tenant `acme`'s bucket of the rule `api` (each rule names its API) at now.
    fn empty(&self, api: &str, per_minute: f64) {
        let key = super::super::runtime_key("llm", api, Some(api), &[("tenant", "acme")]);
        let name = crate::budgets::service_buckets();
        let limit = ratebudget::Limit::new(per_minute / 60.0, per_minute).unwrap();
        self.ledger
            .write(&Spend::new(name, key, 0.0, limit), Fill { tokens: 0.0, refilled_at: self.clock.now() });
    }

    async fn decide(&self, descriptors: &[(&str, Option<u64>)]) -> Answer {
        self.service.decide(&Services::AllButOwn, &request(descriptors)).await.unwrap()
    }

    fn header<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
        answer.headers.iter().find(|(key, _)| *key == name).map(|(_, value)| value.as_str())
    }
}

#[tokio::test]
async fn a_token_budget_checks_with_zero_charges_into_debt_and_refuses_until_refill_repays_it() {
    let service = service();
    // An explicit 0 asks without spending: OK, the whole burst left, nothing written.
    let checked = service.decide(&[("tokens", Some(0))]).await;
    assert_eq!((checked.overall, checked.statuses[0].limit_remaining), (Code::Ok, Some(1000)));
    assert!(service.ledger.rows.lock().unwrap().is_empty());
    // The response's 1500 tokens are charged, more than the bucket holds: accepted, in debt.
    let charged = service.decide(&[("tokens", Some(1500))]).await;
    assert_eq!(charged.overall, Code::Ok);
    assert_eq!(charged.statuses[0].limit_remaining, Some(0));
    // 500 of debt (30 s at 1000 a minute), then a minute to refill.
    assert_eq!(charged.statuses[0].until_reset, Some(Duration::from_secs(90)));
    assert!(service.ledger.takes.lock().unwrap().is_empty(), "a charge is no take");
    // The next check is over the limit until the debt is repaid and a token refilled.
    let over = service.decide(&[("tokens", Some(0))]).await;
    assert_eq!(over.overall, Code::OverLimit);
    assert_eq!(over.statuses[0].limit_remaining, Some(0));
    assert_eq!(over.statuses[0].until_reset, Some(Duration::from_millis(30_060)));
    assert_eq!(Service::header(&over, "retry-after"), Some("31"));
    assert!(Service::header(&over, "ratelimit").is_some(), "{:?}", over.headers);
    service.clock.advance(TimeDelta::seconds(29));
    assert_eq!(service.decide(&[("tokens", Some(0))]).await.overall, Code::OverLimit);
    service.clock.advance(TimeDelta::milliseconds(1_060));
    let repaid = service.decide(&[("tokens", Some(0))]).await;
    assert_eq!((repaid.overall, repaid.statuses[0].limit_remaining), (Code::Ok, Some(1)));
    let verdicts: Vec<Verdict> =
        service.heard.0.lock().unwrap().iter().map(|(_, verdict)| *verdict).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::WithinLimit,
            Verdict::NearLimit,
            Verdict::OverLimit,
            Verdict::OverLimit,
            Verdict::NearLimit
        ]
    );
}

#[tokio::test]
async fn a_check_over_the_limit_refuses_the_request_before_anything_is_spent() {
    let service = service();
    service.decide(&[("tokens", Some(1500))]).await;
    let rows = service.ledger.rows.lock().unwrap().clone();
    // The check and a take of another rule in one request: all or nothing.
    let answer = service.decide(&[("requests", Some(1)), ("tokens", Some(0))]).await;
    assert_eq!(answer.overall, Code::OverLimit);
    assert_eq!((answer.statuses[0].code, answer.statuses[1].code), (Code::Ok, Code::OverLimit));
    assert!(service.ledger.takes.lock().unwrap().is_empty(), "nothing taken");
    assert_eq!(*service.ledger.rows.lock().unwrap(), rows, "nothing written");
    // A normal rule's check of an empty bucket is over the limit too, and writes nothing.
    service.empty("requests", 100.0);
    let rows = service.ledger.rows.lock().unwrap().clone();
    let empty = service.decide(&[("requests", Some(0))]).await;
    assert_eq!(empty.overall, Code::OverLimit);
    // A token at 100 a minute: 0.6 s, said as a whole second.
    assert_eq!(Service::header(&empty, "retry-after"), Some("1"));
    assert_eq!(empty.statuses[0].until_reset, Some(Duration::from_millis(600)));
    assert_eq!(*service.ledger.rows.lock().unwrap(), rows);
}

#[tokio::test]
async fn a_request_refused_by_another_descriptor_charges_nothing() {
    let service = service();
    service.empty("requests", 100.0);
    let rows = service.ledger.rows.lock().unwrap().clone();
    let refused = service.decide(&[("requests", Some(1)), ("tokens", Some(700))]).await;
    assert_eq!(refused.overall, Code::OverLimit);
    assert_eq!(service.ledger.takes.lock().unwrap().len(), 1);
    assert_eq!(*service.ledger.rows.lock().unwrap(), rows, "the tokens were not charged");
}

#[tokio::test]
async fn a_shadow_rules_check_admits_and_counts_as_shadow() {
    let service = service();
    service.empty("shadow", 1.0);
    let answer = service.decide(&[("shadow", Some(0))]).await;
    assert_eq!(answer.overall, Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, None);
    assert_eq!(
        service.heard.0.lock().unwrap().last(),
        Some(&("shadow".to_owned(), Verdict::ShadowOverLimit))
    );
}

#[tokio::test]
async fn a_store_that_cannot_check_or_charge_leaves_a_closed_rules_request_undecided() {
    let service = service();
    service.ledger.failing.store(true, Ordering::SeqCst);
    for hits in [0, 10] {
        let undecided =
            service.service.decide(&Services::AllButOwn, &request(&[("tokens", Some(hits))])).await;
        assert!(matches!(undecided, Err(DecideError::Undecided(_))), "{undecided:?}");
    }
}
