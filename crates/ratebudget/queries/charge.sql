-- ChargeRateBudget: charge one bucket a cost whatever it holds, in one statement: a cost
-- known only after the work it pays for was done (the tokens an LLM's response used), which
-- is accepted, never refused (docs/adr/0040).
--
-- Parameters: $1 scope, $2 bucket_key, $3 cost, $4 rate (tokens per second), $5 burst (the
-- ceiling), $6 now (the caller's clock). Every cast is explicit, as in take.sql.
--
-- Result: one row (tokens, refilled_at), the row as charged.
--
-- The arithmetic, for a row (tokens, refilled_at) (a missing row is minted at the ceiling):
--   level   = min(burst, tokens + max(0, now - refilled_at) * rate)   take.sql's level
--   left    = level - cost
--   tokens      = max(left, 0)
--   refilled_at = max(refilled_at, now) + max(-left, 0) / rate seconds
-- A charge the level covers is a take's debit. One it does not cover leaves the bucket in
-- debt: the table's tokens stay at 0 (its CHECK, and every statement's arithmetic, which
-- reads tokens as what the bucket holds) and the debt is time: refilled_at moves ahead of
-- now by the time the rate takes to repay it. Every statement's level clamps a negative
-- elapsed time to 0, so until that instant the bucket holds nothing and refuses every take
-- (with the exact wait: ratebudget::Limit::covered_at counts from refilled_at), and from it
-- on it refills as an empty bucket does. A charge on a bucket in debt adds to the debt
-- (refilled_at was ahead already). Rounded to the microsecond, as every interval is.
--
-- The debt is capped at a year and a day from now (ratebudget::Limit::MAX_REFILL_TIME, the
-- longest refill of any budget, so at least one whole burst of debt): a bucket is never
-- closed for longer than that after a charge, however large the cost or small the rate, and
-- refilled_at stays an instant PostgreSQL can store. It never moves backwards.
--
-- The charge is exact under concurrency: INSERT ... ON CONFLICT DO UPDATE judges the latest
-- committed version of the row under its lock, as take.sql's upsert does, so takes,
-- coalesced calls, leases and other charges of the bucket serialise with it (it locks one
-- row, so it cannot deadlock with them). A charge that puts the bucket in debt sets its
-- lease_serial to 0, the number no lease has: a refund of a lease made before it is then
-- forfeited, never credited to a bucket in debt as tokens it could grant at once (a lease
-- made while the bucket is in debt takes nothing, so none has the number until repaid).
WITH args AS MATERIALIZED (
    SELECT CASE
        WHEN plexsphere.rate_budget_arguments_valid($3::float8, $4::float8, $5::float8, $6::timestamptz)
        THEN true
        ELSE plexsphere.refuse_rate_budget_arguments(
            'charge: the cost must be finite and not negative; the rate and burst finite and above 0; the instant finite'
        )
    END AS valid
)
INSERT INTO plexsphere.rate_budgets AS b (scope, bucket_key, tokens, refilled_at)
SELECT
    $1::text,
    $2::uuid,
    GREATEST($5::float8 - $3::float8, 0::float8),
    $6::timestamptz
        + LEAST(GREATEST($3::float8 - $5::float8, 0::float8) / $4::float8, 31622400::float8) * interval '1 second'
FROM args
WHERE args.valid
ON CONFLICT (scope, bucket_key) DO UPDATE
SET tokens = GREATEST(
        plexsphere.rate_budget_level(b.tokens, b.refilled_at, $4::float8, $5::float8, $6::timestamptz) - $3::float8,
        0::float8
    ),
    refilled_at = GREATEST(
        b.refilled_at,
        LEAST(
            GREATEST(b.refilled_at, $6::timestamptz)
                + LEAST(
                    GREATEST(
                        $3::float8 - plexsphere.rate_budget_level(b.tokens, b.refilled_at, $4::float8, $5::float8, $6::timestamptz),
                        0::float8
                    ) / $4::float8,
                    31622400::float8
                ) * interval '1 second',
            $6::timestamptz + interval '31622400 seconds'
        )
    ),
    lease_serial = CASE
        WHEN plexsphere.rate_budget_level(b.tokens, b.refilled_at, $4::float8, $5::float8, $6::timestamptz) < $3::float8
        THEN 0
        ELSE b.lease_serial
    END
RETURNING b.tokens, b.refilled_at
