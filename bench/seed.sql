-- Rows the take benchmark and its pgbench twin both work on (bench/compare.sh applies it).
-- Keys are md5(i)::uuid, so the pgbench script can name the same rows from an integer.
TRUNCATE plexsphere.rate_budgets;
INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
SELECT 'ingest_node', md5(i::text)::uuid, 1e12, '2026-01-01T00:00:00Z'
FROM generate_series(1, 100000) AS i;
INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
SELECT 'ingest_domain', md5(i::text)::uuid, 1e12, '2026-01-01T00:00:00Z'
FROM generate_series(1, 1000) AS i;
-- The hot bucket, and the exhausted one that never refills (a scope of their own, so the
-- random workloads never pick them).
INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at) VALUES
    ('secret_read_node', '00000000-0000-4000-8000-000000000001', 1e12, '2026-01-01T00:00:00Z'),
    ('secret_read_node', '00000000-0000-4000-8000-000000000002', 0, '2026-01-01T00:00:00Z');
VACUUM ANALYZE plexsphere.rate_budgets;
