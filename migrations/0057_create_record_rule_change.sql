-- How every rule change is recorded (rules crate), in one place: one more rules revision, the
-- change's row in the append-only history, and the notification every replica listens for.
--
-- Each statement that changes a rule (rules/queries/create.sql, replace.sql, delete.sql,
-- rollback.sql, rollback_if_match.sql) calls this once per row it wrote, in its final SELECT:
-- after its write has locked the rule's row, so every writer takes the rule's lock before the
-- revision row's and none can deadlock, and never when the write matched nothing (a refused
-- change takes no revision lock and records nothing). It runs in the caller's transaction:
-- the change, its history row, the revision and the notification commit together or not at
-- all.
--
-- `written` is the rule as the statement left it (for a deletion, as it was deleted), and
-- `version` the version the change is recorded as (for a deletion, the one after the rule's).
-- Answers the revision the change made.

CREATE FUNCTION plexsphere.record_rule_change(
    written plexsphere.rules,
    version bigint,
    change text,
    rolled_back_to bigint,
    actor text,
    changed_at timestamptz,
    channel text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    made bigint;
BEGIN
    UPDATE plexsphere.rule_revision
    SET revision = rule_revision.revision + 1
    RETURNING rule_revision.revision INTO made;

    INSERT INTO plexsphere.rule_versions (
        rule_id, version, change, rolled_back_to, scope, selector, rate, per_ms, burst, algorithm,
        mode, fail_mode, priority, created_by, created_at, revision
    )
    VALUES (
        written.rule_id, version, change, rolled_back_to, written.scope, written.selector,
        written.rate, written.per_ms, written.burst, written.algorithm, written.mode,
        written.fail_mode, written.priority, actor, changed_at, made
    );

    PERFORM pg_notify(channel, made::text);
    RETURN made;
END;
$$;
