-- plexsphere.refuse_rate_budget_arguments: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/refuse_rate_budget_arguments.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
--
-- Raises invalid_parameter_value with `message`: for statements (take.sql, decide_named.sql)
-- that must fail rather than decide on arguments they must never see. Called only from the
-- ELSE of a CASE whose condition holds for good arguments, so it costs nothing on them.
CREATE OR REPLACE FUNCTION plexsphere.refuse_rate_budget_arguments(message text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION '%', message USING ERRCODE = 'invalid_parameter_value';
END
$$;
