//! `RateLimit-Policy` and `RateLimit` on every response of a budgeted route, as
//! draft-ietf-httpapi-ratelimit-headers-10 defines them (structured-field lists):
//!
//! ```text
//! RateLimit-Policy: "secret_read_node";q=20;w=2
//! RateLimit: "secret_read_node";r=19;t=1
//! ```
//!
//! The policy is named after the scope; `q` is the burst, `w` the whole seconds an empty
//! bucket takes to refill; `r` the whole tokens remaining and `t` the whole seconds until the
//! bucket is full again if nobody spends. A request that spends two budgets reports the one
//! that binds: the one with the fewest whole tokens remaining (on a tie, the first, the
//! Node's). A refusal reports the bucket that refused.
//!
//! The decision is made deep inside a context, which knows nothing of HTTP; the limiters'
//! observer ([`crate::limits`]) records what each decision said about its buckets in a
//! task-local slot this module's middleware opens around each request, and the middleware
//! turns the binding reading into the two fields.

use std::cell::RefCell;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use chrono::{DateTime, Utc};
use ratebudget::{Decision, Fill, Limit, NamedSpend, Scope, Take, Which};

/// One bucket as a decision left it, in the fields' units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The policy: the bucket's scope.
    pub scope: Scope,
    /// `q`: the burst, whole tokens.
    pub quota: u64,
    /// `w`: whole seconds for an empty bucket to refill.
    pub window: u64,
    /// `r`: whole tokens remaining.
    pub remaining: u64,
    /// `t`: whole seconds until full again if nobody spends.
    pub reset: u64,
}

tokio::task_local! {
    static READINGS: RefCell<Vec<Reading>>;
}

const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATE_LIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// What `decision` (of `take`, at `now`) says about the bucket that binds, if anything.
pub fn binding(take: &Take, decision: &Decision, now: DateTime<Utc>) -> Option<Reading> {
    if let Take::Named(spend) = take {
        return named(spend, decision, now);
    }
    let reading = |which: Which, fill: Option<Fill>| {
        let spend = take.spend(which).filter(|spend| !spend.enforcement.is_shadow())?;
        Some(read(spend.scope, spend.limit, fill, now))
    };
    match decision {
        Decision::Granted(grant) => [Which::First, Which::Second]
            .into_iter()
            .filter_map(|which| reading(which, Some(grant.remaining(which)?)))
            // min_by_key keeps the first of equals: the Node's, on a tie.
            .min_by_key(|reading| reading.remaining),
        Decision::Refused(refusal) => reading(refusal.which, refusal.judged),
        Decision::InsufficientCapacity(_) => None,
    }
}

/// A GCRA budget standing for a scope, in the same fields: its cells are the tokens, and it
/// is full again at its theoretical arrival time.
fn named(spend: &NamedSpend, decision: &Decision, now: DateTime<Utc>) -> Option<Reading> {
    let scope = spend.limiter.scope().filter(|_| !spend.enforcement.is_shadow())?;
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
        scope,
        quota: spend.limit.burst().floor() as u64,
        window: window as u64,
        remaining,
        reset,
    })
}

/// A bucket's reading; a bucket whose level is unknown (below the cost, refused under the
/// store's lock) reads as empty, which is what it may as well be.
fn read(scope: Scope, limit: Limit, fill: Option<Fill>, now: DateTime<Utc>) -> Reading {
    let fill = fill.unwrap_or(Fill { tokens: 0.0, refilled_at: now });
    let level = limit.level(fill, now).max(0.0);
    let full_in = limit.time_to_cover(fill, limit.burst(), now);
    Reading {
        scope,
        quota: limit.burst().floor() as u64,
        window: limit.refill_time().as_secs_f64().ceil() as u64,
        remaining: level.floor() as u64,
        reset: full_in.as_secs_f64().ceil() as u64,
    }
}

/// Notes a reading for the current request's fields; outside a request it is dropped.
pub fn record(reading: Reading) {
    let _ = READINGS.try_with(|readings| readings.borrow_mut().push(reading));
}

/// Opens the slot decisions record into, runs the request, and writes the fields of the last
/// reading (the decision that settled the request).
pub(super) async fn add_fields(request: Request, next: Next) -> Response {
    let (readings, mut response) = READINGS
        .scope(RefCell::new(Vec::new()), async {
            let response = next.run(request).await;
            (READINGS.with(|readings| readings.take()), response)
        })
        .await;
    if let Some(reading) = readings.last() {
        let policy = format!("\"{}\";q={};w={}", reading.scope.as_str(), reading.quota, reading.window);
        let state = format!("\"{}\";r={};t={}", reading.scope.as_str(), reading.remaining, reading.reset);
        // Scope names are fixed ASCII and the rest are numbers: always a valid header value.
        if let (Ok(policy), Ok(state)) = (HeaderValue::from_str(&policy), HeaderValue::from_str(&state)) {
            response.headers_mut().insert(POLICY, policy);
            response.headers_mut().insert(RATE_LIMIT, state);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;
    use ratebudget::{Key, Refusal, Spend};

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
        let reading = binding(&take, &Decision::Refused(refusal), now()).unwrap();
        // 199.5 tokens to go at 100 a second: 1.995 s, said as 2.
        assert_eq!(
            reading,
            Reading { scope: Scope::SecretReadDomain, quota: 200, window: 2, remaining: 0, reset: 2 }
        );
    }
}
