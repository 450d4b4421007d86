-- Every version of one rule, oldest first. Parameters: $1 rule_id.
SELECT
    version, change, rolled_back_to, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source, rate, per_ms, burst, algorithm, mode, fail_mode,
    charge, priority, created_by, created_at, revision
FROM plexsphere.rule_versions
WHERE rule_id = $1::text
ORDER BY version
