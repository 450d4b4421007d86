-- DecideRateBudgetPair: debit two buckets all-or-nothing in one round trip.
--
-- The work is in plexsphere.decide_rate_budget_pair (sql/functions/), which guards, locks in
-- (scope, bucket_key) order, judges both on their latest versions and debits both or
-- neither. It answers one row: refused (0 granted, 1 first refused, 2 second refused) and
-- each side's (tokens, refilled_at) as debited or as judged.
SELECT refused, first_tokens, first_refilled_at, second_tokens, second_refilled_at
FROM plexsphere.decide_rate_budget_pair(
    $1::text, $2::uuid, $3::float8, $4::float8, $5::float8,
    $6::text, $7::uuid, $8::float8, $9::float8, $10::float8,
    $11::timestamptz
)
