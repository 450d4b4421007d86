//! What a context's limiter adapter binds to: a decider, the clock it decides at, and where
//! every take's policy comes from.
//!
//! Every adapter does the same things before it translates a decision into its own language:
//! ask [`Budgets`] for the policy of each budget it spends, read `now` from the injected
//! clock, hand the decider a take of the policy's algorithm, and admit what a shadow budget
//! refused. All of it lives here once, in the two shapes adapters use: one budget
//! ([`SingleBudget`], issuance) and two taken together ([`PairBudget`], secret reads and
//! ingest batches).

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::{
    Algorithm, Budgets, Clock, Decider, Decision, Grant, Key, LimiterName, NamedKey, NamedSpend, Policy,
    Scope, Spend, Take, Undecided, Which,
};

/// Takes through a [`Decider`] at a [`Clock`]'s now, sized by [`Budgets`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct Spender {
    decider: Arc<dyn Decider>,
    clock: Arc<dyn Clock>,
    budgets: Arc<dyn Budgets>,
}

impl Spender {
    /// Takes through `decider`, at `clock`'s now on every call (tests move a
    /// [`ManualClock`](crate::ManualClock) instead of sleeping), with the policy `budgets`
    /// gives on every call (so a changed rule applies at the next take).
    pub fn new(decider: Arc<dyn Decider>, clock: Arc<dyn Clock>, budgets: Arc<dyn Budgets>) -> Spender {
        Spender { decider, clock, budgets }
    }

    /// One budget this spender takes from.
    pub fn single(self, scope: Scope) -> SingleBudget {
        SingleBudget { spender: self, scope }
    }

    /// Two budgets this spender takes from together, all-or-nothing: `first` is reported when
    /// both refuse.
    pub fn pair(self, first: Scope, second: Scope) -> PairBudget {
        PairBudget { spender: self, first, second }
    }

    fn policy(&self, scope: Scope, domain: Key) -> Result<Policy, Undecided> {
        self.budgets.policy(scope, domain).map_err(Undecided::Declined)
    }

    /// Decides `take` now. A refusal by a budget in [`Mode::Shadow`](crate::Mode::Shadow) is
    /// turned into an admission: the decider (and its observer) saw the refusal, the caller
    /// does not. In a pair, the other budget is then taken alone, so an enforced budget is
    /// still spent, and still refuses, for every request admitted.
    async fn spend(&self, take: Take) -> Result<Decision, Undecided> {
        self.spend_at(take, self.clock.now()).await
    }

    /// Decides `take`, built by the caller (each spend carrying its own limit and
    /// enforcement), at `now`, with the same shadow semantics as every take of this spender:
    /// a refusal by a budget in [`Mode::Shadow`](crate::Mode::Shadow) is turned into an
    /// admission, and the other budgets of the take (the other of a pair, the rest of a
    /// [`Take::Many`]) are then taken without it, all or nothing, and reported at their own
    /// positions; a shadow spend left out reads as not looked at
    /// ([`Grant::remaining`] is `None` for it).
    ///
    /// # Errors
    /// As [`Decider::decide`].
    pub async fn decide_at(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        self.spend_at(take, now).await
    }

    /// [`Spender::spend`] at a given `now`.
    async fn spend_at(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        let decision = self.decider.decide(take.clone(), now).await?;
        let Some(shadowed) = shadow_refusal(&take, &decision) else {
            return Ok(decision);
        };
        let spends: Vec<Spend> = match &take {
            Take::Pair(first, second) => vec![*first, *second],
            Take::Many(spends) => spends.to_vec(),
            Take::Single(_) | Take::Named(_) => return Ok(Decision::Granted(Grant::FREE)),
        };
        // The spends still taken, by their positions in `take`: each shadow refusal leaves its
        // spend out and takes the rest again, so an enforced budget is still spent, and still
        // refuses, for every request admitted. The store answers the first bucket that cannot
        // cover, so a take whose shadow spends are all short needs one more round trip for
        // each (the pre-check answers those it already knows without a statement).
        let mut kept: Vec<usize> = (0..spends.len()).filter(|index| *index != shadowed.index()).collect();
        while !kept.is_empty() {
            let rest = match kept.as_slice() {
                [only] => Take::Single(spends[*only]),
                kept => Take::many(kept.iter().map(|index| spends[*index]).collect::<Vec<_>>()),
            };
            let decision = self.decider.decide(rest.clone(), now).await?;
            match shadow_refusal(&rest, &decision) {
                None => return Ok(placed(decision, &kept)),
                Some(shadowed) => {
                    kept.remove(shadowed.index());
                }
            }
        }
        Ok(Decision::Granted(Grant::FREE))
    }
}

/// Which spend of `take` refused in shadow mode, if the decision is such a refusal.
fn shadow_refusal(take: &Take, decision: &Decision) -> Option<Which> {
    let which = match decision {
        Decision::Granted(_) => return None,
        Decision::Refused(refusal) => refusal.which,
        Decision::InsufficientCapacity(never) => never.which,
    };
    let shadow = match take {
        Take::Named(spend) => spend.enforcement.is_shadow(),
        _ => take.spend(which).is_some_and(|spend| spend.enforcement.is_shadow()),
    };
    shadow.then_some(which)
}

/// A decision of the spends at positions `kept` of a take (in that order), reported at those
/// positions of the take.
fn placed(decision: Decision, kept: &[usize]) -> Decision {
    let at = |which: Which| Which::at(kept[which.index()]);
    match decision {
        Decision::Granted(grant) => Decision::Granted(Grant {
            named: grant.named,
            ..Grant::of(grant.fills().map(|(which, fill)| (at(which), fill)).collect::<Vec<_>>())
        }),
        Decision::Refused(refusal) => {
            Decision::Refused(crate::Refusal { which: at(refusal.which), ..refusal })
        }
        Decision::InsufficientCapacity(never) => {
            Decision::InsufficientCapacity(crate::InsufficientCapacity { which: at(never.which), ..never })
        }
    }
}

/// One budget, such as a Domain's issuance.
#[derive(Clone, Debug)]
pub struct SingleBudget {
    spender: Spender,
    scope: Scope,
}

impl SingleBudget {
    /// Spends `cost` from `key`'s bucket, sized by the policy the budgets give for `domain`
    /// (`key` itself for a Domain's budget). Under GCRA the cost is whole cells, a fraction
    /// rounded up.
    ///
    /// # Errors
    /// As [`Decider::decide`], and [`Undecided::Declined`] when no policy could be had.
    pub async fn spend(&self, key: Key, domain: Key, cost: f64) -> Result<Decision, Undecided> {
        Ok(self.spend_detailed(key, domain, cost).await?.decision)
    }

    /// Spends as [`SingleBudget::spend`] does, and also says what was taken (the policy's
    /// limit travels in it) and at which instant: for a caller that reports the bucket, such
    /// as an HTTP edge writing the `RateLimit` fields.
    ///
    /// # Errors
    /// As [`SingleBudget::spend`].
    pub async fn spend_detailed(&self, key: Key, domain: Key, cost: f64) -> Result<Spent, Undecided> {
        let policy = self.spender.policy(self.scope, domain)?;
        let take = match policy.algorithm {
            Algorithm::TokenBucket => Take::Single(Spend {
                name: self.scope.name(),
                key,
                cost,
                limit: policy.limit,
                enforcement: policy.enforcement,
            }),
            Algorithm::Gcra => {
                let limiter = LimiterName::of_scope(self.scope);
                Take::Named(NamedSpend {
                    limiter,
                    key: NamedKey::of(limiter, &key.0),
                    // A negative or NaN cost saturates to zero cells, which is free: the same
                    // answer as for a zero cost. Costs here are counts of requests.
                    cells: cost.ceil().clamp(0.0, f64::from(u32::MAX)) as u32,
                    limit: policy.limit,
                    enforcement: policy.enforcement,
                })
            }
        };
        let now = self.spender.clock.now();
        let decision = self.spender.spend_at(take.clone(), now).await?;
        Ok(Spent { take, decision, now })
    }
}

/// What [`SingleBudget::spend_detailed`] took, when, and what was decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Spent {
    /// The take as it was decided: the scope's bucket or named limiter, the cost, the policy.
    pub take: Take,
    /// What was decided, shadow refusals already admitted.
    pub decision: Decision,
    /// The instant it was decided at, from the spender's clock.
    pub now: DateTime<Utc>,
}

/// Two budgets spent together by one request, such as a Node's and its Domain's.
#[derive(Clone, Debug)]
pub struct PairBudget {
    spender: Spender,
    first: Scope,
    second: Scope,
}

/// A budget paired with another was given a GCRA policy, which only single takes can have.
#[derive(Debug, thiserror::Error)]
#[error("{0} is taken together with another budget in one statement, which only the token bucket has; a GCRA policy cannot govern it")]
struct PairedGcra(Scope);

impl PairBudget {
    /// Spends `cost` from `first_key`'s bucket of the first budget and `second_key`'s of the
    /// second, both or neither, each sized by the policy the budgets give for `domain`.
    /// [`Which::First`] names the first budget.
    ///
    /// # Errors
    /// As [`Decider::decide`], and [`Undecided::Declined`] when no policy could be had or one
    /// is GCRA.
    pub async fn spend(
        &self,
        first_key: Key,
        second_key: Key,
        domain: Key,
        cost: f64,
    ) -> Result<Decision, Undecided> {
        let spend = |scope: Scope, key: Key| {
            let policy = self.spender.policy(scope, domain)?;
            if policy.algorithm != Algorithm::TokenBucket {
                return Err(Undecided::Declined(Box::new(PairedGcra(scope))));
            }
            Ok(Spend { name: scope.name(), key, cost, limit: policy.limit, enforcement: policy.enforcement })
        };
        let take = Take::Pair(spend(self.first, first_key)?, spend(self.second, second_key)?);
        self.spender.spend(take).await
    }
}

/// Charges and peeks (docs/adr/0040), for a caller that builds its spends itself.
impl Spender {
    /// Charges `spend` at `now` whatever its bucket holds, leaving it in debt when it does not
    /// cover the cost: [`Decider::charge`].
    ///
    /// # Errors
    /// As [`Decider::charge`].
    pub async fn charge_at(
        &self,
        spend: Spend,
        now: DateTime<Utc>,
    ) -> Result<Option<crate::Fill>, Undecided> {
        self.decider.charge(spend, now).await
    }

    /// What `spend`'s bucket holds at `now`, spending nothing: [`Decider::peek`].
    ///
    /// # Errors
    /// As [`Decider::peek`].
    pub async fn peek_at(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<crate::Fill>, Undecided> {
        self.decider.peek(spend, now).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::{
        Enforcement, FailMode, Fill, FixedBudgets, InsufficientCapacity, Limit, ManualClock, Mode, Refusal,
        RuleRef,
    };

    /// Answers each take with the next scripted decision, and remembers the takes.
    #[derive(Debug, Default)]
    struct Script {
        answers: Mutex<Vec<Decision>>,
        takes: Mutex<Vec<Take>>,
    }

    #[async_trait::async_trait]
    impl Decider for Script {
        async fn decide(&self, take: Take, _: DateTime<Utc>) -> Result<Decision, Undecided> {
            self.takes.lock().unwrap().push(take);
            Ok(self.answers.lock().unwrap().remove(0))
        }
    }

    const NODE: Key = Key([1; 16]);
    const DOMAIN: Key = Key([2; 16]);

    fn policy(mode: Mode, algorithm: Algorithm) -> Policy {
        let enforcement = Enforcement { mode, fail_mode: FailMode::Closed, rule: Some(RuleRef(7)) };
        Policy { limit: Limit::new(1.0, 5.0).unwrap(), algorithm, enforcement }
    }

    fn scripted(answers: Vec<Decision>, node: Policy, domain: Policy) -> (Spender, Arc<Script>) {
        let script = Arc::new(Script { answers: Mutex::new(answers), takes: Mutex::default() });
        let budgets = FixedBudgets::new([(Scope::SecretReadNode, node), (Scope::SecretReadDomain, domain)]);
        let clock = ManualClock::new(DateTime::UNIX_EPOCH);
        (Spender::new(script.clone(), Arc::new(clock), Arc::new(budgets)), script)
    }

    fn refused(which: Which) -> Decision {
        Decision::Refused(Refusal { which, retry_after: Duration::from_secs(1), judged: None, tat: None })
    }

    fn granted_first(tokens: f64) -> Decision {
        let fill = Fill { tokens, refilled_at: DateTime::UNIX_EPOCH };
        Decision::Granted(Grant::of([(Which::First, fill)]))
    }

    #[tokio::test]
    async fn a_shadow_refusal_of_a_single_take_admits() {
        let shadow = policy(Mode::Shadow, Algorithm::TokenBucket);
        let (spender, script) = scripted(vec![refused(Which::First)], shadow, shadow);
        let decision = spender.single(Scope::SecretReadNode).spend(NODE, DOMAIN, 1.0).await.unwrap();
        assert_eq!(decision, Decision::Granted(Grant::FREE));
        let takes = script.takes.lock().unwrap().clone();
        let Take::Single(spend) = takes[0].clone() else { panic!("{takes:?}") };
        assert_eq!(spend.enforcement.rule, Some(RuleRef(7)), "the rule travels with the take");
    }

    #[tokio::test]
    async fn an_enforced_refusal_stands() {
        let enforced = policy(Mode::Enforce, Algorithm::TokenBucket);
        let (spender, _) = scripted(vec![refused(Which::Second)], enforced, enforced);
        let pair = spender.pair(Scope::SecretReadNode, Scope::SecretReadDomain);
        assert_eq!(pair.spend(NODE, DOMAIN, DOMAIN, 1.0).await.unwrap(), refused(Which::Second));
    }

    #[tokio::test]
    async fn a_pair_whose_shadow_budget_refused_still_spends_the_enforced_one_alone() {
        let (shadow, enforced) =
            (policy(Mode::Shadow, Algorithm::TokenBucket), policy(Mode::Enforce, Algorithm::TokenBucket));
        // The Node's shadow budget refuses; the Domain's, taken alone, grants: admitted, and
        // the grant is reported where the Domain's budget stands in the pair.
        let (spender, script) = scripted(vec![refused(Which::First), granted_first(3.0)], shadow, enforced);
        let pair = spender.pair(Scope::SecretReadNode, Scope::SecretReadDomain);
        let Decision::Granted(grant) = pair.spend(NODE, DOMAIN, DOMAIN, 1.0).await.unwrap() else {
            panic!("not admitted")
        };
        assert_eq!(
            (grant.remaining(Which::First), grant.remaining(Which::Second).map(|f| f.tokens)),
            (None, Some(3.0))
        );
        let takes = script.takes.lock().unwrap().clone();
        assert!(matches!(takes[1], Take::Single(spend) if spend.key == DOMAIN), "{takes:?}");

        // Taken alone, the enforced budget refuses: a refusal, of the Domain's budget.
        let (spender, _) = scripted(vec![refused(Which::First), refused(Which::First)], shadow, enforced);
        let pair = spender.pair(Scope::SecretReadNode, Scope::SecretReadDomain);
        assert_eq!(pair.spend(NODE, DOMAIN, DOMAIN, 1.0).await.unwrap(), refused(Which::Second));
    }

    #[tokio::test]
    async fn a_pair_of_shadow_budgets_is_always_admitted() {
        let shadow = policy(Mode::Shadow, Algorithm::TokenBucket);
        let never = Decision::InsufficientCapacity(InsufficientCapacity {
            which: Which::First,
            cost: 9.0,
            burst: 5.0,
        });
        let (spender, _) = scripted(vec![refused(Which::Second), never], shadow, shadow);
        let pair = spender.pair(Scope::SecretReadNode, Scope::SecretReadDomain);
        assert_eq!(pair.spend(NODE, DOMAIN, DOMAIN, 9.0).await.unwrap(), Decision::Granted(Grant::FREE));
    }

    #[tokio::test]
    async fn a_take_of_many_leaves_out_each_shadow_refusal_and_answers_at_the_takes_own_positions() {
        // Issue 34, item 3: a request's descriptors, two of them under SHADOW rules.
        let spend = |i: u8, mode: Mode| Spend {
            enforcement: Enforcement { mode, fail_mode: FailMode::Closed, rule: None },
            ..Spend::new(Scope::SecretReadNode, Key([i; 16]), 1.0, Limit::new(1.0, 5.0).unwrap())
        };
        let take = Take::many([
            spend(1, Mode::Enforce),
            spend(2, Mode::Shadow),
            spend(3, Mode::Enforce),
            spend(4, Mode::Shadow),
        ]);
        let fill = |tokens| Fill { tokens, refilled_at: DateTime::UNIX_EPOCH };
        // The store refuses position 1 (shadow), then, of the three left, their third: the
        // take's position 3 (shadow), then grants the two enforced ones.
        let granted = Decision::Granted(Grant::of([(Which::First, fill(4.0)), (Which::Second, fill(2.0))]));
        let enforced = policy(Mode::Enforce, Algorithm::TokenBucket);
        let (spender, script) =
            scripted(vec![refused(Which::Second), refused(Which::at(2)), granted], enforced, enforced);
        let Decision::Granted(grant) = spender.decide_at(take.clone(), DateTime::UNIX_EPOCH).await.unwrap()
        else {
            panic!("admitted")
        };
        let left: Vec<Option<f64>> =
            (0..4).map(|i| grant.remaining(Which::at(i)).map(|fill| fill.tokens)).collect();
        assert_eq!(
            left,
            [Some(4.0), None, Some(2.0), None],
            "each at its own position; the shadow ones unread"
        );
        let keys = |take: &Take| take.spends().map(|(_, spend)| spend.key.0[0]).collect::<Vec<_>>();
        let takes = script.takes.lock().unwrap().clone();
        assert_eq!(takes.iter().map(keys).collect::<Vec<_>>(), [vec![1, 2, 3, 4], vec![1, 3, 4], vec![1, 3]]);

        // An enforced refusal of what is left stands, at the take's own position.
        let (spender, _) = scripted(vec![refused(Which::at(3)), refused(Which::at(2))], enforced, enforced);
        let decision = spender.decide_at(take, DateTime::UNIX_EPOCH).await.unwrap();
        assert_eq!(decision, refused(Which::at(2)));
    }

    #[tokio::test]
    async fn a_gcra_policy_takes_from_the_scopes_named_limiter_and_never_in_a_pair() {
        let gcra = policy(Mode::Enforce, Algorithm::Gcra);
        let (spender, script) = scripted(vec![refused(Which::First)], gcra, gcra);
        spender.clone().single(Scope::SecretReadNode).spend(NODE, DOMAIN, 1.0).await.unwrap();
        let takes = script.takes.lock().unwrap().clone();
        let limiter = LimiterName::of_scope(Scope::SecretReadNode);
        assert!(
            matches!(takes[0], Take::Named(spend) if spend.limiter == limiter && spend.key == NamedKey::of(limiter, &NODE.0) && spend.cells == 1),
            "{takes:?}"
        );

        let pair = spender.pair(Scope::SecretReadNode, Scope::SecretReadDomain);
        let undecided = pair.spend(NODE, DOMAIN, DOMAIN, 1.0).await.unwrap_err();
        assert!(matches!(undecided, Undecided::Declined(_)), "{undecided:?}");
    }
}
