-- A Domain's issuance policy obeys exactly the rule ratebudget::Limit::new enforces
-- (access and app check a policy with it before inserting one).
--
-- 0003's CHECK compared `burst <= per_second * 3600` while Rust compared
-- `burst / per_second > 3600`; the two disagree by a rounding step near the boundary, so a
-- policy could pass Rust and trip the CHECK (a 500 where a 400 was due). The comparisons
-- below are Limit::new's, operation for operation in float8 (IEEE double, as in Rust), plus
-- the upper bounds that keep the refill arithmetic from overflowing float8, and the access
-- context's own floor (a burst of at least one: an enrolment costs one issuance). sqlx applies
-- the migration in one transaction, so the table is never without its CHECK.

ALTER TABLE plexsphere.domains
    DROP CONSTRAINT domains_issuance_policy_check;

ALTER TABLE plexsphere.domains
    ADD CONSTRAINT domains_issuance_policy_check CHECK (
        (issuance_per_second IS NULL AND issuance_burst IS NULL)
        OR (
            issuance_per_second IS NOT NULL
            AND issuance_burst IS NOT NULL
            AND issuance_per_second > 0
            AND issuance_per_second <= 1e12::float8
            AND issuance_burst >= 1
            AND issuance_burst <= 1e15::float8
            AND issuance_burst <= issuance_per_second * 3600::float8
        )
    );
