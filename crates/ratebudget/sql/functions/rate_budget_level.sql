-- plexsphere.rate_budget_level: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/rate_budget_level.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
--
-- The level a bucket would have at `now`: refilled by elapsed x rate, capped at the burst.
-- A negative elapsed (a clock running behind) refills nothing. This is the same arithmetic as
-- crates/ratebudget/queries/take.sql, whose header explains it.
CREATE OR REPLACE FUNCTION plexsphere.rate_budget_level(
    tokens double precision,
    refilled_at timestamptz,
    rate double precision,
    burst double precision,
    now timestamptz
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN LEAST(burst, tokens + GREATEST(0::float8, date_part('epoch', now - refilled_at)) * rate);
