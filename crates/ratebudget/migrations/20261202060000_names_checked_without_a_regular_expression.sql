-- Budget names checked without a regular expression (ratebudget crate): the same rule as
-- before, 1 to 63 of `a-z 0-9 _` starting with a letter (ratebudget::Name::is_valid), written
-- as three comparisons instead of `~ '^[a-z][a-z0-9_]{0,62}$'`.
--
-- Why: PostgreSQL checks every CHECK of a table on every row version it writes, and every
-- take writes one (an update, or the insert that mints a bucket). The regular expression was
-- the dearest thing in that: perf, random tenants through the gRPC decide API, put 5% of the
-- whole machine's CPU (an eighth of PostgreSQL's) in textregexeq; pgbench of the distinct-
-- bucket function, 23 takes a call, 16 clients, interleaved runs on an emptied table: 1,538
-- and 1,510 calls/s with it, 1,657 and 1,899 with this, 1,739 and 1,808 with no name check
-- at all (BENCHMARKS.md section 8).
--
-- The three comparisons, for a non-empty text: its first character is a lowercase letter;
-- every character is one of `a-z 0-9 _` (ltrim strips all of them from the left, so nothing
-- is left only when nothing else was there); and so, every character being one byte, at most
-- 63 characters. tests/it/ratebudget_store.rs holds both tables to the crate's rule and to the
-- old expression, character by character.
--
-- Adding the constraint checks the rows there are (every one met the old rule, which is this
-- one), a scan of each table under its ALTER's lock.
ALTER TABLE plexsphere.rate_budgets
    DROP CONSTRAINT rate_budgets_name_check,
    ADD CONSTRAINT rate_budgets_name_check CHECK (
        ascii(scope) BETWEEN ascii('a') AND ascii('z')
        AND ltrim(scope, 'abcdefghijklmnopqrstuvwxyz0123456789_') = ''
        AND octet_length(scope) <= 63
    );

ALTER TABLE plexsphere.named_limits
    DROP CONSTRAINT named_limits_limiter_check,
    ADD CONSTRAINT named_limits_limiter_check CHECK (
        ascii(limiter) BETWEEN ascii('a') AND ascii('z')
        AND ltrim(limiter, 'abcdefghijklmnopqrstuvwxyz0123456789_') = ''
        AND octet_length(limiter) <= 63
    );
