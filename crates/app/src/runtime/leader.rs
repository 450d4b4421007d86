//! Leader election: exactly one replica at a time runs the background loops.
//!
//! The leader is whichever replica holds a PostgreSQL session advisory lock on a connection of
//! its own, outside every pool. The lock lives exactly as long as that session, so a replica
//! that dies (or whose session the server drops) releases it without anyone's help, and no
//! lease table, heartbeat column or clock comparison is needed. docs/adr/0003 says why.
//!
//! Advisory-lock keys taken by this process (one bigint each, `pg_try_advisory_lock(key)`):
//!
//! | key | guards |
//! |---|---|
//! | [`LEADER_LOCK_KEY`] (`0x706c_6578_7370_6801`) | the background loops: `rate-budget-sweep` |
//!
//! sqlx's migrator takes a lock of its own while migrating; it derives its key from the
//! database name, so it cannot collide with this one in practice.
//!
//! Timing ([`LeaderTiming::STANDARD`]): a follower asks for the lock every 3 s; a leader checks
//! its session every 2 s and gives up leadership when a check fails or takes over 3 s, so a
//! replica cut off from the database stops leading within 5 s of its last answered check. The
//! server drops a cut-off session (and with it the lock) 7 to 8 s after it last heard from the
//! replica, whether the session was idle or had an answer in flight, because the leader's
//! session sets the server's `tcp_user_timeout` beside aggressive keepalives; the next
//! follower's attempt then wins, so a new leader is in place within about 11 s of a silent
//! partition, and at once when the leader shuts down or dies. The old leader always steps down
//! (at most 5 s) before the server can free the lock (at least 7 s): no two leaders overlap.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::observation::metrics::Metrics;

/// The advisory-lock key whose holder is the leader: "plexsph" and a serial number.
pub const LEADER_LOCK_KEY: i64 = 0x706c_6578_7370_6801;

/// How often the elector acts, and how long it waits for the database.
#[derive(Clone, Copy, Debug)]
pub struct LeaderTiming {
    /// How often a follower asks for the lock (and retries a lost connection).
    pub retry: Duration,
    /// How often a leader checks that its session is alive.
    pub ping: Duration,
    /// How long any one statement (or the connection itself) may take before it counts as lost.
    pub timeout: Duration,
}

impl LeaderTiming {
    /// The production timing; see the module documentation for what it guarantees.
    pub const STANDARD: LeaderTiming = LeaderTiming {
        retry: Duration::from_secs(3),
        ping: Duration::from_secs(2),
        timeout: Duration::from_secs(3),
    };
}

/// A view of whether this replica leads right now; cheap to clone.
#[derive(Clone, Debug)]
pub struct Leadership {
    leading: watch::Receiver<bool>,
}

impl Leadership {
    /// Whether this replica holds the leader lock right now.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Waits until this replica's leadership is `leading` (returns at once if it already is).
    pub async fn wait_until(&mut self, leading: bool) {
        // The sender lives as long as the elector task; if that is gone, nobody leads.
        let _ = self.leading.wait_for(|now| *now == leading).await;
    }
}

/// The elector, to run until `shutdown` is cancelled (it then releases the lock), and the
/// leadership it keeps current.
pub fn elector(
    database: PgConnectOptions,
    timing: LeaderTiming,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> (Leadership, impl std::future::Future<Output = ()> + Send + 'static) {
    let (tell, leading) = watch::channel(false);
    let elector = Elector { database: leader_session_options(database), timing, metrics, tell };
    (Leadership { leading }, elector.run(shutdown))
}

/// Who holds the leader lock, as the database's own tables tell it: what the operator page
/// shows beside this replica's own view. Any replica can ask, leader or not.
#[derive(Clone, Debug)]
pub struct LeaderLookup {
    pool: sqlx::PgPool,
}

/// The session holding the leader lock.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderSession {
    /// Its server process id.
    pub pid: i32,
    /// The address the replica connected from (`None` over a Unix socket, or where the
    /// database user may not see other users' sessions).
    pub client_addr: Option<String>,
    /// When the session started: leadership began at most this long ago, and at least a
    /// follower poll after it.
    pub session_started_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The leader lock's holder. An advisory lock on a bigint key is listed in `pg_locks` with the
/// key's high 32 bits as `classid`, its low 32 bits as `objid`, and `objsubid` 1.
const LEADER_HOLDER: &str = "\
SELECT locks.pid, host(activity.client_addr) AS client_addr, activity.backend_start
FROM pg_catalog.pg_locks AS locks
LEFT JOIN pg_catalog.pg_stat_activity AS activity
    ON activity.pid = locks.pid
WHERE locks.locktype = 'advisory'
  AND locks.granted
  AND locks.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND locks.classid = ($1 >> 32)::oid
  AND locks.objid = ($1 & 4294967295)::oid
  AND locks.objsubid = 1";

impl LeaderLookup {
    /// Asks on `pool`.
    pub fn new(pool: sqlx::PgPool) -> LeaderLookup {
        LeaderLookup { pool }
    }

    /// The session holding the leader lock now, or `None` when no replica leads.
    ///
    /// # Errors
    /// When the database does not answer.
    pub async fn holder(&self) -> Result<Option<LeaderSession>, sqlx::Error> {
        let row: Option<(i32, Option<String>, Option<chrono::DateTime<chrono::Utc>>)> =
            sqlx::query_as(LEADER_HOLDER).bind(LEADER_LOCK_KEY).fetch_optional(&self.pool).await?;
        Ok(row.map(|(pid, client_addr, session_started_at)| LeaderSession {
            pid,
            client_addr,
            session_started_at,
        }))
    }
}

/// How long the server keeps the leader's session when the replica stops acknowledging
/// anything: above the 5 s in which a cut-off leader steps down, below the 15 s in which a
/// successor must lead.
pub const SERVER_USER_TIMEOUT_MS: u64 = 7000;

/// The leader's session asks the server to probe its socket every second after 3 s of silence,
/// so the server notices a replica that vanished in seconds rather than after the kernel's
/// two-hour keepalive default; and it sets the server's TCP user timeout, so that data the
/// server sent (an answer to the last check, say) and never saw acknowledged ends the session
/// too, instead of being retransmitted for the kernel's fifteen minutes.
fn leader_session_options(database: PgConnectOptions) -> PgConnectOptions {
    database
        .application_name("plexsphere-leader")
        .options([
            ("tcp_keepalives_idle", "3"),
            ("tcp_keepalives_interval", "1"),
            ("tcp_keepalives_count", "4"),
        ])
        .options([("tcp_user_timeout", SERVER_USER_TIMEOUT_MS)])
        .log_statements(tracing::log::LevelFilter::Trace)
}

struct Elector {
    database: PgConnectOptions,
    timing: LeaderTiming,
    metrics: Metrics,
    tell: watch::Sender<bool>,
}

/// Where the elector stands; [`Elector::step`] is the whole state machine.
enum State {
    /// No session. Connect, retrying every `retry`; once connected, compete for the lock no
    /// sooner than `compete_after`.
    Disconnected { compete_after: Instant },
    /// A session that does not hold the lock. Ask for it every `retry`, from `compete_after`
    /// on.
    Following { session: PgConnection, compete_after: Instant },
    /// A session that holds the lock: this replica leads. Check the session every `ping`.
    Leading { session: PgConnection },
}

/// What the elector does after a step: go on at once, or wait first.
enum Next {
    Now,
    After(Duration),
}

/// Why a statement on the leader's session did not answer.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("the database failed")]
    Database(#[from] sqlx::Error),
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
}

impl Elector {
    async fn run(self, shutdown: CancellationToken) {
        let mut state = State::Disconnected { compete_after: Instant::now() };
        let mut outage_logged = false;
        loop {
            let next;
            (state, next) = self.step(state, &mut outage_logged).await;
            if let Next::After(wait) = next {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(wait) => {}
                }
            } else if shutdown.is_cancelled() {
                break;
            }
        }
        if let State::Leading { session } = state {
            self.resign(session).await;
        }
    }

    /// One transition of the state machine.
    async fn step(&self, state: State, outage_logged: &mut bool) -> (State, Next) {
        let retry = Next::After(self.timing.retry);
        match state {
            State::Disconnected { compete_after } => {
                match self.bounded(PgConnection::connect_with(&self.database)).await {
                    Ok(session) => (State::Following { session, compete_after }, Next::Now),
                    Err(error) => {
                        // One line per outage, not one per retry.
                        if !*outage_logged {
                            tracing::warn!(%error, "leader elector cannot reach the database; retrying");
                            *outage_logged = true;
                        }
                        (State::Disconnected { compete_after }, retry)
                    }
                }
            }
            State::Following { session, compete_after } if Instant::now() < compete_after => {
                (State::Following { session, compete_after }, retry)
            }
            State::Following { mut session, compete_after } => {
                // Advisory locks work on a hot standby too, so a replica whose session URL
                // still names a standby (a failover's DNS name not yet moved) would lead beside
                // the one on the primary: a standby's session competes for nothing.
                let attempt = sqlx::query_scalar::<_, Option<bool>>(
                    "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE pg_try_advisory_lock($1) END",
                )
                .bind(LEADER_LOCK_KEY)
                .fetch_one(&mut session);
                let attempt = self.bounded(attempt).await;
                if let Ok(Some(_)) = attempt {
                    // A primary answered: the next outage, or standby, is news again.
                    *outage_logged = false;
                }
                match attempt {
                    Ok(Some(true)) => {
                        tracing::info!("became leader");
                        self.announce(true);
                        (State::Leading { session }, Next::Now)
                    }
                    Ok(Some(false)) => (State::Following { session, compete_after }, retry),
                    Ok(None) => {
                        if !*outage_logged {
                            tracing::warn!(
                                "leader elector reached a standby, not the primary; connecting again"
                            );
                            *outage_logged = true;
                        }
                        // Another connection, to wherever the name points by then.
                        (State::Disconnected { compete_after }, retry)
                    }
                    Err(error) => {
                        tracing::warn!(%error, "leader election failed; reconnecting");
                        (State::Disconnected { compete_after }, retry)
                    }
                }
            }
            State::Leading { mut session } => {
                match self.bounded(sqlx::query("SELECT 1").execute(&mut session)).await {
                    Ok(_) => (State::Leading { session }, Next::After(self.timing.ping)),
                    Err(error) => {
                        tracing::warn!(%error, "lost leadership: the leader session stopped answering");
                        self.announce(false);
                        // Sit out two polls before competing again, so a healthy follower takes
                        // over rather than a flaky leader winning the lock back at once.
                        let compete_after = Instant::now() + 2 * self.timing.retry;
                        (State::Disconnected { compete_after }, Next::Now)
                    }
                }
            }
        }
    }

    /// Gives the lock up on the way out, so a successor can lead at once.
    async fn resign(&self, mut session: PgConnection) {
        self.announce(false);
        let unlock = sqlx::query("SELECT pg_advisory_unlock($1)").bind(LEADER_LOCK_KEY).execute(&mut session);
        match self.bounded(unlock).await {
            Ok(_) => tracing::info!("released leadership"),
            Err(error) => tracing::warn!(%error, "could not release leadership; the session's end will"),
        }
        let _ = self.bounded(session.close()).await;
    }

    fn announce(&self, leading: bool) {
        self.metrics.set_leader(leading);
        self.tell.send_replace(leading);
    }

    /// Runs one database call, turning a hang into an error after the timeout.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, SessionError> {
        match tokio::time::timeout(self.timing.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(SessionError::TimedOut(self.timing.timeout)),
        }
    }
}
