//! plexsphere as a rate-limit service: decisions for any service's requests, by that service's
//! rules, for every transport alike (the binary serves it as `POST /v1/decide` and as Envoy's
//! `ShouldRateLimit`; each only maps its request in and this answer out).
//!
//! A request names a service (Envoy's `domain`) and descriptors, each an ordered list of
//! entries from general to specific; the entry keyed `api` names the API, the others are
//! attributes. Each descriptor is governed by the rule [`rules::Snapshot::matching`] ranks
//! first, or by none (unlimited, no statement). Its bucket is its runtime key: 64 bits of
//! SHA-256 over the service, the API if the rule names one, and each attribute the rule names
//! with the request's value for it ([`rules::Snapshot::keyed_by`]), under the budget
//! [`service_buckets`]: an entry the rule does not name never splits its bucket. The
//! descriptors of one request that some rule governs are decided together, all or nothing, in
//! one round trip (a single take, a pair, or a take of any number), through the same guard (pre-check, circuit, fail
//! modes) and coalescing as this project's own takes; a SHADOW rule's refusal admits and is
//! counted. A CLOSED rule whose store cannot answer makes the whole request undecided.
//!
//! A service's rules from envoyproxy/ratelimit's files ([`rules::DescriptorRule`]) are found
//! first, by [`rules::Snapshot::walk`], and answer as envoyproxy/ratelimit answers: no limit or
//! `unlimited` without a statement, 0 a unit refused without one, `replaces` dropping the
//! named limit, `quota_mode` descriptors refusing only when all of them are over, each bucket
//! keyed by [`path_key`]. Token budgets (`token_budgets.rs`): an explicit `hits_addend` of 0
//! checks, and a rule charging `ALWAYS` is charged after the take, into debt.
//!
//! Envoy admits a request whose rate-limit call fails, so on this path an error is an
//! admission: nothing a request's values hold (a long value, a control character, a huge
//! cost, many descriptors) makes a decidable request an error. A value is hashed like any
//! other; a cost no bucket can hold is over the limit, as [`ratebudget::Decision`]'s
//! `InsufficientCapacity` is. Only a request malformed as a message (no domain, a descriptor without entries) is
//! [`DecideError::Invalid`].

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ratebudget::{Clock, Decision, Fill, Key, Limit, Spend, Spender, Take, Undecided, Which};
use sha2::{Digest, Sha256};

use rules::PathLimit;

use crate::budgets::{override_buckets, service_buckets, NotLoaded, RuleBudgets};

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
    /// This descriptor's cost, over the request's. An explicit 0 asks without spending: over
    /// the limit while its bucket holds less than a token (docs/adr/0040).
    pub hits_addend: Option<u64>,
    /// Envoy's `limit` override: this request's limit instead of the rules', in a bucket of
    /// its own ([`override_buckets`]).
    pub limit: Option<Override>,
}

/// A descriptor's limit override (Envoy's `RateLimitOverride`, set by the proxy's route
/// configuration): `requests_per_unit` a `unit`, as envoyproxy/ratelimit applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    /// Requests per unit; 0 refuses every request.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
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

/// The unit a limit is said in: the rules context's, which files name too.
pub use rules::Unit;

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
    /// `limit`'s rate in the smallest of second, minute, hour, day, week, month and year in
    /// which it is a whole number of requests (1 per 60,000 ms is 1 a MINUTE, 50 a second 50 a
    /// SECOND), else rounded down in the smallest in which it is at least one request.
    pub fn of(rule_id: &str, limit: Limit) -> CurrentLimit {
        let per_second = limit.per_second();
        let units = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year];
        let whole = units.into_iter().find_map(|unit| {
            let count = per_second * unit.seconds();
            let nearest = count.round();
            // Rates come from a rule's `rate / (per_ms / 1000)`: allow the division's last bit.
            ((count - nearest).abs() <= 1e-9 * nearest.max(1.0) && nearest >= 1.0).then_some((nearest, unit))
        });
        // Else, rounded down, in the smallest unit that holds at least one request: never a
        // limit of 0 for a rate that admits some (a week's quota written as a day's fraction).
        let (count, unit) = whole.unwrap_or_else(|| {
            units
                .into_iter()
                .map(|unit| ((per_second * unit.seconds()).floor(), unit))
                .find(|(count, _)| *count >= 1.0)
                .unwrap_or((0.0, Unit::Second))
        });
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
    /// Until its bucket is full again, if nothing spends (for a check over its limit, an
    /// explicit `hits_addend` of 0, until it holds a token again: its `Retry-After`); `None`
    /// when unknown, as above.
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
    /// The caller's decide token does not name the service.
    #[error("this decide token does not decide for service {service}")]
    Forbidden {
        /// The service asked for.
        service: String,
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

/// What a request came to, as a [`DecideObserver`] hears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Decided, within every limit.
    Ok,
    /// Decided, over a limit.
    OverLimit,
    /// The caller may not ask for the service.
    Forbidden,
    /// Malformed as a message (no domain, a descriptor without entries): not decided.
    Invalid,
    /// Not decided: the rules are not loaded, or the store could not decide.
    Error,
}

impl Outcome {
    /// Its text, as the metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::OverLimit => "over_limit",
            Outcome::Forbidden => "forbidden",
            Outcome::Invalid => "invalid",
            Outcome::Error => "error",
        }
    }
}

/// What one governed descriptor came to under its rule, as envoyproxy/ratelimit counts a
/// rule's hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted, with more than a fifth of the burst left.
    WithinLimit,
    /// Admitted, with at most a fifth of the burst left (envoyproxy/ratelimit's near limit:
    /// past 80% of the limit).
    NearLimit,
    /// Refused: over the limit.
    OverLimit,
    /// Over the limit of a SHADOW rule, and admitted.
    ShadowOverLimit,
}

impl Verdict {
    /// Its text, as the metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::WithinLimit => "within_limit",
            Verdict::NearLimit => "near_limit",
            Verdict::OverLimit => "over_limit",
            Verdict::ShadowOverLimit => "shadow_over_limit",
        }
    }
}

/// Hears every request [`DecideService`] is asked, as [`ratebudget::Observer`] hears every
/// take: the binary's metrics implement it.
#[cfg_attr(test, mockall::automock)]
pub trait DecideObserver: Send + Sync {
    /// `service` (the request's, when it has rules; `other` otherwise, so the labels stay a
    /// bounded set) came to `outcome`, in `took`.
    fn decided(&self, service: &str, outcome: Outcome, took: Duration);

    /// One descriptor of `service` governed by rule `rule` came to `verdict` (rules are
    /// operator-written: a bounded set of labels).
    fn ruled(&self, service: &str, rule: &str, verdict: Verdict);
}

/// Decides [`Request`]s: the rules (through the replica's [`RuleBudgets`]), the spender over the
/// guard, and an observer.
#[derive(Clone)]
pub struct DecideService {
    budgets: Arc<RuleBudgets>,
    spender: Spender,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn DecideObserver>,
}

impl DecideService {
    /// Decides by `budgets`' rules through `spender`, at `clock`'s now, telling `observer`.
    pub fn new(
        budgets: Arc<RuleBudgets>,
        spender: Spender,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn DecideObserver>,
    ) -> DecideService {
        DecideService { budgets, spender, clock, observer }
    }

    /// Decides `request` for a caller that may ask for `services`.
    ///
    /// # Errors
    /// [`DecideError::Invalid`] for a request malformed as a message (nothing spent),
    /// [`DecideError::Forbidden`] for a service the caller may not ask for,
    /// [`DecideError::NotLoaded`] before the rules are loaded, [`DecideError::Undecided`] when
    /// the store could not decide.
    pub async fn decide(&self, services: &rules::Services, request: &Request) -> Result<Answer, DecideError> {
        let started = std::time::Instant::now();
        let outcome = self.decide_counted(services, request).await;
        let known = self.budgets.has_service_rules(&request.service);
        let label = if known { request.service.as_str() } else { "other" };
        let counted = match &outcome {
            Ok(answer) if answer.overall == Code::Ok => Outcome::Ok,
            Ok(_) => Outcome::OverLimit,
            Err(DecideError::Forbidden { .. }) => Outcome::Forbidden,
            Err(invalid @ DecideError::Invalid { .. }) => {
                // A misconfigured proxy sends these at its own rate: one line each at debug,
                // and the count at every level.
                tracing::debug!(service = label, error = %invalid, "a decide request malformed as a message was refused");
                Outcome::Invalid
            }
            Err(_) => Outcome::Error,
        };
        self.observer.decided(label, counted, started.elapsed());
        outcome
    }

    async fn decide_counted(
        &self,
        services: &rules::Services,
        request: &Request,
    ) -> Result<Answer, DecideError> {
        if request.service.is_empty() {
            return Err(invalid("domain", "is required: the service whose rules decide"));
        }
        if request.descriptors.iter().any(|descriptor| descriptor.entries.is_empty()) {
            return Err(invalid("descriptors", "each descriptor has at least one entry"));
        }
        if !services.permits(&request.service) {
            return Err(DecideError::Forbidden { service: request.service.clone() });
        }
        let compiled = self.budgets.compiled_rules()?;
        let service = request.service.as_str();
        let mut statuses = vec![Status::UNLIMITED; request.descriptors.len()];
        // Each limited descriptor: its position in the request, its spend, and its rule's name
        // in metrics and response fields.
        let mut limited: Vec<(usize, Spend, String)> = Vec::new();
        let service_has_rules = compiled.snapshot.has_service(service);
        // Each override or file limit of `requests_per_unit: 0`: its position and limit
        // (refused, no take).
        let mut refuse_all: Vec<(usize, CurrentLimit)> = Vec::new();
        let governing: Vec<Option<Governed<'_>>> = request
            .descriptors
            .iter()
            .map(|descriptor| governing_bucket(&compiled.snapshot, service, &descriptor.entries))
            .collect();
        // A file's `replaces`: a limit named by another that governs a descriptor of the same
        // request is dropped, as envoyproxy/ratelimit drops it.
        let replaced: std::collections::HashSet<&str> = governing
            .iter()
            .flatten()
            .filter_map(|governed| governed.rule.spec.descriptor())
            .flat_map(|rule| rule.replaces.iter().map(String::as_str))
            .collect();
        for (position, descriptor) in request.descriptors.iter().enumerate() {
            let governed = governing[position].filter(|governed| {
                let name = governed.rule.spec.descriptor().and_then(|rule| rule.name.as_deref());
                name.is_none_or(|name| !replaced.contains(name))
            });
            // Envoy's override, for a service plexsphere decides for (as envoyproxy/ratelimit
            // applies one for a domain it has configuration of): the override's limit, in a
            // bucket keyed by every entry and the override, so requests with an override never
            // drain the bucket of those without; the governing rule's fail mode, enforced.
            if let Some(limit) = descriptor.limit.filter(|_| service_has_rules) {
                let rule_id = governed.as_ref().map_or("", |governed| governed.rule.id.as_str());
                let current = CurrentLimit {
                    rule_id: rule_id.to_owned(),
                    requests_per_unit: limit.requests_per_unit,
                    unit: limit.unit,
                };
                let per_unit = f64::from(limit.requests_per_unit);
                let Ok(budget) = Limit::for_any_period(per_unit / limit.unit.seconds(), per_unit) else {
                    refuse_all.push((position, current));
                    continue;
                };
                let enforcement = governed.as_ref().map_or(ratebudget::Enforcement::STRICT, |governed| {
                    let policy = compiled.policies[governed.index];
                    ratebudget::Enforcement { mode: ratebudget::Mode::Enforce, ..policy.enforcement }
                });
                let hits = descriptor.hits_addend.unwrap_or(request.hits_addend).max(1);
                let spend = Spend {
                    name: override_buckets(),
                    key: override_key(service, &descriptor.entries, limit),
                    cost: hits as f64,
                    limit: budget,
                    enforcement,
                };
                statuses[position].current_limit = Some(current);
                limited.push((position, spend, rule_id.to_owned()));
                continue;
            }
            let Some(governed) = governed else {
                continue;
            };
            let policy = compiled.policies[governed.index];
            let mut label = governed.rule.id.as_str().to_owned();
            if let Some(file_rule) = governed.rule.spec.descriptor() {
                label = file_rule.metric_name(descriptor.entries.iter().map(|entry| entry.value.as_str()));
                let PathLimit::PerUnit { requests_per_unit, unit } = file_rule.limit else {
                    // No limit where the walk ended: OK, no limit, 0 remaining; unlimited: OK,
                    // every request remaining (envoyproxy/ratelimit's answers). No statement.
                    if file_rule.limit == PathLimit::Unlimited {
                        statuses[position].limit_remaining = Some(u32::MAX);
                    }
                    continue;
                };
                let current = CurrentLimit {
                    rule_id: file_rule.name.clone().unwrap_or_default(),
                    requests_per_unit,
                    unit,
                };
                statuses[position].current_limit = Some(current.clone());
                if requests_per_unit == 0 {
                    // 0 a unit refuses every request (or, in shadow mode, would), no statement.
                    if policy.enforcement.is_shadow() {
                        self.observer.ruled(service, &label, Verdict::ShadowOverLimit);
                    } else {
                        refuse_all.push((position, current));
                        self.observer.ruled(service, &label, Verdict::OverLimit);
                    }
                    continue;
                }
            }
            // Every cost up to 2^53 is exact as a float, and above it a cost is above every
            // burst (`Limit::MAX_BURST` is 1e15): the take answers `InsufficientCapacity`.
            let hits = descriptor.hits_addend.unwrap_or(request.hits_addend).max(1);
            let spend = Spend {
                name: service_buckets(),
                key: governed.key,
                cost: hits as f64,
                limit: policy.limit,
                enforcement: policy.enforcement,
            };
            if statuses[position].current_limit.is_none() {
                statuses[position].current_limit =
                    Some(CurrentLimit::of(governed.rule.id.as_str(), policy.limit));
            }
            limited.push((position, spend, label));
        }
        for (position, current) in refuse_all {
            statuses[position].code = Code::OverLimit;
            statuses[position].current_limit = Some(current);
        }
        let refused_all = statuses.iter().any(|status| status.code == Code::OverLimit);
        // A file's `quota_mode` descriptors refuse the request only when every one of them is
        // over: a take refused by one while another remains is taken again without it (each
        // take all or nothing, so a refused one debits nothing), that one answered over.
        let quota_mode = |position: usize| {
            request.descriptors[position].limit.is_none()
                && governing[position]
                    .and_then(|governed| governed.rule.spec.descriptor())
                    .is_some_and(|rule| rule.quota_mode)
        };
        let quota_positions: Vec<usize> =
            limited.iter().map(|(position, ..)| *position).filter(|position| quota_mode(*position)).collect();
        // Token budgets (`token_budgets.rs`): checks (an explicit 0) before the take, and
        // charges of the rules that charge ALWAYS after it.
        let held = token_budgets::HeldBack::of(&mut limited, request, &governing);
        if let Some(answer) =
            self.before_the_take(service, &mut statuses, &held, &limited, &quota_mode).await?
        {
            return Ok(answer);
        }
        let now = self.clock.now();
        let mut headers = Vec::new();
        let decision = loop {
            let take = match limited.as_slice() {
                // An override of 0 refuses the request whatever else it carries: nothing is spent.
                _ if refused_all => {
                    return Ok(Answer { overall: Code::OverLimit, statuses, headers: Vec::new() });
                }
                [] => return Ok(Answer { overall: Code::Ok, statuses, headers: Vec::new() }),
                [(_, only, _)] => Take::Single(*only),
                [(_, first, _), (_, second, _)] => Take::Pair(*first, *second),
                // Every governed descriptor, in one take: all or nothing, in one statement.
                more => Take::many(more.iter().map(|(_, spend, _)| *spend).collect::<Vec<_>>()),
            };
            let decision = self.spender.decide_at(take, now).await.map_err(DecideError::Undecided)?;
            let Decision::Refused(refusal) = &decision else { break decision };
            let slot = refusal.which.index();
            let position = limited[slot].0;
            let another_quota = limited.iter().any(|(other, ..)| *other != position && quota_mode(*other));
            if !(quota_mode(position) && another_quota) {
                break decision;
            }
            let (_, spend, label) = limited.remove(slot);
            let status = &mut statuses[position];
            status.code = Code::OverLimit;
            let fill = refusal.judged.unwrap_or(Fill { tokens: 0.0, refilled_at: now });
            let (remaining, until_reset) = reading(spend.limit, fill, now);
            status.limit_remaining = Some(remaining);
            status.until_reset = Some(until_reset);
            self.observer.ruled(service, &label, Verdict::OverLimit);
        };
        let mut binding: Option<(u32, usize)> = None;
        for (slot, (position, spend, rule_id)) in limited.iter().enumerate() {
            let status = &mut statuses[*position];
            let at = Which::at(slot);
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
        for (slot, (position, spend, rule_id)) in limited.iter().enumerate() {
            let status = &statuses[*position];
            let verdict = match (&decision, status.code, status.limit_remaining) {
                (_, Code::OverLimit, _) => Verdict::OverLimit,
                // A SHADOW rule's refusal is admitted without a reading of its bucket.
                (Decision::Granted(grant), Code::Ok, _)
                    if spend.enforcement.is_shadow() && grant.remaining(Which::at(slot)).is_none() =>
                {
                    Verdict::ShadowOverLimit
                }
                (_, Code::Ok, Some(left)) if f64::from(left) <= spend.limit.burst() / 5.0 => {
                    Verdict::NearLimit
                }
                (_, Code::Ok, _) => Verdict::WithinLimit,
            };
            // An override that no rule governs counts under no rule.
            if !rule_id.is_empty() {
                self.observer.ruled(service, rule_id, verdict);
            }
        }
        if let (Decision::Granted(grant), Some((_, slot))) = (&decision, binding) {
            let (_, spend, rule_id) = &limited[slot];
            push_fields(&mut headers, rule_id, spend.limit, grant.remaining(Which::at(slot)), now);
        }
        // Over when a descriptor outside quota mode is, or every quota-mode one is.
        let over = |position: &usize| statuses[*position].code == Code::OverLimit;
        let others_over =
            (0..statuses.len()).filter(|position| !quota_positions.contains(position)).any(|p| over(&p));
        let quotas_over = !quota_positions.is_empty() && quota_positions.iter().all(over);
        let overall = if others_over || quotas_over { Code::OverLimit } else { Code::Ok };
        self.after_the_take(service, Answer { overall, statuses, headers }, &held).await
    }
}

/// An override's bucket: SHA-256 over the service, every entry in order and the override,
/// length-prefixed, under [`override_buckets`] (envoyproxy/ratelimit keys an override by the
/// whole descriptor and its limit).
pub fn override_key(service: &str, entries: &[Entry], limit: Override) -> Key {
    let requests = limit.requests_per_unit.to_string();
    let entries = entries.iter().flat_map(|entry| [entry.key.as_str(), entry.value.as_str()]);
    key_of(["override", service].into_iter().chain(entries).chain([requests.as_str(), limit.unit.as_str()]))
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

/// A descriptor's governing rule and its bucket, as [`governing_bucket`] finds them.
#[derive(Clone, Copy, Debug)]
pub struct Governed<'s> {
    /// The rule's position in the snapshot (its policy's too).
    pub index: usize,
    /// The rule.
    pub rule: &'s rules::Rule,
    /// Its bucket's key, under [`service_buckets`].
    pub key: Key,
}

/// The rule of `service` that governs a descriptor of `entries` in `snapshot`, and the bucket
/// it is decided in; `None` when no rule governs it (it has no bucket). The one resolution of
/// a descriptor, for deciding and for resetting alike: the entry keyed `api` names the API,
/// the others are attributes.
pub fn governing_bucket<'s>(
    snapshot: &'s rules::Snapshot,
    service: &str,
    entries: &[Entry],
) -> Option<Governed<'s>> {
    // A service's files first, as envoyproxy/ratelimit walks them: every entry, in order.
    let all: Vec<(&str, &str)> =
        entries.iter().map(|entry| (entry.key.as_str(), entry.value.as_str())).collect();
    if let Some((index, rule)) = snapshot.walk(service, &all) {
        let file_rule = rule.spec.descriptor()?;
        return Some(Governed { index, rule, key: path_key(service, rule.id.as_str(), file_rule, &all) });
    }
    let api = entries.iter().find(|entry| entry.key == "api").map(|entry| entry.value.as_str());
    let attributes: Vec<(&str, &str)> = entries
        .iter()
        .filter(|entry| entry.key != "api")
        .map(|entry| (entry.key.as_str(), entry.value.as_str()))
        .collect();
    let governing = snapshot.matching(service, api, &attributes).into_iter().next()?;
    let keyed_by = snapshot.keyed_by(governing.index, &attributes)?;
    let api = if governing.names_the_api { api } else { None };
    Some(Governed {
        index: governing.index,
        rule: governing.rule,
        key: runtime_key(service, governing.rule.id.as_str(), api, &keyed_by),
    })
}

/// A governed descriptor's bucket: the first 64 bits of SHA-256 over the service, the governing
/// rule, the API if the rule names one, and each attribute the rule names with the request's value
/// for it ([`rules::Snapshot::keyed_by`]), each field length-prefixed so no two buckets write
/// the same bytes. What the rule does not name is not hashed, so it never splits the bucket.
pub fn runtime_key(service: &str, rule: &str, api: Option<&str>, keyed_by: &[(&str, &str)]) -> Key {
    let api = match api {
        Some(api) => [Some("api"), Some(api)],
        None => [Some("*"), None],
    };
    let api = api.into_iter().flatten();
    let attributes = keyed_by.iter().flat_map(|(attribute, value)| [*attribute, *value]);
    // Keys of the previous build hashed every entry; the tag keeps the two apart, so those
    // buckets are only ever abandoned to the sweep. Each rule has its own buckets: two rules
    // naming the same attributes (one with `tenant: *`, another with `sku: *`) may govern the
    // same values by the entries' order, and must not share a row under two limits (a pair of
    // them would be a take the store refuses, which Envoy admits).
    key_of(["rule-keyed", service, rule].into_iter().chain(api).chain(attributes))
}

/// A file rule's bucket for a descriptor of `entries` (which its path matched, level for
/// level): SHA-256 over the service, the rule and each entry's key and value, where an entry
/// its path matched by a wildcard with `share_threshold` gives the wildcard instead, so that
/// every value it matches shares one bucket (envoyproxy/ratelimit's cache key is the
/// descriptor's entries likewise).
pub fn path_key(
    service: &str,
    rule: &str,
    file_rule: &rules::DescriptorRule,
    entries: &[(&str, &str)],
) -> Key {
    let levels = file_rule.path.iter().zip(entries).flat_map(|(level, (key, value))| {
        let value = match &level.value {
            Some(pattern) if level.share_threshold => &**pattern,
            _ => *value,
        };
        [*key, value]
    });
    key_of(["path", service, rule].into_iter().chain(levels))
}

/// A bucket's key: the first 64 bits of SHA-256 over `fields`, each length-prefixed so no two
/// lists of fields write the same bytes.
fn key_of<'a>(fields: impl IntoIterator<Item = &'a str>) -> Key {
    let mut hash = Sha256::new();
    for field in fields {
        hash.update((field.len() as u64).to_be_bytes());
        hash.update(field.as_bytes());
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    Key::from(uuid::Uuid::from_u64_pair(0, u64::from_be_bytes(first)))
}

#[cfg(test)]
mod tests;
mod token_budgets;
