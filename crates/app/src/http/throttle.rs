//! Failed authentications, limited per client address across every replica.
//!
//! A made-up but well-formed Node token costs a credential lookup in the database, and a guess
//! at the operator token costs nothing at all; without a limit, one client could drive
//! thousands of lookups a second or guess forever. Each failed authentication (a missing,
//! malformed, unknown or wrong token) spends one cell of the client address's budget in the
//! named limiter `auth_failure`, shared by every replica through `plexsphere.named_limits`.
//! Once the budget is spent the request answers 429 `auth_rate_limited`, before any lookup:
//! the replica's guard remembers what the store said, so a flood costs the database nothing.
//!
//! A valid token is never throttled: the operator's, and a Node token this replica already
//! knows to be valid (its credential cache). The client address is the socket's peer, unless
//! that peer is one of `PLEXSPHERE_TRUSTED_PROXIES`, whose `X-Forwarded-For` is then believed
//! up to the first address that is not a trusted proxy. IPv6 clients are keyed by their /64,
//! the smallest block one subscriber is usually given, so rotating through one's own
//! addresses does not buy more guesses.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use ipnet::IpNet;
use ratebudget::{Clock, Decider, Decision, Guard, Limit, LimiterName, NamedKey, NamedSpend, Take};

use super::ApiError;

/// The named limiter failed authentications spend from.
pub const AUTH_FAILURE: &str = "auth_failure";

/// How often a refused address is logged at most: a flood must not become a flood of lines.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Addresses whose last refusal was logged; cleared whole when it grows past this.
const LOGGED_CAPACITY: usize = 10_000;

/// Where a request comes from, as the failure budget is keyed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientAddress(String);

impl ClientAddress {
    /// The address as it is keyed and logged.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The failure budget per client address, and who may be believed about addresses.
#[derive(Clone)]
pub struct AuthThrottle {
    decider: Arc<dyn Decider>,
    guard: Arc<Guard>,
    clock: Arc<dyn Clock>,
    limit: Limit,
    trusted_proxies: Arc<[IpNet]>,
    logged: Arc<Mutex<HashMap<String, Instant>>>,
}

impl std::fmt::Debug for AuthThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthThrottle").field("limit", &self.limit).finish_non_exhaustive()
    }
}

fn limiter() -> LimiterName {
    LimiterName::new(AUTH_FAILURE).expect("auth_failure is a valid limiter name")
}

impl AuthThrottle {
    /// Failures decided through `decider` (the clock gate in front of `guard`) at `clock`'s
    /// now, `limit` per address; `guard` also answers what is already known to be refused.
    pub fn new(
        decider: Arc<dyn Decider>,
        guard: Arc<Guard>,
        clock: Arc<dyn Clock>,
        limit: Limit,
        trusted_proxies: Vec<IpNet>,
    ) -> AuthThrottle {
        AuthThrottle {
            decider,
            guard,
            clock,
            limit,
            trusted_proxies: trusted_proxies.into(),
            logged: Arc::default(),
        }
    }

    /// The client a request comes from (see the module documentation).
    pub fn client(&self, parts: &Parts) -> ClientAddress {
        let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
            // Only a router driven without a socket (a unit test) has no peer.
            return ClientAddress("unknown".into());
        };
        ClientAddress(key_of(client_ip(peer.ip(), parts, &self.trusted_proxies)))
    }

    /// A 429 when the client's failure budget is already known to be spent: answered before
    /// any credential lookup, at no cost to the database.
    pub fn known_refusal(&self, client: &ClientAddress) -> Option<ApiError> {
        let refusal = self.guard.known_refusal(self.spend(client), self.clock.now())?;
        self.log_refused(client);
        Some(rate_limited(refusal.retry_after))
    }

    /// Spends one failure of `client`'s budget and answers what the request gets: 401, or 429
    /// once the budget is spent. A failure that cannot be counted (the store cannot answer and
    /// the clock gate or fail mode says not to guess) is still a 401: the credentials were
    /// wrong whatever the budget.
    pub async fn failed(&self, client: &ClientAddress) -> ApiError {
        match self.decider.decide(Take::Named(self.spend(client)), self.clock.now()).await {
            Ok(Decision::Refused(refusal)) => {
                self.log_refused(client);
                rate_limited(refusal.retry_after)
            }
            Ok(_) => ApiError::Unauthorized,
            Err(undecided) => {
                tracing::warn!(client = client.as_str(), error = %super::cause_chain(&undecided), "a failed authentication could not be counted");
                ApiError::Unauthorized
            }
        }
    }

    fn spend(&self, client: &ClientAddress) -> NamedSpend {
        let limiter = limiter();
        NamedSpend {
            limiter,
            key: NamedKey::of(limiter, client.0.as_bytes()),
            cells: 1,
            limit: self.limit,
            // Failed authentications keep being throttled per replica while the store cannot
            // answer: the alternative is an unthrottled guesser, or a 500 for a client whose
            // credentials were simply wrong.
            enforcement: ratebudget::Enforcement {
                fail_mode: ratebudget::FailMode::Local,
                ..ratebudget::Enforcement::STRICT
            },
        }
    }

    fn log_refused(&self, client: &ClientAddress) {
        let mut logged = self.logged.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        if logged.get(client.as_str()).is_some_and(|last| now.duration_since(*last) < LOG_EVERY) {
            return;
        }
        if logged.len() >= LOGGED_CAPACITY {
            logged.clear();
        }
        logged.insert(client.0.clone(), now);
        // The address, never the token.
        tracing::warn!(
            client = client.as_str(),
            "failed authentications throttled (said at most once a minute per address)"
        );
    }
}

fn rate_limited(retry_after: Duration) -> ApiError {
    ApiError::RateLimited {
        code: "auth_rate_limited",
        message: "too many failed authentications from this address",
        retry_after,
    }
}

/// The client's address: the peer, or, when the peer is a trusted proxy, the right-most
/// address of `X-Forwarded-For` that is not a trusted proxy itself (each proxy appends the
/// address it received from, so everything left of the first untrusted hop is the client's
/// own claim and worth nothing). A malformed entry stops the walk at the last trusted hop.
fn client_ip(peer: IpAddr, parts: &Parts, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<&str> = parts
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

/// Parses `PLEXSPHERE_TRUSTED_PROXIES`: comma-separated addresses or CIDR ranges.
///
/// # Errors
/// The first entry that is neither, as text to show.
pub fn parse_trusted_proxies(text: &str) -> Result<Vec<IpNet>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{entry:?} is not an address or a CIDR range"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use axum::http::Request;

    use super::*;

    fn parts(forwarded: &[&str]) -> Parts {
        let mut request = Request::builder();
        for value in forwarded {
            request = request.header("x-forwarded-for", *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[track_caller]
    fn check(peer: &str, trusted: &str, forwarded: &[&str], expected: &str) {
        let trusted = parse_trusted_proxies(trusted).unwrap();
        let ip = client_ip(peer.parse().unwrap(), &parts(forwarded), &trusted);
        assert_eq!(key_of(ip), expected);
    }

    #[test]
    fn the_peer_is_the_client_unless_it_is_a_trusted_proxy() {
        check("203.0.113.9", "", &["198.51.100.1"], "203.0.113.9");
        check("203.0.113.9", "10.0.0.0/8", &["198.51.100.1"], "203.0.113.9");
        check("10.0.0.5", "10.0.0.0/8", &["198.51.100.1"], "198.51.100.1");
    }

    #[test]
    fn forwarded_for_is_believed_only_up_to_the_first_untrusted_hop() {
        // The client claims 1.1.1.1; the first proxy saw 198.51.100.1; a second, trusted one
        // saw the first (10.0.0.7).
        check("10.0.0.5", "10.0.0.0/8", &["1.1.1.1, 198.51.100.1, 10.0.0.7"], "198.51.100.1");
        check("10.0.0.5", "10.0.0.0/8", &["1.1.1.1", "198.51.100.1"], "198.51.100.1");
        // Junk stops the walk at the last trusted hop, never at the client's claim.
        check("10.0.0.5", "10.0.0.0/8", &["1.1.1.1, not-an-address"], "10.0.0.5");
        check("10.0.0.5", "10.0.0.5", &[], "10.0.0.5");
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        check("2001:db8:1:2:3:4:5:6", "", &[], "2001:db8:1:2::/64");
        check("::ffff:192.0.2.1", "", &[], "192.0.2.1");
    }

    #[test]
    fn trusted_proxies_are_addresses_or_ranges() {
        assert_eq!(parse_trusted_proxies(" 10.0.0.1 , fd00::/8").unwrap().len(), 2);
        assert!(parse_trusted_proxies("10.0.0.1, nonsense").unwrap_err().contains("nonsense"));
        assert!(parse_trusted_proxies("").unwrap().is_empty());
    }
}
