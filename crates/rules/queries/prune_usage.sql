-- Deletes every rule's usage of the minutes before a cutoff. Parameters: $1 the cutoff.
--
-- The leader runs it after each idle sweep, so one run deletes about a sweep interval of
-- minutes (an hour's: sixty rows a rule); the index on minute finds them.
DELETE FROM plexsphere.rule_usage
WHERE minute < $1::timestamptz
