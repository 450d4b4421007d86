-- Replaces a rule if, and only if, it is at the version its writer read: one conditional
-- UPDATE, so of two writers holding the same version exactly one wins (the second waits for
-- the first's row lock, then finds the version moved on and matches nothing). With it, in the
-- same statement, plexsphere.record_rule_change (migration 0057). `RETURNING *` hands the row
-- whole to it, as a plexsphere.rules.
--
-- Parameters: $1 rule_id, $2 service, $3 api (NULL for plexsphere's own), $4 scope (NULL for
-- another service's), $5 selector (a JSON object, as text), $6 rate, $7 per_ms, $8 burst,
-- $9 algorithm, $10 mode, $11 fail_mode, $12 priority, $13 created_by, $14 the notification
-- channel, $15 the version the writer read, $16 descriptor, $17 source, $18 charge (as in create.sql). Answers the
-- rule as written, or no row when it is not at that version (or does not exist).
WITH updated AS (
    UPDATE plexsphere.rules
    SET
        service = $2::text,
        api = $3::text,
        scope = $4::text,
        selector = $5::jsonb,
        rate = $6::float8,
        per_ms = $7::integer,
        burst = $8::float8,
        algorithm = $9::text,
        mode = $10::text,
        fail_mode = $11::text,
        priority = $12::integer,
        version = version + 1,
        created_by = $13::text,
        updated_at = now(),
        descriptor = $16::jsonb,
        source = $17::text,
        charge = $18::text
    WHERE rule_id = $1::text
      AND version = $15::bigint
    RETURNING *
)
SELECT
    rule_id, service, api, scope, selector::text AS selector_json, descriptor::text AS descriptor_json, source,
    rate, per_ms, burst, algorithm, mode, fail_mode, charge, priority, version, created_by, updated_at,
    plexsphere.record_rule_change(
        ROW(updated.*)::plexsphere.rules,
        updated.version, 'replaced', NULL, updated.created_by, updated.updated_at, $14::text
    ) AS revision
FROM updated
