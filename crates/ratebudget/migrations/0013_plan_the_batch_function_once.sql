-- The coalesced take's statements are planned once per session, not once per call.
--
-- PL/pgSQL prepares each statement of decide_rate_budget_batch (0012) and, its parameters
-- being arrays whose contents the planner cannot see, keeps choosing a plan made for each
-- call's values: six statements planned on every call. Their plans do not depend on the
-- values (unnest of the arguments, probes of the primary key in (scope, bucket_key) order),
-- so the generic plan is the same plan, made once. Measured with pgbench, one client, one
-- hot bucket, 16 takes a call: 0.94-0.99 ms a call before, 0.65-0.67 ms after; 64 distinct
-- random buckets a call: 3.0-3.3 ms either way (the row work dominates). The pair function
-- (0006) measured the same either way and is left alone.
ALTER FUNCTION plexsphere.decide_rate_budget_batch(
    text[], uuid[],
    integer[], double precision[], double precision[], double precision[],
    integer[], double precision[], double precision[], double precision[],
    timestamptz[]
) SET plan_cache_mode = force_generic_plan;
