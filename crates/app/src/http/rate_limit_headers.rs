//! `RateLimit-Policy` and `RateLimit` on every response of a budgeted route, as
//! draft-ietf-httpapi-ratelimit-headers-10 defines them; what the fields say, and how they are
//! written, is `ratebudget_tower::Reading`'s, shared with the tower layer.
//!
//! The decision is made deep inside a context, which knows nothing of HTTP; the limiters'
//! observer ([`crate::limits`]) records what each decision said about its buckets in a
//! task-local slot this module's middleware opens around each request, and the middleware
//! turns the binding reading into the two fields.

use std::cell::RefCell;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use ratebudget_tower::Reading;

tokio::task_local! {
    static READINGS: RefCell<Vec<Reading>>;
}

/// Notes a reading for the current request's fields; outside a request it is dropped.
pub fn record(reading: Reading) {
    let _ = READINGS.try_with(|readings| readings.borrow_mut().push(reading));
}

/// Opens the slot decisions record into, runs the request, and writes the fields of the last
/// reading (the decision that settled the request).
pub(super) async fn add_fields(request: Request, next: Next) -> Response {
    let (readings, mut response) = READINGS
        .scope(RefCell::new(Vec::new()), async {
            let response = next.run(request).await;
            (READINGS.with(|readings| readings.take()), response)
        })
        .await;
    if let Some(reading) = readings.last() {
        reading.set_on(response.headers_mut());
    }
    response
}
