-- Secret values at rest are sealed (secrets::Keyring): AES-256-GCM under the key named by
-- key_id, with a random 96-bit nonce, and the Domain and name as associated data, so a sealed
-- value copied to another row does not open.
--
-- A row is either sealed (key_id, nonce and ciphertext; value NULL) or plain text (value only):
-- rows written before this migration stay plain text, readable as they are, until
-- `plexsphere secrets rekey` seals them. Every write from this build on seals, and clears value.
--
-- During a rolling upgrade a replica of the previous build still reads and writes value only:
-- it cannot read a sealed row (a 500), and its write over a sealed row breaks the CHECK below
-- (a 500, nothing written); its write of a new secret is plain text, which rekey seals.
ALTER TABLE plexsphere.secrets
    ALTER COLUMN value DROP NOT NULL,
    -- secrets::KeyId: 64 bits of the key's hash, in lowercase hex.
    ADD COLUMN key_id text NULL
        CONSTRAINT secrets_key_id_check CHECK (key_id ~ '^[0-9a-f]{16}$'),
    ADD COLUMN nonce bytea NULL
        CONSTRAINT secrets_nonce_check CHECK (length(nonce) = 12),
    -- At most a 64 KiB value (secrets::SecretValue) and GCM's 16-byte tag.
    ADD COLUMN ciphertext bytea NULL
        CONSTRAINT secrets_ciphertext_check CHECK (length(ciphertext) BETWEEN 16 AND 65536 + 16),
    ADD CONSTRAINT secrets_sealed_or_plaintext_check CHECK (
        (value IS NULL AND key_id IS NOT NULL AND nonce IS NOT NULL AND ciphertext IS NOT NULL)
        OR (value IS NOT NULL AND key_id IS NULL AND nonce IS NULL AND ciphertext IS NULL)
    );
