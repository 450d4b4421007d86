//! A small axum service behind two budgets kept in PostgreSQL, shared by every copy of it that
//! runs against the same database, and needing nothing of the `plexsphere` binary: only
//! `ratebudget`'s own migrations are applied.
//!
//! - `POST /upload` costs its body's length, per API key (`x-api-key`), from token buckets
//!   under the name `example_uploads`: a megabyte a second, four at once;
//! - `GET /hello` costs one, per client address, from a GCRA limiter: five a second, ten at once.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run -p ratebudget-tower --example axum_service
//! curl -si -H 'x-api-key: alice' --data-binary 'some bytes' http://127.0.0.1:3000/upload
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/hello; done
//! ```
//!
//! The eleventh greeting in a row answers 429 with `Retry-After` and the `RateLimit` fields;
//! an upload without `x-api-key` answers 400, and one without a `Content-Length` 411.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderName;
use axum::routing::{get, post};
use axum::Router;
use ratebudget::{DatabaseClock, Guard, Limit, Name, Store, TokenBuckets};
use ratebudget_tower::{
    BodyLength, BucketBudget, BudgetLayer, EachRequest, HeaderKey, NamedBudget, PeerAddress,
};

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    // The crate's tables and functions only.
    ratebudget::MIGRATOR.run(&pool).await?;
    // Every copy decides on the database's clock, and nothing while that cannot be trusted.
    let (clock, status) = DatabaseClock::spawn(pool.clone(), Duration::from_secs(1));
    let clock = Arc::new(clock);
    // One guard per process: its pre-check refuses a spent key without a statement, and its
    // circuit and fail modes decide while the database cannot answer.
    let guard = Arc::new(Guard::builder(Store::new(pool)).trusted_only(status).build());

    let uploads = TokenBuckets::new(
        Name::new("example_uploads")?,
        Limit::new(1_000_000.0, 4_000_000.0)?,
        guard.clone(),
        clock.clone(),
    );
    let greetings = NamedBudget::new(Name::new("example_greetings")?, Limit::new(5.0, 10.0)?, guard, clock);

    let app = Router::new()
        .route(
            "/upload",
            post(|body: Bytes| async move { format!("stored {} bytes\n", body.len()) }).route_layer(
                BudgetLayer::new(BucketBudget::new(uploads), HeaderKey::new(API_KEY), BodyLength),
            ),
        )
        .route(
            "/hello",
            get(|| async { "hello\n" }).route_layer(BudgetLayer::new(
                greetings,
                PeerAddress::direct(),
                EachRequest,
            )),
        );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    // PeerAddress keys by the peer axum records for each connection.
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
