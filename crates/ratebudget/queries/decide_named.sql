-- DecideNamedLimit: decide and record one request against a GCRA limiter's key, in one
-- statement, exactly as the governor crate's GCRA does (in microseconds rather than its
-- nanoseconds; both are integers, so the two agree exactly).
--
-- Parameters: $1 limiter, $2 key_hash, $3 now (microseconds since the epoch, the caller's
-- clock), $4 t, the emission interval (microseconds per cell), $5 tau = t * (burst - 1), the
-- tolerance, $6 n, the cells this request costs (the caller refuses n above the burst).
--
-- For a key whose TAT is tat (a missing key: tat = now):
--   earliest = tat + (n - 1) * t - tau     the first instant n cells conform
--   granted  = now >= earliest
--   on a grant: tat = max(tat, now) + n * t
-- A key seen (without a lock) as not conforming yet gets no input row for the upsert, so a
-- refusal locks and writes nothing, as in take.sql: concurrent requests only push a TAT
-- later, so a key seen too early is too early. The conflict arm re-checks on the locked,
-- latest TAT: that serialises concurrent requests on one key.
--
-- Result: (granted, tat_us), the TAT as set by the grant or as judged by the refusal; no row
-- at all when a concurrent request won under the lock.
WITH seen AS (
    SELECT tat_us
    FROM plexsphere.named_limits
    WHERE limiter = $1::text
      AND key_hash = $2::bytea
),
taken AS (
    INSERT INTO plexsphere.named_limits AS l (limiter, key_hash, tat_us)
    SELECT $1::text, $2::bytea, $3::bigint + $6::bigint * $4::bigint
    WHERE NOT EXISTS (
        SELECT 1 FROM seen WHERE $3::bigint < seen.tat_us + ($6::bigint - 1) * $4::bigint - $5::bigint
    )
    ON CONFLICT (limiter, key_hash) DO UPDATE
    SET tat_us = GREATEST(l.tat_us, $3::bigint) + $6::bigint * $4::bigint
    WHERE $3::bigint >= l.tat_us + ($6::bigint - 1) * $4::bigint - $5::bigint
    RETURNING l.tat_us
)
SELECT true AS granted, tat_us
FROM taken
UNION ALL
SELECT false, tat_us
FROM seen
WHERE $3::bigint < seen.tat_us + ($6::bigint - 1) * $4::bigint - $5::bigint
