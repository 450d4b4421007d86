//! The HTTP server: hyper's HTTP/1 connection driver under an accept loop that bounds what
//! clients can hold.
//!
//! `axum::serve` has no header timeout and no connection cap, so a client that sends half a
//! request header, or thousands of them, keeps sockets (and file descriptors) open for as long
//! as it likes. Here:
//! - at most `max_connections` connections are served at once; the accept loop waits for one
//!   to close before it accepts another, so the excess waits in the kernel's listen queue
//!   instead of costing descriptors;
//! - a connection that does not deliver a request's headers within `header_timeout`, or sits
//!   idle between requests that long, is closed (hyper's `header_read_timeout`);
//! - the body and whole-request deadlines are middleware (`http::deadline`), since they need
//!   an HTTP answer;
//! - on shutdown the listener closes, idle connections close, in-flight requests get
//!   `grace` to finish, and whatever is still open then is closed, so a trickling client can
//!   never hold the process up.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower_http::add_extension::AddExtension;

use crate::config::HttpConfig;

/// How long the accept loop holds off after an accept error such as running out of file
/// descriptors, so it does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` is cancelled, then drains for at most
/// `grace`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpConfig,
    grace: Duration,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connections so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        // Responses are small and written at once; Nagle would only delay them.
        let _ = stream.set_nodelay(true);
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            // The peer's address travels with every request (the failed-authentication budget
            // is keyed by it), as axum's own serve would provide it.
            .serve_connection(
                TokioIo::new(stream),
                TowerToHyperService::new(AddExtension::new(router.clone(), ConnectInfo(peer))),
            );
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut connection = std::pin::pin!(connection);
            let outcome = tokio::select! {
                outcome = connection.as_mut() => outcome,
                () = shutdown.cancelled() => {
                    // Finish the request in flight, if any, then close; an idle connection
                    // closes at once.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = outcome {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let draining = connections.len();
    if draining > 0 {
        tracing::info!(connections = draining, grace_secs = grace.as_secs_f64(), "draining connections");
    }
    let drained =
        tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "shutdown grace elapsed: closing the connections still open"
        );
        connections.shutdown().await;
    }
}
