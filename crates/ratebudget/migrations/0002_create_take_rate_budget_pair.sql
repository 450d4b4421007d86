-- The two-budget take: one call that debits two buckets all-or-nothing (ratebudget crate).
--
-- A secret read spends the Node's and the Domain's budget; an ingest batch spends both quotas.
-- Taking them as two statements would either lose the first debit when the second refuses or
-- need a compensating refund that a crash can skip. One function call is one round trip and
-- one transaction, with the same row-level guarantees as the single take: rows are locked
-- before they are judged, so concurrent pairs never overspend either bucket.

-- The level a bucket would have at `now`: refilled by elapsed x rate, capped at the burst.
-- A negative elapsed (a clock running behind) refills nothing. This is the same arithmetic as
-- crates/ratebudget/queries/take.sql, whose header explains it.
CREATE FUNCTION plexsphere.rate_budget_level(
    tokens double precision,
    refilled_at timestamptz,
    rate double precision,
    burst double precision,
    now timestamptz
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN LEAST(burst, tokens + GREATEST(0::float8, date_part('epoch', now - refilled_at)) * rate);

-- Locks one bucket, minting it at the ceiling when it has no row, and returns its level.
-- A row minted here and then not debited (because the other bucket refused) is a full bucket,
-- exactly what the next take would mint, so leaving it is not a lost refusal.
CREATE FUNCTION plexsphere.lock_rate_budget(
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
    SELECT plexsphere.rate_budget_level(b.tokens, b.refilled_at, rate, burst, now)
    INTO level
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key
    FOR UPDATE;
    IF FOUND THEN
        RETURN level;
    END IF;
    -- Waits for a concurrent minting of the same row, then finds it there and does nothing.
    INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
    VALUES (bucket_scope, key, burst, now)
    ON CONFLICT (scope, bucket_key) DO NOTHING;
    SELECT plexsphere.rate_budget_level(b.tokens, b.refilled_at, rate, burst, now)
    INTO STRICT level
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key
    FOR UPDATE;
    RETURN level;
END
$$;

-- Returns 0 when both buckets covered their cost and both were debited, 1 when the first
-- bucket refused, 2 when the second did (1 when both would). A refusal debits neither.
CREATE FUNCTION plexsphere.take_rate_budget_pair(
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
