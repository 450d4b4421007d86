//! The `plexsphere` command line and what each command does; `main.rs` only calls [`main`].
//!
//! It lives in the library so that the integration tests can build the very same binary as a
//! target of their own (tests/Cargo.toml) and run it as a separate process: under SIGTERM,
//! SIGKILL, libfaketime or a network namespace.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use service::operations::Shown;
use service::{OperationError, Operations};

use crate::config::{self, Config};
use crate::startup::{Application, Wiring};

#[derive(Parser)]
#[command(name = "plexsphere", about = "Shared rate budgets for a multi-replica API")]
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
    /// Apply every pending migration to PLEXSPHERE_SESSION_DATABASE_URL, or DATABASE_URL.
    Migrate {
        /// Apply migrations the database lacks below one it has already applied (refused
        /// otherwise, because they would run in another order than on a fresh database):
        /// only after checking that they do not depend on what was applied after them.
        #[arg(long)]
        allow_out_of_order: bool,
        /// The database as a session reaches it, when DATABASE_URL names a transaction
        /// pooler: migrations hold a session lock.
        #[arg(long = "session-database-url", env = config::SESSION_DATABASE_URL, hide_env_values = true)]
        session_url: Option<String>,
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
    /// Manage rules.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Apply envoyproxy/ratelimit configuration files, as they are: print each change
    /// (created, replaced, unchanged, deleted) and make them all in one transaction. Nothing of
    /// any file is applied when one is refused.
    Apply {
        /// Print the changes and make none.
        #[arg(long)]
        dry_run: bool,
        /// Delete the rules of the files' domains, applied from files, that the files no longer
        /// hold.
        #[arg(long)]
        prune: bool,
        /// Files, and directories whose files (hidden entries skipped) are read as
        /// envoyproxy/ratelimit reads its runtime directory.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<std::path::PathBuf>,
        #[command(flatten)]
        database: Database,
    },
}

#[derive(Subcommand)]
enum SecretsCommand {
    /// Re-seal under PLEXSPHERE_SECRETS_KEY every secret sealed under an old key or stored in
    /// plain text, in batches; run it after a rotation or an upgrade.
    Rekey {
        /// Secrets re-sealed per batch (one round trip to list, one per secret to replace), at
        /// least 1.
        #[arg(long, default_value_t = std::num::NonZeroUsize::new(500).expect("500 is not 0"))]
        batch_size: std::num::NonZeroUsize,
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
    #[command(group(clap::ArgGroup::new("bucket").required(true).args(["scope", "service"])))]
    Reset {
        /// The scope: secret_read_node, secret_read_domain, access_issuance_domain,
        /// ingest_node or ingest_domain (with the Node's or Domain's id).
        #[arg(requires = "key")]
        scope: Option<ratebudget::Scope>,
        /// The Node or Domain id.
        key: Option<uuid::Uuid>,
        /// Another service (Envoy's domain) whose bucket to reset: the one its descriptor of
        /// the --entry pairs is decided in, by the rule that governs it.
        #[arg(long, requires = "entries", conflicts_with = "scope")]
        service: Option<String>,
        /// One entry of the descriptor, key=value, in the descriptor's order (repeat it).
        #[arg(long = "entry", value_name = "KEY=VALUE", value_parser = parse_entry)]
        entries: Vec<(String, String)>,
        #[command(flatten)]
        database: Database,
    },
}

/// How a command failed, which decides the process's exit status (README, "Exit status").
#[derive(Debug)]
pub enum Failure {
    /// The command line or a knob is unusable: nothing was done. Exit status 2.
    Usage(String),
    /// The command ran and failed: the database, a migration, an id nobody has. Exit status 1.
    Failed(anyhow::Error),
}

impl Failure {
    /// The line printed after `plexsphere: `.
    pub fn message(&self) -> String {
        match self {
            Failure::Usage(message) => message.clone(),
            Failure::Failed(error) => ratebudget::cause_chain(error.as_ref()),
        }
    }

    /// The exit status.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Failed(_) => EXIT_FAILED,
        }
    }
}

impl From<config::ConfigError> for Failure {
    fn from(error: config::ConfigError) -> Self {
        Failure::Usage(format!("refusing to start: {error}"))
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure::Failed(error)
    }
}

/// The command ran and failed.
pub const EXIT_FAILED: u8 = 1;
/// The command line or a knob is unusable.
pub const EXIT_USAGE: u8 = 2;

/// The whole `plexsphere` binary: parses the command line, runs the command, and on failure
/// prints one line, `plexsphere: <what failed>: <why>`, to standard error (never a backtrace),
/// and returns the exit status: 0, 1 ([`Failure::Failed`]), 2 ([`Failure::Usage`]), or 130
/// from `serve` after a second signal.
pub async fn main() -> std::process::ExitCode {
    crate::observation::logs::init();
    let command = match parse() {
        Ok(cli) => cli.command,
        Err(error) => {
            // --help and --version print and succeed; a command line without a subcommand
            // prints the help and fails as a usage error, as clap does.
            if error.exit_code() == 0
                || error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let _ = error.print();
                return std::process::ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(EXIT_USAGE));
            }
            let rendered = error.render().to_string();
            return report(&Failure::Usage(rendered.trim_end().trim_start_matches("error: ").to_owned()));
        }
    };
    match run(command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => report(&failure),
    }
}

/// The command line, with `--version` saying which build this is: the release, the commit it
/// was built from, and the newest migration it applies (the database schema it expects).
fn parse() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory as _, FromArgMatches as _};
    // Built once per process; clap keeps it for the process's life.
    let version: &'static str = Box::leak(version().into_boxed_str());
    let matches = Cli::command().version(version).try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

/// The version line `plexsphere --version` prints, without the name.
pub fn version() -> String {
    let schema =
        crate::migrations::MIGRATOR.iter().map(|migration| migration.version).max().unwrap_or_default();
    format!("{} (commit {}, database schema {schema})", env!("CARGO_PKG_VERSION"), env!("PLEXSPHERE_COMMIT"))
}

fn report(failure: &Failure) -> std::process::ExitCode {
    eprintln!("plexsphere: {}", failure.message());
    std::process::ExitCode::from(failure.exit_code())
}

async fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Serve { no_migrate, knobs } => {
            let config = Config::from_knobs(&knobs)?;
            Ok(serve(config, !no_migrate).await?)
        }
        Command::Migrate { allow_out_of_order, session_url, database } => {
            let target = match session_url.as_deref().map(str::trim).filter(|url| !url.is_empty()) {
                Some(url) => config::database_options(Some(url)).map_err(|error| config::ConfigError {
                    knob: config::SESSION_DATABASE_URL,
                    problem: error.problem,
                })?,
                None => database.options()?,
            };
            Ok(migrate(target, allow_out_of_order).await?)
        }
        Command::Secrets { command: SecretsCommand::Rekey { batch_size, database, keys } } => {
            let keyring = keys.keyring()?;
            let database = database.options()?;
            Ok(rekey_secrets(database, keyring, batch_size.get(), &mut std::io::stdout()).await?)
        }
        Command::Rules { command: RulesCommand::Apply { dry_run, prune, paths, database } } => {
            let prune = if prune { rules::Prune::SameDomains } else { rules::Prune::Nothing };
            Ok(apply_rules(database.options()?, &paths, prune, dry_run, &mut std::io::stdout()).await?)
        }
        Command::Budgets { command: BudgetsCommand::Show { key, database } } => {
            Ok(show_budgets(database.options()?, key, &mut std::io::stdout()).await?)
        }
        Command::Budgets { command: BudgetsCommand::Reset { scope, key, service, entries, database } } => {
            match (scope, key, service) {
                (Some(scope), Some(key), _) => {
                    Ok(reset_budget(database.options()?, scope, key, &mut std::io::stdout()).await?)
                }
                (_, _, Some(service)) => {
                    let entries: Vec<service::decide::Entry> = entries
                        .into_iter()
                        .map(|(key, value)| service::decide::Entry { key, value })
                        .collect();
                    Ok(reset_service_bucket(database.options()?, &service, &entries, &mut std::io::stdout())
                        .await?)
                }
                _ => Err(Failure::Usage("name a scope and an id, or --service and its --entry pairs".into())),
            }
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
    if config.secrets.keyring.current_key_id() == development_key.id() {
        tracing::warn!(
            "{} is the README's development key: anyone can open these secrets; never use it in production",
            config::SECRETS_KEY
        );
    }
    // Migrations take a session lock: the database itself, never a transaction pooler.
    let pool = connect((*config.database.session_url).clone()).await?;
    if migrate_first {
        migrate_pool(&pool, false).await?;
    } else if let Some(out_of_order) = crate::migrations::gaps(&pool).await? {
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

/// The operator actions on `pool`, as the command line runs them: nobody's replica to reload,
/// no issuance to spend.
fn operations(pool: &PgPool) -> Operations {
    Operations::new(
        access::AccessService::new(
            Arc::new(access::PgAccessRepository::new(pool.clone())),
            Arc::new(NoIssuance),
        ),
        rules::RulesService::new(Arc::new(rules::PgRulesRepository::new(pool.clone()))),
        Arc::new(audit::PgAuditLog::new(pool.clone())),
        Arc::new(ratebudget::Store::new(pool.clone())),
    )
}

/// `plexsphere budgets show <key>`: every scope's bucket of one Node or Domain, as stored.
///
/// A bucket's `tokens` is what its last take left, at `refilled_at`; the level now is higher
/// by the refill since, which the replicas compute from the budget that governs it (`GET
/// /v1/fill/<id>` and the operator page show it). A missing bucket is full.
///
/// # Errors
/// When the database does not answer, or no Node or Domain has the id and no bucket is kept
/// under it.
pub async fn show_budgets(
    database: PgConnectOptions,
    key: uuid::Uuid,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let pool = connect(database).await?;
    let Shown { holder, buckets } =
        operations(&pool).show_budgets(key).await.context("failed to read the budgets")?;
    let Some(holder) = holder else {
        if buckets.is_empty() {
            anyhow::bail!("no Node or Domain has the id {key}, and no bucket is kept under it");
        }
        writeln!(
            out,
            "no Node or Domain has the id {key} (any more); its buckets, until the idle sweep deletes them:"
        )?;
        return print_buckets(&buckets, out);
    };
    let who = holder.as_str();
    if buckets.is_empty() {
        writeln!(
            out,
            "{who} {key} has no bucket: every budget of it is full (its next take mints the bucket)"
        )?;
        return Ok(());
    }
    writeln!(out, "{who} {key}; tokens are what each bucket's last take left, at refilled_at (a missing scope is full):")?;
    print_buckets(&buckets, out)
}

fn print_buckets(buckets: &[ratebudget::Bucket], out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(out, "{:<24} {:>16}  refilled_at", "scope", "tokens")?;
    for bucket in buckets {
        writeln!(
            out,
            "{:<24} {:>16.3}  {}",
            bucket.name.as_str(),
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
/// When the database does not answer, no Node or Domain has the id, or the scope is not keyed
/// by what the id names (a Domain's id given for a Node's scope, say); nothing is reset then.
pub async fn reset_budget(
    database: PgConnectOptions,
    scope: ratebudget::Scope,
    key: uuid::Uuid,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let pool = connect(database).await?;
    let reset = operations(&pool)
        .reset_budget(audit::Actor::command_line(), scope, key)
        .await
        .context("failed to reset the budget")?;
    let who = reset.keyed_by.as_str();
    if !reset.held {
        writeln!(out, "no Node or Domain has the id {key} (any more); its {scope} bucket was reset anyway")?;
    }
    if reset.existed {
        writeln!(out, "reset {scope} of {who} {key}: its next take mints it full")?;
    } else {
        writeln!(
            out,
            "{scope} of {who} {key} had no bucket (it was full already); replicas were told anyway"
        )?;
    }
    Ok(())
}

/// `plexsphere budgets reset --service <service> --entry key=value ...`: forgets the bucket that
/// descriptor of the service is decided in, by the rule that governs it as stored (every
/// replica hears of it), audited as the command line.
///
/// # Errors
/// When the database does not answer, or no rule of the service governs the descriptor.
pub async fn reset_service_bucket(
    database: PgConnectOptions,
    service: &str,
    entries: &[service::decide::Entry],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let pool = connect(database).await?;
    let reset = operations(&pool)
        .reset_service_bucket(audit::Actor::command_line(), service, entries)
        .await
        .context("failed to reset the bucket")?;
    if reset.existed {
        writeln!(
            out,
            "reset the bucket of {service} governed by rule {}: its next take mints it full",
            reset.rule_id
        )?;
    } else {
        writeln!(
            out,
            "the bucket of {service} governed by rule {} was full already (no row); replicas were told anyway",
            reset.rule_id
        )?;
    }
    Ok(())
}

/// `plexsphere rules apply [--dry-run] [--prune] PATH...`: reads envoyproxy/ratelimit's files
/// (all of them, or none when one is refused), prints each rule's change and, unless
/// `dry_run`, makes them in one transaction, audited as the command line.
///
/// # Errors
/// A file that cannot be read or is refused (naming the file and the descriptor path), or a
/// database that does not answer: nothing applied.
pub async fn apply_rules(
    database: PgConnectOptions,
    paths: &[std::path::PathBuf],
    prune: rules::Prune,
    dry_run: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let files = rules::files::read(paths).context("refused the files; nothing was applied")?;
    let pool = connect(database).await?;
    let changes = operations(&pool)
        .apply_rule_files(audit::Actor::command_line(), &files, prune, dry_run)
        .await
        .context("failed to apply the files; nothing was applied")?;
    print_changes(&changes, out)?;
    let made = changes.iter().filter(|change| change.applied != rules::Applied::Unchanged).count();
    if dry_run {
        writeln!(out, "dry run: {made} change(s) would be made, none was")?;
    } else {
        writeln!(out, "{made} change(s) made from {} file(s)", files.files.len())?;
    }
    Ok(())
}

/// One line a change: what, the rule, its descriptor path, its file and the version made.
pub fn print_changes(changes: &[rules::FileChange], out: &mut impl Write) -> std::io::Result<()> {
    for change in changes {
        let version = change.version.map(|version| format!(" (version {version})")).unwrap_or_default();
        writeln!(
            out,
            "{:<9} {} {} from {}{version}",
            change.applied.as_str(),
            change.id,
            change.path,
            change.source
        )?;
    }
    Ok(())
}

/// A descriptor entry from `key=value` (the value may hold `=`).
fn parse_entry(text: &str) -> Result<(String, String), String> {
    let (key, value) = text.split_once('=').ok_or_else(|| format!("{text:?} is not key=value"))?;
    if key.is_empty() {
        return Err(format!("{text:?} has an empty key"));
    }
    Ok((key.to_owned(), value.to_owned()))
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
    out: &mut (impl Write + Send),
) -> anyhow::Result<()> {
    let batch_size = std::num::NonZeroUsize::new(batch_size).context("the batch size must be at least 1")?;
    let pool = connect(database).await?;
    let current = keyring.current_key_id().clone();
    let secrets = secrets::SecretsService::new(
        Arc::new(secrets::PgSecretRepository::new(pool.clone())),
        Arc::new(NoReads),
        Arc::new(keyring),
    );
    let mut printed = Ok(());
    let mut progress = |batch_number: usize, batch: &secrets::RekeyBatch| {
        if printed.is_ok() {
            printed = writeln!(
                out,
                "batch {batch_number}: {} re-sealed from old keys, {} sealed from plain text, {} written meanwhile",
                batch.resealed, batch.sealed_from_plaintext, batch.replaced_meanwhile
            );
        }
    };
    let rekeyed = operations(&pool)
        .rekey_secrets(audit::Actor::command_line(), &secrets, batch_size, &mut progress)
        .await
        .map_err(|error| {
            let hint = match &error {
                OperationError::Rekey { source: secrets::RekeyError::Unreadable { .. }, .. } => format!(
                    "list the key that sealed it in {} (or {} if it is the current one)",
                    config::SECRETS_OLD_KEYS,
                    config::SECRETS_KEY
                ),
                _ => String::new(),
            };
            let error = anyhow::Error::new(error);
            if hint.is_empty() {
                error
            } else {
                error.context(hint)
            }
        })?;
    printed?;
    writeln!(
        out,
        "every secret is sealed under key {current}: {} re-sealed, {} sealed from plain text, \
         {} written meanwhile; the old keys can be retired",
        rekeyed.resealed, rekeyed.sealed_from_plaintext, rekeyed.replaced_meanwhile
    )?;
    Ok(())
}

/// The issuance limiter of a command that enrols no Node: it is never asked, and would refuse
/// to answer rather than admit an issuance nobody budgeted.
struct NoIssuance;

#[async_trait::async_trait]
impl access::Limiter for NoIssuance {
    async fn spend_issuance(&self, _: access::DomainId) -> Result<(), access::IssuanceLimitError> {
        Err(access::IssuanceLimitError::Unavailable("the command line issues no credentials".into()))
    }
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
    /// The PostgreSQL database every replica shares: postgres://user@host:port/database.
    /// Required.
    #[arg(long = "database-url", env = config::DATABASE_URL, hide_env_values = true)]
    url: Option<String>,
}

impl Database {
    /// The connect options the URL names.
    ///
    /// # Errors
    /// When it is missing, the test suite's default, or not a PostgreSQL URL
    /// ([`config::database_options`]).
    pub fn options(&self) -> Result<PgConnectOptions, config::ConfigError> {
        config::database_options(self.url.as_deref())
    }
}

/// How long a command waits for the database to accept its first connection.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A small pool on `database`, once one connection has been made: that connection's error says
/// what is wrong (refused, unknown host, authentication), where a pool retrying until its
/// acquire timeout would say only that it timed out.
async fn connect(database: PgConnectOptions) -> anyhow::Result<PgPool> {
    let place = format!("{}:{} ({})", database.get_host(), database.get_port(), config::DATABASE_URL);
    // Migrations create their bookkeeping table IF NOT EXISTS; PostgreSQL's notice that it
    // exists is not worth a log line on every start.
    let database = database.options([("client_min_messages", "warning")]);
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&database)).await {
        Err(_) => {
            anyhow::bail!("cannot connect to the database at {place}: no answer within {CONNECT_TIMEOUT:?}")
        }
        Ok(Err(error)) => {
            return Err(
                anyhow::Error::new(error).context(format!("cannot connect to the database at {place}"))
            )
        }
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
        }
    }
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(database)
        .await
        .with_context(|| format!("cannot connect to the database at {place}"))
}

async fn migrate_pool(pool: &PgPool, allow_out_of_order: bool) -> anyhow::Result<()> {
    crate::migrations::apply(pool, allow_out_of_order).await?;
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
