//! Who is calling: the operator (one shared token) or a Node (its own credential).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};

/// The operator routes' bearer token, kept only as a digest.
///
/// Comparing digests in constant time hides both the token's bytes and its length from a
/// caller timing the answers.
#[derive(Clone)]
pub struct OperatorToken {
    digest: [u8; 32],
}

impl OperatorToken {
    /// Keeps the digest of `token`.
    pub fn new(token: &str) -> OperatorToken {
        OperatorToken { digest: Sha256::digest(token.as_bytes()).into() }
    }

    fn matches(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&presented).into()
    }
}

/// The text after `Bearer ` in the Authorization header, if there is one.
fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|token| !token.is_empty())
}

/// A request the operator made; extracting it answers 401 for anyone else.
pub(super) struct Operator;

impl Operator {
    /// Who this operator is, as every change it makes records it (a rule's `created_by`).
    ///
    /// There is one operator token, so one name. This is the one place that says so: when
    /// operators have tokens of their own, the extractor keeps whose token it was and this
    /// returns that name.
    ///
    /// # Errors
    /// A 500 if the name is not one a change can record (never, for this fixed one).
    pub(super) fn actor(&self) -> Result<rules::Actor, ApiError> {
        rules::Actor::new("operator").map_err(ApiError::internal)
    }
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        match bearer(parts) {
            Some(token) if state.operator_token.matches(token) => Ok(Operator),
            _ => Err(ApiError::Unauthorized),
        }
    }
}

/// The Node making a request, authenticated by its credential.
pub(super) struct NodeCaller(pub(super) access::AuthenticatedNode);

impl FromRequestParts<AppState> for NodeCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let presented = bearer(parts).ok_or(ApiError::Unauthorized)?;
        // A malformed token is refused here, without a round trip.
        let token = access::NodeToken::parse(presented).map_err(|_| ApiError::Unauthorized)?;
        let hash = token.hash();
        let node = match state.credentials.get(hash.as_bytes()) {
            Some(node) => node,
            None => {
                let node = state
                    .bounded("authenticating a node", state.access.authenticate(token.expose()))
                    .await??;
                state.credentials.insert(*hash.as_bytes(), node);
                node
            }
        };
        // Every later line of this request's log names the caller.
        let span = tracing::Span::current();
        span.record("node_id", tracing::field::display(node.node_id));
        span.record("domain_id", tracing::field::display(node.domain_id));
        Ok(NodeCaller(node))
    }
}

/// Authenticated Nodes by the SHA-256 of their token, with when they were authenticated.
type Entries = HashMap<[u8; 32], (access::AuthenticatedNode, Instant)>;

/// Node credentials authenticated recently, so a Node's requests do not each pay a round trip
/// to look its token up.
///
/// An entry lives for a short, fixed time ([`CredentialCache::TTL`]) and the cache holds a
/// bounded number of them; only tokens the store confirmed are kept, so a flood of made-up
/// tokens cannot fill it. Credentials are never revoked today; the lifetime bounds how long a
/// future revocation would take to reach every replica.
#[derive(Clone, Debug)]
pub struct CredentialCache {
    entries: Arc<Mutex<Entries>>,
    capacity: usize,
}

impl CredentialCache {
    /// How long an authenticated token is trusted without asking the store again.
    pub const TTL: Duration = Duration::from_secs(10);

    /// An empty cache holding at most `capacity` tokens.
    pub fn new(capacity: usize) -> CredentialCache {
        CredentialCache { entries: Arc::default(), capacity }
    }

    fn get(&self, token_hash: &[u8; 32]) -> Option<access::AuthenticatedNode> {
        let entries = self.lock();
        let (node, stored_at) = entries.get(token_hash)?;
        (stored_at.elapsed() < Self::TTL).then_some(*node)
    }

    fn insert(&self, token_hash: [u8; 32], node: access::AuthenticatedNode) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity {
            entries.retain(|_, (_, stored_at)| stored_at.elapsed() < Self::TTL);
            if entries.len() >= self.capacity {
                // Still full of live entries: start over rather than track recency on the hot path.
                entries.clear();
            }
        }
        entries.insert(token_hash, (node, Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Entries are plain values; a panic elsewhere cannot leave one half-written.
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
