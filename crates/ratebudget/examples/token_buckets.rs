//! A plain user of the crate: token buckets under a name of one's own, keyed by any string,
//! shared by every process on the database.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run -p ratebudget --example token_buckets
//! ```
//!
//! It uploads 1.5 MB three times for the same API key against a budget of a megabyte a
//! second, four at once: granted, granted, refused (with how long to wait).

// An example prints what it did; the workspace's lint is for the libraries.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::Duration;

use ratebudget::{DatabaseClock, Decision, Guard, Limit, Name, Store, TokenBuckets};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    ratebudget::MIGRATOR.run(&pool).await?;
    let (clock, status) = DatabaseClock::spawn(pool.clone(), Duration::from_secs(1));
    status.trusted_within(Duration::from_secs(5)).await?;
    let guard = Arc::new(Guard::builder(Store::new(pool)).trusted_only(status).build());
    let uploads = TokenBuckets::new(Name::new("uploads")?, Limit::new(1e6, 4e6)?, guard, Arc::new(clock));
    for _ in 0..3 {
        match uploads.take("api-key-alice", 1.5e6).await? {
            Decision::Granted(_) => println!("granted"),
            Decision::Refused(refusal) => println!("refused: retry after {:?}", refusal.retry_after),
            Decision::InsufficientCapacity(never) => println!("never fits: {never}"),
        }
    }
    Ok(())
}
