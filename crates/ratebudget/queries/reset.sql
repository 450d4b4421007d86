-- ResetRateBudget: forget one bucket and tell every replica, in one statement.
--
-- Parameters: $1 scope, $2 bucket_key, $3 the notification channel. Answers whether the
-- bucket existed. The next take mints it full. pg_notify is transactional: the replicas hear
-- of the reset when it commits, and forget what their pre-checks knew of the bucket (a reset
-- adds tokens, and a pre-check must never refuse from a row that is gone). The `told` CTE is
-- referenced by the final SELECT so that it runs exactly once.
WITH gone AS (
    DELETE FROM plexsphere.rate_budgets
    WHERE scope = $1::text
      AND bucket_key = $2::uuid
    RETURNING 1
),
told AS (
    SELECT pg_notify($3::text, $1::text || ':' || $2::uuid::text)
)
SELECT EXISTS (SELECT 1 FROM gone) AS existed
FROM told
