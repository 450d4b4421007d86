-- Deletes a rule if, and only if, it is at the version its writer read (one conditional
-- DELETE, as replace.sql is one conditional UPDATE), and records the deletion with
-- plexsphere.record_rule_change (migration 0057) as the rule's next version, with the content
-- it deleted.
--
-- Parameters: $1 rule_id, $2 the version the writer read, $3 created_by, $4 the notification
-- channel. Answers the deletion's version, or no row when the rule is not at that version (or
-- does not exist). `RETURNING *` hands the row whole to record_rule_change.
WITH deleted AS (
    DELETE FROM plexsphere.rules
    WHERE rule_id = $1::text
      AND version = $2::bigint
    RETURNING *
)
SELECT
    version + 1 AS version,
    plexsphere.record_rule_change(
        ROW(deleted.*)::plexsphere.rules, deleted.version + 1, 'deleted', NULL, $3::text, now(), $4::text
    ) AS revision
FROM deleted
