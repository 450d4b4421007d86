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

--! include functions/rate_budget_arguments_valid.sql

--! include functions/refuse_rate_budget_arguments.sql

--! include functions/take_rate_budget_pair.sql

--! include functions/decide_rate_budget_pair.sql

--! include functions/decide_rate_budget_batch.sql

--! include functions/decide_rate_budget_batch_of_one_bucket.sql

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
