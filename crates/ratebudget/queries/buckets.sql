-- ReadRateBudgets: every bucket of one key across scopes, for operators.
-- Parameters: $1 bucket_key.
SELECT scope, tokens, refilled_at
FROM plexsphere.rate_budgets
WHERE bucket_key = $1::uuid
ORDER BY scope
