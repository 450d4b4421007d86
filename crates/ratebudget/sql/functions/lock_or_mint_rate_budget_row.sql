-- plexsphere.lock_or_mint_rate_budget_row: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/lock_or_mint_rate_budget_row.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
CREATE OR REPLACE FUNCTION plexsphere.lock_or_mint_rate_budget_row(
    bucket_scope text,
    key uuid,
    burst double precision,
    now timestamptz,
    OUT tokens double precision,
    OUT refilled_at timestamptz,
    OUT minted boolean
)
LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        SELECT b.tokens, b.refilled_at
        INTO tokens, refilled_at
        FROM plexsphere.rate_budgets AS b
        WHERE b.scope = bucket_scope
          AND b.bucket_key = key
        FOR UPDATE;
        IF FOUND THEN
            minted := false;
            RETURN;
        END IF;
        -- Waits for a concurrent minting of the same row; when that wins, goes round to lock it.
        INSERT INTO plexsphere.rate_budgets AS b (scope, bucket_key, tokens, refilled_at)
        VALUES (bucket_scope, key, burst, now)
        ON CONFLICT (scope, bucket_key) DO NOTHING
        RETURNING b.tokens, b.refilled_at INTO tokens, refilled_at;
        IF FOUND THEN
            minted := true;
            RETURN;
        END IF;
    END LOOP;
END
$$;
