-- The coalesced take (ratebudget crate): one call decides a queue of takes (single or pair)
-- in order, exactly as taking them one at a time in that order would, in one round trip and
-- one transaction.
--
-- Measured (PERF-NOTES.md): a round trip and a commit are what a take costs; the row work is
-- cheap. So the store queues concurrent takes while a call is on the wire and sends the queue
-- as the next call (docs/adr/0006).
--
-- Parameters, all arrays:
--   bucket_scopes, bucket_keys    the distinct buckets, sorted by (scope, bucket_key)
--   first_bucket, second_bucket   per take, 1-based positions in those arrays (second NULL
--                                 for a single take)
--   first_cost, first_rate, first_burst, second_cost, second_rate, second_burst, nows
--                                 per take, what take.sql or the pair function would be given
--
-- How it stays identical to one at a time:
-- 1. A snapshot read, without locks, of every bucket. A take that snapshot already shows
--    short on either side will be refused: concurrent takes only lower a bucket, and so do
--    the takes before it in this queue. Its buckets are not locked for it, and a bucket only
--    such takes touch is neither locked nor written: no transaction id for a queue of
--    refusals, as the single take's guard.
-- 2. Every other bucket is locked, in (scope, bucket_key) order as the single take and the
--    pair do, so concurrent calls from any replica never deadlock. A missing bucket is
--    minted to be locked, but judged as missing: one at a time, a bucket is minted by the
--    take that first gets past its guard, at that take's burst and instant, and a take that
--    does not leaves it missing.
-- 3. Every take is judged in order on the rows kept in variables (locked ones, and the
--    snapshot of the rest, which nothing in the queue changes): each sees a bucket as the
--    takes before it left it, with the same arithmetic (plexsphere.rate_budget_level), and a
--    pair reports its first side when both are short, as one at a time would.
-- 4. Each changed bucket is written once: a hot key's takes in one call are one row update.
--    A bucket this call minted that no take debited is deleted again, as missing as before.
--
-- One row per take: take (1-based), refused (0 granted, 1 first refused, 2 second refused),
-- and each side's (tokens, refilled_at) as debited or as judged (NULL for a side not judged).
-- Locks one bucket, minting it when it has no row, and says whether this call minted it.
CREATE FUNCTION plexsphere.lock_or_mint_rate_budget_row(
    bucket_scope text,
    key uuid,
    burst double precision,
    now timestamptz,
    OUT tokens double precision,
    OUT refilled_at timestamptz,
    OUT minted boolean
)
LANGUAGE plpgsql AS $$
BEGIN
    minted := false;
    SELECT b.tokens, b.refilled_at
    INTO tokens, refilled_at
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key
    FOR UPDATE;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Waits for a concurrent minting of the same row, then finds it there and does nothing.
    INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
    VALUES (bucket_scope, key, burst, now)
    ON CONFLICT (scope, bucket_key) DO NOTHING
    RETURNING true INTO minted;
    minted := coalesce(minted, false);
    SELECT b.tokens, b.refilled_at
    INTO STRICT tokens, refilled_at
    FROM plexsphere.rate_budgets AS b
    WHERE b.scope = bucket_scope
      AND b.bucket_key = key
    FOR UPDATE;
END
$$;

CREATE FUNCTION plexsphere.decide_rate_budget_batch(
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

    -- 2. Lock what may be debited, in key order, minting what is missing.
    FOR b IN 1..buckets LOOP
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
