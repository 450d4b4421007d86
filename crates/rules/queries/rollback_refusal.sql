-- Why a rollback wrote nothing: whether the rule was ever written, what the version named
-- did (NULL: no such version), and the rule's version now (NULL: it does not exist). Read
-- after the conditional statement refused, to report, never to decide.
--
-- Parameters: $1 rule_id, $2 the version named.
SELECT
    EXISTS (
        SELECT 1
        FROM plexsphere.rule_versions
        WHERE rule_id = $1::text
    ) AS known,
    (
        SELECT change
        FROM plexsphere.rule_versions
        WHERE rule_id = $1::text
          AND version = $2::bigint
    ) AS target_change,
    (
        SELECT version
        FROM plexsphere.rules
        WHERE rule_id = $1::text
    ) AS current
