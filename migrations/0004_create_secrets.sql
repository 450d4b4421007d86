-- Named secrets per Domain (secrets crate): written by operators, read by that Domain's Nodes.
--
-- One row per (domain_id, name); a write replaces the value. Every lookup is keyed by the
-- reading Node's own Domain, which is what keeps one Domain's secrets from another's.
--
-- domain_id has no foreign key to plexsphere.domains on purpose: that table belongs to the
-- access context, and contexts do not share tables. The composition root checks that the
-- Domain exists before a write.
CREATE TABLE plexsphere.secrets (
    domain_id uuid NOT NULL,
    -- The same rule as secrets::SecretName: 1 to 128 characters a URL path segment carries
    -- unescaped, and not dots alone (URL normalisers collapse "." and "..").
    name text NOT NULL
        CONSTRAINT secrets_name_check CHECK (name ~ '^[A-Za-z0-9._-]{1,128}$' AND name !~ '^[.]+$'),
    -- The same limit as secrets::SecretValue: 64 KiB of UTF-8.
    value text NOT NULL
        CONSTRAINT secrets_value_check CHECK (octet_length(value) <= 65536),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT secrets_pkey PRIMARY KEY (domain_id, name)
);
