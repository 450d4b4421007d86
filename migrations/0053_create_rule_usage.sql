-- How often each rule granted and refused, per minute (rules crate).
--
-- Each replica counts its decisions per rule and minute in memory and adds them here in one
-- statement per flush (an upsert adding to the counts), so one row sums every replica's
-- decisions of that rule in that minute. `minute` is on the deciding replica's clock (the
-- database's, corrected; see docs/adr/0015), truncated to the minute: whole minutes since the
-- epoch, whatever the session's time zone. shadow_refused counts refusals a SHADOW rule would
-- have made and admitted instead.
--
-- No foreign key to plexsphere.rules: a deleted rule's usage stays readable. The leader's
-- sweep deletes minutes older than the retention; the index on `minute` finds them.

CREATE TABLE plexsphere.rule_usage (
    rule_id text NOT NULL,
    minute timestamptz NOT NULL
        CONSTRAINT rule_usage_minute_check CHECK (extract(epoch FROM minute) % 60 = 0),
    granted bigint NOT NULL
        CONSTRAINT rule_usage_granted_check CHECK (granted >= 0),
    refused bigint NOT NULL
        CONSTRAINT rule_usage_refused_check CHECK (refused >= 0),
    shadow_refused bigint NOT NULL
        CONSTRAINT rule_usage_shadow_refused_check CHECK (shadow_refused >= 0),
    CONSTRAINT rule_usage_pkey PRIMARY KEY (rule_id, minute)
);

CREATE INDEX rule_usage_minute_idx ON plexsphere.rule_usage (minute);
