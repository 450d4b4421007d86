//! The replica's connection sets: the request pool, the limiters' store, the background pool,
//! each with its settings, directly to the server or through a transaction pooler.

use std::time::Duration;

use ratebudget::{Statements, Store};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::config::{Config, Pooler};
use crate::observation::metrics::Metrics;

/// Reports each connection set's usage on `/metrics`: `api` (the request pool), `limiter`
/// (the take connections, which also know how many takes wait) and `background`.
pub(super) fn watch_pools(metrics: &Metrics, (api, limiter, background): &(PgPool, Store, PgPool)) {
    let in_use = |pool: &PgPool| pool.size() as usize - pool.num_idle();
    let api = api.clone();
    metrics.watch_pool("api", move || (in_use(&api), None));
    let limiter = limiter.clone();
    metrics.watch_pool("limiter", move || {
        let (in_use, waiting) = limiter.connections_in_use_and_waiting();
        (in_use, Some(waiting))
    });
    let background = background.clone();
    metrics.watch_pool("background", move || (in_use(&background), None));
}

/// The pool request paths use for the contexts' own tables (secrets, credentials, batches).
/// Its acquire timeout bounds how long a request waits for a connection (sqlx would wait
/// 30 s), and a statement timeout bounds what runs on one, so a request answers 500 instead of
/// hanging while the database does not answer. Commits are synchronous: these writes are
/// records that must survive a crash.
pub(super) fn request_pool(config: &Config) -> PgPool {
    pool(config, "plexsphere-api", &[])
}

/// The pool the limiters' store is built on. Its commits are asynchronous
/// (`synchronous_commit = off`, docs/adr/0004): a database crash can lose at most the last few
/// hundred milliseconds of debits, which can only over-admit briefly and never refuses
/// wrongly, and in exchange takes do not wait for a WAL flush. It must never serve the
/// context repositories, whose writes are records.
fn limiter_pool(config: &Config) -> PgPool {
    pool(config, "plexsphere-limiter", &limiter_settings(config))
}

/// The limiters' session settings: asynchronous commits unless told otherwise (docs/adr/0004).
fn limiter_settings(config: &Config) -> [(&'static str, &'static str); 1] {
    [("synchronous_commit", config.database.limiter_synchronous_commit.as_str())]
}

/// The limiters' store on its pool; behind a transaction pooler each take runs in a
/// transaction of its own, with the pool's settings as `SET LOCAL`s.
pub(super) fn limiter_store(config: &Config) -> Store {
    let store = Store::new(limiter_pool(config)).with_coalescing(config.budgets.coalescing);
    match config.database.pooler {
        Pooler::None => store,
        Pooler::Transaction => {
            let timeout = config.database.timeout.as_millis().to_string();
            let [commit] = limiter_settings(config);
            store.through_transaction_pooler(&[("statement_timeout", timeout.as_str()), commit])
        }
    }
}

fn pool(config: &Config, application_name: &str, settings: &[(&str, &str)]) -> PgPool {
    let statement_timeout_ms = config.database.timeout.as_millis().to_string();
    let mut server_settings = vec![("statement_timeout", statement_timeout_ms.as_str())];
    server_settings.extend_from_slice(settings);
    pool_of(
        config,
        application_name,
        config.database.max_connections,
        config.database.timeout,
        &server_settings,
    )
}

/// A pool of `size` connections to `DATABASE_URL` with `settings`. To the server itself, the
/// settings are startup parameters. Through a transaction pooler (see [`through_pooler`])
/// each use of a connection is one transaction: `BEGIN`, the settings as `SET LOCAL`s and
/// `plexsphere.check_out_server_connection()` (a server that cannot take a write refused, the
/// statements sqlx left on the server connection forgotten) when it is handed out, `COMMIT`
/// before its statement answers or when it comes back, so every statement of a use runs on one
/// server connection, on a primary (`ratebudget::transaction_begin`).
pub(super) fn pool_of(
    config: &Config,
    application_name: &str,
    size: u32,
    acquire_timeout: Duration,
    settings: &[(&str, &str)],
) -> PgPool {
    let options = through_pooler(
        config,
        (*config.database.url)
            .clone()
            .application_name(application_name)
            .log_statements(tracing::log::LevelFilter::Trace),
        settings,
    );
    use sqlx::Executor as _;
    let pool = PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(acquire_timeout)
        // A broken connection fails its statement and is replaced; pinging every connection
        // before each use would add a round trip to every request to catch that earlier.
        .test_before_acquire(false);
    match config.database.pooler {
        // No connection is kept to a server that cannot take a write: a DNS name moved to a
        // promoted standby leaves connections made before it where they were (ADR 0033).
        Pooler::None => pool
            .after_connect(|connection, _| {
                Box::pin(
                    async move { connection.execute(ratebudget::REFUSE_READ_ONLY_SERVER).await.map(|_| ()) },
                )
            })
            .connect_lazy_with(options),
        Pooler::Transaction => {
            ratebudget::through_transaction_pooler(pool, settings).connect_lazy_with(options)
        }
    }
}

/// `pool` for the repositories: behind a transaction pooler, each statement's transaction
/// (which `pool_of`'s hooks open) is committed before it answers ([`Statements`]).
pub(super) fn statements(config: &Config, pool: &PgPool) -> Statements {
    match config.database.pooler {
        Pooler::None => Statements::new(pool.clone()),
        Pooler::Transaction => Statements::through_transaction_pooler(pool.clone()),
    }
}

/// `options` with `settings` as startup parameters, as the server takes them; through a
/// transaction pooler, without them (PgBouncer refuses the `options` parameter, and a session
/// setting would not follow a client from one server connection to the next) and without
/// keeping prepared statements (the next transaction may run on a server connection that
/// never prepared them).
fn through_pooler(config: &Config, options: PgConnectOptions, settings: &[(&str, &str)]) -> PgConnectOptions {
    match config.database.pooler {
        Pooler::None => options.options(settings.iter().copied()),
        Pooler::Transaction => options.statement_cache_capacity(0),
    }
}
