-- Rules for any service (issue 23; ../shared/seeds/limit-data-model.txt): a rule names a
-- `service`, an `api` and a selector of attributes, and plexsphere decides other services'
-- requests (POST /v1/decide, Envoy's ShouldRateLimit) by them.
--
-- This project's own rules are the service 'plexsphere': they keep their scope and their
-- Domain selector ({}, {"tier": ...}, {"domain": ...}) exactly as before, and no api (their
-- scope is their API). Another service's rule has no scope; its api is a name ('GET /v1/users')
-- or '*', and its selector a flat object of string values ({}, {"sku": "premium"},
-- {"tenant": "contoso"}; a value '*' matches any value of its key), at most 16 of them, no key
-- 'api'. rules::RuleDraft checks the same; a rule Rust accepts is always stored.
--
-- Another service's rules are TOKEN_BUCKET: the descriptors of one request are decided
-- together in one token-bucket statement, which GCRA (one key at a time) cannot join.
--
-- Existing rows are 'plexsphere' rules, so the new columns' defaults describe them exactly.
-- A replica of the previous build reads `scope` as NOT NULL: write no other service's rule
-- until every replica runs this build.

CREATE FUNCTION plexsphere.rule_attributes_valid(selector jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_typeof(selector) = 'object'
        AND (
            SELECT count(*) <= 16
                AND coalesce(bool_and(
                    char_length(key) BETWEEN 1 AND 128
                    AND key !~ '[\x01-\x1f\x7f-\x9f]'
                    AND key <> 'api'
                    AND jsonb_typeof(value) = 'string'
                    AND char_length(value #>> '{}') <= 256
                    AND (value #>> '{}') !~ '[\x01-\x1f\x7f-\x9f]'
                ), true)
            FROM jsonb_each(selector)
        )
$$;

ALTER TABLE plexsphere.rules
    ADD COLUMN service text NOT NULL DEFAULT 'plexsphere'
        CONSTRAINT rules_service_check CHECK (service ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    ADD COLUMN api text NULL
        CONSTRAINT rules_api_check CHECK (
            api = '*' OR (char_length(api) BETWEEN 1 AND 256 AND api !~ '[\x01-\x1f\x7f-\x9f]')
        ),
    ALTER COLUMN scope DROP NOT NULL,
    DROP CONSTRAINT rules_scope_check,
    DROP CONSTRAINT rules_selector_check,
    DROP CONSTRAINT rules_gcra_check;

-- coalesce: a CHECK passes on NULL, and every branch must say yes, never "unknown".
ALTER TABLE plexsphere.rules
    ADD CONSTRAINT rules_target_check CHECK (coalesce(
        CASE
            WHEN service = 'plexsphere' THEN
                api IS NULL
                AND scope IN ('secret_read_node', 'secret_read_domain', 'access_issuance_domain', 'ingest_node', 'ingest_domain')
                AND (
                    selector = '{}'::jsonb
                    OR (
                        selector - 'tier' = '{}'::jsonb
                        AND jsonb_typeof(selector -> 'tier') = 'string'
                        AND selector ->> 'tier' IN ('free', 'standard', 'premium', 'enterprise')
                    )
                    OR (
                        selector - 'domain' = '{}'::jsonb
                        AND jsonb_typeof(selector -> 'domain') = 'string'
                        AND selector ->> 'domain' ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                        AND selector ->> 'domain' <> '00000000-0000-0000-0000-000000000000'
                    )
                )
            ELSE
                scope IS NULL AND api IS NOT NULL AND plexsphere.rule_attributes_valid(selector)
        END,
        false
    )),
    ADD CONSTRAINT rules_gcra_check CHECK (
        algorithm = 'TOKEN_BUCKET' OR (service = 'plexsphere' AND coalesce(scope = 'access_issuance_domain', false))
    );

-- GET /v1/rules?service=..., and the compiled snapshot of one service.
CREATE INDEX rules_service_idx ON plexsphere.rules (service, rule_id);

ALTER TABLE plexsphere.rule_versions
    ADD COLUMN service text NOT NULL DEFAULT 'plexsphere',
    ADD COLUMN api text NULL,
    ALTER COLUMN scope DROP NOT NULL;

-- As in 0057, with the rule's service and api recorded too.
CREATE OR REPLACE FUNCTION plexsphere.record_rule_change(
    written plexsphere.rules,
    version bigint,
    change text,
    rolled_back_to bigint,
    actor text,
    changed_at timestamptz,
    channel text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    made bigint;
BEGIN
    UPDATE plexsphere.rule_revision
    SET revision = rule_revision.revision + 1
    RETURNING rule_revision.revision INTO made;

    INSERT INTO plexsphere.rule_versions (
        rule_id, version, change, rolled_back_to, service, api, scope, selector, rate, per_ms,
        burst, algorithm, mode, fail_mode, priority, created_by, created_at, revision
    )
    VALUES (
        written.rule_id, version, change, rolled_back_to, written.service, written.api,
        written.scope, written.selector, written.rate, written.per_ms, written.burst,
        written.algorithm, written.mode, written.fail_mode, written.priority, actor, changed_at,
        made
    );

    PERFORM pg_notify(channel, made::text);
    RETURN made;
END;
$$;
