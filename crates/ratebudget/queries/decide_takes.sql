-- DecideRateBudgetTakes: decide takes of any number of buckets each, all or nothing per take,
-- in order, in one round trip: one take of several buckets, or a coalesced call.
--
-- The work is in plexsphere.decide_rate_budget_takes (sql/functions/), whose header says how
-- it stays identical to deciding the takes one at a time and locks in (scope, bucket_key)
-- order. Parameters are arrays: $1 the call's distinct buckets' scopes and $2 their keys, in
-- any order; then per side (each take's buckets in its own order, takes in order) $3 its
-- take's number from 1, $4 its bucket's position in $1 and $2, $5 cost, $6 rate, $7 burst;
-- $8 each take's instant. One row per side, in that order: the take's number, its answer
-- (0 granted, k its k-th side refused) and the side's row as debited or as judged.
SELECT take, refused, row_tokens, row_refilled_at
FROM plexsphere.decide_rate_budget_takes(
    $1::text[], $2::uuid[],
    $3::integer[], $4::integer[], $5::float8[], $6::float8[], $7::float8[],
    $8::timestamptz[]
)
