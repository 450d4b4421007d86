-- plexsphere.rate_budget_arguments_valid: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/rate_budget_arguments_valid.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
--
-- Whether one spend's numbers are ones a take may be given: a cost finite and not negative,
-- a rate and a burst finite and above 0, a finite instant. NULL for a NULL argument (callers
-- treat that as invalid). NaN compares above every number in PostgreSQL, so `< 'Infinity'`
-- refuses it as well as infinity.
CREATE OR REPLACE FUNCTION plexsphere.rate_budget_arguments_valid(
    cost double precision,
    rate double precision,
    burst double precision,
    now timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN cost >= 0 AND cost < 'Infinity'::float8
   AND rate > 0 AND rate < 'Infinity'::float8
   AND burst > 0 AND burst < 'Infinity'::float8
   AND now > '-infinity'::timestamptz AND now < 'infinity'::timestamptz;
