//! Which budget key a request spends under, and what it costs.
//!
//! Keys: a header's value ([`HeaderKey`]), the client's address ([`PeerAddress`]), or
//! anything a closure finds ([`key_fn`]). Costs: one per request ([`EachRequest`]), the
//! body's length in bytes ([`BodyLength`]), or a closure ([`cost_fn`]). An extractor that
//! cannot find what it needs answers a [`Rejection`], which the layer sends instead of calling
//! the service.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{HeaderName, StatusCode};
use ipnet::IpNet;

use crate::{Rejection, RequestKey};

/// Finds the key a request spends under.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key `request` spends under; `Ok(None)` when it spends nothing (it is not limited).
    ///
    /// # Errors
    /// The [`Rejection`] to answer with when no key can be found.
    fn key(&self, request: &Parts) -> Result<Option<RequestKey>, Rejection>;
}

/// Finds what a request costs.
pub trait CostExtractor: Send + Sync + 'static {
    /// What `request` costs; `body_size` is its body's exact size when that is known before
    /// reading it (a `Content-Length`, a buffered body).
    ///
    /// # Errors
    /// The [`Rejection`] to answer with when the cost cannot be known.
    fn cost(&self, request: &Parts, body_size: Option<u64>) -> Result<u64, Rejection>;
}

/// What a key extractor does when a request lacks what it keys by.
#[derive(Clone, Debug)]
enum WhenMissing {
    Reject,
    SpendAs(RequestKey),
}

/// Keys a request by a header's value (an API key, a tenant): requests without the header
/// are answered 400 `missing_key`, or spend under one shared fallback key.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    when_missing: WhenMissing,
}

impl HeaderKey {
    /// Keys by `name`'s first value; a request without it (or with an empty one) is a 400.
    pub fn new(name: HeaderName) -> HeaderKey {
        HeaderKey { name, when_missing: WhenMissing::Reject }
    }

    /// Requests without the header all spend under `key` instead of being refused.
    pub fn or_fallback(self, key: impl Into<RequestKey>) -> HeaderKey {
        HeaderKey { when_missing: WhenMissing::SpendAs(key.into()), ..self }
    }
}

impl KeyExtractor for HeaderKey {
    fn key(&self, request: &Parts) -> Result<Option<RequestKey>, Rejection> {
        match (request.headers.get(&self.name), &self.when_missing) {
            (Some(value), _) if !value.is_empty() => Ok(Some(RequestKey::new(value.as_bytes()))),
            (_, WhenMissing::SpendAs(key)) => Ok(Some(key.clone())),
            (_, WhenMissing::Reject) => Err(Rejection::new(
                StatusCode::BAD_REQUEST,
                "missing_key",
                format!("the {} header is required", self.name),
            )),
        }
    }
}

/// Keys a request by its client's address: the socket's peer, as axum's `ConnectInfo<SocketAddr>`
/// gives it (serve with `into_make_service_with_connect_info::<SocketAddr>()`), unless that
/// peer is a trusted proxy, whose `X-Forwarded-For` is then believed up to the first address
/// that is not a trusted proxy.
///
/// IPv6 clients are keyed by their /64, the smallest block one subscriber is usually given, so
/// rotating through one's own addresses buys nothing. A request without `ConnectInfo` (a
/// service not served with it) is a 500, or spends under a fallback key.
#[derive(Clone, Debug)]
pub struct PeerAddress {
    trusted_proxies: Arc<[IpNet]>,
    when_missing: WhenMissing,
}

impl PeerAddress {
    /// Keys by the socket's peer, believing no `X-Forwarded-For`.
    pub fn direct() -> PeerAddress {
        PeerAddress::behind(Vec::new())
    }

    /// Keys by the client as `trusted_proxies` report it (see the type's documentation).
    pub fn behind(trusted_proxies: Vec<IpNet>) -> PeerAddress {
        PeerAddress { trusted_proxies: trusted_proxies.into(), when_missing: WhenMissing::Reject }
    }

    /// Requests whose peer is unknown all spend under `key` instead of being answered 500.
    pub fn or_fallback(self, key: impl Into<RequestKey>) -> PeerAddress {
        PeerAddress { when_missing: WhenMissing::SpendAs(key.into()), ..self }
    }

    /// The key a client at `ip` spends under, as text: `203.0.113.9`, or `2001:db8:1:2::/64`;
    /// for a server that knows its peer otherwise than through axum (a gRPC server).
    pub fn key_of(ip: IpAddr) -> String {
        key_of(ip)
    }

    /// The client's address key, as text: `203.0.113.9`, or `2001:db8:1:2::/64`.
    pub fn client(&self, request: &Parts) -> Option<String> {
        let ConnectInfo(peer) = request.extensions.get::<ConnectInfo<SocketAddr>>()?;
        Some(key_of(client_ip(peer.ip(), request, &self.trusted_proxies)))
    }
}

impl KeyExtractor for PeerAddress {
    fn key(&self, request: &Parts) -> Result<Option<RequestKey>, Rejection> {
        match (self.client(request), &self.when_missing) {
            (Some(client), _) => Ok(Some(client.into())),
            (None, WhenMissing::SpendAs(key)) => Ok(Some(key.clone())),
            (None, WhenMissing::Reject) => {
                tracing::error!(
                    "a request has no peer address to key its budget by; serve with into_make_service_with_connect_info::<SocketAddr>()"
                );
                Err(Rejection::undecided())
            }
        }
    }
}

/// The client's address: the peer, or, when the peer is a trusted proxy, the right-most
/// address of `X-Forwarded-For` that is not a trusted proxy itself (each proxy appends the
/// address it received from, so everything left of the first untrusted hop is the client's
/// own claim and worth nothing). A malformed entry stops the walk at the last trusted hop.
fn client_ip(peer: IpAddr, request: &Parts, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<&str> = request
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .collect();
    let mut client = peer;
    for hop in hops.into_iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) if is_trusted(&ip) => client = ip,
            Ok(ip) => return ip,
            Err(_) => return client,
        }
    }
    client
}

/// The key an address spends under: itself for IPv4 (and IPv4-mapped IPv6), its /64 for IPv6.
fn key_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let segments = v6.segments();
                let network = Ipv6Addr::new(segments[0], segments[1], segments[2], segments[3], 0, 0, 0, 0);
                format!("{network}/64")
            }
        },
    }
}

/// A key extractor from a closure; see [`key_fn`].
#[derive(Clone, Debug)]
pub struct KeyFn<F>(F);

/// Keys requests by whatever `find` says (`Ok(None)`: not limited).
pub fn key_fn<F>(find: F) -> KeyFn<F>
where
    F: Fn(&Parts) -> Result<Option<RequestKey>, Rejection> + Send + Sync + 'static,
{
    KeyFn(find)
}

impl<F> KeyExtractor for KeyFn<F>
where
    F: Fn(&Parts) -> Result<Option<RequestKey>, Rejection> + Send + Sync + 'static,
{
    fn key(&self, request: &Parts) -> Result<Option<RequestKey>, Rejection> {
        (self.0)(request)
    }
}

/// Every request costs one.
#[derive(Clone, Copy, Debug)]
pub struct EachRequest;

impl CostExtractor for EachRequest {
    fn cost(&self, _: &Parts, _: Option<u64>) -> Result<u64, Rejection> {
        Ok(1)
    }
}

/// A request costs its body's length in bytes, known before the body is read: its
/// `Content-Length` (which the server holds the body to), else the body's exact size hint (an
/// empty body is 0). A request whose length is not known in advance (a chunked upload) is
/// answered 411 Length Required rather than read first: the budget is spent before the body
/// arrives.
#[derive(Clone, Copy, Debug)]
pub struct BodyLength;

impl CostExtractor for BodyLength {
    fn cost(&self, request: &Parts, body_size: Option<u64>) -> Result<u64, Rejection> {
        if let Some(length) = request.headers.get(CONTENT_LENGTH) {
            return length.to_str().ok().and_then(|length| length.trim().parse().ok()).ok_or_else(|| {
                Rejection::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_content_length",
                    "Content-Length is not a number",
                )
            });
        }
        body_size.ok_or_else(|| {
            Rejection::new(
                StatusCode::LENGTH_REQUIRED,
                "length_required",
                "this request costs its body's length, which must be known in advance (Content-Length)",
            )
        })
    }
}

/// A cost extractor from a closure; see [`cost_fn`].
#[derive(Clone, Debug)]
pub struct CostFn<F>(F);

/// Prices requests by whatever `price` says, given the request and its body's exact size when
/// known in advance.
pub fn cost_fn<F>(price: F) -> CostFn<F>
where
    F: Fn(&Parts, Option<u64>) -> Result<u64, Rejection> + Send + Sync + 'static,
{
    CostFn(price)
}

impl<F> CostExtractor for CostFn<F>
where
    F: Fn(&Parts, Option<u64>) -> Result<u64, Rejection> + Send + Sync + 'static,
{
    fn cost(&self, request: &Parts, body_size: Option<u64>) -> Result<u64, Rejection> {
        (self.0)(request, body_size)
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = Request::builder();
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn trusted(nets: &[&str]) -> Vec<IpNet> {
        nets.iter().map(|net| net.parse().unwrap()).collect()
    }

    #[track_caller]
    fn check(peer: &str, trusted_nets: &[&str], forwarded: &[&str], expected: &str) {
        let headers: Vec<_> = forwarded.iter().map(|value| ("x-forwarded-for", *value)).collect();
        let mut parts = parts(&headers);
        parts.extensions.insert(ConnectInfo(SocketAddr::new(peer.parse().unwrap(), 4242)));
        assert_eq!(PeerAddress::behind(trusted(trusted_nets)).client(&parts).as_deref(), Some(expected));
    }

    #[test]
    fn the_peer_is_the_client_unless_it_is_a_trusted_proxy() {
        check("203.0.113.9", &[], &["198.51.100.1"], "203.0.113.9");
        check("203.0.113.9", &["10.0.0.0/8"], &["198.51.100.1"], "203.0.113.9");
        check("10.0.0.5", &["10.0.0.0/8"], &["198.51.100.1"], "198.51.100.1");
    }

    #[test]
    fn forwarded_for_is_believed_only_up_to_the_first_untrusted_hop() {
        // The client claims 1.1.1.1; the first proxy saw 198.51.100.1; a second, trusted one
        // saw the first (10.0.0.7).
        check("10.0.0.5", &["10.0.0.0/8"], &["1.1.1.1, 198.51.100.1, 10.0.0.7"], "198.51.100.1");
        check("10.0.0.5", &["10.0.0.0/8"], &["1.1.1.1", "198.51.100.1"], "198.51.100.1");
        // Junk stops the walk at the last trusted hop, never at the client's claim.
        check("10.0.0.5", &["10.0.0.0/8"], &["1.1.1.1, not-an-address"], "10.0.0.5");
        check("10.0.0.5", &["10.0.0.5/32"], &[], "10.0.0.5");
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        check("2001:db8:1:2:3:4:5:6", &[], &[], "2001:db8:1:2::/64");
        check("::ffff:192.0.2.1", &[], &[], "192.0.2.1");
    }

    #[test]
    fn a_missing_key_is_refused_or_spends_the_fallback() {
        let by_header = HeaderKey::new(HeaderName::from_static("x-api-key"));
        let rejection = by_header.key(&parts(&[("x-api-key", "")])).unwrap_err();
        assert_eq!((rejection.status(), rejection.code()), (StatusCode::BAD_REQUEST, "missing_key"));
        let fallback = by_header.or_fallback("anonymous").key(&parts(&[])).unwrap();
        assert_eq!(fallback, Some(RequestKey::from("anonymous")));
        assert_eq!(
            PeerAddress::direct().key(&parts(&[])).unwrap_err().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn the_body_length_is_the_content_length_else_the_known_size_else_411() {
        assert_eq!(BodyLength.cost(&parts(&[("content-length", "42")]), Some(7)).unwrap(), 42);
        assert_eq!(BodyLength.cost(&parts(&[]), Some(7)).unwrap(), 7);
        assert_eq!(BodyLength.cost(&parts(&[]), None).unwrap_err().status(), StatusCode::LENGTH_REQUIRED);
        let invalid = BodyLength.cost(&parts(&[("content-length", "lots")]), Some(7)).unwrap_err();
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    }
}
