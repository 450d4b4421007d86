//! What each `plexsphere` command does; `main.rs` only parses arguments and dispatches here.

use std::io::Write;
use std::str::FromStr;

use anyhow::Context as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::config::{self, Config};
use crate::startup::{Application, Wiring};

/// `plexsphere serve`: runs one replica until SIGTERM or SIGINT, migrating first unless told not to.
///
/// # Errors
/// When the database cannot be migrated or the listener cannot be bound.
pub async fn serve(config: Config, migrate_first: bool) -> anyhow::Result<()> {
    if migrate_first {
        let pool = connect(config.database.clone()).await?;
        migrate_pool(&pool).await?;
        pool.close().await;
    }
    let application = Application::build(config, Wiring::production()).await?;
    let shutdown = application.shutdown_token();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        shutdown.cancel();
    });
    application.run_until_stopped().await
}

/// `plexsphere migrate`: applies every pending migration.
///
/// # Errors
/// When the database cannot be reached or a migration fails.
pub async fn migrate(database: PgConnectOptions) -> anyhow::Result<()> {
    let pool = connect(database).await?;
    migrate_pool(&pool).await
}

/// `plexsphere budgets show <key>`: every scope's bucket of one Node or Domain, as stored.
///
/// # Errors
/// When the database does not answer.
pub async fn show_budgets(
    database: PgConnectOptions,
    key: uuid::Uuid,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let pool = connect(database).await?;
    let buckets =
        ratebudget::Store::new(pool).buckets(key.into()).await.context("failed to read the budgets")?;
    if buckets.is_empty() {
        writeln!(out, "no buckets for {key}: every budget of it is full (the next take mints the bucket)")?;
        return Ok(());
    }
    writeln!(out, "{:<24} {:>16}  refilled_at", "scope", "tokens")?;
    for bucket in buckets {
        writeln!(
            out,
            "{:<24} {:>16.3}  {}",
            bucket.scope.as_str(),
            bucket.tokens,
            bucket.refilled_at.to_rfc3339()
        )?;
    }
    Ok(())
}

/// `plexsphere budgets reset <scope> <key>`: forgets one bucket; every replica's pre-check
/// hears of it and the next take mints the bucket full.
///
/// # Errors
/// When the database does not answer.
pub async fn reset_budget(
    database: PgConnectOptions,
    scope: ratebudget::Scope,
    key: uuid::Uuid,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let pool = connect(database).await?;
    let existed =
        ratebudget::Store::new(pool).reset(scope, key.into()).await.context("failed to reset the budget")?;
    if existed {
        writeln!(out, "reset {scope} of {key}: the next take mints it full")?;
    } else {
        writeln!(out, "{scope} of {key} had no bucket (it was full already); replicas were told anyway")?;
    }
    Ok(())
}

/// The one knob the commands other than `serve` need.
#[derive(clap::Args, Clone, Debug)]
pub struct Database {
    /// The PostgreSQL database every replica shares.
    #[arg(long = "database-url", env = config::DATABASE_URL, hide_env_values = true)]
    url: String,
}

impl Database {
    /// The connect options the URL names.
    ///
    /// # Errors
    /// When it is not a PostgreSQL URL.
    pub fn options(&self) -> anyhow::Result<PgConnectOptions> {
        PgConnectOptions::from_str(&self.url)
            .with_context(|| format!("{} is not a PostgreSQL URL", config::DATABASE_URL))
    }
}

async fn connect(database: PgConnectOptions) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(database)
        .await
        .context("failed to connect to the database (DATABASE_URL)")
}

async fn migrate_pool(pool: &PgPool) -> anyhow::Result<()> {
    crate::MIGRATOR.run(pool).await.context("failed to apply migrations")?;
    tracing::info!("migrations applied");
    Ok(())
}

async fn wait_for_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; stopping on SIGINT only");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
