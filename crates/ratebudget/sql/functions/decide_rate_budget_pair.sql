-- plexsphere.decide_rate_budget_pair: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/decide_rate_budget_pair.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
CREATE OR REPLACE FUNCTION plexsphere.decide_rate_budget_pair(
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
    IF NOT coalesce(plexsphere.rate_budget_arguments_valid(first_cost, first_rate, first_burst, now)
                    AND plexsphere.rate_budget_arguments_valid(second_cost, second_rate, second_burst, now), false) THEN
        RAISE EXCEPTION 'decide_rate_budget_pair: costs must be finite and not negative, rates and bursts finite and above 0, the instant finite'
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
