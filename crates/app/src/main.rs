//! `plexsphere`: the binary every replica runs. The command line lives in `app::cli`, so the
//! integration tests can build the same binary.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    app::cli::main().await
}

// glibc's malloc spent a fifth of a replica's CPU under load, much of it on its arena lock
// (BENCHMARKS.md section 8); mimalloc keeps a heap per thread.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
