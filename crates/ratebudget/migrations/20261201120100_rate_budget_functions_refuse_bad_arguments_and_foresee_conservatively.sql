-- The rate-budget table and every decision function defend themselves against direct SQL
-- (an operator's psql, a future caller), and the general coalesced take foresees refusals
-- conservatively.
--
-- 1. The table refuses what no take writes: tokens that are NaN or infinite (`tokens >= 0`
--    lets NaN and +Infinity through: PostgreSQL orders NaN above every number), and a
--    refilled_at of +-infinity. Checked on the rows there (none is expected to fail).
-- 2. Every decision function refuses, with an error and before it reads or writes anything,
--    a cost that is negative, NaN or infinite, a rate or burst that is not a number above 0,
--    an instant of +-infinity, NULLs where a value is needed, repeated buckets where it assumes
--    distinct ones, and a pair whose first and second bucket are one: each of those, given to
--    the arithmetic, could grant (a NaN rate refills a bucket to full: LEAST ignores NaN) or
--    credit (a negative cost adds tokens). take.sql and decide_named.sql, statements of the
--    crate rather than functions, check their parameters the same way.
-- 3. decide_rate_budget_batch foresaw a take refused when the snapshot, at the take's own
--    instant and rate, could not cover it; but a take earlier in the call at a later instant,
--    or at a higher rate, leaves more than that, so a pair foreseen short was refused and
--    blamed its other, full bucket (1 in about 1,500 random calls with pairs). It now
--    foresees from a bound on what the takes before it can leave (see step 1).
--
-- Each function is replaced whole, with the same signature, so replicas of earlier builds
-- keep calling it; the coalesced takes keep planning once per session (0013's SET clause,
-- which CREATE OR REPLACE would otherwise drop).

ALTER TABLE plexsphere.rate_budgets
    ADD CONSTRAINT rate_budgets_tokens_finite CHECK (tokens < 'Infinity'::float8) NOT VALID,
    ADD CONSTRAINT rate_budgets_refilled_at_finite CHECK (isfinite(refilled_at)) NOT VALID;
ALTER TABLE plexsphere.rate_budgets VALIDATE CONSTRAINT rate_budgets_tokens_finite;
ALTER TABLE plexsphere.rate_budgets VALIDATE CONSTRAINT rate_budgets_refilled_at_finite;

--! include functions/rate_budget_arguments_valid.sql

--! include functions/refuse_rate_budget_arguments.sql

--! include functions/take_rate_budget_pair.sql

--! include functions/decide_rate_budget_pair.sql

--! include functions/decide_rate_budget_batch.sql

--! include functions/decide_rate_budget_batch_of_one_bucket.sql

--! include functions/decide_rate_budget_batch_of_distinct_buckets.sql
