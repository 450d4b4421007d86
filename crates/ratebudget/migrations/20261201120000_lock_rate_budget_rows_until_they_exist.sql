-- The row-locking helpers of the pair functions (0002, 0006) and of the first coalesced take
-- (0009) lock a bucket's row, minting it when it is missing: SELECT ... FOR UPDATE, then
-- INSERT ... ON CONFLICT DO NOTHING, then SELECT ... FOR UPDATE INTO STRICT. When a reset or
-- the sweep deleted the row between the INSERT (which found it there and did nothing) and the
-- last SELECT (which waited on the deleter's lock and then found nothing), the take failed with
-- "query returned no rows": an error where a decision was due. Each now loops until it holds
-- the row: found and locked, or inserted by this call (a row this transaction inserted is its
-- own until it commits). A deletion can only make it go round once more; nothing here waits
-- on anything the first version did not.
--
-- The same signatures, so every caller and every replica of an earlier build keeps working.

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

CREATE OR REPLACE FUNCTION plexsphere.lock_rate_budget_row(
    bucket_scope text,
    key uuid,
    burst double precision,
    now timestamptz,
    OUT tokens double precision,
    OUT refilled_at timestamptz
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
            RETURN;
        END IF;
        -- Waits for a concurrent minting of the same row; when that wins, goes round to lock it.
        INSERT INTO plexsphere.rate_budgets AS b (scope, bucket_key, tokens, refilled_at)
        VALUES (bucket_scope, key, burst, now)
        ON CONFLICT (scope, bucket_key) DO NOTHING
        RETURNING b.tokens, b.refilled_at INTO tokens, refilled_at;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;

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
