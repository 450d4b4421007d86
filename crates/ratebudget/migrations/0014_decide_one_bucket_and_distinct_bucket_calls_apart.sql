-- Two shapes of coalesced call get a function of their own; every other call still goes to
-- decide_rate_budget_batch (0012), whose header says what "decided exactly as one at a time"
-- means. Both decide as that function would, in fewer steps, and answer in its columns (one
-- answer differs, and only under concurrency: see the second function).
--
-- Why: PERF-NOTES.md's ceiling is one commit per decision, and most coalesced calls take the
-- shape of their workload. One hot bucket's callers send calls of single takes all of that
-- bucket; callers spread over many buckets send calls of single takes of distinct buckets. The
-- general function pays for what neither needs (numbering buckets, pairs, a bucket repeated
-- within a call; four statements over unnest with their sorts and joins). Measured with
-- pgbench, synchronous commit on (BENCHMARKS.md section 6 has the end-to-end figures):
--   one bucket, 16 takes a call, one client: 1,800-1,860 calls/s with the general function,
--     3,270 with decide_rate_budget_batch_of_one_bucket (0.42 -> 0.19 ms of CPU a call);
--   32 distinct random buckets a call, two clients: 1,120-1,230 calls/s with the general
--     function, 1,720-1,840 with decide_rate_budget_batch_of_distinct_buckets (the same 32
--     takes as one unguarded upsert, PostgreSQL's floor for them: 2,600-2,640).
-- The client (crates/ratebudget/src/batch.rs) picks the function by the call's shape.

-- A call of single takes, all of one bucket: one snapshot read; if any take may be granted,
-- one SELECT ... FOR UPDATE of that row (the only lock the call takes, so it cannot deadlock
-- with anyone); the takes judged in order in variables; one UPDATE. A bucket with no row, or
-- whose row the sweep deletes between the snapshot and the lock, goes to the general function
-- instead, which mints it: nothing is locked at that point.
CREATE FUNCTION plexsphere.decide_rate_budget_batch_of_one_bucket(
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

-- A call of single takes of distinct buckets (distinct keys, so a key names its take): take.sql
-- made set-based, one statement. The snapshot read foresees refusals, which lock and write
-- nothing; the rest go through one INSERT ... ON CONFLICT DO UPDATE whose rows go in the
-- database's (scope, bucket_key) order, the general function's and the pair's, so it cannot
-- deadlock with them, and whose conflict arm judges each against the latest version under
-- its lock, finding its take's budget by its key. A take refused there (a concurrent take got
-- the tokens between the snapshot and the lock) is answered without a level, as take.sql
-- answers it, where the general function answers with the locked row: the caller's wait is
-- then an empty bucket's, an upper bound. Reading those rows back would cost a second
-- statement on every call to improve the Retry-After of a take that lost a race.
--
-- A key must not repeat in a call, even under another scope (a Node's id names its secret
-- read and its ingest buckets): the conflict arm would find the first take with that key and
-- debit the other bucket by its budget. The client sends such calls to the general function;
-- this one refuses them rather than trust it.
CREATE FUNCTION plexsphere.decide_rate_budget_batch_of_distinct_buckets(
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
