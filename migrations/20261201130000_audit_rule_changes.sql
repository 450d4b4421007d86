-- Rule changes go into the audit log too (audit crate): PUT, rollback and DELETE of a rule
-- were recorded only in the rule's own history (rule_versions), although the audit log is
-- where every operator action that changes something is read. An entry about a rule names
-- the rule and the version the change made in its history (a deletion is a version too).
--
-- Both columns are NULL for every other action, and for every entry written before.
-- Replicas of the previous build keep writing their entries (they name neither column).
ALTER TABLE plexsphere.audit_events
    ADD COLUMN rule_id text NULL
        CONSTRAINT audit_events_rule_id_check CHECK (rule_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    ADD COLUMN rule_version bigint NULL
        CONSTRAINT audit_events_rule_version_check CHECK (rule_version >= 1);
