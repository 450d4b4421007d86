-- Rolls a rule back to an earlier version's content if, and only if, it is at the version
-- its writer read: one conditional UPDATE from the history row (a deleted rule is at no
-- version, so it matches nothing), and plexsphere.record_rule_change (migration 0057).
--
-- Parameters: $1 rule_id, $2 the version to roll back to, $3 created_by, $4 the notification
-- channel, $5 the version the writer read. Answers the rule as written (never recreated), or
-- no row.
WITH target AS (
    SELECT service, api, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority,
        descriptor, source, charge
    FROM plexsphere.rule_versions
    WHERE rule_id = $1::text
      AND version = $2::bigint
      AND change <> 'deleted'
),
written AS (
    UPDATE plexsphere.rules AS rules
    SET
        service = target.service,
        api = target.api,
        scope = target.scope,
        selector = target.selector,
        rate = target.rate,
        per_ms = target.per_ms,
        burst = target.burst,
        algorithm = target.algorithm,
        mode = target.mode,
        fail_mode = target.fail_mode,
        priority = target.priority,
        version = rules.version + 1,
        created_by = $3::text,
        updated_at = now(),
        descriptor = target.descriptor,
        source = target.source,
        charge = target.charge
    FROM target
    WHERE rules.rule_id = $1::text
      AND rules.version = $5::bigint
    RETURNING rules.*
)
SELECT
    rule_id, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source,
    rate, per_ms, burst, algorithm, mode, fail_mode, charge, priority, version, created_by, updated_at,
    false AS recreated,
    plexsphere.record_rule_change(
        ROW(written.*)::plexsphere.rules,
        written.version, 'rolled_back', $2::bigint, written.created_by, written.updated_at, $4::text
    ) AS revision
FROM written
