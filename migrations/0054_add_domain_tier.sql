-- Domains gain a service tier (access crate): which tier template of the rate-budget rules
-- governs a Domain that has no override of its own (docs/adr/0020).
--
-- Every existing Domain is 'standard', access::Tier::DEFAULT, as is a Domain created by a
-- replica of the previous build during a rolling upgrade (the column's default). The set of
-- tiers is access::Tier::ALL.
--
-- The partial index holds exactly the Domains off the default tier: each replica keeps those
-- in memory (the tier directory), and reads them all whenever it may have missed a change.

ALTER TABLE plexsphere.domains
    ADD COLUMN tier text NOT NULL DEFAULT 'standard'
        CONSTRAINT domains_tier_check CHECK (tier IN ('free', 'standard', 'premium', 'enterprise'));

CREATE INDEX domains_tier_idx ON plexsphere.domains (tier) WHERE tier <> 'standard';
