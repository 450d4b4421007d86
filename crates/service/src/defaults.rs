//! The budgets that govern where no rule does: one per scope of this project's own, a limit and
//! a fail mode each, held as a table keyed by [`Scope::ALL`] rather than five named fields.

use ratebudget::{Enforcement, FailMode, Limit, Policy, Scope};

/// One scope's budget where no rule governs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DefaultBudget {
    /// Its rate and burst.
    pub limit: Limit,
    /// What its takes do while the store cannot answer.
    pub fail_mode: FailMode,
}

/// Every scope's [`DefaultBudget`], in [`Scope::ALL`]'s order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DefaultBudgets([DefaultBudget; Scope::ALL.len()]);

impl DefaultBudgets {
    /// The table whose budget for each scope is `of(scope)`.
    ///
    /// # Errors
    /// The first error `of` returns, in [`Scope::ALL`]'s order.
    pub fn try_from_fn<E>(
        mut of: impl FnMut(Scope) -> Result<DefaultBudget, E>,
    ) -> Result<DefaultBudgets, E> {
        let mut budgets = Vec::with_capacity(Scope::ALL.len());
        for scope in Scope::ALL {
            budgets.push(of(scope)?);
        }
        Ok(DefaultBudgets(budgets.try_into().expect("one budget per scope")))
    }

    /// `scope`'s budget.
    pub fn of(&self, scope: Scope) -> DefaultBudget {
        let position = Scope::ALL.iter().position(|known| *known == scope).expect("every scope is in ALL");
        self.0[position]
    }

    /// The policy of `scope`'s takes where no rule governs: its budget, enforced, failing as
    /// its fail mode says.
    pub fn policy(&self, scope: Scope) -> Policy {
        let DefaultBudget { limit, fail_mode } = self.of(scope);
        Policy { enforcement: Enforcement { fail_mode, ..Enforcement::STRICT }, ..Policy::strict(limit) }
    }
}

#[cfg(test)]
mod tests;
