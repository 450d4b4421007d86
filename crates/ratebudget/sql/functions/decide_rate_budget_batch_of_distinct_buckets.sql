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
