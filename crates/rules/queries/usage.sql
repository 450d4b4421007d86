-- One rule's usage from a minute on, oldest first. Parameters: $1 rule_id, $2 since.
SELECT minute, granted, refused, shadow_refused
FROM plexsphere.rule_usage
WHERE rule_id = $1::text
  AND minute >= $2::timestamptz
ORDER BY minute
