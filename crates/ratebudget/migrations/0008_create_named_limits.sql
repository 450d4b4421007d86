-- Named GCRA limiters (ratebudget crate): limits keyed by arbitrary strings, such as a client
-- address for failed authentications, shared by every replica.
--
-- One row per (limiter, key): the key's theoretical arrival time (GCRA's TAT), in
-- microseconds since the Unix epoch, on the callers' injected clock like rate_budgets. The
-- key is stored as the SHA-256 of the limiter's name and the key, so a key of any length
-- costs the same row and the table never holds a caller's address or login in clear. The
-- limit (rate and burst) is not stored: it travels with every decision, so a changed setting
-- applies at the next one.
--
-- A key is back to a full budget once its TAT has passed; delete_expired removes those rows
-- in batches, and the index on tat_us is what finds them.
CREATE TABLE plexsphere.named_limits (
    limiter text NOT NULL
        CONSTRAINT named_limits_limiter_check CHECK (limiter ~ '^[a-z][a-z0-9_]{0,62}$'),
    key_hash bytea NOT NULL
        CONSTRAINT named_limits_key_hash_check CHECK (length(key_hash) = 32),
    tat_us bigint NOT NULL,
    CONSTRAINT named_limits_pkey PRIMARY KEY (limiter, key_hash)
);

CREATE INDEX named_limits_tat_us_idx ON plexsphere.named_limits (tat_us);
