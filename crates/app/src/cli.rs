//! The `plexsphere` command line and what each command does; `main.rs` only calls [`main`].
//!
//! It lives in the library so that the integration tests can build the very same binary as a
//! target of their own (tests/Cargo.toml) and run it as a separate process: under SIGTERM,
//! SIGKILL, libfaketime or a network namespace.

use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context as _;
use audit::AuditLog as _;
use clap::{Parser, Subcommand};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::config::{self, Config};
use crate::startup::{Application, Wiring};

#[derive(Parser)]
#[command(name = "plexsphere", about = "Shared rate budgets for a multi-replica API", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API and run the leader-elected loops; every knob is listed below.
    Serve {
        /// Do not apply pending migrations before serving.
        #[arg(long)]
        no_migrate: bool,
        #[command(flatten)]
        knobs: Box<config::Knobs>,
    },
    /// Apply every pending migration to DATABASE_URL.
    Migrate {
        /// Apply migrations the database lacks below one it has already applied (refused
        /// otherwise, because they would run in another order than on a fresh database):
        /// only after checking that they do not depend on what was applied after them.
        #[arg(long)]
        allow_out_of_order: bool,
        #[command(flatten)]
        database: Database,
    },
    /// Manage the secret store.
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
    /// Read rate budgets.
    Budgets {
        #[command(subcommand)]
        command: BudgetsCommand,
    },
}

#[derive(Subcommand)]
enum SecretsCommand {
    /// Re-seal under PLEXSPHERE_SECRETS_KEY every secret sealed under an old key or stored in
    /// plain text, in batches; run it after a rotation or an upgrade.
    Rekey {
        /// Secrets re-sealed per batch (one round trip to list, one per secret to replace).
        #[arg(long, default_value_t = 500)]
        batch_size: usize,
        #[command(flatten)]
        database: Database,
        #[command(flatten)]
        keys: config::SecretsKeys,
    },
}

#[derive(Subcommand)]
enum BudgetsCommand {
    /// Every scope's tokens and refilled_at for one Node or Domain.
    Show {
        /// The Node or Domain id.
        key: uuid::Uuid,
        #[command(flatten)]
        database: Database,
    },
    /// Forget one bucket, so the next take on any replica mints it full (unblocks a caller).
    Reset {
        /// The scope: secret_read_node, secret_read_domain, access_issuance_domain,
        /// ingest_node or ingest_domain.
        scope: ratebudget::Scope,
        /// The Node or Domain id.
        key: uuid::Uuid,
        #[command(flatten)]
        database: Database,
    },
}

/// The whole `plexsphere` binary: parses the command line and runs the command.
///
/// # Errors
/// Whatever the command failed with; an unusable knob exits with status 2 instead.
pub async fn main() -> anyhow::Result<()> {
    crate::telemetry::init();
    match Cli::parse().command {
        Command::Serve { no_migrate, knobs } => match Config::from_knobs(&knobs) {
            Ok(config) => serve(config, !no_migrate).await,
            Err(error) => {
                eprintln!("plexsphere: refusing to start: {error}");
                std::process::exit(2);
            }
        },
        Command::Migrate { allow_out_of_order, database } => {
            migrate(database.options()?, allow_out_of_order).await
        }
        Command::Secrets { command: SecretsCommand::Rekey { batch_size, database, keys } } => {
            let keyring = match keys.keyring() {
                Ok(keyring) => keyring,
                Err(error) => {
                    eprintln!("plexsphere: refusing to start: {error}");
                    std::process::exit(2);
                }
            };
            rekey_secrets(database.options()?, keyring, batch_size, &mut std::io::stdout()).await
        }
        Command::Budgets { command: BudgetsCommand::Show { key, database } } => {
            show_budgets(database.options()?, key, &mut std::io::stdout()).await
        }
        Command::Budgets { command: BudgetsCommand::Reset { scope, key, database } } => {
            reset_budget(database.options()?, scope, key, &mut std::io::stdout()).await
        }
    }
}

/// The exit status after a second signal cut shutdown short: 128 + SIGINT, as shells report
/// a process stopped by Ctrl-C.
const INTERRUPTED: i32 = 130;

/// `plexsphere serve`: runs one replica until SIGTERM or SIGINT, migrating first unless told
/// not to. The first signal stops it gracefully (in-flight requests get
/// `PLEXSPHERE_SHUTDOWN_GRACE_SECS` to finish, leadership is released); a second exits at once.
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
    let pool = connect(config.database.clone()).await?;
    if migrate_first {
        migrate_pool(&pool, false).await?;
    } else if let Some(out_of_order) = crate::migrations::gaps(&crate::MIGRATOR, &pool).await? {
        return Err(out_of_order.into());
    }
    pool.close().await;
    let application = Application::build(config, Wiring::production()).await?;
    let shutdown = application.shutdown_token();
    let mut signals = StopSignals::listen();
    tokio::spawn(async move {
        signals.next().await;
        tracing::info!("shutting down: finishing in-flight requests (a second signal exits at once)");
        shutdown.cancel();
        signals.next().await;
        tracing::warn!("second signal: exiting at once");
        std::process::exit(INTERRUPTED);
    });
    application.run_until_stopped().await
}

/// `plexsphere migrate`: applies every pending migration; one below a migration the database
/// has already applied only when `allow_out_of_order` (see [`crate::migrations`]).
///
/// # Errors
/// When the database cannot be reached, lacks a migration below one it has (and
/// `allow_out_of_order` is not given), or a migration fails.
pub async fn migrate(database: PgConnectOptions, allow_out_of_order: bool) -> anyhow::Result<()> {
    let pool = connect(database).await?;
    migrate_pool(&pool, allow_out_of_order).await
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
    let existed = ratebudget::Store::new(pool.clone())
        .reset(scope, key.into())
        .await
        .context("failed to reset the budget")?;
    let subject = match scope {
        ratebudget::Scope::SecretReadNode | ratebudget::Scope::IngestNode => {
            audit::Subject { node_id: Some(key), ..audit::Subject::default() }
        }
        _ => audit::Subject { domain_id: Some(key), ..audit::Subject::default() },
    };
    let entry =
        audit::NewEntry { actor: audit::Actor::command_line(), action: audit::Action::ResetBudget, subject };
    audit::PgAuditLog::new(pool)
        .record(&entry)
        .await
        .context("failed to record the reset in the audit log")?;
    if existed {
        writeln!(out, "reset {scope} of {key}: the next take mints it full")?;
    } else {
        writeln!(out, "{scope} of {key} had no bucket (it was full already); replicas were told anyway")?;
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

async fn migrate_pool(pool: &PgPool, allow_out_of_order: bool) -> anyhow::Result<()> {
    crate::migrations::apply(&crate::MIGRATOR, pool, allow_out_of_order).await?;
    tracing::info!("migrations applied");
    Ok(())
}

/// SIGTERM and SIGINT, listened for once for the whole run, so that a second signal sent
/// while the first is being handled is not missed.
struct StopSignals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn listen() -> StopSignals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(signal) => Some(signal),
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for {name}");
                    None
                }
            };
            StopSignals {
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
            }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// Waits for the next SIGTERM or SIGINT.
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = recv(&mut self.terminate) => {}
                () = recv(&mut self.interrupt) => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
