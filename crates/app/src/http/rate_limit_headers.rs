//! `RateLimit-Policy` and `RateLimit` on every response of a budgeted route, as
//! draft-ietf-httpapi-ratelimit-headers-10 defines them; what the fields say, and how they are
//! written, is `ratebudget_tower::Reading`'s, shared with the tower layer.
//!
//! The decision is made deep inside a context, which knows nothing of HTTP; the limiters'
//! observer ([`crate::limits`]) notes what each decision said about its buckets while this
//! module's middleware collects them around each request, and the middleware turns the
//! binding reading into the two fields.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

use crate::limits::collect_readings;

/// Runs the request, collecting its decisions' readings, and writes the fields of the last
/// one (the decision that settled the request).
pub(super) async fn add_fields(request: Request, next: Next) -> Response {
    let (mut response, readings) = collect_readings(next.run(request)).await;
    if let Some(reading) = readings.last() {
        reading.set_on(response.headers_mut());
    }
    response
}
