//! Building and running one replica: pools, adapters bound to ports, HTTP, leader and loops.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ratebudget::{Clock, Decider, Guard, Spender, Store};
use rules::{PgRulesRepository, RulesService};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use access::CredentialCache;
use ratebudget::cause_chain;
use ratebudget::discipline::{self, ClockStatus};
use rules::{RuleRefs, Usage};
use service::{DecideService, Operations, Replica, RuleBudgets, Sources};

use crate::config::Config;
use crate::edge::database_time::DatabaseTime;
use crate::edge::throttle::AuthThrottle;
use crate::edge::tokens::{DecideTokens, OperatorTokens};
use crate::grpc;
use crate::http::{self, AppState, Handles};
use crate::observation::fill::FillHistory;
use crate::observation::metrics::Metrics;
use crate::observation::observer::DecisionObserver;
use crate::observation::otlp::OtlpExport;
use crate::runtime::followers::{self, QuotaRebalances, Resets, Revocations, SecretChanges};
use crate::runtime::leader::{self, LeaderLookup, LeaderTiming, Leadership};
use crate::runtime::readiness::Readiness;
use crate::runtime::{listener, rules_dir, sweep};

mod adapters;
mod pools;

use adapters::{bind_ingest, bind_secrets};
use pools::{limiter_store, pool_of, request_pool, statements, watch_pools};

/// How many Node credentials a replica keeps authenticated at once.
const CREDENTIAL_CACHE_CAPACITY: usize = 100_000;

/// The background pool's size: the sweep holds one while it runs, and the clock check, the
/// rules' poll and reloads and the usage flush take one briefly. The listener and the leader
/// elector hold one connection each of their own, outside it.
const BACKGROUND_CONNECTIONS: u32 = 4;

/// Between two attempts at the first load of the rules and tiers.
const STARTUP_LOAD_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Where a replica's decisions get their time from.
#[derive(Clone, Debug)]
pub enum TimeSource {
    /// The database's clock, measured and anchored (production; [`ratebudget::discipline`]).
    Database,
    /// A clock a test drives; it is neither measured nor gated.
    Given(Arc<dyn Clock>),
}

/// What a test may vary that an operator never sets.
#[derive(Clone, Debug)]
pub struct Wiring {
    /// Where limiters and the sweep read `now`.
    pub time: TimeSource,
    /// How often the leader elector acts.
    pub leader_timing: LeaderTiming,
}

impl Wiring {
    /// The production wiring: the database's clock and the standard leader timing.
    pub fn production() -> Wiring {
        Wiring { time: TimeSource::Database, leader_timing: LeaderTiming::STANDARD }
    }
}

/// The clock limiters and the sweep read, whether it may be decided with, and the task that
/// measures it (for a given clock, one that only waits for shutdown).
struct Time {
    clock: Arc<dyn Clock>,
    status: ClockStatus,
    task: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// One running replica.
pub struct Application {
    local_addr: SocketAddr,
    grpc_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    leadership: Leadership,
    metrics: Metrics,
    tasks: Tasks,
    limiter_store: Store,
    otlp: Option<OtlpExport>,
}

/// A replica's long-running tasks, by name, in the order shutdown waits for them, and word of
/// the first that ends on its own.
///
/// Shutdown waits for them one after another rather than as a set: the HTTP server first
/// (requests in flight finish), the sweeper before the elector (leadership must outlive the
/// last sweep statement, so a successor never sweeps beside it; the elector then releases the
/// lock on its way out), the usage flusher last (every request has been decided, so its last
/// flush counts them all).
struct Tasks {
    running: Vec<(&'static str, JoinHandle<()>)>,
    ended: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
    tell: tokio::sync::mpsc::UnboundedSender<&'static str>,
}

impl Tasks {
    fn new() -> Tasks {
        let (tell, ended) = tokio::sync::mpsc::unbounded_channel();
        Tasks { running: Vec::new(), ended, tell }
    }

    /// Runs `task` as `name`; shutdown waits for it after those added before it.
    fn add(&mut self, name: &'static str, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let tell = self.tell.clone();
        let handle = tokio::spawn(async move {
            task.await;
            let _ = tell.send(name);
        });
        self.running.push((name, handle));
    }

    /// The name of the first task to end, once one does.
    async fn first_ended(&mut self) -> &'static str {
        self.ended.recv().await.unwrap_or("every task")
    }

    /// Waits for every task, in order; the names of those that panicked.
    async fn wait_in_order(self) -> Vec<&'static str> {
        let mut panicked = Vec::new();
        for (name, handle) in self.running {
            if handle.await.is_err() {
                panicked.push(name);
            }
        }
        panicked
    }
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
        let store = limiter_store(&config);
        let rule_refs = RuleRefs::default();
        let usage = Arc::new(Usage::default());
        let fill = FillHistory::new();
        // Background work gets a pool of its own so it never takes a request's connection:
        // the sweep (which holds one while it runs), and the clock discipline, the rules' poll
        // and reloads, and the usage flush, which are short.
        let background_pool = pool_of(
            &config,
            "plexsphere-background",
            BACKGROUND_CONNECTIONS,
            Duration::from_secs(10),
            // The sweep bounds each batch itself; this stops the server's side too.
            &[("statement_timeout", "10000")],
        );
        // The repositories' statements answer once committed, behind a pooler too.
        let (api_statements, background_statements) =
            (statements(&config, &api_pool), statements(&config, &background_pool));
        let time = match &wiring.time {
            TimeSource::Given(clock) => Time {
                clock: clock.clone(),
                status: ClockStatus::always_trusted(),
                task: Box::pin(shutdown.clone().cancelled_owned()),
            },
            TimeSource::Database => {
                let (clock, status) = discipline::disciplined(config.budgets.max_clock_skew);
                // On the background pool: one short statement every few seconds, never
                // behind a request.
                let offsets = metrics.clone();
                let task = Box::pin(discipline::run(
                    clock.clone(),
                    background_pool.clone(),
                    move |offset| offsets.set_clock_offset(offset),
                    shutdown.clone().cancelled_owned(),
                ));
                Time { clock: Arc::new(clock), status, task }
            }
        };
        let guard = Arc::new(
            Guard::builder(store.clone())
                .leases(config.budgets.lease_period.unwrap_or_default())
                .decision_timeout(config.budgets.decision_timeout)
                .trusted_only(time.status.clone())
                .observer(Arc::new(DecisionObserver::new(
                    metrics.clone(),
                    usage.clone(),
                    rule_refs.clone(),
                    fill.clone(),
                )))
                .build(),
        );
        let rule_budgets =
            Arc::new(RuleBudgets::new(config.budgets.defaults, guard.clone(), rule_refs.clone()));
        // Takes decide through the guard (which decides nothing while the clock cannot be
        // trusted), then the store, each sized by the rules (or the knobs) at the moment it is
        // made.
        let decider: Arc<dyn Decider> = guard.clone();
        let credentials = CredentialCache::new(CREDENTIAL_CACHE_CAPACITY);
        let secret_cache = secrets::SecretCache::new(config.secrets.cache_capacity);
        let spender = Spender::new(decider.clone(), time.clock.clone(), rule_budgets.clone());
        let issuance: Arc<dyn access::Limiter> =
            Arc::new(access::RateBudgetIssuanceLimiter::new(spender.clone()));
        let decide = DecideService::new(
            rule_budgets.clone(),
            spender.clone(),
            time.clock.clone(),
            Arc::new(metrics.clone()),
        );
        let sources = Sources {
            rules: RulesService::new(Arc::new(PgRulesRepository::new(background_statements.clone()))),
            access: access::AccessService::new(
                Arc::new(access::PgAccessRepository::new(background_statements.clone())),
                issuance.clone(),
            ),
        };
        // Nothing is decided before the rules and tiers are loaded. Loading them here means a
        // replica that can reach the database serves decisions from its first request; one
        // that cannot starts anyway (answering /healthz) and its listener loads them later.
        // A busy server can take longer than one database time to answer a replica's first
        // statements (its connections are new), so the load is tried again, a tenth of a
        // second apart, for up to three database times in all: a replica that started without
        // its rules answered 500 to every decision until the listener loaded them (seen in CI,
        // two cores running the whole suite).
        let loading_since = tokio::time::Instant::now();
        loop {
            let failure =
                match tokio::time::timeout(config.database.timeout, rule_budgets.reload(&sources)).await {
                    Ok(Ok(())) => break,
                    Ok(Err(error)) => {
                        format!("cannot load the rate-budget rules yet: {}", cause_chain(error.as_ref()))
                    }
                    Err(_) => "the rate-budget rules did not load in time".to_owned(),
                };
            if loading_since.elapsed() + STARTUP_LOAD_PAUSE >= config.database.timeout * 3 {
                tracing::warn!("{failure}; retrying in the background");
                break;
            }
            tracing::info!("{failure}; trying again");
            tokio::time::sleep(STARTUP_LOAD_PAUSE).await;
        }
        // Weak: the budgets hold the guard, whose observer holds the metrics; a strong
        // reference here would be a cycle that keeps every pool the metrics watch open.
        let reading = Arc::downgrade(&rule_budgets);
        metrics.watch_limits(move || reading.upgrade().map(|budgets| budgets.reading()).unwrap_or_default());
        let decide_tokens = DecideTokens::new(&config.auth.decide_callers);
        let database_time = DatabaseTime::new(config.database.timeout);
        let api_access = access::AccessService::new(
            Arc::new(access::PgAccessRepository::new(api_statements.clone())),
            issuance,
        );
        let api_rules = RulesService::new(Arc::new(PgRulesRepository::new(api_statements.clone())));
        let audit: Arc<dyn audit::AuditLog> = Arc::new(audit::PgAuditLog::new(api_statements.clone()));
        let operations =
            Operations::new(api_access.clone(), api_rules.clone(), audit.clone(), Arc::new(store.clone()))
                .on_replica(Replica { budgets: rule_budgets.clone(), precheck: guard.clone() });
        let rules_dir_operations = operations.clone();
        // Bound before the state is made: the allocator names this replica by its address, and
        // the operator routes list its shares.
        let listener = tokio::net::TcpListener::bind(config.http.listen)
            .await
            .with_context(|| format!("failed to listen on {}", config.http.listen))?;
        let local_addr = listener.local_addr()?;
        let grpc_listener = match config.grpc_listen {
            Some(address) => Some(
                grpc::bind(address)
                    .await
                    .with_context(|| format!("failed to listen for gRPC on {address}"))?,
            ),
            None => None,
        };
        let grpc_addr = grpc_listener.as_ref().map(tokio::net::TcpListener::local_addr).transpose()?;
        // RLQS shares are counted on the API's statements: one a report of a bucket, by every
        // replica alike, each holder named by its stream and the replica by its gRPC address.
        let quota = service::quota::QuotaService::new(
            rule_budgets.clone(),
            Arc::new(crate::quota_store::PgQuotaStore::new(api_statements.clone())),
            Arc::new(metrics.clone()),
            config.quota,
            grpc_addr.map_or_else(|| local_addr.to_string(), |address| address.to_string()),
        );
        let quota_for_sweep = quota.clone();
        let state = AppState::new(Handles {
            access: api_access,
            secrets: bind_secrets(&config, &api_statements, &spender, &secret_cache),
            ingest: bind_ingest(&api_statements, &spender),
            store: store.clone(),
            operations,
            guard: guard.clone(),
            operator_tokens: OperatorTokens::new(&config.auth.operators),
            decide_tokens: decide_tokens.clone(),
            decide: decide.clone(),
            audit,
            credentials: credentials.clone(),
            readiness: Readiness::new(api_pool.clone(), config.database.timeout),
            throttle: AuthThrottle::new(
                decider.clone(),
                guard.clone(),
                time.clock.clone(),
                config.auth.failures,
                config.auth.trusted_proxies.clone(),
            ),
            database_time,
            ingest_max_batch_bytes: config.ingest_max_batch_bytes,
            metrics: metrics.clone(),
            http: config.http,
            clock: time.status.clone(),
            decision_clock: time.clock.clone(),
            rules: api_rules,
            rule_budgets: rule_budgets.clone(),
            fill,
            leader: LeaderLookup::new(api_pool.clone()),
            quota: quota.clone(),
        });

        let state_pools = (api_pool, store.clone(), background_pool.clone());
        let callers = grpc::Callers::new(decide_tokens, state.throttle.clone());
        let grpc_server = grpc::RateLimitServer::new(decide, callers.clone(), database_time);
        // Buckets to decide again now, heard by the listener from any replica's reports.
        let (rebalances, _) = tokio::sync::broadcast::channel(1024);
        let quota_server = grpc::quota::QuotaServer::new(
            quota,
            callers,
            Arc::new(metrics.clone()),
            rebalances.clone(),
            shutdown.clone(),
        );
        // After the bind, the other step that can fail, and before the loops start: an export
        // dropped by a failed build would push once more, blocking the runtime meanwhile.
        let otlp = config
            .otlp
            .as_ref()
            .map(|otlp| OtlpExport::start(otlp, metrics.clone()))
            .transpose()
            .context("failed to start the OTLP metrics export")?;
        let mut tasks = Tasks::new();
        // In-flight requests finish (within the grace) before this returns.
        tasks.add(
            "the HTTP server",
            http::server::serve(
                listener,
                http::router(state),
                config.http,
                config.shutdown_grace,
                shutdown.clone(),
            ),
        );

        watch_pools(&metrics, &state_pools);
        let (leadership, elector) = leader::elector(
            (*config.database.session_url).clone(),
            wiring.leader_timing,
            metrics.clone(),
            shutdown.clone(),
        );
        let (mut followers, hearing) = followers::rules_and_tiers();
        followers.push(Box::new(Resets(guard.clone())));
        followers.push(Box::new(Revocations { cache: credentials, metrics: metrics.clone() }));
        followers.push(Box::new(SecretChanges(secret_cache, metrics.clone())));
        followers.push(Box::new(QuotaRebalances(rebalances.clone())));
        let rules = service::follow(
            rule_budgets.clone(),
            sources.clone(),
            hearing,
            config.budgets.rules_poll_interval,
            shutdown.clone(),
        );
        let flushes = metrics.clone();
        let usage = rules::flush_every(
            usage,
            rule_refs,
            sources.rules.clone(),
            config.budgets.rule_usage_flush_interval,
            move |flushed| flushes.usage_flush(flushed),
            shutdown.clone().cancelled_owned(),
        );
        tasks.add(
            sweep::LOOP_NAME,
            sweep::run(
                // The snapshot must have been confirmed current within two polls for the sweep
                // to judge by it how long other services' buckets take to refill.
                (
                    Store::new(background_pool),
                    sources.rules,
                    rule_budgets.clone(),
                    config.budgets.rules_poll_interval * 2,
                ),
                (time.clock.clone(), time.status.clone()),
                leadership.clone(),
                metrics.clone(),
                config.budgets.sweep_interval,
                shutdown.clone(),
            ),
        );
        tasks.add(
            crate::runtime::quota_sweep::LOOP_NAME,
            crate::runtime::quota_sweep::run(
                quota_for_sweep,
                leadership.clone(),
                config.budgets.sweep_interval,
                shutdown.clone(),
            ),
        );
        if let Some(directory) = config.budgets.rules_dir.clone() {
            tasks.add(
                rules_dir::LOOP_NAME,
                rules_dir::run(
                    directory,
                    rules_dir_operations,
                    leadership.clone(),
                    metrics.clone(),
                    config.budgets.rules_dir_interval,
                    shutdown.clone(),
                ),
            );
        }
        tasks.add("the leader elector", elector);
        tasks.add("the clock discipline", time.task);
        tasks.add(
            "the listener",
            listener::run((*config.database.session_url).clone(), followers, shutdown.clone()),
        );
        tasks.add("the rule and tier follower", rules);
        if let Some(period) = config.budgets.lease_period {
            tasks.add(
                "the lease return",
                return_leases(guard.clone(), time.clock.clone(), period, shutdown.clone()),
            );
        }
        tasks.add("the rule usage flusher", usage);
        if let Some(grpc_listener) = grpc_listener {
            tasks.add(
                "the gRPC server",
                grpc::serve(grpc_listener, grpc_server, quota_server, shutdown.clone()),
            );
        }
        tracing::info!(%local_addr, ?grpc_addr, "serving");
        Ok(Application {
            local_addr,
            grpc_addr,
            shutdown,
            leadership,
            metrics,
            tasks,
            limiter_store: store,
            otlp,
        })
    }

    /// The address Envoy's rate limit service protocol is served on, if it is.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
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
    /// When the HTTP server task panicked.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Application { shutdown, mut tasks, limiter_store, otlp, .. } = self;
        tokio::select! {
            // Shutdown first: once it is cancelled every task ends, and that is not news.
            biased;
            () = shutdown.cancelled() => {}
            task = tasks.first_ended() => tracing::error!(task, "a task stopped on its own; stopping the replica"),
        }
        shutdown.cancel();
        let panicked = tasks.wait_in_order().await;
        // Every decision is counted: the collector gets the last counts.
        if let Some(otlp) = otlp {
            otlp.stop().await;
        }
        // No request is in flight any more: say goodbye to the server on the take connections.
        limiter_store.close().await;
        anyhow::ensure!(panicked.is_empty(), "tasks panicked: {}", panicked.join(", "));
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

/// Gives back, every lease period, what this replica's expired leases did not grant
/// (docs/adr/0034), until `shutdown`; a bucket still hot gives back with its next lease.
async fn return_leases(
    guard: Arc<Guard>,
    clock: Arc<dyn Clock>,
    period: Duration,
    shutdown: CancellationToken,
) {
    let mut every = tokio::time::interval(period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        guard.return_leases(clock.now()).await;
    }
}
