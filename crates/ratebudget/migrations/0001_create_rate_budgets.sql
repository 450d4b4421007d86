-- The shared token buckets every replica admits requests through (ratebudget crate).
--
-- One row per (scope, bucket_key). The budget itself (rate and ceiling) is not stored: it
-- travels with every take, so an operator changing a knob is obeyed by the next take rather
-- than by whichever replica last rewrote a stored copy.
--
-- bucket_key has no foreign key on purpose: it holds Node ids under two scopes and Domain ids
-- under three, and a bucket is an admission tally, not a record of its caller. Rows of callers
-- that are gone stop being taken from and the idle sweep deletes them.
CREATE SCHEMA IF NOT EXISTS plexsphere;

CREATE TABLE plexsphere.rate_budgets (
    scope text NOT NULL
        CONSTRAINT rate_budgets_scope_check CHECK (scope IN (
            'secret_read_node',
            'secret_read_domain',
            'access_issuance_domain',
            'ingest_node',
            'ingest_domain'
        )),
    bucket_key uuid NOT NULL,
    -- What is left. A take never debits past zero; the CHECK makes a bug loud instead of
    -- letting a bucket carry debt.
    tokens double precision NOT NULL
        CONSTRAINT rate_budgets_tokens_check CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL,
    CONSTRAINT rate_budgets_pkey PRIMARY KEY (scope, bucket_key)
);

-- For the idle sweep. It costs the take its HOT updates (every take changes refilled_at),
-- measured at 10-19% of throughput; without it the sweep would scan the whole table.
CREATE INDEX rate_budgets_refilled_at_idx ON plexsphere.rate_budgets (refilled_at);
