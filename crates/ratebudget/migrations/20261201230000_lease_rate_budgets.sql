-- Leases for hot buckets (ratebudget crate, docs/adr/0034): a replica takes many tokens of a
-- hot bucket in one statement and grants them from memory, and gives back what it did not
-- grant. Each row numbers its leases (`lease_serial`), so a refund can tell whether a later
-- lease was made since (the function says why that matters). Adding a column with a constant
-- default rewrites nothing; the take statements never read or write it.
ALTER TABLE plexsphere.rate_budgets
    ADD COLUMN lease_serial bigint NOT NULL DEFAULT 0 CHECK (lease_serial >= 0);

--! include functions/lease_rate_budget.sql
