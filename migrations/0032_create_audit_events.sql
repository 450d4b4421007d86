-- The audit log (audit crate): who did what, appended once per operator action and never
-- changed. Entries name the actor (an operator's name from PLEXSPHERE_OPERATOR_TOKENS, or
-- <cli> for the command line), the action and what it acted on, never a token or a secret
-- value. The triggers below refuse UPDATE, DELETE and TRUNCATE to everyone but whoever drops
-- them, which takes the table owner: the log is append-only for the service.
CREATE TABLE plexsphere.audit_events (
    id bigint GENERATED ALWAYS AS IDENTITY
        CONSTRAINT audit_events_pkey PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    -- The same rules as audit::Actor and audit::Action.
    actor text NOT NULL
        CONSTRAINT audit_events_actor_check CHECK (actor ~ '^([A-Za-z0-9._-]{1,64}|<cli>)$'),
    action text NOT NULL
        CONSTRAINT audit_events_action_check CHECK (action ~ '^[a-z]+[.][a-z]+$'),
    domain_id uuid NULL,
    node_id uuid NULL,
    secret_name text NULL
        CONSTRAINT audit_events_secret_name_check CHECK (char_length(secret_name) BETWEEN 1 AND 128)
);

CREATE FUNCTION plexsphere.refuse_audit_change()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'plexsphere.audit_events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER audit_events_append_only
BEFORE UPDATE OR DELETE ON plexsphere.audit_events
FOR EACH ROW
EXECUTE FUNCTION plexsphere.refuse_audit_change();

CREATE TRIGGER audit_events_never_truncated
BEFORE TRUNCATE ON plexsphere.audit_events
FOR EACH STATEMENT
EXECUTE FUNCTION plexsphere.refuse_audit_change();
