-- The row-locking helpers of the pair functions (0002, 0006) and of the first coalesced take
-- (0009) lock a bucket's row, minting it when it is missing: SELECT ... FOR UPDATE, then
-- INSERT ... ON CONFLICT DO NOTHING, then SELECT ... FOR UPDATE INTO STRICT. When a reset or
-- the sweep deleted the row between the INSERT (which found it there and did nothing) and the
-- last SELECT (which waited on the deleter's lock and then found nothing), the take failed with
-- "query returned no rows": an error where a decision was due. Each now loops until it holds
-- the row: found and locked, or inserted by this call (a row this transaction inserted is its
-- own until it commits). A deletion can only make it go round once more; nothing here waits
-- on anything the first version did not.
--
-- The same signatures, so every caller and every replica of an earlier build keeps working.

--! include functions/lock_rate_budget.sql

--! include functions/lock_rate_budget_row.sql

--! include functions/lock_or_mint_rate_budget_row.sql
