-- Every rule, or every rule of one scope or one service, by id. Parameters: $1 scope (or NULL:
-- any), $2 service (or NULL: any).
SELECT
    rule_id, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source,
    rate, per_ms, burst, algorithm, mode, fail_mode, charge, priority, version, created_by, updated_at
FROM plexsphere.rules
WHERE ($1::text IS NULL OR scope = $1::text)
  AND ($2::text IS NULL OR service = $2::text)
ORDER BY rule_id
