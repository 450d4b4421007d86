-- Writes a rule where none stands, as the version after its last one (1 for a new id), in one
-- statement: the rule, and plexsphere.record_rule_change (its history row, the rules'
-- revision and the notification; migration 0057).
--
-- Parameters: $1 rule_id, $2 scope, $3 selector tier (or NULL), $4 selector domain (or NULL),
-- $5 rate, $6 per_ms, $7 burst, $8 algorithm, $9 mode, $10 fail_mode, $11 priority,
-- $12 created_by, $13 the notification channel. Answers the rule as written, or no row when a
-- rule of that id exists (ON CONFLICT DO NOTHING: a concurrent creator wins or loses whole).
--
-- `RETURNING *` on purpose: the row is handed whole to record_rule_change as a
-- plexsphere.rules, whose column order it must match. A create racing a delete of the same id
-- can compute the version the deletion took (this statement's snapshot predates it): the
-- history's primary key refuses it, and the caller retries.
WITH previous AS (
    SELECT coalesce(max(version), 0) AS version
    FROM plexsphere.rule_versions
    WHERE rule_id = $1::text
),
inserted AS (
    INSERT INTO plexsphere.rules (
        rule_id, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority,
        version, created_by, updated_at
    )
    SELECT
        $1::text,
        $2::text,
        CASE
            WHEN $3::text IS NOT NULL THEN jsonb_build_object('tier', $3::text)
            WHEN $4::uuid IS NOT NULL THEN jsonb_build_object('domain', $4::uuid::text)
            ELSE '{}'::jsonb
        END,
        $5::float8,
        $6::integer,
        $7::float8,
        $8::text,
        $9::text,
        $10::text,
        $11::integer,
        previous.version + 1,
        $12::text,
        now()
    FROM previous
    ON CONFLICT (rule_id) DO NOTHING
    RETURNING *
)
SELECT
    rule_id, scope, selector ->> 'tier' AS selector_tier, selector ->> 'domain' AS selector_domain,
    rate, per_ms, burst, algorithm, mode, fail_mode, priority, version, created_by, updated_at,
    plexsphere.record_rule_change(
        ROW(inserted.*)::plexsphere.rules,
        inserted.version, 'created', NULL, inserted.created_by, inserted.updated_at, $13::text
    ) AS revision
FROM inserted
