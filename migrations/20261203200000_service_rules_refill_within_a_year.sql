-- Another service's rule may take up to a year and a day to refill from empty (a day's, a
-- week's, a year's quota: envoyproxy/ratelimit's units run to a year), since the sweep keeps that
-- service's buckets until the slowest of its rules has refilled them (ratebudget's
-- `IdleSweep::retaining`). Our own rules keep the hour: their buckets are swept after an hour
-- idle, so they must be full by then. The comparisons are `ratebudget::Limit::new`'s and
-- `Limit::for_any_period`'s, in float8, as before.
--
-- Replicas of the previous build refuse to load a rule that refills over more than an hour:
-- write none until every replica runs this build.
ALTER TABLE plexsphere.rules
    DROP CONSTRAINT rules_limit_check,
    ADD CONSTRAINT rules_limit_check CHECK (
        rate > 0
        AND rate < 'Infinity'::float8
        AND rate / (per_ms::float8 / 1000::float8) > 0
        AND rate / (per_ms::float8 / 1000::float8) <= 1e12::float8
        AND burst >= 1
        AND burst <= 1e15::float8
        AND burst <= rate / (per_ms::float8 / 1000::float8) * (
            CASE WHEN service = 'plexsphere' THEN 3600::float8 ELSE 31622400::float8 END
        )
    );
