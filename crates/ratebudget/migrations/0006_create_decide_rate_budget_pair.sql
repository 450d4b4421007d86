-- The two-budget take, answering with the buckets it judged (ratebudget crate).
--
-- plexsphere.take_rate_budget_pair (0002) answers only which bucket refused. A caller that
-- must say when the refused cost will be covered (Retry-After) or what is left (RateLimit
-- headers) needs the row each decision was made on, so this function returns it. It decides
-- exactly as 0002's does: the snapshot guard first (a bucket this snapshot already shows
-- short is refused without a lock or a write), then both rows locked in (scope, bucket_key)
-- order, judged on their latest versions, and debited both or neither. 0002's function stays
-- for replicas of the previous build during a rolling upgrade.

-- Locks one bucket, minting it at the ceiling when it has no row, and returns the row.
-- A row minted here and then not debited (because the other bucket refused) is a full bucket,
-- exactly what the next take would mint, so leaving it is not a lost refusal.
CREATE FUNCTION plexsphere.lock_rate_budget_row(
    bucket_scope text,
    key uuid,
    burst double precision,
    now timestamptz,
    OUT tokens double precision,
    OUT refilled_at timestamptz
)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT b.tokens, b.refilled_at
    INTO tokens, refilled_at
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key
    FOR UPDATE;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Waits for a concurrent minting of the same row, then finds it there and does nothing.
    INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
    VALUES (bucket_scope, key, burst, now)
    ON CONFLICT (scope, bucket_key) DO NOTHING;
    SELECT b.tokens, b.refilled_at
    INTO STRICT tokens, refilled_at
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key
    FOR UPDATE;
END
$$;

-- One row: refused is 0 when both buckets covered their cost and both were debited (the
-- tokens and refilled_at columns are then each row as debited), 1 when the first refused and
-- 2 when the second did (1 when both would; that side's columns are its row as judged, the
-- other side's are NULL). A refusal debits neither.
CREATE FUNCTION plexsphere.decide_rate_budget_pair(
    first_scope text,
    first_key uuid,
    first_cost double precision,
    first_rate double precision,
    first_burst double precision,
    second_scope text,
    second_key uuid,
    second_cost double precision,
    second_rate double precision,
    second_burst double precision,
    now timestamptz
) RETURNS TABLE (
    refused smallint,
    first_tokens double precision,
    first_refilled_at timestamptz,
    second_tokens double precision,
    second_refilled_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    f_tokens double precision;
    f_at timestamptz;
    s_tokens double precision;
    s_at timestamptz;
BEGIN
    IF first_scope = second_scope AND first_key = second_key THEN
        RAISE EXCEPTION 'decide_rate_budget_pair needs two distinct buckets'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The guard, as in the single take. Concurrent takes only lower a bucket, so a bucket
    -- seen short is short.
    SELECT b.tokens, b.refilled_at
    INTO f_tokens, f_at
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = first_scope
      AND b.bucket_key = first_key;
    IF FOUND AND plexsphere.rate_budget_level(f_tokens, f_at, first_rate, first_burst, now) < first_cost THEN
        RETURN QUERY SELECT 1::smallint, f_tokens, f_at, NULL::float8, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT b.tokens, b.refilled_at
    INTO s_tokens, s_at
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = second_scope
      AND b.bucket_key = second_key;
    IF FOUND AND plexsphere.rate_budget_level(s_tokens, s_at, second_rate, second_burst, now) < second_cost THEN
        RETURN QUERY SELECT 2::smallint, NULL::float8, NULL::timestamptz, s_tokens, s_at;
        RETURN;
    END IF;

    -- Lock in one global order, (scope, bucket_key), so two pairs sharing a bucket cannot
    -- deadlock whichever order their callers named the buckets in.
    IF (first_scope, first_key) < (second_scope, second_key) THEN
        SELECT l.tokens, l.refilled_at INTO f_tokens, f_at
        FROM plexsphere.lock_rate_budget_row(first_scope, first_key, first_burst, now) AS l;
        SELECT l.tokens, l.refilled_at INTO s_tokens, s_at
        FROM plexsphere.lock_rate_budget_row(second_scope, second_key, second_burst, now) AS l;
    ELSE
        SELECT l.tokens, l.refilled_at INTO s_tokens, s_at
        FROM plexsphere.lock_rate_budget_row(second_scope, second_key, second_burst, now) AS l;
        SELECT l.tokens, l.refilled_at INTO f_tokens, f_at
        FROM plexsphere.lock_rate_budget_row(first_scope, first_key, first_burst, now) AS l;
    END IF;

    -- Judged on the locked, latest versions: this is what decides under concurrency.
    IF plexsphere.rate_budget_level(f_tokens, f_at, first_rate, first_burst, now) < first_cost THEN
        RETURN QUERY SELECT 1::smallint, f_tokens, f_at, NULL::float8, NULL::timestamptz;
        RETURN;
    END IF;
    IF plexsphere.rate_budget_level(s_tokens, s_at, second_rate, second_burst, now) < second_cost THEN
        RETURN QUERY SELECT 2::smallint, NULL::float8, NULL::timestamptz, s_tokens, s_at;
        RETURN;
    END IF;

    UPDATE plexsphere.rate_budgets AS b
    SET tokens = plexsphere.rate_budget_level(b.tokens, b.refilled_at, first_rate, first_burst, now) - first_cost,
        refilled_at = GREATEST(b.refilled_at, now)
    WHERE b.scope = first_scope
      AND b.bucket_key = first_key
    RETURNING b.tokens, b.refilled_at INTO f_tokens, f_at;
    UPDATE plexsphere.rate_budgets AS b
    SET tokens = plexsphere.rate_budget_level(b.tokens, b.refilled_at, second_rate, second_burst, now) - second_cost,
        refilled_at = GREATEST(b.refilled_at, now)
    WHERE b.scope = second_scope
      AND b.bucket_key = second_key
    RETURNING b.tokens, b.refilled_at INTO s_tokens, s_at;
    RETURN QUERY SELECT 0::smallint, f_tokens, f_at, s_tokens, s_at;
END
$$;
