-- PeekRateBudget: one bucket's row as stored, read without a lock or a write: what a check
-- that spends nothing (a descriptor's hits_addend of 0) judges. No row: the bucket is full,
-- as a take would mint it.
--
-- Parameters: $1 scope, $2 bucket_key.
SELECT tokens, refilled_at
FROM plexsphere.rate_budgets
WHERE scope = $1::text
  AND bucket_key = $2::uuid
