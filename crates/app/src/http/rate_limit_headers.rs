//! `RateLimit-Policy` and `RateLimit` on every response of a budgeted route, as
//! draft-ietf-httpapi-ratelimit-headers-10 defines them; what the fields say, and how they are
//! written, is `ratebudget_tower::Reading`'s, shared with the tower layer.
//!
//! The decision is made deep inside a context, which knows nothing of HTTP; the limiters'
//! observer ([`crate::observation::observer`]) notes what each decision said about its buckets while
//! `with_fields`, which the router's one middleware runs around each request, collects them
//! and turns the binding reading into the two fields.

use std::future::Future;

use axum::response::Response;

use crate::observation::observer::collect_readings;

/// Runs `answer`, collecting its decisions' readings, and writes the fields of the last one
/// (the decision that settled the request) on its response.
pub(super) async fn with_fields(answer: impl Future<Output = Response>) -> Response {
    let (mut response, readings) = collect_readings(answer).await;
    if let Some(reading) = readings.last() {
        reading.set_on(response.headers_mut());
    }
    response
}
