//! Token budgets (docs/adr/0040): a descriptor's explicit `hits_addend` of 0 asks without
//! spending, before the take of the request's other descriptors; a descriptor whose rule
//! charges its costs `ALWAYS` is charged after that take is granted (or when there is none),
//! whatever its bucket holds.
//!
//! A check (a peek) reads its bucket: under a token it is over the limit, with the wait until
//! the bucket holds one as its `Retry-After` and its `duration_until_reset`, and an enforced
//! one refuses the request before anything is spent (all or nothing); a SHADOW rule's admits
//! and is counted as shadow. A charge is accepted: the bucket is debited, into debt when it
//! does not cover the cost, so its next check (and every take) is over the limit until refill
//! has repaid the debt. A request refused by another descriptor charges nothing. Both go
//! through the spender and the guard as takes do (the trusted clock, the decision timeout,
//! the circuit and the rule's fail mode: a `CLOSED` rule whose store cannot answer makes the
//! request undecided).

use chrono::{DateTime, Utc};
use ratebudget::{Fill, Limit, Spend};

use super::{
    push_fields, reading, Answer, Code, CurrentLimit, DecideError, DecideService, Governed, Request, Status,
    Verdict,
};

/// A governed descriptor as the decide service holds it: its position in the request, its
/// spend, and its rule's name in metrics and response fields.
pub(super) type Limited = (usize, Spend, String);

/// The descriptors held back from the take: checks, decided before it, and charges, after it.
#[derive(Debug, Default)]
pub(super) struct HeldBack {
    checks: Vec<Limited>,
    charges: Vec<Limited>,
}

impl HeldBack {
    /// Takes out of `limited` each descriptor whose own `hits_addend` is an explicit 0 (a
    /// check) and each other one governed by a rule that charges `ALWAYS` (a charge), leaving
    /// the request's takes.
    pub(super) fn of(
        limited: &mut Vec<Limited>,
        request: &Request,
        governing: &[Option<Governed<'_>>],
    ) -> HeldBack {
        let mut held = HeldBack::default();
        let mut takes = Vec::with_capacity(limited.len());
        for entry in limited.drain(..) {
            let position = entry.0;
            if request.descriptors[position].hits_addend == Some(0) {
                held.checks.push(entry);
            } else if governing[position]
                .is_some_and(|governed| governed.rule.spec.charge() == rules::Charge::Always)
            {
                held.charges.push(entry);
            } else {
                takes.push(entry);
            }
        }
        *limited = takes;
        held
    }

    fn is_empty(&self) -> bool {
        self.checks.is_empty() && self.charges.is_empty()
    }
}

impl DecideService {
    /// Before the take of `takes`: decides the checks held back, and answers the request when
    /// one refuses it or when nothing is left to take (then the charges are made here).
    /// `None`: the take goes ahead, and [`DecideService::after_the_take`] charges.
    ///
    /// A check of a file's `quota_mode` descriptor (`quota_mode` says which positions are)
    /// that is over is answered over without refusing the request by itself: the request is
    /// over when every quota-mode descriptor is, as the take's are. When every quota-mode
    /// descriptor is a check and all are over, it is refused here, before anything is spent.
    pub(super) async fn before_the_take(
        &self,
        service: &str,
        statuses: &mut Vec<Status>,
        held: &HeldBack,
        takes: &[Limited],
        quota_mode: &(dyn Fn(usize) -> bool + Sync),
    ) -> Result<Option<Answer>, DecideError> {
        // Refused already (an override of 0): nothing is read, spent or charged.
        if held.is_empty() || statuses.iter().any(|status| status.code == Code::OverLimit) {
            return Ok(None);
        }
        let now = self.clock.now();
        let mut headers = Vec::new();
        let mut refused = false;
        // The quota-mode check over the limit that holds a token soonest, for the fields of a
        // request they refuse together.
        let mut soonest: Option<(std::time::Duration, &Limited, Fill)> = None;
        for check @ (position, spend, rule_id) in &held.checks {
            let status = &mut statuses[*position];
            let verdict = match self.spender.peek_at(*spend, now).await.map_err(DecideError::Undecided)? {
                // Not read (the store cannot answer, and the rule fails OPEN): admitted.
                None => Verdict::WithinLimit,
                Some(fill) if spend.limit.level(fill, now) >= 1.0 => {
                    read_into(status, spend.limit, fill, now)
                }
                Some(_) if spend.enforcement.is_shadow() => Verdict::ShadowOverLimit,
                Some(fill) => {
                    let until_a_token = spend.limit.time_to_cover(fill, 1.0, now);
                    status.code = Code::OverLimit;
                    status.limit_remaining = Some(0);
                    status.until_reset = Some(until_a_token);
                    if !quota_mode(*position) {
                        refused = true;
                        push_fields(&mut headers, rule_id, spend.limit, Some(fill), now);
                        let seconds = ratebudget_tower::retry_after_seconds(until_a_token);
                        headers.push(("retry-after", seconds.to_string()));
                    } else if soonest.is_none_or(|(wait, ..)| until_a_token < wait) {
                        soonest = Some((until_a_token, check, fill));
                    }
                    Verdict::OverLimit
                }
            };
            named(status, rule_id, spend.limit);
            self.counted(service, rule_id, verdict);
        }
        // Every quota-mode descriptor a check, and every one over: the request is over.
        let quotas_over = !takes.iter().any(|(position, ..)| quota_mode(*position))
            && held.checks.iter().any(|(position, ..)| quota_mode(*position))
            && held
                .checks
                .iter()
                .filter(|(position, ..)| quota_mode(*position))
                .all(|(position, ..)| statuses[*position].code == Code::OverLimit);
        if quotas_over && !refused {
            if let Some((wait, (_, spend, rule_id), fill)) = soonest {
                push_fields(&mut headers, rule_id, spend.limit, Some(fill), now);
                headers.push(("retry-after", ratebudget_tower::retry_after_seconds(wait).to_string()));
            }
        }
        if refused || quotas_over {
            return Ok(Some(Answer {
                overall: Code::OverLimit,
                statuses: std::mem::take(statuses),
                headers,
            }));
        }
        if !takes.is_empty() {
            return Ok(None);
        }
        let answer = Answer { overall: Code::Ok, statuses: std::mem::take(statuses), headers };
        Ok(Some(self.after_the_take(service, answer, held).await?))
    }

    /// After the take: charges the charges held back, unless the request is refused. Each is
    /// accepted, its status saying what its bucket holds now (0 while in debt).
    pub(super) async fn after_the_take(
        &self,
        service: &str,
        mut answer: Answer,
        held: &HeldBack,
    ) -> Result<Answer, DecideError> {
        if answer.overall == Code::OverLimit || held.charges.is_empty() {
            return Ok(answer);
        }
        let now = self.clock.now();
        let mut least: Option<(u32, &Limited, Fill)> = None;
        for charge @ (position, spend, rule_id) in &held.charges {
            let status = &mut answer.statuses[*position];
            named(status, rule_id, spend.limit);
            let verdict = match self.spender.charge_at(*spend, now).await.map_err(DecideError::Undecided)? {
                Some(fill) => {
                    let verdict = read_into(status, spend.limit, fill, now);
                    let remaining = status.limit_remaining.unwrap_or(u32::MAX);
                    if least.is_none_or(|(fewest, _, _)| remaining < fewest) {
                        least = Some((remaining, charge, fill));
                    }
                    verdict
                }
                // Charged nowhere the store could say (it cannot answer; the rule fails OPEN
                // or STATIC): accepted.
                None => Verdict::WithinLimit,
            };
            self.counted(service, rule_id, verdict);
        }
        // The fields of the binding bucket, when the take gave none.
        if let Some((_, (_, spend, rule_id), fill)) = least {
            if !answer.headers.iter().any(|(name, _)| *name == "ratelimit") {
                push_fields(&mut answer.headers, rule_id, spend.limit, Some(fill), now);
            }
        }
        Ok(answer)
    }

    fn counted(&self, service: &str, rule_id: &str, verdict: Verdict) {
        // An override that no rule governs counts under no rule.
        if !rule_id.is_empty() {
            self.observer.ruled(service, rule_id, verdict);
        }
    }
}

/// `fill` read into `status` (remaining whole tokens, until full) and the verdict it comes to.
fn read_into(status: &mut Status, limit: Limit, fill: Fill, now: DateTime<Utc>) -> Verdict {
    let (remaining, until_reset) = reading(limit, fill, now);
    status.limit_remaining = Some(remaining);
    status.until_reset = Some(until_reset);
    if f64::from(remaining) <= limit.burst() / 5.0 {
        Verdict::NearLimit
    } else {
        Verdict::WithinLimit
    }
}

/// The limit a held-back descriptor's status names, when the descriptor loop named none.
fn named(status: &mut Status, rule_id: &str, limit: Limit) {
    if status.current_limit.is_none() {
        status.current_limit = Some(CurrentLimit::of(rule_id, limit));
    }
}

#[cfg(test)]
mod tests;
