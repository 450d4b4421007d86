-- Replaces a rule if, and only if, it is at the version its writer read: one conditional
-- UPDATE, so of two writers holding the same version exactly one wins (the second waits for
-- the first's row lock, then finds the version moved on and matches nothing). With it, in the
-- same statement, plexsphere.record_rule_change (migration 0057). `RETURNING *` hands the row
-- whole to it, as a plexsphere.rules.
--
-- Parameters: $1 rule_id, $2 scope, $3 selector tier (or NULL), $4 selector domain (or NULL),
-- $5 rate, $6 per_ms, $7 burst, $8 algorithm, $9 mode, $10 fail_mode, $11 priority,
-- $12 created_by, $13 the notification channel, $14 the version the writer read. Answers the
-- rule as written, or no row when it is not at that version (or does not exist).
WITH updated AS (
    UPDATE plexsphere.rules
    SET
        scope = $2::text,
        selector = CASE
            WHEN $3::text IS NOT NULL THEN jsonb_build_object('tier', $3::text)
            WHEN $4::uuid IS NOT NULL THEN jsonb_build_object('domain', $4::uuid::text)
            ELSE '{}'::jsonb
        END,
        rate = $5::float8,
        per_ms = $6::integer,
        burst = $7::float8,
        algorithm = $8::text,
        mode = $9::text,
        fail_mode = $10::text,
        priority = $11::integer,
        version = version + 1,
        created_by = $12::text,
        updated_at = now()
    WHERE rule_id = $1::text
      AND version = $14::bigint
    RETURNING *
)
SELECT
    rule_id, scope, selector ->> 'tier' AS selector_tier, selector ->> 'domain' AS selector_domain,
    rate, per_ms, burst, algorithm, mode, fail_mode, priority, version, created_by, updated_at,
    plexsphere.record_rule_change(
        ROW(updated.*)::plexsphere.rules,
        updated.version, 'replaced', NULL, updated.created_by, updated.updated_at, $13::text
    ) AS revision
FROM updated
