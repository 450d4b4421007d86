-- The rate-budget rules operators write (rules crate): one row per rule as it stands now.
--
-- A rule sizes one scope's budget for the Domains its selector picks: {} every Domain,
-- {"tier": "<tier>"} a tier's template, {"domain": "<uuid>"} one Domain's override. The rule
-- id is the caller's (PUT /v1/rules/{rule_id} is idempotent); `version` is the rule's own
-- ETag for If-Match, one more with every change; `created_by` and `updated_at` say who wrote
-- the current version and when. Every version is kept in plexsphere.rule_versions.
--
-- The budget is `rate` tokens every `per_ms` milliseconds, up to `burst`. rules::RuleDraft
-- checks it with ratebudget::Limit::new on the rate per second; the CHECK below makes exactly
-- the same float8 comparisons on exactly the same per-second rate (`rate / (per_ms / 1000)`,
-- in that order; a period of one second divides by exactly 1, so such a rate is kept to the
-- last bit), so a rule Rust accepts is always stored and one it refuses never is: it must
-- refill from empty within the idle sweep's hour (`burst <= per_second * 3600`), as every
-- budget must, with bounds that keep the refill arithmetic finite, and a burst of at least
-- one (every request costs at least one token). NaN sorts above every number in PostgreSQL,
-- so the upper bounds reject it.
--
-- GCRA decides single takes only (plexsphere.named_limits), and access_issuance_domain is
-- the one scope spent alone; the others are spent two at a time in one token-bucket statement.

CREATE TABLE plexsphere.rules (
    rule_id text NOT NULL
        CONSTRAINT rules_pkey PRIMARY KEY
        CONSTRAINT rules_rule_id_check CHECK (rule_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    scope text NOT NULL
        CONSTRAINT rules_scope_check CHECK (
            scope IN ('secret_read_node', 'secret_read_domain', 'access_issuance_domain', 'ingest_node', 'ingest_domain')
        ),
    selector jsonb NOT NULL
        CONSTRAINT rules_selector_check CHECK (
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
        ),
    rate double precision NOT NULL,
    per_ms integer NOT NULL
        CONSTRAINT rules_per_ms_check CHECK (per_ms BETWEEN 1 AND 86400000),
    burst double precision NOT NULL,
    algorithm text NOT NULL
        CONSTRAINT rules_algorithm_check CHECK (algorithm IN ('TOKEN_BUCKET', 'GCRA')),
    mode text NOT NULL
        CONSTRAINT rules_mode_check CHECK (mode IN ('ENFORCE', 'SHADOW')),
    fail_mode text NOT NULL
        CONSTRAINT rules_fail_mode_check CHECK (fail_mode IN ('CLOSED', 'OPEN', 'STATIC')),
    priority integer NOT NULL,
    version bigint NOT NULL
        CONSTRAINT rules_version_check CHECK (version >= 1),
    created_by text NOT NULL
        CONSTRAINT rules_created_by_check CHECK (
            char_length(created_by) BETWEEN 1 AND 200
            AND created_by !~ '[\x01-\x1f\x7f-\x9f]'
        ),
    updated_at timestamptz NOT NULL,
    CONSTRAINT rules_limit_check CHECK (
        rate > 0
        AND rate < 'Infinity'::float8
        AND rate / (per_ms::float8 / 1000::float8) > 0
        AND rate / (per_ms::float8 / 1000::float8) <= 1e12::float8
        AND burst >= 1
        AND burst <= 1e15::float8
        AND burst <= rate / (per_ms::float8 / 1000::float8) * 3600::float8
    ),
    CONSTRAINT rules_gcra_check CHECK (algorithm = 'TOKEN_BUCKET' OR scope = 'access_issuance_domain')
);

-- GET /v1/rules?scope=...
CREATE INDEX rules_scope_idx ON plexsphere.rules (scope, rule_id);
