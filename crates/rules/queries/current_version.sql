-- A rule's version now, if it exists: read after a conditional write refused, to tell the
-- writer which version to read again; never to decide.
--
-- Parameters: $1 rule_id.
SELECT version
FROM plexsphere.rules
WHERE rule_id = $1::text
