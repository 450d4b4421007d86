//! The connections takes run on: opened with the pool's own options and bounded by its size,
//! but without the round trip sqlx's pool adds to every use.
//!
//! sqlx 0.8's pool pings every connection as it comes back (a Sync round trip, in
//! `PoolConnection::return_to_pool`), and by default pings it again before handing it out.
//! For a take, which is itself one short round trip, that doubled the round trips, the
//! client's wake-ups and the latency a caller sees (measured in BENCHMARKS.md). Here a
//! connection goes back to the idle list untouched when its statement completed, and is
//! dropped (closed) when it failed or its future was cancelled mid-statement, which is the
//! case the pool's ping exists for. A connection idle for long enough that the server or the
//! network may have dropped it is pinged before reuse, so an outage that is over does not
//! fail the first take on each stale connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// An idle connection older than this is pinged before it is reused.
const STALE_AFTER: Duration = Duration::from_secs(10);
/// A connection older than this is closed when it is released, as sqlx's pool does, so that
/// server-side memory and a changed route to the server do not live forever.
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

struct Idle {
    connection: PgConnection,
    opened_at: Instant,
    released_at: Instant,
}

/// A bounded set of connections for takes, sized and configured like `pool`.
pub(crate) struct TakeConnections {
    pool: PgPool,
    /// Behind a transaction pooler: what opens each lease's transaction (`BEGIN` and its
    /// `SET LOCAL`s). See [`crate::Store::through_transaction_pooler`].
    pooled: Option<Arc<str>>,
    idle: Mutex<Vec<Idle>>,
    permits: Arc<Semaphore>,
    size: usize,
    waiting: AtomicUsize,
}

impl TakeConnections {
    pub(crate) fn new(pool: PgPool) -> TakeConnections {
        let size = pool.options().get_max_connections() as usize;
        TakeConnections {
            pool,
            pooled: None,
            idle: Mutex::new(Vec::with_capacity(size)),
            permits: Arc::new(Semaphore::new(size)),
            size,
            waiting: AtomicUsize::new(0),
        }
    }

    /// The same set, each lease in a transaction `begin` opens (behind a transaction pooler).
    pub(crate) fn pooled(pool: PgPool, begin: String) -> TakeConnections {
        TakeConnections { pooled: Some(begin.into()), ..TakeConnections::new(pool) }
    }

    /// A connection for one statement, waiting at most the pool's acquire timeout for a free
    /// one and for a new one to connect; behind a transaction pooler, in a transaction of its
    /// own, which [`Lease::finish`] ends.
    pub(crate) async fn lease(self: &Arc<Self>) -> Result<Lease, sqlx::Error> {
        let acquire_timeout = self.pool.options().get_acquire_timeout();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let lease = tokio::time::timeout(acquire_timeout, self.lease_unbounded()).await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        let mut lease = lease.map_err(|_| sqlx::Error::PoolTimedOut)??;
        if let Some(begin) = &self.pooled {
            // A simple query: one round trip, no statement to prepare.
            sqlx::Executor::execute(lease.connection(), &**begin).await?;
        }
        Ok(lease)
    }

    /// How many connections are leased right now, and how many callers wait for one.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (self.size - self.permits.available_permits(), self.waiting.load(Ordering::Relaxed))
    }

    async fn lease_unbounded(self: &Arc<Self>) -> Result<Lease, sqlx::Error> {
        if self.pool.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        let permit = self.permits.clone().acquire_owned().await.map_err(|_| sqlx::Error::PoolClosed)?;
        loop {
            // The guard must be gone before the await below: bind the popped value first.
            let popped = self.lock_idle().pop();
            let Some(mut idle) = popped else { break };
            if idle.released_at.elapsed() < STALE_AFTER || idle.connection.ping().await.is_ok() {
                return Ok(Lease {
                    set: self.clone(),
                    connection: Some(idle.connection),
                    opened_at: idle.opened_at,
                    _permit: permit,
                });
            }
            // Dead: dropping it closes the socket; try the next one.
        }
        let mut connection = PgConnection::connect_with(&self.pool.connect_options()).await?;
        // Dropped (closed) on failure, so the next take connects again: after a failover,
        // to wherever the name points by then. Behind a transaction pooler a session setting
        // would stay on whichever server connection ran it, for the pooler's other clients:
        // there the settings are each transaction's own (`Store::through_transaction_pooler`).
        let opening = match self.pooled {
            Some(_) => REFUSE_READ_ONLY_SERVER.to_owned(),
            None => decision_session_opening(),
        };
        sqlx::Executor::execute(&mut connection, opening.as_str()).await?;
        Ok(Lease {
            set: self.clone(),
            connection: Some(connection),
            opened_at: Instant::now(),
            _permit: permit,
        })
    }

    /// Closes every idle connection politely and refuses new leases; leases in flight close
    /// their connection when they end.
    pub(crate) async fn close(&self) {
        self.pool.close().await;
        let idle: Vec<Idle> = std::mem::take(&mut *self.lock_idle());
        for idle in idle {
            let _ = idle.connection.close().await;
        }
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list holds whole connections; a panic elsewhere cannot leave one half-pushed.
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One connection, held for one statement. Dropped without [`Lease::release`], it closes the
/// connection (the statement failed, or was cancelled and may have left the protocol mid-way)
/// and the idle ones too: a statement fails on a live connection rarely, and when the server
/// restarted or ended our sessions every idle connection is as dead as this one, and each
/// would otherwise fail one more take before it is found out.
/// The permit goes back only after the connection is gone (fields drop in order), so the set
/// never has more connections open than permits.
pub(crate) struct Lease {
    set: Arc<TakeConnections>,
    connection: Option<PgConnection>,
    opened_at: Instant,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.connection.is_some() {
            let stale: Vec<Idle> = std::mem::take(&mut *self.set.lock_idle());
            drop(stale);
        }
    }
}

impl Lease {
    pub(crate) fn connection(&mut self) -> &mut PgConnection {
        self.connection.as_mut().expect("a lease holds its connection until released")
    }

    /// Ends the lease's statement: behind a transaction pooler, commits its transaction and
    /// forgets the statements it prepared (the pooler may give the next transaction another
    /// server connection, where they do not exist and a name could collide), then returns the
    /// connection for reuse.
    pub(crate) async fn finish(mut self) -> Result<(), sqlx::Error> {
        if self.set.pooled.is_some() {
            // The next transaction on whichever server connection this one used deallocates
            // what it prepared (transaction_begin).
            sqlx::Executor::execute(self.connection(), "COMMIT").await?;
        }
        self.release();
        Ok(())
    }

    /// Returns the connection for reuse; call it only after the statement completed.
    fn release(mut self) {
        if let Some(connection) = self.connection.take() {
            if self.opened_at.elapsed() < MAX_LIFETIME && !self.set.pool.is_closed() {
                let idle = Idle { connection, opened_at: self.opened_at, released_at: Instant::now() };
                self.set.lock_idle().push(idle);
            }
        }
    }
}

/// What every new connection to the store runs first, as one simple query: a server that
/// cannot take a write (a hot standby, one in recovery, one set read-only) fails it with the
/// error a write there gets, SQLSTATE 25006 `read_only_sql_transaction`, so no connection is
/// kept to it. A take's grant would fail there anyway, but a refusal the snapshot foresees
/// writes nothing and would be answered from a standby's replayed rows; and a connection made
/// while a failover's DNS name still named the old server would stay there after it moved.
/// Run it in a pool's `after_connect` too, for the repositories beside the store. One round
/// trip per connection, none per take.
pub const REFUSE_READ_ONLY_SERVER: &str = "\
DO $refuse$ BEGIN
    IF pg_catalog.pg_is_in_recovery() OR pg_catalog.current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'read_only_sql_transaction',
            MESSAGE = 'the database is read-only (a standby, or in recovery): not the primary to decide on';
    END IF;
END $refuse$";

/// What a take connection's session sets before its first decision: each decision statement
/// finds its rows by key, and PostgreSQL keeps a statement's generic plan for the session, so
/// one planned while `rate_budgets` looked empty (a fresh deployment; a table the sweep emptied
/// and ANALYZE saw so) would read the whole table on every decision until the next ANALYZE
/// replanned it. With sequential scans priced out, the plans PostgreSQL 15 makes of every
/// decision statement look rows up by key on an empty table too (`tests/it/plans.rs` checks
/// each; docs/adr/0035). Nothing else runs on these sessions. Behind a transaction pooler
/// they are each transaction's first `SET LOCAL`s, so a caller's own settings come after.
pub(crate) const DECISION_SETTINGS: &[(&str, &str)] = &[("enable_seqscan", "off")];

/// A take connection's first query, in one round trip: [`REFUSE_READ_ONLY_SERVER`], then
/// [`DECISION_SETTINGS`] for the session.
fn decision_session_opening() -> String {
    let mut opening = String::from(REFUSE_READ_ONLY_SERVER);
    for (name, value) in DECISION_SETTINGS {
        opening.push_str(&format!("; SET {name} = '{value}'"));
    }
    opening
}

/// `BEGIN`, a `SET LOCAL` for each of `settings`, and `plexsphere.check_out_server_connection()`,
/// as one simple query: what opens a transaction behind a transaction pooler
/// ([`crate::Store::through_transaction_pooler`], [`crate::through_transaction_pooler`]).
/// Values are quoted as SQL literals.
///
/// The function runs on the server connection the pooler pinned the transaction to, which may
/// be another one each transaction, made whenever the pooler liked: it refuses a server that
/// cannot take a write (as [`REFUSE_READ_ONLY_SERVER`] does when a connection is made, which
/// behind a pooler saw only the first transaction's server; a pooler repointed at a standby
/// afterwards was not caught), and it forgets the statements sqlx left there (sqlx names them
/// and, with its cache off, never closes them, so another client's next statement of the same
/// name would fail), and only those: a pooler that prepares statements itself
/// (PgBouncer 1.21+ with `max_prepared_statements`) keeps its own on the server connection
/// for every client, which `DEALLOCATE ALL`, as this once ran, dropped. Its file says more.
/// Inside the transaction, not after the COMMIT, which would reach whichever server connection
/// the pooler picks next.
pub fn transaction_begin(settings: &[(&str, &str)]) -> String {
    let mut begin = String::from("BEGIN");
    for (name, value) in settings {
        // A setting's name is an identifier of letters, digits and underscores; anything else
        // is dropped rather than spliced into SQL.
        if !name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_') {
            continue;
        }
        begin.push_str(&format!("; SET LOCAL {name} = '{}'", value.replace('\'', "''")));
    }
    begin.push_str("; SELECT plexsphere.check_out_server_connection()");
    begin
}
