-- DeleteIdleRateBudgets: delete one batch of buckets last taken from before $1.
--
-- Parameters: $1 before, $2 the batch size. The caller repeats it until a batch comes back
-- short, so no single statement holds row locks for long however many rows are idle.
-- SKIP LOCKED keeps the sweep from ever waiting on (or deadlocking with) a take: a row that
-- a take holds is being taken from, so it is not idle. FOR UPDATE re-checks refilled_at on
-- the latest version of each row it locks, so a bucket taken from since the snapshot stays.
WITH idle AS (
    SELECT scope, bucket_key
    FROM plexsphere.rate_budgets
    WHERE refilled_at < $1::timestamptz
    LIMIT $2::bigint
    FOR UPDATE SKIP LOCKED
)
DELETE FROM plexsphere.rate_budgets AS b
USING idle
WHERE b.scope = idle.scope
  AND b.bucket_key = idle.bucket_key
