//! `Retry-After`, and `RateLimit-Policy` and `RateLimit` as
//! draft-ietf-httpapi-ratelimit-headers-10 defines them (structured-field lists):
//!
//! ```text
//! RateLimit-Policy: "secret_read_node";q=20;w=2
//! RateLimit: "secret_read_node";r=19;t=1
//! ```
//!
//! The policy is named after the scope or the named limiter; `q` is the burst, `w` the whole
//! seconds an empty bucket takes to refill; `r` the whole tokens remaining and `t` the whole
//! seconds until the bucket is full again if nobody spends. A take that spends two budgets
//! reports the one that binds: the one with the fewest whole tokens remaining (on a tie, the
//! first). A refusal reports the bucket that refused. A shadow budget never binds: its
//! refusals refuse nobody.
//!
//! One implementation for every response that reports a budget: the layer's, and the
//! `plexsphere` binary's own routes, whose decisions are made deep inside a context.

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::{HeaderMap, HeaderName, HeaderValue};
use ratebudget::{Decision, Fill, Limit, NamedSpend, Take, Which};

/// The `RateLimit-Policy` field.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The `RateLimit` field.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// One bucket as a decision left it, in the fields' units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The policy's name: the scope, or the named limiter.
    pub policy: &'static str,
    /// `q`: the burst, whole tokens.
    pub quota: u64,
    /// `w`: whole seconds for an empty bucket to refill.
    pub window: u64,
    /// `r`: whole tokens remaining.
    pub remaining: u64,
    /// `t`: whole seconds until full again if nobody spends.
    pub reset: u64,
}

impl Reading {
    /// What `decision` (of `take`, at `now`) says about the bucket that binds, if anything: a
    /// grant of zero cost, a shadow budget's answer and a cost that never fits say nothing.
    pub fn binding(take: &Take, decision: &Decision, now: DateTime<Utc>) -> Option<Reading> {
        if let Take::Named(spend) = take {
            return named(spend, decision, now);
        }
        let reading = |which: Which, fill: Option<Fill>| {
            let spend = take.spend(which).filter(|spend| !spend.enforcement.is_shadow())?;
            Some(read(spend.name.as_str(), spend.limit, fill, now))
        };
        match decision {
            Decision::Granted(grant) => take
                .spends()
                .filter_map(|(which, _)| reading(which, Some(grant.remaining(which)?)))
                // min_by_key keeps the first of equals: the first budget, on a tie.
                .min_by_key(|reading| reading.remaining),
            Decision::Refused(refusal) => reading(refusal.which, refusal.judged),
            Decision::InsufficientCapacity(_) => None,
        }
    }

    /// Sets both fields to this reading alone, replacing any others.
    pub fn set_on(&self, headers: &mut HeaderMap) {
        if let Some((policy, state)) = self.values() {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, state);
        }
    }

    /// Adds this reading to both fields' lists, beside any a service already reported: a
    /// further field line is a further list member (RFC 9110, section 5.3).
    pub fn append_to(&self, headers: &mut HeaderMap) {
        if let Some((policy, state)) = self.values() {
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, state);
        }
    }

    /// The two field values; `None` for a policy name a structured-field string cannot hold
    /// as it is. Scope and limiter names never are (lowercase ASCII letters, digits and
    /// underscores, the tables' CHECKs); only a hand-made reading could be.
    fn values(&self) -> Option<(HeaderValue, HeaderValue)> {
        field_values(self.policy, self.quota, self.window, self.remaining, self.reset)
    }
}

/// The two field values of a token bucket of `limit` under the policy name `policy` (a rule's
/// id, say), as `fill` left it at `now` (`None`: empty), for a caller that builds its own
/// response (a rate-limit service answering for another service); `None` for a name a
/// structured-field string cannot hold as it is.
pub fn bucket_fields(
    policy: &str,
    limit: Limit,
    fill: Option<Fill>,
    now: DateTime<Utc>,
) -> Option<(HeaderValue, HeaderValue)> {
    let reading = read("", limit, fill, now);
    field_values(policy, reading.quota, reading.window, reading.remaining, reading.reset)
}

fn field_values(
    policy: &str,
    quota: u64,
    window: u64,
    remaining: u64,
    reset: u64,
) -> Option<(HeaderValue, HeaderValue)> {
    let printable = |byte: &u8| (b' '..=b'~').contains(byte) && *byte != b'"' && *byte != b'\\';
    if !policy.as_bytes().iter().all(printable) {
        return None;
    }
    let policy_field = format!("\"{policy}\";q={quota};w={window}");
    let state = format!("\"{policy}\";r={remaining};t={reset}");
    Some((HeaderValue::from_str(&policy_field).ok()?, HeaderValue::from_str(&state).ok()?))
}

/// A named (GCRA) budget in the same fields: its cells are the tokens, and it is full again at
/// its theoretical arrival time.
fn named(spend: &NamedSpend, decision: &Decision, now: DateTime<Utc>) -> Option<Reading> {
    if spend.enforcement.is_shadow() {
        return None;
    }
    let whole_seconds_until = |at: Option<DateTime<Utc>>, otherwise: f64| {
        at.map_or(otherwise, |at| (at - now).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6).ceil()
            as u64
    };
    let window = spend.limit.refill_time().as_secs_f64().ceil();
    let (remaining, reset) = match decision {
        Decision::Granted(grant) => {
            (u64::from(grant.cells_left()?), whole_seconds_until(grant.tat(), window))
        }
        Decision::Refused(refusal) => (0, whole_seconds_until(refusal.tat, window)),
        Decision::InsufficientCapacity(_) => return None,
    };
    Some(Reading {
        policy: spend.limiter.as_str(),
        quota: spend.limit.burst().floor() as u64,
        window: window as u64,
        remaining,
        reset,
    })
}

/// A bucket's reading; a bucket whose level is unknown (below the cost, refused under the
/// store's lock) reads as empty, which is what it may as well be.
fn read(policy: &'static str, limit: Limit, fill: Option<Fill>, now: DateTime<Utc>) -> Reading {
    let fill = fill.unwrap_or(Fill { tokens: 0.0, refilled_at: now });
    let level = limit.level(fill, now).max(0.0);
    let full_in = limit.time_to_cover(fill, limit.burst(), now);
    Reading {
        policy,
        quota: limit.burst().floor() as u64,
        window: limit.refill_time().as_secs_f64().ceil() as u64,
        remaining: level.floor() as u64,
        reset: full_in.as_secs_f64().ceil() as u64,
    }
}

/// `Retry-After` in whole seconds, rounded up, and at least 1: a client told 0 would retry at
/// once into the same refusal.
pub fn retry_after_seconds(retry_after: Duration) -> u64 {
    let whole = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    whole.max(1)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use ratebudget::{Enforcement, Key, LimiterName, Mode, NamedKey, Refusal, Scope, Spend};

    use super::*;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
    }

    fn spend(scope: Scope, per_second: f64, burst: f64) -> Spend {
        Spend::new(scope, Key([1; 16]), 1.0, Limit::new(per_second, burst).unwrap())
    }

    #[test]
    fn a_refusal_reports_the_refused_bucket_in_whole_units_rounded_safely() {
        let take = Take::Pair(
            spend(Scope::SecretReadNode, 10.0, 20.0),
            spend(Scope::SecretReadDomain, 100.0, 200.0),
        );
        let judged = Fill { tokens: 0.5, refilled_at: now() };
        let refusal = Refusal {
            which: Which::Second,
            retry_after: Duration::from_millis(5),
            judged: Some(judged),
            tat: None,
        };
        let reading = Reading::binding(&take, &Decision::Refused(refusal), now()).unwrap();
        // 199.5 tokens to go at 100 a second: 1.995 s, said as 2.
        assert_eq!(
            reading,
            Reading { policy: "secret_read_domain", quota: 200, window: 2, remaining: 0, reset: 2 }
        );
    }

    #[test]
    fn a_named_limiter_is_its_own_policy_and_a_shadow_one_reports_nothing() {
        let limiter = LimiterName::new("login_attempt").unwrap();
        let mut spend = NamedSpend {
            limiter,
            key: NamedKey::of(limiter, b"203.0.113.9"),
            cells: 1,
            limit: Limit::new(0.5, 4.0).unwrap(),
            enforcement: Enforcement::STRICT,
        };
        let refusal = Refusal {
            which: Which::First,
            retry_after: Duration::from_secs(2),
            judged: None,
            tat: Some(now() + chrono::Duration::milliseconds(7_500)),
        };
        let refused = Decision::Refused(refusal);
        assert_eq!(
            Reading::binding(&Take::Named(spend), &refused, now()),
            Some(Reading { policy: "login_attempt", quota: 4, window: 8, remaining: 0, reset: 8 })
        );
        spend.enforcement = Enforcement { mode: Mode::Shadow, ..Enforcement::STRICT };
        assert_eq!(Reading::binding(&Take::Named(spend), &refused, now()), None);
    }

    #[test]
    fn fields_are_structured_field_lists_and_appending_keeps_what_was_there() {
        let reading = Reading { policy: "uploads", quota: 100, window: 10, remaining: 7, reset: 3 };
        let mut headers = HeaderMap::new();
        Reading { policy: "service_own", quota: 1, window: 1, remaining: 1, reset: 0 }.set_on(&mut headers);
        reading.append_to(&mut headers);
        let values: Vec<_> = headers.get_all(RATELIMIT).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(values, ["\"service_own\";r=1;t=0", "\"uploads\";r=7;t=3"]);
        reading.set_on(&mut headers);
        assert_eq!(headers.get_all(RATELIMIT_POLICY).iter().count(), 1);
        assert_eq!(headers[RATELIMIT_POLICY], "\"uploads\";q=100;w=10");
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_never_zero() {
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(100)), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_seconds(Duration::from_secs_f64(2.5)), 3);
    }
}
