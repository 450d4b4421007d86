-- Leases for hot buckets (ratebudget crate, docs/adr/0034): a replica takes many tokens of a
-- hot bucket in one statement and grants them from memory, and gives back what it did not
-- grant. Each row numbers its leases (`lease_serial`), so a refund can tell whether a later
-- lease was made since (the function says why that matters). Adding a column with a constant
-- default rewrites nothing; the take statements never read or write it.
ALTER TABLE plexsphere.rate_budgets
    ADD COLUMN lease_serial bigint NOT NULL DEFAULT 0 CHECK (lease_serial >= 0);

-- plexsphere.lease_rate_budget: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/lease_rate_budget.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
--
-- A lease (docs/adr/0034): one statement that first gives back what a replica leased and did
-- not grant (`refund`, of the lease numbered `serial`), then takes between `at_least` and
-- `at_most` tokens, as many whole multiples of `at_least` as the level covers, for the
-- replica to grant from memory. With `at_least` = `at_most` it decides as take.sql; with both
-- 0 it only gives back.
--
-- Result (leased, refunded, serial, tokens, refilled_at): what was taken (0 when the level
-- could not cover `at_least`), what of the refund was credited, the number of the lease made
-- (the row's `lease_serial`, raised by every lease that takes something), and the row as
-- written, or as judged when nothing was written.
--
-- The arithmetic is take.sql's (rate_budget_level: refilled by elapsed x rate, capped at the
-- burst; a clock behind refills nothing; refilled_at never moves back; a missing row is minted
-- full). A lease that cannot be covered and has nothing to give back writes nothing, and when
-- the snapshot already shows the level short it does not even lock the row (docs/adr/0001).
-- Everything else runs under the row lock, so concurrent leases and takes of one bucket never
-- hand out the same token twice.
--
-- Why a refund is credited only to the latest lease: a replica holding a lease grants from it
-- no more than the burst less what the row it leased from holds by now (ratebudget's guard),
-- which bounds the bucket's admissions in every window only while nothing adds tokens the
-- row it leased from did not count. Tokens given back by a lease made before it would be such
-- tokens; tokens of the latest lease are ones every other holder's row still counts. So a
-- refund is credited when `serial` is still the row's `lease_serial`, and otherwise forfeited
-- (fewer grants, never more). The burst caps it too. A refund is a credit: callers give back
-- only tokens they leased and did not grant.
CREATE OR REPLACE FUNCTION plexsphere.lease_rate_budget(
    bucket_scope text,
    key uuid,
    at_least double precision,
    at_most double precision,
    refund double precision,
    refund_serial bigint,
    rate double precision,
    burst double precision,
    now timestamptz,
    OUT leased double precision,
    OUT refunded double precision,
    OUT serial bigint,
    OUT tokens double precision,
    OUT refilled_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    level double precision;
    minted boolean;
BEGIN
    IF NOT (plexsphere.rate_budget_arguments_valid(at_least, rate, burst, now)
            AND at_most >= at_least AND at_most <= burst
            AND refund >= 0 AND refund <= burst AND refund_serial IS NOT NULL
            AND bucket_scope IS NOT NULL AND key IS NOT NULL) IS TRUE THEN
        PERFORM plexsphere.refuse_rate_budget_arguments(
            'lease: at_least finite, not negative and at most at_most, which is at most the burst; a refund between 0 and the burst, of a lease serial; the rate and burst finite and above 0; the instant finite'
        );
    END IF;
    leased := 0;
    refunded := 0;
    -- The snapshot's row: a lease it shows short, with nothing to give back, locks and writes
    -- nothing.
    SELECT b.tokens, b.refilled_at, b.lease_serial
    INTO tokens, refilled_at, serial
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key;
    IF FOUND AND (refund = 0 OR serial <> refund_serial)
       AND plexsphere.rate_budget_level(tokens, refilled_at, rate, burst, now) < at_least THEN
        RETURN;
    END IF;
    SELECT locked.tokens, locked.refilled_at, locked.minted
    INTO tokens, refilled_at, minted
    FROM plexsphere.lock_or_mint_rate_budget_row(bucket_scope, key, burst, now) AS locked;
    SELECT b.lease_serial INTO serial
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key;
    level := plexsphere.rate_budget_level(tokens, refilled_at, rate, burst, now);
    IF refund > 0 AND serial = refund_serial THEN
        refunded := LEAST(refund, burst - level);
        level := level + refunded;
    END IF;
    -- Whole multiples of the asking take's cost: a fraction left over would be a refund,
    -- forfeited whenever another replica leased since (the usual case on a saturated bucket),
    -- where left in the row it stays for the next take.
    IF level >= at_least AND at_least > 0 THEN
        leased := at_least * floor(LEAST(level, at_most) / at_least);
    END IF;
    IF leased > 0 OR refunded > 0 OR minted THEN
        UPDATE plexsphere.rate_budgets AS b
        SET tokens = level - leased,
            refilled_at = GREATEST(b.refilled_at, now),
            lease_serial = b.lease_serial + CASE WHEN leased > 0 THEN 1 ELSE 0 END
        WHERE b.scope = bucket_scope
          AND b.bucket_key = key
        RETURNING b.tokens, b.refilled_at, b.lease_serial INTO tokens, refilled_at, serial;
    END IF;
END
$$;
