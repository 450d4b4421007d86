-- Every rule and the rules' revision they are as of, in one statement, so both come from one
-- snapshot of the database (and no explicit transaction is needed, which a transaction pooler
-- would make awkward). One row per rule; the revision alone, with NULL rule columns, when
-- there is no rule.
SELECT
    revision.revision AS snapshot_revision,
    rule_id, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source,
    rate, per_ms, burst, algorithm, mode, fail_mode, charge, priority, version, created_by, updated_at
FROM plexsphere.rule_revision AS revision
LEFT JOIN plexsphere.rules ON true
ORDER BY rule_id
