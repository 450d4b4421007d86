//! Charges and peeks through the guard (docs/adr/0040): the same trusted clock, decision
//! timeout, circuit and fail modes as a take, and the pre-check learns the rows they read.
//!
//! A charge is always accepted, so the pre-check never answers one; what the store says the
//! charge left is learned, so the bucket's next take (or peek) is refused without a
//! statement while it is in debt. A peek that the row the pre-check knows already reads
//! below its `cost` is answered from that row without a statement: every later version of the
//! row holds at most as much (the module documentation of [`super`] says why), so the store
//! would read it below too.
//!
//! When the store cannot answer, a charge fails as its spend's fail mode says: `CLOSED`, not
//! decided; `OPEN`, accepted and charged nowhere (`None`); `STATIC`, charged to this
//! replica's fallback bucket, whose level may go below 0 (a debt its refill repays). A peek
//! likewise: `OPEN` does not know (`None`), `STATIC` reads the fallback bucket.

use chrono::{DateTime, Utc};

use super::precheck::BucketId;
use super::{lock, Guard};
use crate::{FailMode, Fill, Limit, Spend, Undecided};

impl Guard {
    /// [`Decider::charge`](crate::Decider::charge) through the guard.
    pub(super) async fn charge_guarded(
        &self,
        spend: Spend,
        now: DateTime<Utc>,
    ) -> Result<Option<Fill>, Undecided> {
        let deadline = tokio::time::Instant::now() + self.config.decision_timeout;
        if let Some(Err(untrusted)) = self.config.clock.as_ref().map(crate::ClockStatus::check) {
            return Err(Undecided::Declined(Box::new(untrusted)));
        }
        let spend = spend.validate().map_err(Undecided::Store)?;
        let id = BucketId::Budget(spend.name, spend.key);
        let entry = self.entry(id);
        let fail_mode = spend.enforcement.fail_mode;
        let answer =
            self.ask_store_with(fail_mode != FailMode::Closed, deadline, self.inner.charge(spend, now)).await;
        let undecided = match answer {
            Some(Ok(fill)) => {
                if let Some(fill) = fill {
                    lock(&entry).fill = Some(fill);
                }
                return Ok(fill);
            }
            Some(Err(undecided)) if !undecided.is_store_failure() => return Err(undecided),
            Some(Err(undecided)) => undecided,
            None => Undecided::StoreFailing,
        };
        match fail_mode {
            FailMode::Closed => Err(undecided),
            FailMode::Open => {
                self.warn_fallback(&[spend.name], fail_mode, &undecided);
                Ok(None)
            }
            FailMode::Static => {
                self.warn_fallback(&[spend.name], fail_mode, &undecided);
                let (rate, burst) = (spend.limit.per_second(), spend.limit.burst());
                match self.fallback.charge(id, spend.cost, rate, burst, now) {
                    Ok(level) => Ok(Some(fill_of(spend.limit, level, now))),
                    Err(super::fallback::FallbackFull) => Err(self.fallback_full(undecided)),
                }
            }
        }
    }

    /// [`Decider::peek`](crate::Decider::peek) through the guard: `spend.cost` is the level
    /// the caller needs, below which the pre-check may answer without the store.
    pub(super) async fn peek_guarded(
        &self,
        spend: Spend,
        now: DateTime<Utc>,
    ) -> Result<Option<Fill>, Undecided> {
        let deadline = tokio::time::Instant::now() + self.config.decision_timeout;
        if let Some(Err(untrusted)) = self.config.clock.as_ref().map(crate::ClockStatus::check) {
            return Err(Undecided::Declined(Box::new(untrusted)));
        }
        let spend = spend.validate().map_err(Undecided::Store)?;
        let id = BucketId::Budget(spend.name, spend.key);
        let entry = self.entry(id);
        let known = lock(&entry).fill;
        if let Some(fill) = known.filter(|fill| spend.limit.level(*fill, now) < spend.cost) {
            return Ok(Some(fill));
        }
        let fail_mode = spend.enforcement.fail_mode;
        let answer =
            self.ask_store_with(fail_mode != FailMode::Closed, deadline, self.inner.peek(spend, now)).await;
        let undecided = match answer {
            Some(Ok(fill)) => {
                if let Some(fill) = fill {
                    lock(&entry).fill = Some(fill);
                }
                return Ok(fill);
            }
            Some(Err(undecided)) if !undecided.is_store_failure() => return Err(undecided),
            Some(Err(undecided)) => undecided,
            None => Undecided::StoreFailing,
        };
        match fail_mode {
            FailMode::Closed => Err(undecided),
            FailMode::Open => {
                self.warn_fallback(&[spend.name], fail_mode, &undecided);
                Ok(None)
            }
            FailMode::Static => {
                self.warn_fallback(&[spend.name], fail_mode, &undecided);
                let (rate, burst) = (spend.limit.per_second(), spend.limit.burst());
                Ok(Some(fill_of(spend.limit, self.fallback.level(id, rate, burst, now), now)))
            }
        }
    }
}

/// A fallback bucket's `level` at `now` as a row of the table would hold it: a level below 0
/// is a debt, 0 tokens refilled from when the rate has repaid it.
fn fill_of(limit: Limit, level: f64, now: DateTime<Utc>) -> Fill {
    if level >= 0.0 {
        return Fill { tokens: level, refilled_at: now };
    }
    let seconds = (-level / limit.per_second()).min(Limit::MAX_REFILL_TIME.as_secs_f64());
    let micros = (seconds * 1e6).ceil() as i64;
    Fill { tokens: 0.0, refilled_at: now + chrono::TimeDelta::microseconds(micros) }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use chrono::TimeZone;

    use super::*;
    use crate::{Decider, Decision, Enforcement, Key, Scope, Take};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()
    }

    /// A store that charges into a row of its own (as charge.sql does) and reads it, or fails.
    #[derive(Debug, Default)]
    struct Ledger {
        row: std::sync::Mutex<Option<Fill>>,
        failing: std::sync::atomic::AtomicBool,
        peeks: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl Decider for Ledger {
        async fn decide(&self, _: Take, _: DateTime<Utc>) -> Result<Decision, Undecided> {
            unreachable!("only charges and peeks")
        }

        async fn charge(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Undecided::Malformed("down".into()));
            }
            let mut row = self.row.lock().unwrap();
            let fill = row.unwrap_or(Fill { tokens: spend.limit.burst(), refilled_at: now });
            let left = spend.limit.level(fill, now) - spend.cost;
            let from = fill.refilled_at.max(now);
            let charged = if left >= 0.0 {
                Fill { tokens: left, refilled_at: from }
            } else {
                fill_of(spend.limit, left, from)
            };
            *row = Some(charged);
            Ok(Some(charged))
        }

        async fn peek(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
            self.peeks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Undecided::Malformed("down".into()));
            }
            Ok(Some(
                self.row.lock().unwrap().unwrap_or(Fill { tokens: spend.limit.burst(), refilled_at: now }),
            ))
        }
    }

    fn spend(cost: f64, fail_mode: FailMode) -> Spend {
        let limit = Limit::new(10.0, 100.0).unwrap();
        let enforcement = Enforcement { fail_mode, ..Enforcement::STRICT };
        Spend { enforcement, ..Spend::new(Scope::IngestNode, Key([7; 16]), cost, limit) }
    }

    #[tokio::test]
    async fn a_charge_the_bucket_cannot_cover_is_accepted_and_its_debt_refuses_peeks_from_the_precheck() {
        let ledger = Arc::new(Ledger::default());
        let guard = crate::GuardBuilder::shared(ledger.clone()).build();
        let charged = guard.charge(spend(150.0, FailMode::Closed), now()).await.unwrap().unwrap();
        // 50 tokens of debt at 10 a second: empty for five seconds.
        assert_eq!(charged, Fill { tokens: 0.0, refilled_at: now() + chrono::TimeDelta::seconds(5) });
        let peeked = guard.peek(spend(1.0, FailMode::Closed), now()).await.unwrap().unwrap();
        assert_eq!(peeked, charged);
        assert_eq!(ledger.peeks.load(std::sync::atomic::Ordering::SeqCst), 0, "the pre-check knew the debt");
        let limit = spend(1.0, FailMode::Closed).limit;
        assert_eq!(limit.time_to_cover(peeked, 1.0, now()), Duration::from_millis(5_100));
        // Once the debt is repaid and a token refilled, the store is asked again.
        let later = now() + chrono::TimeDelta::milliseconds(5_100);
        assert!(
            limit.level(guard.peek(spend(1.0, FailMode::Closed), later).await.unwrap().unwrap(), later)
                >= 1.0
        );
        assert_eq!(ledger.peeks.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn without_the_store_a_charge_and_a_peek_follow_the_fail_mode() {
        let ledger = Arc::new(Ledger::default());
        ledger.failing.store(true, std::sync::atomic::Ordering::SeqCst);
        let guard = crate::GuardBuilder::shared(ledger.clone()).build();
        assert!(guard.charge(spend(150.0, FailMode::Closed), now()).await.is_err());
        assert!(guard.peek(spend(1.0, FailMode::Closed), now()).await.is_err());
        assert_eq!(guard.charge(spend(150.0, FailMode::Open), now()).await.unwrap(), None);
        assert_eq!(guard.peek(spend(1.0, FailMode::Open), now()).await.unwrap(), None);
        // STATIC: the fallback bucket is charged into debt, and a peek reads it.
        let charged = guard.charge(spend(150.0, FailMode::Static), now()).await.unwrap().unwrap();
        assert_eq!(charged, Fill { tokens: 0.0, refilled_at: now() + chrono::TimeDelta::seconds(5) });
        let peeked = guard.peek(spend(1.0, FailMode::Static), now()).await.unwrap().unwrap();
        assert_eq!(peeked, charged);
        let later = now() + chrono::TimeDelta::seconds(6);
        let peeked = guard.peek(spend(1.0, FailMode::Static), later).await.unwrap().unwrap();
        assert_eq!(peeked, Fill { tokens: 10.0, refilled_at: later });
    }

    #[tokio::test]
    async fn a_guard_on_an_untrusted_clock_neither_charges_nor_peeks() {
        let ledger = Arc::new(Ledger::default());
        // Never measured: untrusted.
        let (_clock, status) = crate::discipline::disciplined(Duration::from_millis(50));
        let guard = crate::GuardBuilder::shared(ledger.clone()).trusted_only(status).build();
        assert!(matches!(guard.charge(spend(1.0, FailMode::Open), now()).await, Err(Undecided::Declined(_))));
        assert!(matches!(guard.peek(spend(1.0, FailMode::Open), now()).await, Err(Undecided::Declined(_))));
        assert!(ledger.row.lock().unwrap().is_none());
    }
}
