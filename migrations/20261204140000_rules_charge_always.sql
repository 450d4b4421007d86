-- A rule's costs may be charged always (issue 34; docs/adr/0040): `charge` is
-- 'WHEN_COVERED' (every rule so far: a cost is debited only when the bucket covers it) or
-- 'ALWAYS' (a cost is charged whatever the bucket holds, leaving it in debt when it does not
-- cover it: a cost known only after the response, such as an LLM's tokens, which Envoy sends
-- with apply_on_stream_done). Only another service's rules written through the API may say
-- ALWAYS: plexsphere's own budgets and a file's rules charge only what a bucket covers.
--
-- A replica of the previous build reads an ALWAYS rule as WHEN_COVERED, and cannot roll a
-- rule back once this is applied (its rollback hands record_rule_change a row without the
-- column): write no ALWAYS rule, and roll none back, until every replica runs this build.

ALTER TABLE plexsphere.rules
    ADD COLUMN charge text NOT NULL DEFAULT 'WHEN_COVERED'
        CONSTRAINT rules_charge_check CHECK (
            charge = 'WHEN_COVERED'
            OR (charge = 'ALWAYS' AND service <> 'plexsphere' AND descriptor IS NULL)
        );

ALTER TABLE plexsphere.rule_versions
    ADD COLUMN charge text NOT NULL DEFAULT 'WHEN_COVERED';

-- As in 20261204100000, with the rule's charge recorded too.
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
        descriptor, source, charge
    )
    VALUES (
        written.rule_id, version, change, rolled_back_to, written.service, written.api,
        written.scope, written.selector, written.rate, written.per_ms, written.burst,
        written.algorithm, written.mode, written.fail_mode, written.priority, actor, changed_at,
        made, written.descriptor, written.source, written.charge
    );

    PERFORM pg_notify(channel, made::text);
    RETURN made;
END;
$$;
