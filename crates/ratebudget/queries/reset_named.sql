-- ResetNamedLimit: forget one key of a named limiter and tell every replica, in one
-- statement (as reset.sql does for a bucket). Parameters: $1 limiter, $2 key_hash, $3 the
-- notification channel. The payload is `named:<limiter>:<key hash in hex>`.
WITH gone AS (
    DELETE FROM plexsphere.named_limits
    WHERE limiter = $1::text
      AND key_hash = $2::bytea
    RETURNING 1
),
told AS (
    SELECT pg_notify($3::text, 'named:' || $1::text || ':' || encode($2::bytea, 'hex'))
)
SELECT EXISTS (SELECT 1 FROM gone) AS existed
FROM told
