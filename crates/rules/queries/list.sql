-- Every rule, or every rule of one scope, by id. Parameters: $1 scope (or NULL: all).
SELECT
    rule_id, scope, selector ->> 'tier' AS selector_tier, selector ->> 'domain' AS selector_domain,
    rate, per_ms, burst, algorithm, mode, fail_mode, priority, version, created_by, updated_at
FROM plexsphere.rules
WHERE $1::text IS NULL
   OR scope = $1::text
ORDER BY rule_id
