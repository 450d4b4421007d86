-- DecideRateBudgetBatchOfOneBucket: a coalesced call whose takes are all single takes of one
-- bucket (one hot bucket's callers), decided in order in one round trip.
--
-- The work is in plexsphere.decide_rate_budget_batch_of_one_bucket (sql/functions/), which
-- decides exactly as decide_takes.sql would. Parameters: $1 the bucket's scope, $2 its key;
-- then per take $3 cost, $4 rate, $5 burst, $6 the caller's instant. One row per take, in
-- the columns plexsphere.decide_rate_budget_batch answers (the second side's always NULL).
SELECT take, refused, first_tokens, first_refilled_at, second_tokens, second_refilled_at
FROM plexsphere.decide_rate_budget_batch_of_one_bucket(
    $1::text, $2::uuid, $3::float8[], $4::float8[], $5::float8[], $6::timestamptz[]
)
ORDER BY take
