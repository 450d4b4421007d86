//! The operator page at `/ui`: a static HTML page, its script and its style sheet, compiled
//! into the binary (no build step, nothing fetched from elsewhere).
//!
//! The page itself is public and holds no data; everything it shows it asks of the JSON API
//! with the operator token the operator types in (docs/adr/0027), so "operator token
//! required" holds for the data exactly as it does for any other client. Every response
//! forbids caching and framing, and its Content-Security-Policy allows this origin's own
//! script, style and API only: no inline script, no inline style, nothing from elsewhere.

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// What the page may load and do: its own script and style sheet, requests to this origin,
/// SVG charts drawn in place; no plugin, no frame around it, no form posted elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 6] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        // The page is small and changes with the binary: a stale copy after an upgrade would
        // call routes the replica no longer has.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    (headers, body).into_response()
}

/// `GET /ui`: the page.
pub(super) async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/app.js`: its script.
pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/app.css`: its style sheet.
pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
