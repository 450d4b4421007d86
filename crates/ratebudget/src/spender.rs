//! What a context's limiter adapter binds to: a decider and the clock it decides at.
//!
//! Every adapter does the same two things before it translates a decision into its own
//! language: read `now` from the injected clock, and hand the decider a take. Both live here
//! once, along with the two-budget shape that secret reads and ingest batches share.

use std::sync::Arc;

use crate::{Clock, Decider, Decision, Key, Limit, Scope, Spend, Take, Undecided};

/// Takes through a [`Decider`] at a [`Clock`]'s now; cheap to clone.
#[derive(Clone, Debug)]
pub struct Spender {
    decider: Arc<dyn Decider>,
    clock: Arc<dyn Clock>,
}

impl Spender {
    /// Takes through `decider`, at `clock`'s now on every call (tests move a
    /// [`ManualClock`](crate::ManualClock) instead of sleeping).
    pub fn new(decider: Arc<dyn Decider>, clock: Arc<dyn Clock>) -> Spender {
        Spender { decider, clock }
    }

    /// Decides `take` now.
    ///
    /// # Errors
    /// As [`Decider::decide`]: the take could not be decided, which is never a refusal.
    pub async fn spend(&self, take: Take) -> Result<Decision, Undecided> {
        self.decider.decide(take, self.clock.now()).await
    }

    /// Two budgets this spender takes from together, all-or-nothing: `first` is reported when
    /// both refuse.
    pub fn pair(self, first: (Scope, Limit), second: (Scope, Limit)) -> PairBudget {
        PairBudget { spender: self, first, second }
    }
}

/// Two budgets spent together by one request, such as a Node's and its Domain's.
#[derive(Clone, Debug)]
pub struct PairBudget {
    spender: Spender,
    first: (Scope, Limit),
    second: (Scope, Limit),
}

impl PairBudget {
    /// Spends `cost` from `first_key`'s bucket of the first budget and `second_key`'s of the
    /// second, both or neither. [`Which::First`](crate::Which::First) names the first budget.
    ///
    /// # Errors
    /// As [`Spender::spend`].
    pub async fn spend(&self, first_key: Key, second_key: Key, cost: f64) -> Result<Decision, Undecided> {
        let spend = |(scope, limit): (Scope, Limit), key| Spend { scope, key, cost, limit };
        self.spender.spend(Take::Pair(spend(self.first, first_key), spend(self.second, second_key))).await
    }
}
