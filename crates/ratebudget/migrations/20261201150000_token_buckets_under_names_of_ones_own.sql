-- Token buckets under names of their owner's own (ratebudget crate): the `scope` column holds
-- a budget's name, any name of `a-z 0-9 _` starting with a letter, up to 63 characters (the
-- rule ratebudget::Name and named_limits' limiter CHECK hold names to), where it held one of
-- this project's five scopes. The five are names like any other: their rows are unchanged.
--
-- Why: a user of the crate alone could take only from GCRA limiters, whose keys are any
-- string; token buckets (fractional costs such as bytes, two budgets taken together) were
-- closed to the five. With names open, both kinds of budget serve any caller, with the same
-- statements, guard, coalescing and sweep. The column keeps its name, so every statement and
-- every replica of an earlier build keeps working; keys that are not uuids are hashed to 16
-- bytes under their budget's name (ratebudget::Key::hashed).
ALTER TABLE plexsphere.rate_budgets
    DROP CONSTRAINT rate_budgets_scope_check,
    ADD CONSTRAINT rate_budgets_name_check CHECK (scope ~ '^[a-z][a-z0-9_]{0,62}$');
