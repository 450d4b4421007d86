-- plexsphere.lock_rate_budget: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/lock_rate_budget.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
CREATE OR REPLACE FUNCTION plexsphere.lock_rate_budget(
    bucket_scope text,
    key uuid,
    rate double precision,
    burst double precision,
    now timestamptz
) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    level double precision;
BEGIN
    LOOP
        SELECT plexsphere.rate_budget_level(b.tokens, b.refilled_at, rate, burst, now)
        INTO level
        FROM plexsphere.rate_budgets AS b
        WHERE b.scope = bucket_scope
          AND b.bucket_key = key
        FOR UPDATE;
        IF FOUND THEN
            RETURN level;
        END IF;
        -- Waits for a concurrent minting of the same row; when that wins, goes round to lock it.
        INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
        VALUES (bucket_scope, key, burst, now)
        ON CONFLICT (scope, bucket_key) DO NOTHING;
        IF FOUND THEN
            RETURN burst;
        END IF;
    END LOOP;
END
$$;
