-- The revision of the Domains' tiers (access crate): how many tier changes there have been.
--
-- Every statement that changes a tier (a Domain created off the default tier, or moved to
-- another) adds one to it in the same statement and announces the new revision on the
-- plexsphere_domain_tiers channel. A replica compares the revision its tier directory was read
-- at with this one row, cheaply, to tell whether it missed a change while it was not listening.
--
-- One row: the CHECK on the key makes a second row impossible.

CREATE TABLE plexsphere.domain_tier_revision (
    singleton boolean NOT NULL DEFAULT true
        CONSTRAINT domain_tier_revision_pkey PRIMARY KEY
        CONSTRAINT domain_tier_revision_singleton_check CHECK (singleton),
    revision bigint NOT NULL
        CONSTRAINT domain_tier_revision_revision_check CHECK (revision >= 0)
);

INSERT INTO plexsphere.domain_tier_revision (revision) VALUES (0);
