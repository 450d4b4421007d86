-- Writes a rule where none stands, as the version after its last one (1 for a new id), in one
-- statement: the rule, and plexsphere.record_rule_change (its history row, the rules'
-- revision and the notification; migration 0057).
--
-- Parameters: $1 rule_id, $2 service, $3 api (NULL for plexsphere's own), $4 scope (NULL for
-- another service's), $5 selector (a JSON object, as text), $6 rate, $7 per_ms, $8 burst,
-- $9 algorithm, $10 mode, $11 fail_mode, $12 priority, $13 created_by, $14 the notification
-- channel, $15 descriptor (a file's rule: a JSON object, as text; NULL otherwise), $16 source (the
-- file it was applied from), $17 charge (WHEN_COVERED or ALWAYS). Answers the rule as written, or no row when a
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
        rule_id, service, api, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode,
        priority, version, created_by, updated_at, descriptor, source, charge
    )
    SELECT
        $1::text,
        $2::text,
        $3::text,
        $4::text,
        $5::jsonb,
        $6::float8,
        $7::integer,
        $8::float8,
        $9::text,
        $10::text,
        $11::text,
        $12::integer,
        previous.version + 1,
        $13::text,
        now(),
        $15::jsonb,
        $16::text,
        $17::text
    FROM previous
    ON CONFLICT (rule_id) DO NOTHING
    RETURNING *
)
SELECT
    rule_id, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source,
    rate, per_ms, burst, algorithm, mode, fail_mode, charge, priority, version, created_by, updated_at,
    plexsphere.record_rule_change(
        ROW(inserted.*)::plexsphere.rules,
        inserted.version, 'created', NULL, inserted.created_by, inserted.updated_at, $14::text
    ) AS revision
FROM inserted
