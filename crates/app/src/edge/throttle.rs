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
//! The throttle is the `ratebudget_tower` layer around the authenticated routes, charging
//! after the route answered 401 (docs/adr/0025): the auth extractors only say who is calling,
//! and know nothing of the budget.
//!
//! A valid token is never throttled: the operator's, and a Node token this replica already
//! knows to be valid (its credential cache). The client address is the socket's peer, unless
//! that peer is one of `PLEXSPHERE_TRUSTED_PROXIES`, whose `X-Forwarded-For` is then believed
//! up to the first address that is not a trusted proxy; IPv6 clients are keyed by their /64
//! (`ratebudget_tower::PeerAddress`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::request::Parts;
use axum::http::StatusCode;
use ipnet::IpNet;
use ratebudget::{Clock, Decider, Enforcement, FailMode, Guard, Limit, LimiterName};
use ratebudget_tower::{
    Answer, BudgetLayer, EachRequest, NamedBudget, PeerAddress, RequestBudget, RequestKey,
};

/// The named limiter failed authentications spend from.
pub const AUTH_FAILURE: &str = "auth_failure";

/// How often a refused address is logged at most: a flood must not become a flood of lines.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Addresses whose last refusal was logged; cleared whole when it grows past this.
const LOGGED_CAPACITY: usize = 10_000;

/// The failure budget per client address, and who may be believed about addresses.
#[derive(Clone)]
pub struct AuthThrottle {
    budget: NamedBudget,
    client: PeerAddress,
    logged: Arc<Mutex<HashMap<RequestKey, Instant>>>,
}

impl std::fmt::Debug for AuthThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthThrottle").field("budget", &self.budget).finish_non_exhaustive()
    }
}

fn limiter() -> LimiterName {
    LimiterName::new(AUTH_FAILURE).expect("auth_failure is a valid limiter name")
}

impl AuthThrottle {
    /// Failures decided through `decider` (the guard, which decides nothing while the clock cannot be trusted) at `clock`'s
    /// now, `limit` per address; `guard` also answers what is already known to be refused.
    pub fn new(
        decider: Arc<dyn Decider>,
        guard: Arc<Guard>,
        clock: Arc<dyn Clock>,
        limit: Limit,
        trusted_proxies: Vec<IpNet>,
    ) -> AuthThrottle {
        let budget = NamedBudget::new(limiter(), limit, guard, clock)
            .deciding_through(decider)
            // Failed authentications keep being throttled per replica while the store cannot
            // answer: the alternative is an unthrottled guesser, or a 500 for a client whose
            // credentials were simply wrong.
            .with_enforcement(Enforcement { fail_mode: FailMode::Static, ..Enforcement::STRICT });
        // Only a router driven without a socket (a unit test) has no peer.
        let client = PeerAddress::behind(trusted_proxies).or_fallback("unknown");
        AuthThrottle { budget, client, logged: Arc::default() }
    }

    /// The layer around every authenticated route: each 401 spends one cell of the client
    /// address's budget, and the 401 the budget refuses becomes a 429 `auth_rate_limited`. An
    /// address whose budget this replica already knows to be spent is answered 429 before
    /// the route runs, so before any credential lookup, unless `vouched_for` says the request
    /// carries a credential this replica already knows to be valid. A failure that cannot be
    /// counted (the clock cannot be trusted, or the store cannot answer) stays a 401: the credentials were
    /// wrong whatever the budget.
    pub fn layer(
        &self,
        vouched_for: impl Fn(&Parts) -> bool + Send + Sync + 'static,
    ) -> BudgetLayer<PeerAddress, EachRequest> {
        let logged = self.logged.clone();
        BudgetLayer::new(self.budget.clone(), self.client.clone(), EachRequest)
            .charge_only_responses([StatusCode::UNAUTHORIZED])
            .skip_precheck_when(vouched_for)
            .refusal("auth_rate_limited", "too many failed authentications from this address")
            .on_refusal(move |client| log_refused(&logged, client))
    }
}

impl AuthThrottle {
    /// Whether `client`'s failures are already known to be spent on this replica: for a server
    /// the layer is not around (the gRPC API), to refuse before looking at the credential.
    pub fn known_spent(&self, client: IpAddr) -> bool {
        self.budget.known_refusal(&address_key(client), 1).is_some()
    }

    /// Counts one failed authentication of `client`, as the layer counts a 401; `true` when
    /// the address's budget refused it (the caller answers as throttled, not unauthenticated).
    /// A failure that cannot be counted is not a refusal.
    pub async fn count_failure(&self, client: IpAddr) -> bool {
        let key = address_key(client);
        let refused = matches!(self.budget.spend(&key, 1).await, Ok(Answer::Refused(_)));
        if refused {
            log_refused(&self.logged, &key);
        }
        refused
    }
}

fn address_key(client: IpAddr) -> RequestKey {
    RequestKey::new(PeerAddress::key_of(client).as_bytes())
}

/// Says that `client`'s failures are throttled, at most once a minute per address.
fn log_refused(logged: &Mutex<HashMap<RequestKey, Instant>>, client: &RequestKey) {
    let mut logged = logged.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let now = Instant::now();
    if logged.get(client).is_some_and(|last| now.duration_since(*last) < LOG_EVERY) {
        return;
    }
    if logged.len() >= LOGGED_CAPACITY {
        logged.clear();
    }
    logged.insert(client.clone(), now);
    // This key is the client's address, never a token.
    tracing::warn!(
        client = %String::from_utf8_lossy(client.as_bytes()),
        "failed authentications throttled (said at most once a minute per address)"
    );
}
