-- Every version of every rule (rules crate): append-only, for audit and rollback.
--
-- Each change of plexsphere.rules (created, replaced, rolled back, deleted) adds exactly one
-- row here in the same statement, with the rule's content from that version on (for a
-- deletion, the content deleted), who made it and when, and the rules' revision it made (the
-- first snapshot version that holds it). Rows are copies of rows plexsphere.rules accepted,
-- so they carry no CHECKs of their own beyond their shape.
--
-- Append-only is the table's own rule, not a convention: the triggers refuse UPDATE, DELETE
-- and TRUNCATE, so history cannot be rewritten by a bug or a hurried hand.

CREATE TABLE plexsphere.rule_versions (
    rule_id text NOT NULL,
    version bigint NOT NULL
        CONSTRAINT rule_versions_version_check CHECK (version >= 1),
    change text NOT NULL
        CONSTRAINT rule_versions_change_check CHECK (change IN ('created', 'replaced', 'rolled_back', 'deleted')),
    rolled_back_to bigint NULL
        CONSTRAINT rule_versions_rolled_back_to_check CHECK ((change = 'rolled_back') = (rolled_back_to IS NOT NULL)),
    scope text NOT NULL,
    selector jsonb NOT NULL,
    rate double precision NOT NULL,
    per_ms integer NOT NULL,
    burst double precision NOT NULL,
    algorithm text NOT NULL,
    mode text NOT NULL,
    fail_mode text NOT NULL,
    priority integer NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL,
    revision bigint NOT NULL,
    CONSTRAINT rule_versions_pkey PRIMARY KEY (rule_id, version)
);

CREATE FUNCTION plexsphere.rule_versions_are_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'plexsphere.rule_versions is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER rule_versions_append_only
    BEFORE UPDATE OR DELETE ON plexsphere.rule_versions
    FOR EACH ROW EXECUTE FUNCTION plexsphere.rule_versions_are_append_only();

CREATE TRIGGER rule_versions_no_truncate
    BEFORE TRUNCATE ON plexsphere.rule_versions
    FOR EACH STATEMENT EXECUTE FUNCTION plexsphere.rule_versions_are_append_only();
