-- One rule as it stands. Parameters: $1 rule_id.
SELECT
    rule_id, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source,
    rate, per_ms, burst, algorithm, mode, fail_mode, charge, priority, version, created_by, updated_at
FROM plexsphere.rules
WHERE rule_id = $1::text
