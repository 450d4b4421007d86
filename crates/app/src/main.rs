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
    /// Forget one bucket, so the next take on any replica mints it full (unblocks a caller).
    Reset {
        /// The scope: secret_read_node, secret_read_domain, access_issuance_domain,
        /// ingest_node or ingest_domain.
        scope: ratebudget::Scope,
        /// The Node or Domain id.
        key: uuid::Uuid,
        #[command(flatten)]
        database: app::cli::Database,
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
        Command::Budgets { command: BudgetsCommand::Show { key, database } } => {
            app::cli::show_budgets(database.options()?, key, &mut std::io::stdout()).await
        }
        Command::Budgets { command: BudgetsCommand::Reset { scope, key, database } } => {
            app::cli::reset_budget(database.options()?, scope, key, &mut std::io::stdout()).await
        }
    }
}
