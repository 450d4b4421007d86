-- Adds one replica's counts to the usage rows, in one statement: an upsert adding to what
-- other replicas (and earlier flushes) counted in the same minutes.
--
-- Parameters: five arrays of one length, element by element a count: $1 rule_id,
-- $2 minute, $3 granted, $4 refused, $5 shadow_refused. Each (rule_id, minute) appears once
-- (the caller sums per key first: an upsert may not touch a row twice).
--
-- Rows are locked in (rule_id, minute) order, whatever order the arrays hold them in, so two
-- replicas flushing the same minutes at once wait for each other instead of deadlocking.
INSERT INTO plexsphere.rule_usage (rule_id, minute, granted, refused, shadow_refused)
SELECT rule_id, minute, granted, refused, shadow_refused
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::bigint[], $5::bigint[])
    AS counts (rule_id, minute, granted, refused, shadow_refused)
ORDER BY rule_id, minute
ON CONFLICT (rule_id, minute) DO UPDATE
SET
    granted = plexsphere.rule_usage.granted + EXCLUDED.granted,
    refused = plexsphere.rule_usage.refused + EXCLUDED.refused,
    shadow_refused = plexsphere.rule_usage.shadow_refused + EXCLUDED.shadow_refused
