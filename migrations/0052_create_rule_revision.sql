-- The rules' revision (rules crate): how many rule changes there have been, and so the
-- version of every replica's compiled snapshot.
--
-- Every statement that changes a rule adds one to it in the same statement, after it has
-- locked the rule's row (the bump reads the change's result), and announces the new revision
-- on the plexsphere_rules channel; rules::PgRulesRepository::load reads it together with the
-- rules, so a snapshot's revision says exactly which changes it holds. A replica polls this
-- one row as the backstop for a notification it missed.
--
-- One row: the CHECK on the key makes a second row impossible.

CREATE TABLE plexsphere.rule_revision (
    singleton boolean NOT NULL DEFAULT true
        CONSTRAINT rule_revision_pkey PRIMARY KEY
        CONSTRAINT rule_revision_singleton_check CHECK (singleton),
    revision bigint NOT NULL
        CONSTRAINT rule_revision_revision_check CHECK (revision >= 0)
);

INSERT INTO plexsphere.rule_revision (revision) VALUES (0);
