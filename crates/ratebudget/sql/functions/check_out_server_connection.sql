-- plexsphere.check_out_server_connection: its current definition, whole. A migration that changes it includes this
-- file (`--! include functions/check_out_server_connection.sql`); tests/it/migrations.rs checks that the database
-- holds exactly this.
--
-- What each transaction behind a transaction pooler runs first, after its BEGIN and SET LOCALs
-- (ratebudget::transaction_begin), on the server connection the pooler pinned it to, which may
-- be another one each transaction, made whenever the pooler liked:
--
-- 1. It refuses a server that cannot take a write (a hot standby, one in recovery, one set
--    read-only) with the error a write there gets, SQLSTATE 25006, as REFUSE_READ_ONLY_SERVER
--    does when a connection is made. Behind a pooler that check saw only the server connection
--    the client's first transaction ran on: a pooler repointed at a standby afterwards (its
--    [databases] host edited, or a name it resolves moved) served every later transaction from
--    the standby, where a refusal the snapshot foresees writes nothing and is answered from
--    replayed rows. Checked here, every transaction is refused there.
--
-- 2. It forgets the statements sqlx left on this server connection, and only those. sqlx names
--    every statement it prepares (`sqlx_s_<n>`, counted per client connection) and, with its
--    statement cache off, never closes one, so a server connection keeps what its earlier
--    clients prepared, and this client's next statement of the same name would fail ("already
--    exists"). DEALLOCATE ALL, as this once was, also dropped statements of others: PgBouncer
--    1.21 and later with `max_prepared_statements` (on by default since 1.22) prepares each
--    client's statements on the server connection under names of its own (`PGBOUNCER_<n>`)
--    and keeps them there for every client, believing they exist. Statements named as sqlx
--    names them are no client's but this one's: nobody can rely on one across transactions
--    behind a transaction pooler without such support, and with it the server-side names are
--    the pooler's.
--
-- A function, planned once per server session, rather than a DO block, which is compiled on
-- every call: it adds about 0.06 ms of server time to a transaction (0.17 ms as a DO block).
CREATE OR REPLACE FUNCTION plexsphere.check_out_server_connection()
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    leftover text;
BEGIN
    IF pg_catalog.pg_is_in_recovery() OR pg_catalog.current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'read_only_sql_transaction',
            MESSAGE = 'the database is read-only (a standby, or in recovery): not the primary to decide on';
    END IF;
    FOR leftover IN
        SELECT s.name
        FROM pg_catalog.pg_prepared_statements AS s
        WHERE s.name LIKE 'sqlx\_s\_%'
          AND NOT s.from_sql
    LOOP
        EXECUTE 'DEALLOCATE ' || pg_catalog.quote_ident(leftover);
    END LOOP;
END
$$;
