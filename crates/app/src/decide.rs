//! plexsphere as a rate-limit service: decisions for any service's requests, by that service's
//! rules, for `POST /v1/decide` ([`crate::http`]) and Envoy's `ShouldRateLimit`
//! ([`crate::grpc`]) alike.
//!
//! A request names a service (Envoy's `domain`) and descriptors, each an ordered list of
//! entries from general to specific; the entry keyed `api` names the API, the others are
//! attributes. Each descriptor is governed by the rule [`rules::Snapshot::matching`] ranks
//! first, or by none (unlimited, no statement). Its bucket is its runtime key: 64 bits of
//! SHA-256 over the service and every entry, under the budget [`service_buckets`]. The
//! descriptors of one request that some rule governs are decided together, all or nothing, in
//! one round trip (a single take, or a pair), through the same guard (pre-check, circuit, fail
//! modes) and coalescing as this project's own takes; a SHADOW rule's refusal admits and is
//! counted. A CLOSED rule whose store cannot answer makes the whole request undecided.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ratebudget::{Clock, Decision, Fill, Key, Limit, Spend, Spender, Take, Undecided, Which};
use sha2::{Digest, Sha256};

pub use crate::budgets::service_buckets;
use crate::budgets::{NotLoaded, RuleBudgets};
use crate::metrics::Metrics;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 16;
/// The most entries one descriptor may carry (its `api` among them).
pub const MAX_ENTRIES: usize = 17;
/// The most descriptors of one request some rule may govern: they are decided together in one
/// statement, which takes one bucket or two.
pub const MAX_LIMITED: usize = 2;
/// The largest cost a request may ask for: above it, a float would not count every hit.
const MAX_HITS: u64 = 1 << 53;

/// One entry of a descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The entry's key: `api`, or an attribute.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// One descriptor: its entries, general to specific, and its own cost, if it names one.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// The entries.
    pub entries: Vec<Entry>,
    /// This descriptor's cost, over the request's.
    pub hits_addend: Option<u64>,
}

/// A request for decisions.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Request {
    /// The service (Envoy's `domain`).
    pub service: String,
    /// Its descriptors.
    pub descriptors: Vec<Descriptor>,
    /// What each descriptor costs unless it says otherwise; 0 means 1.
    pub hits_addend: u64,
}

/// A descriptor's or the request's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Within its limit (or unlimited).
    Ok,
    /// Over its limit: the request is refused.
    OverLimit,
}

impl Code {
    /// Envoy's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
        }
    }
}

/// The unit a limit is said in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Per second.
    Second,
    /// Per minute.
    Minute,
    /// Per hour.
    Hour,
    /// Per day.
    Day,
}

impl Unit {
    /// Envoy's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
        }
    }

    fn seconds(self) -> f64 {
        match self {
            Unit::Second => 1.0,
            Unit::Minute => 60.0,
            Unit::Hour => 3600.0,
            Unit::Day => 86_400.0,
        }
    }
}

/// A rule's rate as Envoy says a limit: whole requests per unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The governing rule's id (Envoy's `name`).
    pub rule_id: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

impl CurrentLimit {
    /// `limit`'s rate in the smallest of second, minute, hour and day in which it is a whole
    /// number of requests (1 per 60,000 ms is 1 a MINUTE, 50 a second 50 a SECOND), else per
    /// second rounded down.
    pub fn of(rule_id: &str, limit: Limit) -> CurrentLimit {
        let per_second = limit.per_second();
        let whole = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day].into_iter().find_map(|unit| {
            let count = per_second * unit.seconds();
            let nearest = count.round();
            // Rates come from a rule's `rate / (per_ms / 1000)`: allow the division's last bit.
            ((count - nearest).abs() <= 1e-9 * nearest.max(1.0) && nearest >= 1.0).then_some((nearest, unit))
        });
        let (count, unit) = whole.unwrap_or((per_second.floor(), Unit::Second));
        CurrentLimit {
            rule_id: rule_id.to_owned(),
            requests_per_unit: if count >= f64::from(u32::MAX) { u32::MAX } else { count as u32 },
            unit,
        }
    }
}

/// One descriptor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Its verdict.
    pub code: Code,
    /// The governing rule's limit; `None`: no rule governs it (unlimited).
    pub current_limit: Option<CurrentLimit>,
    /// Whole tokens its bucket holds after the decision; `None` when the decision did not say
    /// (the other descriptor of a pair that was refused, a shadow refusal admitted, a decision
    /// without the store).
    pub limit_remaining: Option<u32>,
    /// Until its bucket is full again, if nothing spends; `None` when unknown, as above.
    pub until_reset: Option<Duration>,
}

impl Status {
    const UNLIMITED: Status =
        Status { code: Code::Ok, current_limit: None, limit_remaining: None, until_reset: None };
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// `OverLimit` when any descriptor is.
    pub overall: Code,
    /// One per descriptor, in the request's order.
    pub statuses: Vec<Status>,
    /// The response fields the HTTP API would send: `RateLimit-Policy` and `RateLimit` of the
    /// binding bucket, and `Retry-After` when over the limit.
    pub headers: Vec<(&'static str, String)>,
}

/// Why a request was not decided.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The request is malformed: nothing was spent.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field, as the HTTP API names it.
        field: &'static str,
        /// What it must be.
        reason: String,
    },
    /// This replica has not loaded the rules yet.
    #[error(transparent)]
    NotLoaded(#[from] NotLoaded),
    /// The store could not decide a take that fails closed (or this replica's clock cannot
    /// be trusted).
    #[error("the rate-budget store could not decide")]
    Undecided(#[source] Undecided),
}

fn invalid(field: &'static str, reason: impl Into<String>) -> DecideError {
    DecideError::Invalid { field, reason: reason.into() }
}

/// Decides [`Request`]s: the rules (through the replica's [`RuleBudgets`]), the spender over the
/// guard, and the metrics.
#[derive(Clone)]
pub struct DecideService {
    budgets: Arc<RuleBudgets>,
    spender: Spender,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
}

impl DecideService {
    /// Decides by `budgets`' rules through `spender`, at `clock`'s now, counting into `metrics`.
    pub fn new(
        budgets: Arc<RuleBudgets>,
        spender: Spender,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
    ) -> DecideService {
        DecideService { budgets, spender, clock, metrics }
    }

    /// Decides `request`.
    ///
    /// # Errors
    /// [`DecideError::Invalid`] for a malformed request (nothing spent), [`DecideError::NotLoaded`]
    /// before the rules are loaded, [`DecideError::Undecided`] when the store could not decide.
    pub async fn decide(&self, request: &Request) -> Result<Answer, DecideError> {
        let outcome = self.decide_counted(request).await;
        let service = match &outcome {
            Err(DecideError::Invalid { .. }) => None,
            _ => Some(request.service.as_str()),
        };
        if let Some(service) = service {
            let known = self.budgets.has_service_rules(service);
            let label = if known { service } else { "other" };
            let outcome = match &outcome {
                Ok(answer) if answer.overall == Code::Ok => "ok",
                Ok(_) => "over_limit",
                Err(_) => "error",
            };
            self.metrics.service_decision(label, outcome);
        }
        outcome
    }

    async fn decide_counted(&self, request: &Request) -> Result<Answer, DecideError> {
        let service = rules::Service::parse(&request.service).map_err(|_| {
            invalid(
                "domain",
                "must be a service name: 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit",
            )
        })?;
        if service.is_own() {
            return Err(invalid(
                "domain",
                "plexsphere's own budgets are spent by its own routes, not decided for callers",
            ));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(invalid("descriptors", format!("at most {MAX_DESCRIPTORS} a request")));
        }
        for descriptor in &request.descriptors {
            check_entries(&descriptor.entries)?;
        }
        let compiled = self.budgets.compiled_rules()?;
        let mut statuses = vec![Status::UNLIMITED; request.descriptors.len()];
        // Each limited descriptor: its position in the request, its spend, and its rule's id.
        let mut limited: Vec<(usize, Spend, &str)> = Vec::new();
        for (position, descriptor) in request.descriptors.iter().enumerate() {
            let api =
                descriptor.entries.iter().find(|entry| entry.key == "api").map(|entry| entry.value.as_str());
            let attributes: Vec<(&str, &str)> = descriptor
                .entries
                .iter()
                .filter(|entry| entry.key != "api")
                .map(|entry| (entry.key.as_str(), entry.value.as_str()))
                .collect();
            let Some(governing) =
                compiled.snapshot.matching(service.as_str(), api, &attributes).into_iter().next()
            else {
                continue;
            };
            let hits = descriptor.hits_addend.unwrap_or(request.hits_addend).max(1);
            if hits > MAX_HITS {
                return Err(invalid("hits_addend", format!("must be at most {MAX_HITS}")));
            }
            let policy = compiled.policies[governing.index];
            let spend = Spend {
                name: service_buckets(),
                key: runtime_key(service.as_str(), &descriptor.entries),
                cost: hits as f64,
                limit: policy.limit,
                enforcement: policy.enforcement,
            };
            limited.push((position, spend, governing.rule.id.as_str()));
        }
        let take = match limited.as_slice() {
            [] => return Ok(Answer { overall: Code::Ok, statuses, headers: Vec::new() }),
            [(_, only, _)] => Take::Single(*only),
            [(_, first, _), (_, second, _)] => Take::Pair(*first, *second),
            _ => {
                return Err(invalid(
                    "descriptors",
                    format!("at most {MAX_LIMITED} of a request's descriptors may be governed by rules: they are decided together, all or nothing, in one statement"),
                ))
            }
        };
        let now = self.clock.now();
        let decision = self.spender.decide_at(take, now).await.map_err(DecideError::Undecided)?;
        let which = [Which::First, Which::Second];
        let mut headers = Vec::new();
        let mut binding: Option<(u32, usize)> = None;
        for (slot, (position, spend, rule_id)) in limited.iter().enumerate() {
            let status = &mut statuses[*position];
            status.current_limit = Some(CurrentLimit::of(rule_id, spend.limit));
            let at = which[slot];
            match &decision {
                Decision::Granted(grant) => {
                    if let Some(fill) = grant.remaining(at) {
                        let (remaining, until_reset) = reading(spend.limit, fill, now);
                        status.limit_remaining = Some(remaining);
                        status.until_reset = Some(until_reset);
                        if binding.is_none_or(|(least, _)| remaining < least) {
                            binding = Some((remaining, slot));
                        }
                    }
                }
                Decision::Refused(refusal) if refusal.which == at => {
                    status.code = Code::OverLimit;
                    let fill = refusal.judged.unwrap_or(Fill { tokens: 0.0, refilled_at: now });
                    let (remaining, until_reset) = reading(spend.limit, fill, now);
                    status.limit_remaining = Some(remaining);
                    status.until_reset = Some(until_reset);
                    push_fields(&mut headers, rule_id, spend.limit, Some(fill), now);
                    let seconds = ratebudget_tower::retry_after_seconds(refusal.retry_after);
                    headers.push(("retry-after", seconds.to_string()));
                }
                Decision::InsufficientCapacity(never) if never.which == at => status.code = Code::OverLimit,
                Decision::Refused(_) | Decision::InsufficientCapacity(_) => {}
            }
        }
        if let (Decision::Granted(grant), Some((_, slot))) = (&decision, binding) {
            let (_, spend, rule_id) = &limited[slot];
            push_fields(&mut headers, rule_id, spend.limit, grant.remaining(which[slot]), now);
        }
        let overall = if statuses.iter().any(|status| status.code == Code::OverLimit) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Answer { overall, statuses, headers })
    }
}

/// Whole tokens `fill` holds at `now` under `limit`, and how long until it is full again.
fn reading(limit: Limit, fill: Fill, now: DateTime<Utc>) -> (u32, Duration) {
    let level = limit.level(fill, now).max(0.0).floor();
    let remaining = if level >= f64::from(u32::MAX) { u32::MAX } else { level as u32 };
    (remaining, limit.time_to_cover(fill, limit.burst(), now))
}

fn push_fields(
    headers: &mut Vec<(&'static str, String)>,
    rule_id: &str,
    limit: Limit,
    fill: Option<Fill>,
    now: DateTime<Utc>,
) {
    if let Some((policy, state)) = ratebudget_tower::bucket_fields(rule_id, limit, fill, now) {
        for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
            if let Ok(value) = value.to_str() {
                headers.push((name, value.to_owned()));
            }
        }
    }
}

/// Refuses a descriptor's entries unless there are 1 to [`MAX_ENTRIES`], each key 1 to 128
/// characters and each value at most 256, none of them control characters.
fn check_entries(entries: &[Entry]) -> Result<(), DecideError> {
    let reason = format!("each descriptor has 1 to {MAX_ENTRIES} entries, each key 1 to 128 characters and each value at most 256, none of them control characters");
    let printable = |text: &str, least: usize, most: usize| {
        (least..=most).contains(&text.chars().count()) && !text.chars().any(char::is_control)
    };
    let fits = (1..=MAX_ENTRIES).contains(&entries.len())
        && entries.iter().all(|entry| printable(&entry.key, 1, 128) && printable(&entry.value, 0, 256));
    if fits {
        Ok(())
    } else {
        Err(invalid("descriptors", reason))
    }
}

/// A descriptor's bucket: the first 64 bits of SHA-256 over the service and every entry, each
/// length-prefixed so no two descriptors write the same bytes.
pub fn runtime_key(service: &str, entries: &[Entry]) -> Key {
    let mut hash = Sha256::new();
    let mut field = |text: &str| {
        hash.update((text.len() as u64).to_be_bytes());
        hash.update(text.as_bytes());
    };
    field(service);
    for entry in entries {
        field(&entry.key);
        field(&entry.value);
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    Key::from(uuid::Uuid::from_u64_pair(0, u64::from_be_bytes(first)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs
            .iter()
            .map(|(key, value)| Entry { key: (*key).to_owned(), value: (*value).to_owned() })
            .collect()
    }

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
        // 1/7 a second is no whole number in any unit: per second, rounded down.
        assert_eq!(said(1.0 / 7.0), (0, Unit::Second));
    }

    #[test]
    fn a_descriptors_bucket_is_its_service_and_every_entry_in_order() {
        let contoso = entries(&[("api", "GET /v1/users"), ("tenant", "contoso")]);
        let key = runtime_key("directory", &contoso);
        assert_eq!(key, runtime_key("directory", &contoso));
        assert_ne!(key, runtime_key("billing", &contoso));
        assert_ne!(
            key,
            runtime_key("directory", &entries(&[("tenant", "contoso"), ("api", "GET /v1/users")]))
        );
        // Length prefixes: moving a boundary between key and value is another bucket.
        assert_ne!(runtime_key("s", &entries(&[("ab", "c")])), runtime_key("s", &entries(&[("a", "bc")])));
        assert_eq!(key.as_uuid().as_u64_pair().0, 0, "64 bits");
    }

    #[test]
    fn entries_are_bounded_and_printable() {
        assert!(check_entries(&entries(&[("api", "GET /")])).is_ok());
        assert!(check_entries(&entries(&[("tenant", "")])).is_ok());
        assert!(check_entries(&[]).is_err());
        assert!(check_entries(&entries(&[("", "x")])).is_err());
        assert!(check_entries(&entries(&[("tenant", "a\u{7}b")])).is_err());
        let many: Vec<(&str, &str)> = vec![("k", "v"); MAX_ENTRIES + 1];
        assert!(check_entries(&entries(&many)).is_err());
    }
}
