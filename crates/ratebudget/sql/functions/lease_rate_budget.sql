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
-- (the row's `lease_serial`, a new number for every lease that takes something), and the row
-- as written, or as judged when nothing was written.
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
--
-- Why a lease's number comes from a sequence: numbered per row, a bucket's leases started
-- again at 1 once a reset deleted its row and a take minted it again, and a replica that had
-- not yet heard of the reset gave back a lease of the old row under a number the new row's
-- own lease then had: credited to it, tokens no holder of the new row counted (burst 100: the
-- row read 98 while another replica still held 24 it could grant). A sequence never repeats a
-- number, and a minted row has none (0), so a refund is credited only to the lease it came
-- from.
--
-- Why a refund alone refills nothing: it comes from a lease of a bucket that cooled, under the
-- limit the lease was made under, which may no longer be the bucket's (a rule lowered since; a
-- replica forgets its leases only when a budget may grow). Refilled at that rate and burst,
-- the row would hold tokens the current limit never gives. Credited to the row as stored, the
-- next take refills it at its own limit, the current one, and caps it at its burst: the level
-- refilling first and crediting after would give (min(B, min(B, x + r.t) + c) =
-- min(B, x + c + r.t)), at whatever limit is current then.
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
    IF at_most = 0 THEN
        -- A refund alone. A number the snapshot shows gone never comes back: nothing to lock.
        IF NOT FOUND OR refund = 0 OR serial <> refund_serial THEN
            RETURN;
        END IF;
        SELECT b.tokens, b.refilled_at, b.lease_serial
        INTO tokens, refilled_at, serial
        FROM plexsphere.rate_budgets AS b
        WHERE b.scope = bucket_scope
          AND b.bucket_key = key
        FOR UPDATE;
        IF FOUND AND serial = refund_serial THEN
            refunded := LEAST(refund, GREATEST(burst - tokens, 0));
            UPDATE plexsphere.rate_budgets AS b
            SET tokens = b.tokens + refunded
            WHERE b.scope = bucket_scope
              AND b.bucket_key = key
            RETURNING b.tokens INTO tokens;
        END IF;
        RETURN;
    END IF;
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
    IF leased > 0 THEN
        serial := nextval('plexsphere.rate_budget_lease_serials');
    END IF;
    IF leased > 0 OR refunded > 0 OR minted THEN
        UPDATE plexsphere.rate_budgets AS b
        SET tokens = level - leased,
            refilled_at = GREATEST(b.refilled_at, now),
            lease_serial = serial
        WHERE b.scope = bucket_scope
          AND b.bucket_key = key
        RETURNING b.tokens, b.refilled_at, b.lease_serial INTO tokens, refilled_at, serial;
    END IF;
END
$$;
