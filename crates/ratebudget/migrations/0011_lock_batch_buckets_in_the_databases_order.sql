-- The coalesced take (0009) locked its buckets in the order the caller listed them, which the
-- ratebudget crate sorted by its own Scope order: secret_read_node before
-- secret_read_domain. The pair function (0006) locks in PostgreSQL's (scope, bucket_key)
-- order, where secret_read_domain comes first. A coalesced call and a pair sharing a Node's
-- and a Domain's buckets could therefore each hold one row and wait for the other: a
-- deadlock, which PostgreSQL broke after deadlock_timeout by failing one of them (found by
-- bench/e2e.sh as 500s after one-second stalls; pinned by tests/it/coalescing.rs,
-- concurrent_calls_and_pairs_from_several_replicas_never_deadlock).
--
-- This version sorts the buckets itself, by the database's own comparison, so every lock in
-- the schema is taken in one order under any collation, whatever order a caller sends.
-- Everything else is 0009's function unchanged; its header says how the function decides.

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
LANGUAGE plpgsql AS $$
DECLARE
    buckets integer := coalesce(array_length(bucket_keys, 1), 0);
    takes integer := coalesce(array_length(nows, 1), 0);
    held double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    held_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    needed boolean[] := array_fill(false, ARRAY[buckets]);
    changed boolean[] := array_fill(false, ARRAY[buckets]);
    minted boolean[] := array_fill(false, ARRAY[buckets]);
    was_minted boolean;
    mint_burst double precision[] := array_fill(NULL::double precision, ARRAY[buckets]);
    mint_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[buckets]);
    b integer;
    b1 integer;
    b2 integer;
    i integer;
    level1 double precision;
    level2 double precision;
    locked_tokens double precision;
    locked_at timestamptz;
BEGIN
    -- 1. The snapshot, no locks.
    SELECT array_agg(r.tokens ORDER BY q.ord), array_agg(r.refilled_at ORDER BY q.ord)
    INTO held, held_at
    FROM unnest(bucket_scopes, bucket_keys) WITH ORDINALITY AS q (scope, bucket_key, ord)
    LEFT JOIN plexsphere.rate_budgets AS r
        ON r.scope = q.scope
       AND r.bucket_key = q.bucket_key;

    FOR i IN 1..takes LOOP
        b1 := first_bucket[i];
        b2 := second_bucket[i];
        IF (held[b1] IS NOT NULL
            AND plexsphere.rate_budget_level(held[b1], held_at[b1], first_rate[i], first_burst[i], nows[i]) < first_cost[i])
           OR (b2 IS NOT NULL AND held[b2] IS NOT NULL
            AND plexsphere.rate_budget_level(held[b2], held_at[b2], second_rate[i], second_burst[i], nows[i]) < second_cost[i]) THEN
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

    -- 2. Lock what may be debited, minting what is missing, in the order of PostgreSQL's own
    -- (scope, bucket_key) comparison, the one the pair function locks in under this
    -- database's collation; the order the caller listed the buckets in is not trusted.
    FOR b IN
        SELECT q.ord::integer
        FROM unnest(bucket_scopes, bucket_keys) WITH ORDINALITY AS q (scope, bucket_key, ord)
        ORDER BY q.scope, q.bucket_key
    LOOP
        IF needed[b] THEN
            SELECT l.tokens, l.refilled_at, l.minted INTO locked_tokens, locked_at, was_minted
            FROM plexsphere.lock_or_mint_rate_budget_row(bucket_scopes[b], bucket_keys[b], mint_burst[b], mint_at[b]) AS l;
            IF was_minted THEN
                -- Held by this call, but missing to the takes until one gets past its guard.
                minted[b] := true;
                held[b] := NULL;
                held_at[b] := NULL;
            ELSE
                held[b] := locked_tokens;
                held_at[b] := locked_at;
            END IF;
        END IF;
    END LOOP;

    -- 3. Judge in order. A bucket still missing here is touched only by takes the snapshot
    -- refused on their other side; it would be minted full, so it holds its burst.
    FOR i IN 1..takes LOOP
        b1 := first_bucket[i];
        b2 := second_bucket[i];
        level1 := CASE WHEN held[b1] IS NULL THEN first_burst[i]
            ELSE plexsphere.rate_budget_level(held[b1], held_at[b1], first_rate[i], first_burst[i], nows[i]) END;
        IF level1 < first_cost[i] THEN
            RETURN QUERY SELECT i, 1::smallint, held[b1], held_at[b1], NULL::float8, NULL::timestamptz;
            CONTINUE;
        END IF;
        IF b2 IS NOT NULL THEN
            level2 := CASE WHEN held[b2] IS NULL THEN second_burst[i]
                ELSE plexsphere.rate_budget_level(held[b2], held_at[b2], second_rate[i], second_burst[i], nows[i]) END;
            IF level2 < second_cost[i] THEN
                RETURN QUERY SELECT i, 2::smallint, NULL::float8, NULL::timestamptz, held[b2], held_at[b2];
                CONTINUE;
            END IF;
        END IF;
        -- A take the snapshot foresaw as short is refused even if neither side is short now:
        -- that happens only if an operator reset a bucket meanwhile, and such a take's other
        -- bucket is not locked, so it must not be debited.
        IF NOT needed[b1] OR (b2 IS NOT NULL AND NOT needed[b2]) THEN
            IF needed[b1] THEN
                RETURN QUERY SELECT i, 2::smallint, NULL::float8, NULL::timestamptz, held[b2], held_at[b2];
            ELSE
                RETURN QUERY SELECT i, 1::smallint, held[b1], held_at[b1], NULL::float8, NULL::timestamptz;
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
        RETURN QUERY SELECT i, 0::smallint, held[b1], held_at[b1],
            CASE WHEN b2 IS NULL THEN NULL ELSE held[b2] END,
            CASE WHEN b2 IS NULL THEN NULL ELSE held_at[b2] END;
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
END
$$;
