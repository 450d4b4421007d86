-- The rate-budget table and every decision function defend themselves against direct SQL
-- (an operator's psql, a future caller), and the general coalesced take foresees refusals
-- conservatively.
--
-- 1. The table refuses what no take writes: tokens that are NaN or infinite (`tokens >= 0`
--    lets NaN and +Infinity through: PostgreSQL orders NaN above every number), and a
--    refilled_at of +-infinity. Checked on the rows there (none is expected to fail).
-- 2. Every decision function refuses, with an error and before it reads or writes anything,
--    a cost that is negative, NaN or infinite, a rate or burst that is not a number above 0,
--    an instant of +-infinity, NULLs where a value is needed, repeated buckets where it assumes
--    distinct ones, and a pair whose first and second bucket are one: each of those, given to
--    the arithmetic, could grant (a NaN rate refills a bucket to full: LEAST ignores NaN) or
--    credit (a negative cost adds tokens). take.sql and decide_named.sql, statements of the
--    crate rather than functions, check their parameters the same way.
-- 3. decide_rate_budget_batch foresaw a take refused when the snapshot, at the take's own
--    instant and rate, could not cover it; but a take earlier in the call at a later instant,
--    or at a higher rate, leaves more than that, so a pair foreseen short was refused and
--    blamed its other, full bucket (1 in about 1,500 random calls with pairs). It now
--    foresees from a bound on what the takes before it can leave (see step 1).
--
-- Each function is replaced whole, with the same signature, so replicas of earlier builds
-- keep calling it; the coalesced takes keep planning once per session (0013's SET clause,
-- which CREATE OR REPLACE would otherwise drop).

ALTER TABLE plexsphere.rate_budgets
    ADD CONSTRAINT rate_budgets_tokens_finite CHECK (tokens < 'Infinity'::float8) NOT VALID,
    ADD CONSTRAINT rate_budgets_refilled_at_finite CHECK (isfinite(refilled_at)) NOT VALID;
ALTER TABLE plexsphere.rate_budgets VALIDATE CONSTRAINT rate_budgets_tokens_finite;
ALTER TABLE plexsphere.rate_budgets VALIDATE CONSTRAINT rate_budgets_refilled_at_finite;

-- Whether one spend's numbers are ones a take may be given: a cost finite and not negative,
-- a rate and a burst finite and above 0, a finite instant. NULL for a NULL argument (callers
-- treat that as invalid). NaN compares above every number in PostgreSQL, so `< 'Infinity'`
-- refuses it as well as infinity.
CREATE FUNCTION plexsphere.rate_budget_arguments_valid(
    cost double precision,
    rate double precision,
    burst double precision,
    now timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN cost >= 0 AND cost < 'Infinity'::float8
   AND rate > 0 AND rate < 'Infinity'::float8
   AND burst > 0 AND burst < 'Infinity'::float8
   AND now > '-infinity'::timestamptz AND now < 'infinity'::timestamptz;

-- Raises invalid_parameter_value with `message`: for statements (take.sql, decide_named.sql)
-- that must fail rather than decide on arguments they must never see. Called only from the
-- ELSE of a CASE whose condition holds for good arguments, so it costs nothing on them.
CREATE FUNCTION plexsphere.refuse_rate_budget_arguments(message text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION '%', message USING ERRCODE = 'invalid_parameter_value';
END
$$;

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

CREATE OR REPLACE FUNCTION plexsphere.decide_rate_budget_batch(
    bucket_scopes text[],
    bucket_keys uuid[],
    first_bucket integer[],
    first_cost double precision[],
    first_rate double precision[],
    first_burst double precision[],
    second_bucket integer[],
    second_cost double precision[],
    second_rate double precision[],
    second_burst double precision[],
    nows timestamptz[]
) RETURNS TABLE (
    take integer,
    refused smallint,
    first_tokens double precision,
    first_refilled_at timestamptz,
    second_tokens double precision,
    second_refilled_at timestamptz
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    buckets integer := coalesce(array_length(bucket_keys, 1), 0);
    takes integer := coalesce(array_length(nows, 1), 0);
    held double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    held_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    needed boolean[] := array_fill(false, ARRAY[buckets]);
    changed boolean[] := array_fill(false, ARRAY[buckets]);
    minted boolean[] := array_fill(false, ARRAY[buckets]);
    minted_positions integer[];
    mint_burst double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    mint_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    -- Per bucket, the latest instant, highest rate and highest burst of the takes so far:
    -- what bounds the level any of them can leave it at (step 1).
    bound_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    bound_rate double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    bound_burst double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    b integer;
    b1 integer;
    b2 integer;
    i integer;
    level1 double precision;
    level2 double precision;
    -- The answers, one element per take, returned together at the end: a RETURN QUERY per
    -- take would be a statement per take.
    answer smallint[] := array_fill(NULL::smallint, ARRAY[takes]);
    answer_first double precision[] := array_fill(NULL::double precision, ARRAY[takes]);
    answer_first_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[takes]);
    answer_second double precision[] := array_fill(NULL::double precision, ARRAY[takes]);
    answer_second_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[takes]);
BEGIN
    -- 0. Arguments this function must never see, from a caller other than the ratebudget
    -- crate (an operator's psql, say): an error, never a grant or a credit.
    IF cardinality(bucket_scopes) IS DISTINCT FROM buckets
       OR takes = 0
       OR cardinality(first_bucket) IS DISTINCT FROM takes OR cardinality(first_cost) IS DISTINCT FROM takes
       OR cardinality(first_rate) IS DISTINCT FROM takes OR cardinality(first_burst) IS DISTINCT FROM takes
       OR cardinality(second_bucket) IS DISTINCT FROM takes OR cardinality(second_cost) IS DISTINCT FROM takes
       OR cardinality(second_rate) IS DISTINCT FROM takes OR cardinality(second_burst) IS DISTINCT FROM takes THEN
        RAISE EXCEPTION 'decide_rate_budget_batch: the bucket arrays, and the per-take arrays, must each be of one length, and there must be takes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT (q.scope, q.bucket_key)) FROM unnest(bucket_scopes, bucket_keys) AS q (scope, bucket_key)) <> buckets THEN
        RAISE EXCEPTION 'decide_rate_budget_batch: a bucket is named twice in bucket_scopes and bucket_keys'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (
        SELECT 1
        FROM unnest(first_bucket, first_cost, first_rate, first_burst, second_bucket, second_cost, second_rate, second_burst, nows)
            AS t (b1, c1, r1, u1, b2, c2, r2, u2, at)
        WHERE NOT coalesce(
            t.b1 BETWEEN 1 AND buckets
            AND plexsphere.rate_budget_arguments_valid(t.c1, t.r1, t.u1, t.at)
            AND (t.b2 IS NULL AND t.c2 IS NULL AND t.r2 IS NULL AND t.u2 IS NULL
                 OR t.b2 BETWEEN 1 AND buckets AND t.b2 <> t.b1
                    AND plexsphere.rate_budget_arguments_valid(t.c2, t.r2, t.u2, t.at)),
            false)
    ) THEN
        RAISE EXCEPTION 'decide_rate_budget_batch: every take needs a first bucket, and may have a second other than its first; costs finite and not negative, rates and bursts finite and above 0, instants finite'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- 1. The snapshot, no locks.
    SELECT array_agg(r.tokens ORDER BY q.ord), array_agg(r.refilled_at ORDER BY q.ord)
    INTO held, held_at
    FROM unnest(bucket_scopes, bucket_keys) WITH ORDINALITY AS q (scope, bucket_key, ord)
    LEFT JOIN plexsphere.rate_budgets AS r
        ON r.scope = q.scope
       AND r.bucket_key = q.bucket_key;

    -- A take is foreseen refused only when the level the takes before it may have left its
    -- bucket at is short. Those takes only spend, but a take at a later instant than this
    -- one (callers read their clocks before they queue) moves refilled_at past this one's
    -- instant, keeping the refill up to it, and a take at a higher rate refills faster: both
    -- can leave more than the snapshot holds at this take's own instant and rate. The level
    -- at the latest instant so far, at the highest rate and burst so far, bounds every level
    -- they can leave (each grant leaves tokens + (latest - refilled_at) * highest rate no
    -- higher than before it, capped at the highest burst). With one take per bucket, or
    -- takes in order at one rate, the bound is the take's own level, as before.
    FOR i IN 1..takes LOOP
        b1 := first_bucket[i];
        b2 := second_bucket[i];
        bound_at[b1] := GREATEST(bound_at[b1], nows[i]);
        bound_rate[b1] := GREATEST(bound_rate[b1], first_rate[i]);
        bound_burst[b1] := GREATEST(bound_burst[b1], first_burst[i]);
        IF b2 IS NOT NULL THEN
            bound_at[b2] := GREATEST(bound_at[b2], nows[i]);
            bound_rate[b2] := GREATEST(bound_rate[b2], second_rate[i]);
            bound_burst[b2] := GREATEST(bound_burst[b2], second_burst[i]);
        END IF;
        IF (held[b1] IS NOT NULL
            AND plexsphere.rate_budget_level(held[b1], held_at[b1], bound_rate[b1], bound_burst[b1], bound_at[b1]) < first_cost[i])
           OR (b2 IS NOT NULL AND held[b2] IS NOT NULL
            AND plexsphere.rate_budget_level(held[b2], held_at[b2], bound_rate[b2], bound_burst[b2], bound_at[b2]) < second_cost[i]) THEN
            -- Foreseen: refused whatever the takes before it do; judged in step 3.
            NULL;
        ELSE
            needed[b1] := true;
            IF mint_at[b1] IS NULL THEN
                mint_burst[b1] := first_burst[i];
                mint_at[b1] := nows[i];
            END IF;
            IF b2 IS NOT NULL THEN
                needed[b2] := true;
                IF mint_at[b2] IS NULL THEN
                    mint_burst[b2] := second_burst[i];
                    mint_at[b2] := nows[i];
                END IF;
            END IF;
        END IF;
    END LOOP;

    -- 2. Lock what may be debited, minting what is missing, in one statement whose rows go in
    -- the order of PostgreSQL's own (scope, bucket_key) comparison, the one the pair function
    -- locks in under this database's collation, so concurrent calls and pairs never deadlock.
    -- ON CONFLICT DO UPDATE locks a row that exists even though its WHERE holds for none, so
    -- nothing is written to it; RETURNING names the rows this call inserted: those it minted.
    WITH inserted AS (
        INSERT INTO plexsphere.rate_budgets AS r (scope, bucket_key, tokens, refilled_at)
        SELECT q.scope, q.bucket_key, q.burst, q.at
        FROM unnest(bucket_scopes, bucket_keys, needed, mint_burst, mint_at) AS q (scope, bucket_key, needed, burst, at)
        WHERE q.needed
        ORDER BY q.scope, q.bucket_key
        ON CONFLICT (scope, bucket_key) DO UPDATE
        SET tokens = r.tokens
        WHERE false
        RETURNING r.scope, r.bucket_key
    )
    SELECT array_agg(q.ord::integer)
    INTO minted_positions
    FROM inserted
    JOIN unnest(bucket_scopes, bucket_keys) WITH ORDINALITY AS q (scope, bucket_key, ord)
        ON q.scope = inserted.scope
       AND q.bucket_key = inserted.bucket_key;
    IF minted_positions IS NOT NULL THEN
        FOREACH b IN ARRAY minted_positions LOOP
            minted[b] := true;
        END LOOP;
    END IF;

    -- The locked rows as they are now: this statement's snapshot is newer than every lock it
    -- holds, so it reads their latest versions. A minted bucket is held by this call but is
    -- missing to the takes until one gets past its guard; the others keep the snapshot.
    SELECT array_agg(CASE WHEN q.minted THEN NULL WHEN q.needed THEN r.tokens ELSE q.tokens END ORDER BY q.ord),
           array_agg(CASE WHEN q.minted THEN NULL WHEN q.needed THEN r.refilled_at ELSE q.at END ORDER BY q.ord)
    INTO held, held_at
    FROM unnest(bucket_scopes, bucket_keys, needed, minted, held, held_at)
        WITH ORDINALITY AS q (scope, bucket_key, needed, minted, tokens, at, ord)
    LEFT JOIN plexsphere.rate_budgets AS r
        ON q.needed
       AND r.scope = q.scope
       AND r.bucket_key = q.bucket_key;

    -- 3. Judge in order. A bucket still missing here is touched only by takes the snapshot
    -- refused on their other side; it would be minted full, so it holds its burst.
    FOR i IN 1..takes LOOP
        b1 := first_bucket[i];
        b2 := second_bucket[i];
        level1 := CASE WHEN held[b1] IS NULL THEN first_burst[i]
            ELSE plexsphere.rate_budget_level(held[b1], held_at[b1], first_rate[i], first_burst[i], nows[i]) END;
        IF level1 < first_cost[i] THEN
            answer[i] := 1;
            answer_first[i] := held[b1];
            answer_first_at[i] := held_at[b1];
            CONTINUE;
        END IF;
        IF b2 IS NOT NULL THEN
            level2 := CASE WHEN held[b2] IS NULL THEN second_burst[i]
                ELSE plexsphere.rate_budget_level(held[b2], held_at[b2], second_rate[i], second_burst[i], nows[i]) END;
            IF level2 < second_cost[i] THEN
                answer[i] := 2;
                answer_second[i] := held[b2];
                answer_second_at[i] := held_at[b2];
                CONTINUE;
            END IF;
        END IF;
        -- A take the snapshot foresaw as short is refused even if neither side is short now:
        -- that happens only if an operator reset a bucket meanwhile, and such a take's other
        -- bucket is not locked, so it must not be debited.
        IF NOT needed[b1] OR (b2 IS NOT NULL AND NOT needed[b2]) THEN
            IF needed[b1] THEN
                answer[i] := 2;
                answer_second[i] := held[b2];
                answer_second_at[i] := held_at[b2];
            ELSE
                answer[i] := 1;
                answer_first[i] := held[b1];
                answer_first_at[i] := held_at[b1];
            END IF;
            CONTINUE;
        END IF;
        IF b2 IS NOT NULL THEN
            held[b2] := level2 - second_cost[i];
            held_at[b2] := GREATEST(held_at[b2], nows[i]);
            changed[b2] := true;
        END IF;
        held[b1] := level1 - first_cost[i];
        held_at[b1] := GREATEST(held_at[b1], nows[i]);
        changed[b1] := true;
        answer[i] := 0;
        answer_first[i] := held[b1];
        answer_first_at[i] := held_at[b1];
        IF b2 IS NOT NULL THEN
            answer_second[i] := held[b2];
            answer_second_at[i] := held_at[b2];
        END IF;
    END LOOP;

    -- 4. One write per changed bucket; a minted bucket nobody debited goes again.
    DELETE FROM plexsphere.rate_budgets AS r
    USING unnest(bucket_scopes, bucket_keys, minted, changed) AS m (scope, bucket_key, minted, changed)
    WHERE m.minted
      AND NOT m.changed
      AND r.scope = m.scope
      AND r.bucket_key = m.bucket_key;

    UPDATE plexsphere.rate_budgets AS r
    SET tokens = w.tokens,
        refilled_at = w.refilled_at
    FROM unnest(bucket_scopes, bucket_keys, held, held_at, changed) AS w (scope, bucket_key, tokens, refilled_at, changed)
    WHERE w.changed
      AND r.scope = w.scope
      AND r.bucket_key = w.bucket_key;

    RETURN QUERY
    SELECT a.ord::integer, a.refused, a.first_tokens, a.first_refilled_at, a.second_tokens, a.second_refilled_at
    FROM unnest(answer, answer_first, answer_first_at, answer_second, answer_second_at)
        WITH ORDINALITY AS a (refused, first_tokens, first_refilled_at, second_tokens, second_refilled_at, ord);
END
$$;

CREATE OR REPLACE FUNCTION plexsphere.decide_rate_budget_batch_of_one_bucket(
    bucket_scope text,
    bucket_key uuid,
    costs double precision[],
    rates double precision[],
    bursts double precision[],
    nows timestamptz[]
) RETURNS TABLE (
    take integer,
    refused smallint,
    first_tokens double precision,
    first_refilled_at timestamptz,
    second_tokens double precision,
    second_refilled_at timestamptz
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    takes integer := coalesce(array_length(nows, 1), 0);
    held double precision;
    held_at timestamptz;
    level double precision;
    missing boolean;
    locked boolean := false;
    changed boolean := false;
    i integer;
    answer smallint[] := array_fill(NULL::smallint, ARRAY[takes]);
    answer_tokens double precision[] := array_fill(NULL::double precision, ARRAY[takes]);
    answer_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[takes]);
BEGIN
    IF takes = 0
       OR cardinality(costs) IS DISTINCT FROM takes OR cardinality(rates) IS DISTINCT FROM takes
       OR cardinality(bursts) IS DISTINCT FROM takes
       OR EXISTS (
        SELECT 1
        FROM unnest(costs, rates, bursts, nows) AS t (cost, rate, burst, at)
        WHERE NOT coalesce(plexsphere.rate_budget_arguments_valid(t.cost, t.rate, t.burst, t.at), false)
    ) THEN
        RAISE EXCEPTION 'decide_rate_budget_batch_of_one_bucket: one cost, rate, burst and instant per take; costs finite and not negative, rates and bursts finite and above 0, instants finite'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The snapshot, no lock.
    SELECT r.tokens, r.refilled_at INTO held, held_at
    FROM plexsphere.rate_budgets AS r
    WHERE r.scope = bucket_scope
      AND r.bucket_key = decide_rate_budget_batch_of_one_bucket.bucket_key;
    missing := NOT FOUND;

    -- Lock only if the snapshot does not foresee every take refused: refusals it foresees
    -- lock and write nothing, as take.sql's.
    IF NOT missing THEN
        FOR i IN 1..takes LOOP
            IF plexsphere.rate_budget_level(held, held_at, rates[i], bursts[i], nows[i]) >= costs[i] THEN
                SELECT r.tokens, r.refilled_at INTO held, held_at
                FROM plexsphere.rate_budgets AS r
                WHERE r.scope = bucket_scope
                  AND r.bucket_key = decide_rate_budget_batch_of_one_bucket.bucket_key
                FOR UPDATE;
                missing := NOT FOUND;
                locked := true;
                EXIT;
            END IF;
        END LOOP;
    END IF;

    -- No row to decide against (never minted, or swept since the snapshot): the general
    -- function mints it. Nothing is locked here, so this cannot deadlock.
    IF missing THEN
        RETURN QUERY SELECT * FROM plexsphere.decide_rate_budget_batch(
            ARRAY[bucket_scope], ARRAY[decide_rate_budget_batch_of_one_bucket.bucket_key],
            array_fill(1, ARRAY[takes]), costs, rates, bursts,
            array_fill(NULL::integer, ARRAY[takes]), array_fill(NULL::double precision, ARRAY[takes]),
            array_fill(NULL::double precision, ARRAY[takes]), array_fill(NULL::double precision, ARRAY[takes]),
            nows);
        RETURN;
    END IF;

    -- Judge in order against the locked row (or, when nothing was locked, the snapshot, which
    -- refuses them all).
    FOR i IN 1..takes LOOP
        level := plexsphere.rate_budget_level(held, held_at, rates[i], bursts[i], nows[i]);
        IF locked AND level >= costs[i] THEN
            held := level - costs[i];
            held_at := GREATEST(held_at, nows[i]);
            changed := true;
            answer[i] := 0;
        ELSE
            answer[i] := 1;
        END IF;
        answer_tokens[i] := held;
        answer_at[i] := held_at;
    END LOOP;

    IF changed THEN
        UPDATE plexsphere.rate_budgets AS r
        SET tokens = held,
            refilled_at = held_at
        WHERE r.scope = bucket_scope
          AND r.bucket_key = decide_rate_budget_batch_of_one_bucket.bucket_key;
    END IF;

    RETURN QUERY
    SELECT a.ord::integer, a.refused, a.tokens, a.at, NULL::double precision, NULL::timestamptz
    FROM unnest(answer, answer_tokens, answer_at) WITH ORDINALITY AS a (refused, tokens, at, ord);
END
$$;

CREATE OR REPLACE FUNCTION plexsphere.decide_rate_budget_batch_of_distinct_buckets(
    bucket_scopes text[],
    bucket_keys uuid[],
    costs double precision[],
    rates double precision[],
    bursts double precision[],
    nows timestamptz[]
) RETURNS TABLE (
    take integer,
    refused smallint,
    first_tokens double precision,
    first_refilled_at timestamptz,
    second_tokens double precision,
    second_refilled_at timestamptz
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF cardinality(nows) = 0
       OR cardinality(bucket_scopes) IS DISTINCT FROM cardinality(nows) OR cardinality(bucket_keys) IS DISTINCT FROM cardinality(nows)
       OR cardinality(costs) IS DISTINCT FROM cardinality(nows) OR cardinality(rates) IS DISTINCT FROM cardinality(nows)
       OR cardinality(bursts) IS DISTINCT FROM cardinality(nows)
       OR EXISTS (
        SELECT 1
        FROM unnest(costs, rates, bursts, nows) AS t (cost, rate, burst, at)
        WHERE NOT coalesce(plexsphere.rate_budget_arguments_valid(t.cost, t.rate, t.burst, t.at), false)
    ) THEN
        RAISE EXCEPTION 'decide_rate_budget_batch_of_distinct_buckets: one scope, key, cost, rate, burst and instant per take; costs finite and not negative, rates and bursts finite and above 0, instants finite'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(ARRAY(SELECT DISTINCT k FROM unnest(bucket_keys) AS k)) <> cardinality(bucket_keys) THEN
        RAISE EXCEPTION 'decide_rate_budget_batch_of_distinct_buckets: a key repeats; send such a call to decide_rate_budget_batch'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH q AS (
        SELECT *
        FROM unnest(bucket_scopes, bucket_keys, costs, rates, bursts, nows)
            WITH ORDINALITY AS q (scope, bucket_key, cost, rate, burst, at, ord)
    ),
    seen AS (
        SELECT q.ord, r.tokens, r.refilled_at,
               plexsphere.rate_budget_level(r.tokens, r.refilled_at, q.rate, q.burst, q.at) < q.cost AS short
        FROM q
        JOIN plexsphere.rate_budgets AS r
            ON r.scope = q.scope
           AND r.bucket_key = q.bucket_key
    ),
    taken AS (
        INSERT INTO plexsphere.rate_budgets AS b (scope, bucket_key, tokens, refilled_at)
        SELECT q.scope, q.bucket_key, q.burst - q.cost, q.at
        FROM q
        WHERE NOT EXISTS (SELECT 1 FROM seen WHERE seen.ord = q.ord AND seen.short)
        ORDER BY q.scope, q.bucket_key
        ON CONFLICT (scope, bucket_key) DO UPDATE
        SET tokens = plexsphere.rate_budget_level(
                b.tokens, b.refilled_at,
                rates[array_position(bucket_keys, b.bucket_key)],
                bursts[array_position(bucket_keys, b.bucket_key)],
                EXCLUDED.refilled_at
            ) - costs[array_position(bucket_keys, b.bucket_key)],
            refilled_at = GREATEST(b.refilled_at, EXCLUDED.refilled_at)
        WHERE plexsphere.rate_budget_level(
                b.tokens, b.refilled_at,
                rates[array_position(bucket_keys, b.bucket_key)],
                bursts[array_position(bucket_keys, b.bucket_key)],
                EXCLUDED.refilled_at
            ) >= costs[array_position(bucket_keys, b.bucket_key)]
        RETURNING b.bucket_key, b.tokens, b.refilled_at
    )
    SELECT q.ord::integer,
           CASE WHEN t.bucket_key IS NULL THEN 1 ELSE 0 END::smallint,
           coalesce(t.tokens, s.tokens),
           coalesce(t.refilled_at, s.refilled_at),
           NULL::double precision,
           NULL::timestamptz
    FROM q
    LEFT JOIN taken AS t ON t.bucket_key = q.bucket_key
    LEFT JOIN seen AS s ON s.ord = q.ord AND s.short
    ORDER BY q.ord;
END
$$;
