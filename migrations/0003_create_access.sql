-- The access context's tables (access crate): Domains, and the Nodes enrolled into them with
-- the hash of each Node's credential.
--
-- A Domain may carry its own issuance policy (the rate at which Node credentials may be issued
-- in it); a Domain without one uses the process-wide default, so the two columns are NULL
-- together. The budget it sizes lives in plexsphere.rate_budgets, not here.
--
-- A Node's bearer token is never stored, only its SHA-256: reading this table does not let
-- anyone present a Node's credential.

CREATE TABLE plexsphere.domains (
    id uuid NOT NULL
        CONSTRAINT domains_pkey PRIMARY KEY,
    -- The model trims names and refuses control characters (C0, DEL and C1, as Rust's
    -- char::is_control); these make an empty, oversized or terminal-rewriting name impossible.
    name text NOT NULL
        CONSTRAINT domains_name_check CHECK (
            char_length(name) BETWEEN 1 AND 100
            AND name !~ '[\x01-\x1f\x7f-\x9f]'
        ),
    issuance_per_second double precision NULL,
    issuance_burst double precision NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Both NULL, or a usable policy: a positive finite rate and a finite burst of at least one
    -- (an enrolment costs one issuance). The upper bound against 'Infinity' also rejects NaN,
    -- which PostgreSQL orders above every number, so `> 0` alone would admit it. The IS NOT
    -- NULLs are needed: with one column NULL the comparisons are NULL, and a CHECK passes NULL.
    -- The bucket must refill from empty within the idle sweep's hour (access::MAX_REFILL_SECONDS),
    -- or the sweep would delete a bucket that is not yet full.
    CONSTRAINT domains_issuance_policy_check CHECK (
        (issuance_per_second IS NULL AND issuance_burst IS NULL)
        OR (
            issuance_per_second IS NOT NULL
            AND issuance_burst IS NOT NULL
            AND issuance_per_second > 0
            AND issuance_per_second < 'Infinity'::float8
            AND issuance_burst >= 1
            AND issuance_burst < 'Infinity'::float8
            AND issuance_burst <= issuance_per_second * 3600
        )
    )
);

CREATE TABLE plexsphere.nodes (
    id uuid NOT NULL
        CONSTRAINT nodes_pkey PRIMARY KEY,
    domain_id uuid NOT NULL
        CONSTRAINT nodes_domain_id_fkey REFERENCES plexsphere.domains (id),
    name text NOT NULL
        CONSTRAINT nodes_name_check CHECK (
            char_length(name) BETWEEN 1 AND 100
            AND name !~ '[\x01-\x1f\x7f-\x9f]'
        ),
    -- SHA-256 of the token text. The unique index is also what authentication looks up by.
    token_hash bytea NOT NULL
        CONSTRAINT nodes_token_hash_key UNIQUE
        CONSTRAINT nodes_token_hash_check CHECK (length(token_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The foreign key's referencing side: without it, deleting or locking a Domain scans every
-- Node, and listing a Domain's Nodes would too.
CREATE INDEX nodes_domain_id_idx ON plexsphere.nodes (domain_id);
