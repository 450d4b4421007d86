//! What each `plexsphere` command does; `main.rs` only parses arguments and dispatches here.

use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context as _;
use audit::AuditLog as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::config::{self, Config};
use crate::startup::{Application, Wiring};

/// `plexsphere serve`: runs one replica until SIGTERM or SIGINT, migrating first unless told not to.
///
/// # Errors
/// When the database cannot be migrated or the listener cannot be bound.
pub async fn serve(config: Config, migrate_first: bool) -> anyhow::Result<()> {
    let development_key = secrets::SecretsKey::from_base64(config::DEVELOPMENT_SECRETS_KEY)
        .expect("the development key is a key");
    if config.keyring.current_key_id() == development_key.id() {
        tracing::warn!(
            "{} is the README's development key: anyone can open these secrets; never use it in production",
            config::SECRETS_KEY
        );
    }
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

/// `plexsphere secrets rekey`: re-seals under the current key, `batch_size` at a time, every
/// secret sealed under an old key or written in plain text before sealing, printing each
/// batch. It can run beside serving replicas (a value a replica writes meanwhile is left as
/// that write sealed it), and a rekey that stopped resumes from the start harmlessly.
///
/// # Errors
/// When the database does not answer, or a value does not open: its key is in neither knob.
pub async fn rekey_secrets(
    database: PgConnectOptions,
    keyring: secrets::Keyring,
    batch_size: usize,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    anyhow::ensure!(batch_size > 0, "the batch size must be at least 1");
    let pool = connect(database).await?;
    let current = keyring.current_key_id().clone();
    let service = secrets::SecretsService::new(
        Arc::new(secrets::PgSecretRepository::new(pool.clone())),
        Arc::new(NoReads),
        Arc::new(keyring),
    );
    let (mut resealed, mut from_plaintext, mut replaced) = (0, 0, 0);
    let mut after = None;
    for batch_number in 1.. {
        let batch = service.rekey_batch(after.as_ref(), batch_size).await.map_err(|error| {
            let hint = match error {
                secrets::RekeyError::Unreadable { .. } => format!(
                    "; list the key that sealed it in {} (or {} if it is the current one)",
                    config::SECRETS_OLD_KEYS,
                    config::SECRETS_KEY
                ),
                secrets::RekeyError::Unavailable(_) => String::new(),
            };
            anyhow::Error::new(error).context(format!("re-sealing stopped in batch {batch_number}{hint}"))
        })?;
        writeln!(
            out,
            "batch {batch_number}: {} re-sealed from old keys, {} sealed from plain text, {} written meanwhile",
            batch.resealed, batch.sealed_from_plaintext, batch.replaced_meanwhile
        )?;
        resealed += batch.resealed;
        from_plaintext += batch.sealed_from_plaintext;
        replaced += batch.replaced_meanwhile;
        after = batch.next;
        if after.is_none() {
            break;
        }
    }
    let entry = audit::NewEntry {
        actor: audit::Actor::command_line(),
        action: audit::Action::RekeySecrets,
        subject: audit::Subject::default(),
    };
    audit::PgAuditLog::new(pool)
        .record(&entry)
        .await
        .context("failed to record the rekey in the audit log")?;
    writeln!(
        out,
        "every secret is sealed under key {current}: {resealed} re-sealed, {from_plaintext} sealed from plain text, \
         {replaced} written meanwhile; the old keys can be retired"
    )?;
    Ok(())
}

/// The read limiter of a service that only re-seals: it is never asked, and would refuse to
/// answer rather than admit a read nobody budgeted.
struct NoReads;

#[async_trait::async_trait]
impl secrets::Limiter for NoReads {
    async fn spend_read(&self, _: secrets::Reader) -> Result<(), secrets::ReadLimitError> {
        Err(secrets::ReadLimitError::Unavailable("the command line reads no secrets".into()))
    }
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
