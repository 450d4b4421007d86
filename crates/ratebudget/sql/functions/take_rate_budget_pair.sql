-- plexsphere.take_rate_budget_pair: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/take_rate_budget_pair.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
CREATE OR REPLACE FUNCTION plexsphere.take_rate_budget_pair(
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
) RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    first_level double precision;
    second_level double precision;
BEGIN
    IF first_scope = second_scope AND first_key = second_key THEN
        RAISE EXCEPTION 'take_rate_budget_pair needs two distinct buckets'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT coalesce(plexsphere.rate_budget_arguments_valid(first_cost, first_rate, first_burst, now)
                    AND plexsphere.rate_budget_arguments_valid(second_cost, second_rate, second_burst, now), false) THEN
        RAISE EXCEPTION 'take_rate_budget_pair: costs must be finite and not negative, rates and bursts finite and above 0, the instant finite'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The guard, as in the single take: a bucket that this snapshot already shows short is
    -- refused without locking or writing anything. Concurrent takes only lower a bucket, so a
    -- bucket seen short is short.
    SELECT plexsphere.rate_budget_level(b.tokens, b.refilled_at, first_rate, first_burst, now)
    INTO first_level
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = first_scope
      AND b.bucket_key = first_key;
    IF FOUND AND first_level < first_cost THEN
        RETURN 1;
    END IF;
    SELECT plexsphere.rate_budget_level(b.tokens, b.refilled_at, second_rate, second_burst, now)
    INTO second_level
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = second_scope
      AND b.bucket_key = second_key;
    IF FOUND AND second_level < second_cost THEN
        RETURN 2;
    END IF;

    -- Lock in one global order, (scope, bucket_key), so two pairs sharing a bucket cannot
    -- deadlock whichever order their callers named the buckets in.
    IF (first_scope, first_key) < (second_scope, second_key) THEN
        first_level := plexsphere.lock_rate_budget(first_scope, first_key, first_rate, first_burst, now);
        second_level := plexsphere.lock_rate_budget(second_scope, second_key, second_rate, second_burst, now);
    ELSE
        second_level := plexsphere.lock_rate_budget(second_scope, second_key, second_rate, second_burst, now);
        first_level := plexsphere.lock_rate_budget(first_scope, first_key, first_rate, first_burst, now);
    END IF;

    -- Judged on the locked, latest versions: this is what decides under concurrency.
    IF first_level < first_cost THEN
        RETURN 1;
    END IF;
    IF second_level < second_cost THEN
        RETURN 2;
    END IF;

    UPDATE plexsphere.rate_budgets
    SET tokens = first_level - first_cost,
        refilled_at = GREATEST(refilled_at, now)
    WHERE scope = first_scope
      AND bucket_key = first_key;
    UPDATE plexsphere.rate_budgets
    SET tokens = second_level - second_cost,
        refilled_at = GREATEST(refilled_at, now)
    WHERE scope = second_scope
      AND bucket_key = second_key;
    RETURN 0;
END
$$;
