-- plexsphere.decide_rate_budget_takes: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/decide_rate_budget_takes.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
--
-- Takes in order, each of any number of distinct buckets, every bucket of a take debited or
-- none, in one call: one take of many buckets (a request's descriptors), or a coalesced call
-- of such takes, pairs and single takes. decide_rate_budget_batch (migrations/0009 to
-- 20261201120100) with a take's sides as rows rather than two fixed columns, step for step:
--
-- 1. One read of every bucket from the statement's snapshot, without locks. A take is foreseen
--    refused when any of its buckets is short at a bound of what the takes before it in the
--    call may leave (the latest instant, highest rate and highest burst so far); it is judged
--    in step 3 without locking anything for it.
-- 2. One INSERT ... ON CONFLICT locks every bucket a take not foreseen refused may debit, in
--    PostgreSQL's (scope, bucket_key) order (the order of every take function: concurrent
--    calls, pairs and single takes never deadlock), minting the missing ones; the locked rows
--    are read again at their latest versions.
-- 3. Each take is judged in order: the first of its buckets (in its own order) that cannot
--    cover its cost refuses it, nothing of it is debited; otherwise every bucket of it is.
-- 4. One DELETE of what was minted and not debited, and one UPDATE of every bucket debited: a
--    refused take leaves every row as it was.
--
-- Arguments: the call's distinct buckets (bucket_scopes, bucket_keys, any order); each take's
-- sides, flattened in take order (side_take: the take's number from 1, side_bucket: the
-- bucket's position in the bucket arrays, and its cost, rate and burst); each take's instant.
-- One row per side, in the same order: the take's number, its answer (0 granted, k its k-th
-- side refused, the same on each of its sides), and the side's row as debited (granted) or
-- as judged (the refused side; NULL on its other sides).
CREATE OR REPLACE FUNCTION plexsphere.decide_rate_budget_takes(
    bucket_scopes text[],
    bucket_keys uuid[],
    side_take integer[],
    side_bucket integer[],
    side_cost double precision[],
    side_rate double precision[],
    side_burst double precision[],
    nows timestamptz[]
) RETURNS TABLE (
    take integer,
    refused integer,
    row_tokens double precision,
    row_refilled_at timestamptz
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    buckets integer := coalesce(array_length(bucket_keys, 1), 0);
    takes integer := coalesce(array_length(nows, 1), 0);
    sides integer := coalesce(array_length(side_take, 1), 0);
    -- Take k's sides are first_side[k] .. first_side[k + 1] - 1.
    first_side integer[] := array_fill(NULL::integer, ARRAY[takes + 1]);
    held double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    held_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    needed boolean[] := array_fill(false, ARRAY[buckets]);
    changed boolean[] := array_fill(false, ARRAY[buckets]);
    minted boolean[] := array_fill(false, ARRAY[buckets]);
    minted_positions integer[];
    mint_burst double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    mint_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    bound_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    bound_rate double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    bound_burst double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    levels double precision[] := array_fill(NULL::double precision, ARRAY[sides]);
    b integer;
    j integer;
    k integer;
    foreseen boolean;
    -- The answers, returned together at the end: a RETURN QUERY per take would be a
    -- statement per take.
    answer integer[] := array_fill(NULL::integer, ARRAY[takes]);
    answer_tokens double precision[] := array_fill(NULL::double precision, ARRAY[sides]);
    answer_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[sides]);
BEGIN
    -- 0. Arguments this function must never see, from a caller other than the ratebudget
    -- crate (an operator's psql, say): an error, never a grant or a credit.
    IF takes = 0 OR sides = 0
       OR cardinality(bucket_scopes) IS DISTINCT FROM buckets
       OR cardinality(side_bucket) IS DISTINCT FROM sides OR cardinality(side_cost) IS DISTINCT FROM sides
       OR cardinality(side_rate) IS DISTINCT FROM sides OR cardinality(side_burst) IS DISTINCT FROM sides THEN
        RAISE EXCEPTION 'decide_rate_budget_takes: the bucket arrays, and the side arrays, must each be of one length, and there must be takes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Sides in take order, every take from 1 to the last with at least one.
    k := 0;
    FOR j IN 1..sides LOOP
        IF side_take[j] IS NOT DISTINCT FROM k + 1 THEN
            k := k + 1;
            first_side[k] := j;
        ELSIF side_take[j] IS DISTINCT FROM k THEN
            k := -1;
            EXIT;
        END IF;
    END LOOP;
    IF k <> takes THEN
        RAISE EXCEPTION 'decide_rate_budget_takes: sides must be in take order, each take from 1 to the number of instants with at least one'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    first_side[takes + 1] := sides + 1;
    IF (SELECT count(DISTINCT (q.scope, q.bucket_key)) FROM unnest(bucket_scopes, bucket_keys) AS q (scope, bucket_key)) <> buckets
       OR (SELECT count(DISTINCT (q.t, q.b)) FROM unnest(side_take, side_bucket) AS q (t, b)) <> sides THEN
        RAISE EXCEPTION 'decide_rate_budget_takes: a bucket is named twice in bucket_scopes and bucket_keys, or twice in one take'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (
        SELECT 1
        FROM unnest(side_take, side_bucket, side_cost, side_rate, side_burst) AS q (t, b, cost, rate, burst)
        WHERE NOT coalesce(
            q.b BETWEEN 1 AND buckets
            AND plexsphere.rate_budget_arguments_valid(q.cost, q.rate, q.burst, nows[q.t]),
            false)
    ) THEN
        RAISE EXCEPTION 'decide_rate_budget_takes: every side needs a bucket of the call; costs finite and not negative, rates and bursts finite and above 0, instants finite'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- 1. The snapshot, no locks.
    SELECT array_agg(r.tokens ORDER BY q.ord), array_agg(r.refilled_at ORDER BY q.ord)
    INTO held, held_at
    FROM unnest(bucket_scopes, bucket_keys) WITH ORDINALITY AS q (scope, bucket_key, ord)
    LEFT JOIN plexsphere.rate_budgets AS r
        ON r.scope = q.scope
       AND r.bucket_key = q.bucket_key;

    -- A take is foreseen refused only when the level the takes before it may have left one of
    -- its buckets at is short: a take at a later instant moves refilled_at past this one's,
    -- keeping the refill up to it, and a take at a higher rate refills faster, so the level at
    -- the latest instant, highest rate and highest burst so far bounds every level they can
    -- leave (decide_rate_budget_batch's header has the whole argument).
    FOR k IN 1..takes LOOP
        foreseen := false;
        FOR j IN first_side[k] .. first_side[k + 1] - 1 LOOP
            b := side_bucket[j];
            bound_at[b] := GREATEST(bound_at[b], nows[k]);
            bound_rate[b] := GREATEST(bound_rate[b], side_rate[j]);
            bound_burst[b] := GREATEST(bound_burst[b], side_burst[j]);
            IF held[b] IS NOT NULL
               AND plexsphere.rate_budget_level(held[b], held_at[b], bound_rate[b], bound_burst[b], bound_at[b]) < side_cost[j] THEN
                foreseen := true;
            END IF;
        END LOOP;
        CONTINUE WHEN foreseen;
        FOR j IN first_side[k] .. first_side[k + 1] - 1 LOOP
            b := side_bucket[j];
            needed[b] := true;
            IF mint_at[b] IS NULL THEN
                mint_burst[b] := side_burst[j];
                mint_at[b] := nows[k];
            END IF;
        END LOOP;
    END LOOP;

    -- 2. Lock what may be debited, minting what is missing, in one statement whose rows go in
    -- the order of PostgreSQL's own (scope, bucket_key) comparison. ON CONFLICT DO UPDATE
    -- locks a row that exists even though its WHERE holds for none, so nothing is written to
    -- it; RETURNING names the rows this call inserted: those it minted.
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
    -- refused on another of their buckets; it would be minted full, so it holds its burst.
    FOR k IN 1..takes LOOP
        answer[k] := 0;
        FOR j IN first_side[k] .. first_side[k + 1] - 1 LOOP
            b := side_bucket[j];
            levels[j] := CASE WHEN held[b] IS NULL THEN side_burst[j]
                ELSE plexsphere.rate_budget_level(held[b], held_at[b], side_rate[j], side_burst[j], nows[k]) END;
            IF levels[j] < side_cost[j] THEN
                answer[k] := j - first_side[k] + 1;
                answer_tokens[j] := held[b];
                answer_at[j] := held_at[b];
                EXIT;
            END IF;
        END LOOP;
        CONTINUE WHEN answer[k] <> 0;
        -- A take the snapshot foresaw as short is refused even if none of its buckets is short
        -- now: that happens only if an operator reset a bucket meanwhile, and such a take's
        -- other buckets are not locked, so they must not be debited.
        FOR j IN first_side[k] .. first_side[k + 1] - 1 LOOP
            b := side_bucket[j];
            IF NOT needed[b] THEN
                answer[k] := j - first_side[k] + 1;
                answer_tokens[j] := held[b];
                answer_at[j] := held_at[b];
                EXIT;
            END IF;
        END LOOP;
        CONTINUE WHEN answer[k] <> 0;
        FOR j IN first_side[k] .. first_side[k + 1] - 1 LOOP
            b := side_bucket[j];
            held[b] := levels[j] - side_cost[j];
            held_at[b] := GREATEST(held_at[b], nows[k]);
            changed[b] := true;
            answer_tokens[j] := held[b];
            answer_at[j] := held_at[b];
        END LOOP;
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
    SELECT a.t, answer[a.t], a.tokens, a.at
    FROM unnest(side_take, answer_tokens, answer_at) WITH ORDINALITY AS a (t, tokens, at, ord)
    ORDER BY a.ord;
END
$$;
