-- TakeRateBudget: decide and record one take from one bucket, in one statement.
--
-- Parameters: $1 scope, $2 bucket_key, $3 cost, $4 rate (tokens per second),
-- $5 burst (the ceiling), $6 now (the caller's clock). Every cast is explicit so the
-- statement prepares the same way from sqlx, psql and pgbench.
--
-- Result: one row (granted, tokens, refilled_at). On a grant, the row as debited: what is
-- left. On a refusal the snapshot foresaw, the row as judged, so the caller can work out when
-- the cost will be covered (ratebudget::Limit::covered_at repeats this arithmetic exactly).
-- No row at all: refused under the lock by a concurrent take; the level is then known only
-- to be below the cost.
--
-- The arithmetic, for a row (tokens, refilled_at):
--   elapsed = max(0, now - refilled_at)          a clock running behind refills nothing
--   level   = min(burst, tokens + elapsed * rate)  never above the ceiling
--   granted = level >= cost
--   on a grant: tokens = level - cost, refilled_at = max(refilled_at, now)
-- refilled_at never moves backwards, so a replica whose clock runs behind under-refills for
-- the skew instead of granting the same tokens twice. A missing row is minted at the
-- ceiling and debited (burst - cost); the caller refuses a cost above the burst before the
-- query, so that value is never negative.
--
-- Why two steps in one statement:
-- `seen` reads the row from the statement's snapshot without locking it. When that version
-- already cannot cover the cost, the INSERT gets no input row, so nothing is locked or
-- written: no transaction id, no WAL, no wait for a flush. That matters because
-- INSERT ... ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE fails,
-- which made every refusal as expensive as an admit (measured: ~480 bytes of WAL per
-- refusal and ~4-5k refusals/s on a hot bucket, against ~40k/s and no WAL with the guard).
-- The snapshot can only be optimistic: concurrent takes only lower a bucket, so a row seen
-- as short is short. (One exception, and it only under-admits: a replica whose clock runs
-- ahead may have refilled the row since, to an instant this caller's clock has not reached.
-- The refusal then stands where the upsert would have granted; skew costs tokens, never
-- grants extra ones.) A row seen as coverable (or missing) goes through the upsert, whose
-- conflict arm is evaluated against the latest committed version under the row lock. That
-- is what serialises concurrent takes on one bucket: the last token is granted once.
-- A refusal decided by that WHERE matches no row and leaves the row as it was, so tokens
-- accrued since the last grant are kept for the next take.
--
-- `args` refuses, with an error, arguments no caller of the crate sends (a cost negative, NaN
-- or above the burst, a rate or burst not a number above 0, an infinite instant): given to
-- the arithmetic they could grant or credit (docs in the migration that made
-- plexsphere.rate_budget_arguments_valid). `seen` joins it to the row and the INSERT reads
-- it when there is no row, so no plan decides without it; with good arguments it is a few
-- comparisons.
WITH args AS MATERIALIZED (
    SELECT CASE
        WHEN plexsphere.rate_budget_arguments_valid($3::float8, $4::float8, $5::float8, $6::timestamptz)
             AND $3::float8 <= $5::float8
        THEN true
        ELSE plexsphere.refuse_rate_budget_arguments(
            'take: the cost must be finite, not negative and at most the burst; the rate and burst finite and above 0; the instant finite'
        )
    END AS valid
),
seen AS (
    SELECT
        b.tokens,
        b.refilled_at,
        LEAST(
            $5::float8,
            b.tokens + GREATEST(0::float8, date_part('epoch', $6::timestamptz - b.refilled_at)) * $4::float8
        ) AS level
    FROM args
    JOIN plexsphere.rate_budgets AS b
        ON args.valid
       AND b.scope = $1::text
       AND b.bucket_key = $2::uuid
),
taken AS (
    INSERT INTO plexsphere.rate_budgets AS b (scope, bucket_key, tokens, refilled_at)
    SELECT $1::text, $2::uuid, $5::float8 - $3::float8, $6::timestamptz
    FROM args
    WHERE args.valid
      AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.level < $3::float8)
    ON CONFLICT (scope, bucket_key) DO UPDATE
    SET tokens = LEAST(
            $5::float8,
            b.tokens + GREATEST(0::float8, date_part('epoch', $6::timestamptz - b.refilled_at)) * $4::float8
        ) - $3::float8,
        refilled_at = GREATEST(b.refilled_at, $6::timestamptz)
    WHERE LEAST(
            $5::float8,
            b.tokens + GREATEST(0::float8, date_part('epoch', $6::timestamptz - b.refilled_at)) * $4::float8
        ) >= $3::float8
    RETURNING b.tokens, b.refilled_at
)
SELECT true AS granted, tokens, refilled_at
FROM taken
UNION ALL
SELECT false, tokens, refilled_at
FROM seen
WHERE seen.level < $3::float8
