-- The rules' revision: how many rule changes there have been.
SELECT revision
FROM plexsphere.rule_revision
