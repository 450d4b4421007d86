-- DeleteIdleRateBudgets: delete one batch of buckets last taken from before $1, or, for a name
-- the sweep retains longer, before that name's own instant.
--
-- Parameters: $1 before, $2 the batch size, $3 and $4 the names retained longer and, index for
-- index, the instant before which each one's buckets are idle (each at or before $1: a name's
-- budgets that take longer than the hour to refill keep their buckets until they are full).
-- The caller repeats it until a batch comes back short, so no single statement holds row locks
-- for long however many rows are idle.
-- SKIP LOCKED keeps the sweep from ever waiting on (or deadlocking with) a take: a row that
-- a take holds is being taken from, so it is not idle. FOR UPDATE re-checks refilled_at on
-- the latest version of each row it locks, so a bucket taken from since the snapshot stays.
WITH retained AS (
    SELECT name, before
    FROM unnest($3::text[], $4::timestamptz[]) AS r (name, before)
),
idle AS (
    SELECT b.scope, b.bucket_key
    FROM plexsphere.rate_budgets AS b
    LEFT JOIN retained AS r ON r.name = b.scope
    WHERE b.refilled_at < $1::timestamptz
      AND (r.before IS NULL OR b.refilled_at < r.before)
    LIMIT $2::bigint
    FOR UPDATE OF b SKIP LOCKED
)
DELETE FROM plexsphere.rate_budgets AS b
USING idle
WHERE b.scope = idle.scope
  AND b.bucket_key = idle.bucket_key
