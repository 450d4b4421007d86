-- plexsphere.decide_rate_budget_batch_of_one_bucket: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/decide_rate_budget_batch_of_one_bucket.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
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
