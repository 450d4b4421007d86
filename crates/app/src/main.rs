//! `plexsphere`: the binary every replica runs. The command line lives in `app::cli`, so the
//! integration tests can build the same binary.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    app::cli::main().await
}
