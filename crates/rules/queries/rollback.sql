-- Rolls a rule back to an earlier version's content, whatever version it is at now, as its
-- next version; a deleted rule is recreated. One statement: an upsert from the history row,
-- and plexsphere.record_rule_change (migration 0057), handed the rule's columns in the
-- table's order (`recreated` is not one of them).
--
-- Parameters: $1 rule_id, $2 the version to roll back to, $3 created_by, $4 the notification
-- channel. Answers the rule as written and whether it was recreated, or no row when the rule
-- has no such version or that version was a deletion.
--
-- `recreated` is PostgreSQL's own mark of a row this statement inserted rather than updated
-- (xmax is zero only for a fresh insert), the usual way to tell the two arms of an upsert.
-- The insert arm's version is the one after the history's last; a rollback racing a delete of
-- the same id can compute the deletion's (see create.sql), and the caller retries.
WITH target AS (
    SELECT rule_id, service, api, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority,
        descriptor, source, charge
    FROM plexsphere.rule_versions
    WHERE rule_id = $1::text
      AND version = $2::bigint
      AND change <> 'deleted'
),
previous AS (
    SELECT coalesce(max(version), 0) AS version
    FROM plexsphere.rule_versions
    WHERE rule_id = $1::text
),
written AS (
    INSERT INTO plexsphere.rules (
        rule_id, service, api, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode,
        priority, version, created_by, updated_at, descriptor, source, charge
    )
    SELECT
        target.rule_id, target.service, target.api, target.scope, target.selector, target.rate, target.per_ms, target.burst,
        target.algorithm, target.mode, target.fail_mode, target.priority, previous.version + 1,
        $3::text, now(), target.descriptor, target.source, target.charge
    FROM target
    CROSS JOIN previous
    ON CONFLICT (rule_id) DO UPDATE
    SET
        service = EXCLUDED.service,
        api = EXCLUDED.api,
        scope = EXCLUDED.scope,
        selector = EXCLUDED.selector,
        rate = EXCLUDED.rate,
        per_ms = EXCLUDED.per_ms,
        burst = EXCLUDED.burst,
        algorithm = EXCLUDED.algorithm,
        mode = EXCLUDED.mode,
        fail_mode = EXCLUDED.fail_mode,
        priority = EXCLUDED.priority,
        version = plexsphere.rules.version + 1,
        created_by = EXCLUDED.created_by,
        updated_at = EXCLUDED.updated_at,
        descriptor = EXCLUDED.descriptor,
        source = EXCLUDED.source,
        charge = EXCLUDED.charge
    RETURNING *, (xmax = 0) AS recreated
)
SELECT
    rule_id, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source,
    rate, per_ms, burst, algorithm, mode, fail_mode, charge, priority, version, created_by, updated_at,
    recreated,
    plexsphere.record_rule_change(
        ROW(
            written.rule_id, written.scope, written.selector, written.rate, written.per_ms,
            written.burst, written.algorithm, written.mode, written.fail_mode, written.priority,
            written.version, written.created_by, written.updated_at, written.service, written.api,
            written.descriptor, written.source, written.charge
        )::plexsphere.rules,
        written.version, 'rolled_back', $2::bigint, written.created_by, written.updated_at, $4::text
    ) AS revision
FROM written
