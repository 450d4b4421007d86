-- Telemetry batches the ingest context has accepted from Nodes (ingest crate).
--
-- One row per accepted batch, committed before the Node is answered. A refused batch never
-- gets a row: its quotas are spent (or refused) before it is inserted.
--
-- node_id and domain_id carry no foreign keys on purpose: Nodes and Domains belong to the
-- access context, and contexts do not share tables. A batch is a record of what was received
-- from whom, and stays true after its Node or Domain is gone.
CREATE TABLE plexsphere.ingest_batches (
    id uuid NOT NULL,
    node_id uuid NOT NULL,
    domain_id uuid NOT NULL,
    -- The database's clock, not a replica's: batches from many replicas order on one clock.
    received_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    -- The wire bytes the batch was charged, kept beside the payload so usage can be summed
    -- without reading payloads; the CHECK keeps the two from disagreeing.
    byte_count bigint NOT NULL
        CONSTRAINT ingest_batches_byte_count_check
        CHECK (byte_count >= 0 AND byte_count = octet_length(payload)),
    payload bytea NOT NULL,
    CONSTRAINT ingest_batches_pkey PRIMARY KEY (id)
);

-- For reading one Domain's batches by time, the way usage and retention look at them.
CREATE INDEX ingest_batches_domain_id_received_at_idx
    ON plexsphere.ingest_batches (domain_id, received_at);
