//! Building and running one replica: pools, adapters bound to ports, HTTP, leader and loops.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ratebudget::{Clock, Decider, Spender, Store, SystemClock};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http::{self, AppState, CredentialCache, OperatorTokens};
use crate::leader::{self, LeaderTiming, Leadership};
use crate::limits::{MeteredIssuanceLimiter, MeteredQuotaLimiter, MeteredReadLimiter};
use crate::metrics::Metrics;
use crate::{revocations, sweep};

/// How many Node credentials a replica keeps authenticated at once.
const CREDENTIAL_CACHE_CAPACITY: usize = 100_000;

/// What a test may vary that an operator never sets.
#[derive(Clone, Debug)]
pub struct Wiring {
    /// Where limiters and the sweep read `now`.
    pub clock: Arc<dyn Clock>,
    /// How often the leader elector acts.
    pub leader_timing: LeaderTiming,
}

impl Wiring {
    /// The production wiring: the system clock and the standard leader timing.
    pub fn production() -> Wiring {
        Wiring { clock: Arc::new(SystemClock), leader_timing: LeaderTiming::STANDARD }
    }
}

/// One running replica.
pub struct Application {
    local_addr: SocketAddr,
    shutdown: CancellationToken,
    leadership: Leadership,
    metrics: Metrics,
    server: JoinHandle<std::io::Result<()>>,
    elector: JoinHandle<()>,
    sweeper: JoinHandle<()>,
    revocations: JoinHandle<()>,
    limiter_store: Store,
}

impl Application {
    /// Binds the listener, builds the pools (lazily: the process starts and answers
    /// `/healthz` even while the database is down) and starts serving, electing and sweeping.
    ///
    /// # Errors
    /// When the listen address cannot be bound.
    pub async fn build(config: Config, wiring: Wiring) -> anyhow::Result<Application> {
        let metrics = Metrics::new();
        let shutdown = CancellationToken::new();

        let api_pool = request_pool(&config);
        let store = Store::new(limiter_pool(&config));
        let decider: Arc<dyn Decider> = Arc::new(store.clone());
        // The sweep gets a pool of its own so a long sweep never takes a request's connection.
        let background_pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(
                config
                    .database
                    .clone()
                    .application_name("plexsphere-background")
                    // The sweep bounds each batch itself; this stops the server's side too.
                    .options([("statement_timeout", "10000")]),
            );
        let credentials = CredentialCache::new(CREDENTIAL_CACHE_CAPACITY);
        let state = AppState {
            access: bind_access(&config, &api_pool, &decider, &wiring, &metrics),
            secrets: bind_secrets(&config, &api_pool, &decider, &wiring, &metrics),
            ingest: bind_ingest(&config, &api_pool, &decider, &wiring, &metrics),
            budgets: store.clone(),
            operator_tokens: OperatorTokens::new(&config.operators),
            audit: Arc::new(audit::PgAuditLog::new(api_pool.clone())),
            credentials: credentials.clone(),
            readiness: api_pool,
            database_timeout: config.database_timeout,
            ingest_max_batch_bytes: config.ingest_max_batch_bytes,
            metrics: metrics.clone(),
        };

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("failed to listen on {}", config.listen))?;
        let local_addr = listener.local_addr()?;
        let server = tokio::spawn({
            let shutdown = shutdown.clone();
            // In-flight requests finish before this returns.
            axum::serve(listener, http::router(state))
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .into_future()
        });

        let (leadership, elector) =
            leader::spawn(config.database.clone(), wiring.leader_timing, metrics.clone(), shutdown.clone());
        let sweeper = tokio::spawn(sweep::run(
            Store::new(background_pool),
            wiring.clock.clone(),
            leadership.clone(),
            metrics.clone(),
            config.sweep_interval,
            shutdown.clone(),
        ));
        let revocations = tokio::spawn(revocations::run(
            config.database.clone(),
            credentials,
            metrics.clone(),
            shutdown.clone(),
        ));
        tracing::info!(%local_addr, "serving");
        Ok(Application {
            local_addr,
            shutdown,
            leadership,
            metrics,
            server,
            elector,
            sweeper,
            revocations,
            limiter_store: store,
        })
    }

    /// The address the API listens on (useful when the configured port was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether this replica leads, now and as it changes.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// This replica's metrics.
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// A token that stops the replica gracefully when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Runs until the shutdown token is cancelled (or a task ends on its own, which is logged
    /// and stops the rest), then waits for in-flight requests and releases leadership.
    ///
    /// # Errors
    /// When the HTTP server failed.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Application {
            shutdown,
            mut server,
            mut elector,
            mut sweeper,
            mut revocations,
            limiter_store,
            ..
        } = self;
        let (mut server_result, mut elector_done, mut sweeper_done, mut revocations_done) =
            (None, false, false, false);
        tokio::select! {
            // Shutdown first: once it is cancelled every task ends, and that is not news.
            biased;
            () = shutdown.cancelled() => {}
            result = &mut server => {
                tracing::error!("the HTTP server stopped on its own");
                server_result = Some(result);
            }
            _ = &mut elector => {
                tracing::error!("the leader elector stopped on its own");
                elector_done = true;
            }
            _ = &mut sweeper => {
                tracing::error!(loop_name = sweep::LOOP_NAME, "the loop stopped on its own");
                sweeper_done = true;
            }
            _ = &mut revocations => {
                tracing::error!("the revocation listener stopped on its own");
                revocations_done = true;
            }
        }
        shutdown.cancel();
        let server_result = match server_result {
            Some(result) => result,
            None => server.await,
        };
        // The sweeper first: leadership must outlive the last sweep statement, so a successor
        // never sweeps beside it. Then the elector releases the lock on its way out; wait for
        // it so a successor can lead at once.
        if !sweeper_done {
            let _ = sweeper.await;
        }
        if !elector_done {
            let _ = elector.await;
        }
        if !revocations_done {
            let _ = revocations.await;
        }
        // No request is in flight any more: say goodbye to the server on the take connections.
        limiter_store.close().await;
        server_result.context("the HTTP server task panicked")?.context("the HTTP server failed")?;
        tracing::info!("stopped");
        Ok(())
    }

    /// Stops the replica gracefully and waits until it has.
    ///
    /// # Errors
    /// As [`Application::run_until_stopped`].
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.run_until_stopped().await
    }
}

/// The pool request paths use for the contexts' own tables (secrets, credentials, batches).
/// Its acquire timeout bounds how long a request waits for a connection (sqlx would wait
/// 30 s), and a statement timeout bounds what runs on one, so a request answers 500 instead of
/// hanging while the database does not answer. Commits are synchronous: these writes are
/// records that must survive a crash.
fn request_pool(config: &Config) -> PgPool {
    pool(config, "plexsphere-api", &[])
}

/// The pool the limiters' store is built on. Its commits are asynchronous
/// (`synchronous_commit = off`, docs/adr/0004): a database crash can lose at most the last few
/// hundred milliseconds of debits, which can only over-admit briefly and never refuses
/// wrongly, and in exchange takes do not wait for a WAL flush. It must never serve the
/// context repositories, whose writes are records.
fn limiter_pool(config: &Config) -> PgPool {
    pool(config, "plexsphere-limiter", &[("synchronous_commit", "off")])
}

fn pool(config: &Config, application_name: &str, settings: &[(&str, &str)]) -> PgPool {
    let statement_timeout_ms = config.database_timeout.as_millis().to_string();
    let mut server_settings = vec![("statement_timeout", statement_timeout_ms.as_str())];
    server_settings.extend_from_slice(settings);
    let options: PgConnectOptions = config
        .database
        .clone()
        .application_name(application_name)
        .options(server_settings)
        .log_statements(tracing::log::LevelFilter::Trace);
    PgPoolOptions::new()
        .max_connections(config.database_max_connections)
        .acquire_timeout(config.database_timeout)
        // A broken connection fails its statement and is replaced; pinging every connection
        // before each use would add a round trip to every request to catch that earlier.
        .test_before_acquire(false)
        .connect_lazy_with(options)
}

fn bind_access(
    config: &Config,
    pool: &PgPool,
    decider: &Arc<dyn Decider>,
    wiring: &Wiring,
    metrics: &Metrics,
) -> access::AccessService {
    let limiter = access::RateBudgetIssuanceLimiter::new(
        Spender::new(decider.clone(), wiring.clock.clone()),
        config.limits.access_issuance,
    );
    access::AccessService::new(
        Arc::new(access::PgAccessRepository::new(pool.clone())),
        Arc::new(MeteredIssuanceLimiter { inner: Arc::new(limiter), metrics: metrics.clone() }),
    )
}

fn bind_secrets(
    config: &Config,
    pool: &PgPool,
    decider: &Arc<dyn Decider>,
    wiring: &Wiring,
    metrics: &Metrics,
) -> secrets::SecretsService {
    let limiter = secrets::RateBudgetReadLimiter::new(
        Spender::new(decider.clone(), wiring.clock.clone()),
        config.limits.secret_read_node,
        config.limits.secret_read_domain,
    );
    secrets::SecretsService::new(
        Arc::new(secrets::PgSecretRepository::new(pool.clone())),
        Arc::new(MeteredReadLimiter { inner: Arc::new(limiter), metrics: metrics.clone() }),
        Arc::new(config.keyring.clone()),
    )
}

fn bind_ingest(
    config: &Config,
    pool: &PgPool,
    decider: &Arc<dyn Decider>,
    wiring: &Wiring,
    metrics: &Metrics,
) -> ingest::IngestService {
    let limiter = ingest::RateBudgetQuotaLimiter::new(
        Spender::new(decider.clone(), wiring.clock.clone()),
        config.limits.ingest_node,
        config.limits.ingest_domain,
    );
    ingest::IngestService::new(
        Arc::new(ingest::PgBatchRepository::new(pool.clone())),
        Arc::new(MeteredQuotaLimiter { inner: Arc::new(limiter), metrics: metrics.clone() }),
    )
}
