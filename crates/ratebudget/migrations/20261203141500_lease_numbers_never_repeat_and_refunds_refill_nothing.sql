-- Leases (ratebudget crate, docs/adr/0034; issue 32, item 6): a lease's number comes from a
-- sequence, so a refund is credited only to the lease it came from, even once a reset deleted
-- the row and a take minted it again (numbered per row, its leases started again at 1); and a
-- refund alone is credited to the row as stored, refilling nothing at the limit the lease was
-- made under. The function's text says why.
--
-- The sequence starts above every number a row holds now, so that no lease a replica holds
-- across the upgrade shares its number with a lease made after it.
CREATE SEQUENCE plexsphere.rate_budget_lease_serials AS bigint;
SELECT setval(
    'plexsphere.rate_budget_lease_serials',
    COALESCE((SELECT max(lease_serial) FROM plexsphere.rate_budgets), 0) + 1,
    false
);

--! include functions/lease_rate_budget.sql
