-- Rules read from envoyproxy/ratelimit's configuration files (issue 34; `plexsphere rules
-- apply`, PLEXSPHERE_RULES_DIR). Each node of a file's descriptor tree that sets a limit, and
-- each leaf that sets none, is one rule of its domain (the service) whose `descriptor` holds
-- the path from the domain's root and what the file says of it (rules::DescriptorRule), and
-- whose `source` names the file it was applied from. Such a rule has no api, scope or
-- selector: it matches by its path, entry by entry, to a descriptor's full depth.
--
-- A file's `requests_per_unit: 0`, `unlimited: true` and a leaf without `rate_limit` never
-- spend from a bucket: those rules store no rate, per_ms or burst. Every other rule stores all
-- three, and the checks of migration 20261203200000 hold for them as before (a week's, a
-- month's or a year's limit is stored per day, which their arithmetic reads as the same rate).
--
-- A replica of the previous build cannot read a rule with a descriptor: apply no file until
-- every replica runs this build.

ALTER TABLE plexsphere.rules
    ADD COLUMN descriptor jsonb NULL
        CONSTRAINT rules_descriptor_check CHECK (jsonb_typeof(descriptor) = 'object'),
    ADD COLUMN source text NULL
        CONSTRAINT rules_source_check CHECK (
            char_length(source) BETWEEN 1 AND 4096 AND source !~ '[\x01-\x1f\x7f-\x9f]'
        ),
    ALTER COLUMN rate DROP NOT NULL,
    ALTER COLUMN per_ms DROP NOT NULL,
    ALTER COLUMN burst DROP NOT NULL,
    DROP CONSTRAINT rules_target_check;

-- coalesce: a CHECK passes on NULL, and every branch must say yes, never "unknown".
ALTER TABLE plexsphere.rules
    ADD CONSTRAINT rules_target_check CHECK (coalesce(
        CASE
            WHEN service = 'plexsphere' THEN
                descriptor IS NULL
                AND source IS NULL
                AND api IS NULL
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
            WHEN descriptor IS NOT NULL THEN
                scope IS NULL AND api IS NULL AND selector = '{}'::jsonb AND source IS NOT NULL
            ELSE
                source IS NULL AND scope IS NULL AND api IS NOT NULL AND plexsphere.rule_attributes_valid(selector)
        END,
        false
    )),
    -- Rate, per_ms and burst stand together, and only a file's rule may go without them (the
    -- limit checks above pass on NULL, so this one says when NULL is allowed).
    ADD CONSTRAINT rules_spends_check CHECK (
        (rate IS NULL) = (per_ms IS NULL)
        AND (rate IS NULL) = (burst IS NULL)
        AND (rate IS NOT NULL OR descriptor IS NOT NULL)
    );

ALTER TABLE plexsphere.rule_versions
    ADD COLUMN descriptor jsonb NULL,
    ADD COLUMN source text NULL,
    ALTER COLUMN rate DROP NOT NULL,
    ALTER COLUMN per_ms DROP NOT NULL,
    ALTER COLUMN burst DROP NOT NULL;

-- As in 20261201160000, with the rule's descriptor and source recorded too.
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
        burst, algorithm, mode, fail_mode, priority, created_by, created_at, revision,
        descriptor, source
    )
    VALUES (
        written.rule_id, version, change, rolled_back_to, written.service, written.api,
        written.scope, written.selector, written.rate, written.per_ms, written.burst,
        written.algorithm, written.mode, written.fail_mode, written.priority, actor, changed_at,
        made, written.descriptor, written.source
    );

    PERFORM pg_notify(channel, made::text);
    RETURN made;
END;
$$;

-- `plexsphere rules apply --prune`: the rules a domain's files wrote.
CREATE INDEX rules_source_idx ON plexsphere.rules (service) WHERE source IS NOT NULL;

-- The leader applying PLEXSPHERE_RULES_DIR is an actor of its own, as the command line is.
ALTER TABLE plexsphere.audit_events
    DROP CONSTRAINT audit_events_actor_check,
    ADD CONSTRAINT audit_events_actor_check CHECK (actor ~ '^([A-Za-z0-9._-]{1,64}|<cli>|<rules-dir>)$');
