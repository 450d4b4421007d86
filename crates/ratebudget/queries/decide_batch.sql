-- DecideRateBudgetBatch: decide a queue of takes in order, in one round trip.
--
-- The work is in plexsphere.decide_rate_budget_batch (sql/functions/; migrations/0009, locking in the
-- database's own order since 0011), whose header says how it stays identical to taking them
-- one at a time. Parameters are arrays: $1 the distinct buckets' scopes and $2 their keys, in
-- any order; then per take $3 its first bucket's position, $4 cost, $5 rate, $6 burst, $7 its
-- second bucket's position (NULL for a single take), $8 cost, $9 rate, $10 burst, $11 the caller's instant. One row per take.
SELECT take, refused, first_tokens, first_refilled_at, second_tokens, second_refilled_at
FROM plexsphere.decide_rate_budget_batch(
    $1::text[], $2::uuid[],
    $3::integer[], $4::float8[], $5::float8[], $6::float8[],
    $7::integer[], $8::float8[], $9::float8[], $10::float8[],
    $11::timestamptz[]
)
ORDER BY take
