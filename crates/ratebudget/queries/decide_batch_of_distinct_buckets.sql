-- DecideRateBudgetBatchOfDistinctBuckets: a coalesced call whose takes are all single takes,
-- each of a bucket with a key no other take in the call has (callers spread over many
-- buckets), decided in one round trip.
--
-- The work is in plexsphere.decide_rate_budget_batch_of_distinct_buckets (sql/functions/),
-- which decides as decide_takes.sql would (a take refused under the row lock, after a
-- concurrent take won the race, is answered without a level, as take.sql answers it; the
-- function's header says why). No key may repeat. Parameters, per take: $1 scope, $2 key,
-- $3 cost, $4 rate, $5 burst, $6 the caller's instant. One row per take, in the
-- columns plexsphere.decide_rate_budget_batch answers (the second side's always NULL).
SELECT take, refused, first_tokens, first_refilled_at, second_tokens, second_refilled_at
FROM plexsphere.decide_rate_budget_batch_of_distinct_buckets(
    $1::text[], $2::uuid[], $3::float8[], $4::float8[], $5::float8[], $6::timestamptz[]
)
ORDER BY take
