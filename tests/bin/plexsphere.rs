//! The `plexsphere` binary, built again as a target of this package so that its integration
//! tests can run it as a separate process (cargo tells them where: `CARGO_BIN_EXE_<name>`, which
//! it sets only for the package's own binaries). It is `app::cli::main`, exactly as the real one.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    app::cli::main().await
}
