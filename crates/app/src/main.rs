//! `plexsphere`: the binary every replica runs.

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "plexsphere", about = "Shared rate budgets for a multi-replica API")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply every pending migration to DATABASE_URL.
    Migrate {
        /// The database to migrate.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
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
        Command::Migrate { database_url } => {
            let pool =
                sqlx::PgPool::connect(&database_url).await.context("failed to connect to DATABASE_URL")?;
            app::MIGRATOR.run(&pool).await.context("failed to apply migrations")?;
            tracing::info!("migrations applied");
        }
    }
    Ok(())
}
