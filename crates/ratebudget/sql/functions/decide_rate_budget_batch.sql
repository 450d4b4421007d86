-- plexsphere.decide_rate_budget_batch: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/decide_rate_budget_batch.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
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
