-- LeaseRateBudget: give back what an earlier lease did not grant, then lease tokens of one
-- bucket, in one statement (plexsphere.lease_rate_budget says how, and why it is exact).
--
-- Parameters: $1 scope, $2 bucket_key, $3 at_least, $4 at_most, $5 refund, $6 the refund's
-- lease serial, $7 rate, $8 burst, $9 now (the caller's clock).
SELECT leased, refunded, serial, tokens, refilled_at
FROM plexsphere.lease_rate_budget(
    $1::text, $2::uuid, $3::float8, $4::float8, $5::float8, $6::int8, $7::float8, $8::float8, $9::timestamptz
)
