-- Deletes a rule if, and only if, it is at the version its writer read (one conditional
-- DELETE, as replace.sql is one conditional UPDATE), recording the deletion as the rule's next
-- version with the content it deleted, with the revision and the notification.
--
-- Parameters: $1 rule_id, $2 the version the writer read, $3 created_by, $4 the notification
-- channel. Answers the deletion's version, or no row when the rule is not at that version (or
-- does not exist).
WITH deleted AS (
    DELETE FROM plexsphere.rules
    WHERE rule_id = $1::text
      AND version = $2::bigint
    RETURNING
        rule_id, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority, version
),
bumped AS (
    UPDATE plexsphere.rule_revision
    SET revision = revision + 1
    WHERE EXISTS (SELECT 1 FROM deleted)
    RETURNING revision
),
logged AS (
    INSERT INTO plexsphere.rule_versions (
        rule_id, version, change, rolled_back_to, scope, selector, rate, per_ms, burst, algorithm,
        mode, fail_mode, priority, created_by, created_at, revision
    )
    SELECT
        deleted.rule_id, deleted.version + 1, 'deleted', NULL, deleted.scope, deleted.selector,
        deleted.rate, deleted.per_ms, deleted.burst, deleted.algorithm, deleted.mode,
        deleted.fail_mode, deleted.priority, $3::text, now(), bumped.revision
    FROM deleted
    CROSS JOIN bumped
    RETURNING version, revision
),
told AS (
    SELECT pg_notify($4::text, revision::text)
    FROM logged
)
SELECT
    version,
    (SELECT count(*) FROM told) AS told
FROM logged
