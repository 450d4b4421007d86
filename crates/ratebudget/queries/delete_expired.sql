-- DeleteExpiredNamedLimits: delete at most $2 keys whose budget is back to full, that is
-- whose TAT is not after $1 (now, microseconds). Such a row is exactly what a missing one
-- means, so deleting it changes no decision. SKIP LOCKED keeps the sweep from waiting on a
-- decision in progress; FOR UPDATE re-checks each row's latest TAT.
WITH expired AS (
    SELECT limiter, key_hash
    FROM plexsphere.named_limits
    WHERE tat_us <= $1::bigint
    LIMIT $2::bigint
    FOR UPDATE SKIP LOCKED
)
DELETE FROM plexsphere.named_limits AS l
USING expired
WHERE l.limiter = expired.limiter
  AND l.key_hash = expired.key_hash
