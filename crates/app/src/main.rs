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
    /// Serve the HTTP API and run the leader-elected loops (knobs: see .env.example).
    Serve {
        /// Do not apply pending migrations before serving.
        #[arg(long)]
        no_migrate: bool,
    },
    /// Apply every pending migration to DATABASE_URL.
    Migrate,
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
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Serve { no_migrate } => {
            let config = match app::config::Config::from_env() {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("plexsphere: refusing to start: {error}");
                    std::process::exit(2);
                }
            };
            app::cli::serve(config, !no_migrate).await
        }
        Command::Migrate => app::cli::migrate(app::cli::database_from_env()?).await,
        Command::Budgets { command: BudgetsCommand::Show { key } } => {
            app::cli::show_budgets(app::cli::database_from_env()?, key, &mut std::io::stdout()).await
        }
    }
}
