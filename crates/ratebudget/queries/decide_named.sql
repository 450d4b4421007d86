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
--
-- `args` refuses, with an error, arguments no caller of the crate sends: an interval below
-- 1 µs, a negative tolerance, n below 1 or above the burst (`(n - 1) * t > tau`: a missing
-- key would be granted n cells at once, more than the burst). `seen` joins it to the row and
-- the INSERT reads it when there is no row, so no plan decides without it.
WITH args AS MATERIALIZED (
    SELECT CASE
        WHEN $4::bigint >= 1 AND $5::bigint >= 0 AND $6::bigint >= 1
             AND ($6::bigint - 1) * $4::bigint <= $5::bigint
        THEN true
        ELSE plexsphere.refuse_rate_budget_arguments(
            'decide_named: the interval must be at least 1 µs, the tolerance not negative, and n from 1 to the burst'
        )
    END AS valid
),
seen AS (
    SELECT l.tat_us
    FROM args
    JOIN plexsphere.named_limits AS l
        ON args.valid
       AND l.limiter = $1::text
       AND l.key_hash = $2::bytea
),
taken AS (
    INSERT INTO plexsphere.named_limits AS l (limiter, key_hash, tat_us)
    SELECT $1::text, $2::bytea, $3::bigint + $6::bigint * $4::bigint
    FROM args
    WHERE args.valid
      AND NOT EXISTS (
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
