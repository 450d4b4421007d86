-- plexsphere.decide_rate_budget_batch_of_distinct_buckets: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/decide_rate_budget_batch_of_distinct_buckets.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
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
-- The UPDATE below joins the takes to the table; on a table whose statistics say it is empty
-- (never analyzed, or analyzed while empty) PostgreSQL would plan that join as a merge or hash
-- join over a whole index, and keep the plan for the session (tests/it/plans.rs). With those
-- two priced out the join is the nested loop of index probes in (scope, bucket_key) order the
-- text below relies on.
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    granted_takes bigint[];
    granted_tokens double precision[];
    granted_at timestamptz[];
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

    -- First, one UPDATE of the rows that exist, in (scope, bucket_key) order (the nested loop
    -- over the sorted takes locks them in that order, as every other take function does, so
    -- concurrent calls cannot deadlock on these locks). Its WHERE is judged first against the
    -- statement's snapshot: a row seen as short is neither locked nor written, as take.sql's
    -- guard would have it. A row seen as coverable is locked, and if a concurrent take changed
    -- it meanwhile, PostgreSQL judges the WHERE again against the latest committed version
    -- (READ COMMITTED's re-check of an updated row), so the last token is granted once.
    --
    -- Why this comes first: when every take is granted, as for callers spread over many
    -- buckets with room in each, this is the whole call, and each take costs one index probe
    -- and one row version. The upsert below costs a snapshot probe, a conflict probe and a
    -- row lock record besides (measured with pgbench, 23 takes a call over 100,000 rows:
    -- 800 calls/s as the upsert alone, 1,040 with this first).
    WITH q AS (
        SELECT *
        FROM unnest(bucket_scopes, bucket_keys, costs, rates, bursts, nows)
            WITH ORDINALITY AS q (scope, bucket_key, cost, rate, burst, at, ord)
    ),
    updated AS (
        UPDATE plexsphere.rate_budgets AS b
        SET tokens = plexsphere.rate_budget_level(b.tokens, b.refilled_at, q.rate, q.burst, q.at) - q.cost,
            refilled_at = GREATEST(b.refilled_at, q.at)
        FROM (SELECT * FROM q ORDER BY q.scope, q.bucket_key) AS q
        WHERE b.scope = q.scope
          AND b.bucket_key = q.bucket_key
          AND plexsphere.rate_budget_level(b.tokens, b.refilled_at, q.rate, q.burst, q.at) >= q.cost
        RETURNING q.ord, b.tokens, b.refilled_at
    )
    SELECT array_agg(u.ord), array_agg(u.tokens), array_agg(u.refilled_at)
    INTO granted_takes, granted_tokens, granted_at
    FROM updated AS u;

    IF cardinality(granted_takes) = cardinality(nows) THEN
        RETURN QUERY
        SELECT g.take::integer, 0::smallint, g.tokens, g.at, NULL::double precision, NULL::timestamptz
        FROM unnest(granted_takes, granted_tokens, granted_at) AS g (take, tokens, at)
        ORDER BY g.take;
        RETURN;
    END IF;

    -- The takes the UPDATE did not grant: buckets with no row yet (or none since the sweep or a
    -- reset deleted it), and takes it refused. They are decided by the guarded upsert, in a
    -- statement of its own and so against a fresh snapshot: a bucket without a row is minted;
    -- one short now is refused with its level and writes nothing; one with room now (a lease
    -- gave tokens back, or its row was deleted and minted again) is decided under the row lock.
    -- Each take is still decided once, against a committed version of its row. So a refusal
    -- costs two probes here against the upsert's one; calls of refusals spread over many
    -- buckets pay that, and still write nothing.
    -- Only the rows locked here can be locked out of the one order (after the UPDATE's). A
    -- cycle needs two calls sharing two buckets while one of them is being minted; PostgreSQL's
    -- deadlock detector then fails one of the calls, whose takes are undecided, never granted.

    RETURN QUERY
    WITH q AS (
        SELECT *
        FROM unnest(bucket_scopes, bucket_keys, costs, rates, bursts, nows)
            WITH ORDINALITY AS q (scope, bucket_key, cost, rate, burst, at, ord)
        WHERE NOT (q.ord = ANY (coalesce(granted_takes, '{}')))
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
    UNION ALL
    SELECT g.take::integer, 0::smallint, g.tokens, g.at, NULL::double precision, NULL::timestamptz
    FROM unnest(granted_takes, granted_tokens, granted_at) AS g (take, tokens, at)
    ORDER BY 1;
END
$$;
