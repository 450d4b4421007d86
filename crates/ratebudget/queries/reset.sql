-- ResetRateBudget: forget one bucket and tell every replica, in one statement.
--
-- Parameters: $1 scope, $2 bucket_key, $3 the notification channel, $4 the key's hash under
-- the scope's GCRA limiter (a rule may decide the scope with GCRA, whose state for the key is
-- that named_limits row: it is forgotten too, whichever algorithm governs now). Answers
-- whether either existed. The next take mints the bucket full. pg_notify is transactional:
-- the replicas hear of the reset when it commits, and forget what their pre-checks knew of
-- the bucket (a reset adds tokens, and a pre-check must never refuse from a row that is
-- gone). The `told` CTE is referenced by the final SELECT so that it runs exactly once.
WITH gone AS (
    DELETE FROM plexsphere.rate_budgets
    WHERE scope = $1::text
      AND bucket_key = $2::uuid
    RETURNING 1
),
gone_named AS (
    DELETE FROM plexsphere.named_limits
    WHERE limiter = $1::text
      AND key_hash = $4::bytea
    RETURNING 1
),
told AS (
    SELECT pg_notify($3::text, $1::text || ':' || $2::uuid::text)
)
SELECT EXISTS (SELECT 1 FROM gone) OR EXISTS (SELECT 1 FROM gone_named) AS existed
FROM told
