-- Rolls a rule back to an earlier version's content if, and only if, it is at the version
-- its writer read: one conditional UPDATE from the history row (a deleted rule is at no
-- version, so it matches nothing), with the history row, the revision and the notification.
--
-- Parameters: $1 rule_id, $2 the version to roll back to, $3 created_by, $4 the notification
-- channel, $5 the version the writer read. Answers the rule as written (never recreated), or
-- no row.
WITH target AS (
    SELECT scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority
    FROM plexsphere.rule_versions
    WHERE rule_id = $1::text
      AND version = $2::bigint
      AND change <> 'deleted'
),
written AS (
    UPDATE plexsphere.rules AS rules
    SET
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
        updated_at = now()
    FROM target
    WHERE rules.rule_id = $1::text
      AND rules.version = $5::bigint
    RETURNING
        rules.rule_id, rules.scope, rules.selector, rules.rate, rules.per_ms, rules.burst,
        rules.algorithm, rules.mode, rules.fail_mode, rules.priority, rules.version,
        rules.created_by, rules.updated_at, false AS recreated
),
bumped AS (
    UPDATE plexsphere.rule_revision
    SET revision = revision + 1
    WHERE EXISTS (SELECT 1 FROM written)
    RETURNING revision
),
logged AS (
    INSERT INTO plexsphere.rule_versions (
        rule_id, version, change, rolled_back_to, scope, selector, rate, per_ms, burst, algorithm,
        mode, fail_mode, priority, created_by, created_at, revision
    )
    SELECT
        written.rule_id, written.version, 'rolled_back', $2::bigint, written.scope, written.selector,
        written.rate, written.per_ms, written.burst, written.algorithm, written.mode,
        written.fail_mode, written.priority, written.created_by, written.updated_at,
        bumped.revision
    FROM written
    CROSS JOIN bumped
    RETURNING revision
),
told AS (
    SELECT pg_notify($4::text, revision::text)
    FROM logged
)
SELECT
    rule_id,
    scope,
    selector ->> 'tier' AS selector_tier,
    selector ->> 'domain' AS selector_domain,
    rate,
    per_ms,
    burst,
    algorithm,
    mode,
    fail_mode,
    priority,
    version,
    created_by,
    updated_at,
    recreated,
    (SELECT count(*) FROM told) AS told
FROM written
