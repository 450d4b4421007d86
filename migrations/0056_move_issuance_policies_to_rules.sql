-- Every Domain's own issuance policy becomes that Domain's override rule (data; the rules
-- crate governs issuance from now on, docs/adr/0020).
--
-- Each Domain with a policy gets rule `domain-<id>-issuance` (rules::RuleId::issuance_override,
-- the id POST /v1/domains gives the overrides it writes): scope access_issuance_domain,
-- selector {"domain": "<id>"}, `rate` the policy's issuances a second over `per_ms` 1000, its
-- burst, TOKEN_BUCKET, ENFORCE, priority 0, version 1 by 'migration 0056'. Its fail mode is
-- CLOSED, the issuance scope's default: a deployment that set
-- PLEXSPHERE_ACCESS_ISSUANCE_FAIL_MODE=local gives these rules STATIC with a PUT (the knob
-- still governs Domains without an override). The policies passed 0007's CHECK, whose
-- comparisons on the rate per second are exactly rules_limit_check's with per_ms 1000 (the
-- rate divided by exactly 1), so every one of them passes.
--
-- Each rule is one change: it gets its history row (created) and its own revision, in the
-- Domains' creation order, and the revision moves by their number. No notification: no
-- replica of this build runs before its migrations do.
--
-- The domains' issuance columns stay, no longer read or written, so a replica of the previous
-- build still sizes the migrated Domains during a rolling upgrade; a later migration drops
-- them. sqlx applies the migration in one transaction: rules, history and revision agree.

WITH policies AS (
    SELECT
        id,
        issuance_per_second,
        issuance_burst,
        row_number() OVER (ORDER BY created_at, id) AS n
    FROM plexsphere.domains
    WHERE issuance_per_second IS NOT NULL
),
start AS (
    SELECT revision
    FROM plexsphere.rule_revision
),
inserted AS (
    INSERT INTO plexsphere.rules (
        rule_id, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority,
        version, created_by, updated_at
    )
    SELECT
        'domain-' || id::text || '-issuance',
        'access_issuance_domain',
        jsonb_build_object('domain', id::text),
        issuance_per_second,
        1000,
        issuance_burst,
        'TOKEN_BUCKET',
        'ENFORCE',
        'CLOSED',
        0,
        1,
        'migration 0056',
        now()
    FROM policies
    RETURNING rule_id, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority, created_by, updated_at
)
INSERT INTO plexsphere.rule_versions (
    rule_id, version, change, rolled_back_to, scope, selector, rate, per_ms, burst, algorithm,
    mode, fail_mode, priority, created_by, created_at, revision
)
SELECT
    inserted.rule_id, 1, 'created', NULL, inserted.scope, inserted.selector, inserted.rate,
    inserted.per_ms, inserted.burst, inserted.algorithm, inserted.mode, inserted.fail_mode,
    inserted.priority, inserted.created_by, inserted.updated_at, start.revision + policies.n
FROM inserted
JOIN policies
    ON inserted.rule_id = 'domain-' || policies.id::text || '-issuance'
CROSS JOIN start;

UPDATE plexsphere.rule_revision
SET revision = revision + (
    SELECT count(*)
    FROM plexsphere.domains
    WHERE issuance_per_second IS NOT NULL
);
