//! `plexsphere`: the binary every replica runs.

use clap::{Parser, Subcommand};

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
        knobs: Box<app::config::Knobs>,
    },
    /// Apply every pending migration to DATABASE_URL.
    Migrate {
        #[command(flatten)]
        database: app::cli::Database,
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
enum BudgetsCommand {
    /// Every scope's tokens and refilled_at for one Node or Domain.
    Show {
        /// The Node or Domain id.
        key: uuid::Uuid,
        #[command(flatten)]
        database: app::cli::Database,
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
        database: app::cli::Database,
        #[command(flatten)]
        keys: app::config::SecretsKeys,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    app::telemetry::init();
    match Cli::parse().command {
        Command::Serve { no_migrate, knobs } => match app::config::Config::from_knobs(&knobs) {
            Ok(config) => app::cli::serve(config, !no_migrate).await,
            Err(error) => {
                eprintln!("plexsphere: refusing to start: {error}");
                std::process::exit(2);
            }
        },
        Command::Migrate { database } => app::cli::migrate(database.options()?).await,
        Command::Secrets { command: SecretsCommand::Rekey { batch_size, database, keys } } => {
            let keyring = match keys.keyring() {
                Ok(keyring) => keyring,
                Err(error) => {
                    eprintln!("plexsphere: refusing to start: {error}");
                    std::process::exit(2);
                }
            };
            app::cli::rekey_secrets(database.options()?, keyring, batch_size, &mut std::io::stdout()).await
        }
        Command::Budgets { command: BudgetsCommand::Show { key, database } } => {
            app::cli::show_budgets(database.options()?, key, &mut std::io::stdout()).await
        }
    }
}
