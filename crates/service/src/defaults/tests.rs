use super::*;

#[test]
fn each_scope_has_its_own_budget_and_fail_mode_enforced() {
    let budgets = DefaultBudgets::try_from_fn(|scope| {
        let position = Scope::ALL.iter().position(|known| *known == scope).unwrap() as f64;
        let fail_mode = if scope == Scope::IngestNode { FailMode::Open } else { FailMode::Closed };
        Ok::<_, ()>(DefaultBudget { limit: Limit::new(1.0 + position, 10.0).unwrap(), fail_mode })
    })
    .unwrap();
    for (position, scope) in Scope::ALL.into_iter().enumerate() {
        let policy = budgets.policy(scope);
        assert_eq!(policy.limit.per_second(), 1.0 + position as f64, "{scope}");
        assert_eq!(policy.enforcement.mode, ratebudget::Mode::Enforce);
        assert_eq!(policy.enforcement.rule, None, "no rule governs a default");
    }
    assert_eq!(budgets.policy(Scope::IngestNode).enforcement.fail_mode, FailMode::Open);
    assert_eq!(budgets.policy(Scope::IngestDomain).enforcement.fail_mode, FailMode::Closed);
}

#[test]
fn the_first_scope_that_fails_is_the_error() {
    let failed = DefaultBudgets::try_from_fn(|scope| match scope {
        Scope::SecretReadDomain | Scope::IngestDomain => Err(scope),
        _ => Ok(DefaultBudget { limit: Limit::new(1.0, 1.0).unwrap(), fail_mode: FailMode::Closed }),
    });
    assert_eq!(failed.unwrap_err(), Scope::SecretReadDomain);
}
