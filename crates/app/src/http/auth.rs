//! Who is calling: an operator (by the name of its token) or a Node (its own credential).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};
use crate::config::OperatorCredential;

/// The operator routes' bearer tokens, each kept only as a digest beside the name it acts
/// under.
///
/// Comparing digests in constant time hides both a token's bytes and its length from a caller
/// timing the answers; every token is compared, matching or not, so the time does not tell
/// which operator's token came close either.
#[derive(Clone)]
pub struct OperatorTokens {
    operators: Arc<[(audit::Actor, [u8; 32])]>,
}

impl OperatorTokens {
    /// Keeps the digest of each operator's token.
    pub fn new(operators: &[OperatorCredential]) -> OperatorTokens {
        OperatorTokens {
            operators: operators
                .iter()
                .map(|operator| (operator.name.clone(), Sha256::digest(operator.token.as_bytes()).into()))
                .collect(),
        }
    }

    /// The operator whose token `presented` is.
    fn operator(&self, presented: &str) -> Option<audit::Actor> {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (name, digest) in self.operators.iter() {
            if bool::from(digest.ct_eq(&presented)) {
                found = Some(name.clone());
            }
        }
        found
    }
}

/// The text after `Bearer ` in the Authorization header, if there is one.
fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|token| !token.is_empty())
}

/// A request an operator made, and which operator; extracting it answers 401 for anyone else.
pub(super) struct Operator(pub(super) audit::Actor);

impl Operator {
    /// Who this operator is, as a rule's history records it (`created_by`): the name its token
    /// is configured under, the same name the audit log records.
    ///
    /// # Errors
    /// A 500 if the name is not one a change can record (never: an operator's name is 1 to 64
    /// printable ASCII characters, a subset of what a rule's history accepts).
    pub(super) fn actor(&self) -> Result<rules::Actor, ApiError> {
        rules::Actor::new(self.0.as_str()).map_err(ApiError::internal)
    }
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        // A 401 here spends from the client address's failure budget in the throttle's layer
        // around the route (throttle.rs); the operator's own token is never throttled.
        let name = bearer(parts)
            .and_then(|token| state.operator_tokens.operator(token))
            .ok_or(ApiError::Unauthorized)?;
        // Every later line of this request's log names the operator.
        tracing::Span::current().record("operator", tracing::field::display(&name));
        Ok(Operator(name))
    }
}

/// The Node making a request, authenticated by its credential.
pub(super) struct NodeCaller(pub(super) access::AuthenticatedNode);

impl FromRequestParts<AppState> for NodeCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        // Missing or malformed: refused without a round trip. Every 401 spends from the client
        // address's failure budget in the throttle's layer around the route (throttle.rs),
        // which refuses a spent address before this runs, so before any lookup.
        let token = bearer(parts)
            .and_then(|presented| access::NodeToken::parse(presented).ok())
            .ok_or(ApiError::Unauthorized)?;
        let lookup = match state.credentials.get(token.hash().as_bytes()) {
            Ok(node) => return Ok(NodeCaller::named(node)),
            Err(lookup) => lookup,
        };
        let node =
            match state.bounded("authenticating a node", state.access.authenticate(token.expose())).await? {
                Ok(node) => {
                    state.credentials.insert(lookup, *token.hash().as_bytes(), node);
                    node
                }
                Err(access::AuthError::MalformedToken | access::AuthError::UnknownToken) => {
                    return Err(ApiError::Unauthorized)
                }
                Err(unavailable @ access::AuthError::Unavailable(_)) => return Err(unavailable.into()),
            };
        Ok(NodeCaller::named(node))
    }
}

/// Whether a request carries a credential this replica already knows to be valid: the
/// operator's token, or a Node token in the credential cache. Such a request is never refused
/// for its address's failed authentications before it is authenticated (throttle.rs).
pub(super) fn vouched_for(state: &AppState, parts: &Parts) -> bool {
    let Some(presented) = bearer(parts) else { return false };
    state.operator_tokens.operator(presented).is_some()
        || access::NodeToken::parse(presented)
            .is_ok_and(|token| state.credentials.get(token.hash().as_bytes()).is_ok())
}

impl NodeCaller {
    /// The caller `node`, named in every later line of this request's log.
    fn named(node: access::AuthenticatedNode) -> NodeCaller {
        let span = tracing::Span::current();
        span.record("node_id", tracing::field::display(node.node_id));
        span.record("domain_id", tracing::field::display(node.domain_id));
        NodeCaller(node)
    }
}

/// Authenticated Nodes by the SHA-256 of their token, with when they were authenticated.
#[derive(Debug, Default)]
struct Entries {
    nodes: HashMap<[u8; 32], (access::AuthenticatedNode, Instant)>,
    /// Bumped by every invalidation, so a lookup that raced one does not cache what it found.
    epoch: u64,
    /// Whether revocations reach this cache now; while they do not, it is bypassed.
    listening: bool,
}

/// Node credentials authenticated recently, so a Node's requests do not each pay a round trip
/// to look its token up.
///
/// Revocation reaches it through the database: deleting a Node announces it (migration 0031),
/// and the replica's revocation listener calls [`CredentialCache::revoke`], on every replica,
/// within moments. The cache is used only while that listener is connected
/// ([`CredentialCache::resume`]); while it is not, announcements could be missed, so every
/// request asks the store. An entry also lives at most [`CredentialCache::TTL`], the backstop
/// for a listener whose connection went silent without failing. Only tokens the store
/// confirmed are kept, so a flood of made-up tokens cannot fill it.
#[derive(Clone, Debug)]
pub struct CredentialCache {
    entries: Arc<Mutex<Entries>>,
    capacity: usize,
}

/// A lookup's ticket: the cache's epoch when it started (see [`CredentialCache::insert`]).
pub(super) struct Lookup(u64);

impl CredentialCache {
    /// How long an authenticated token is trusted without asking the store again.
    pub const TTL: Duration = Duration::from_secs(10);

    /// An empty cache holding at most `capacity` tokens; bypassed until [`CredentialCache::resume`].
    pub fn new(capacity: usize) -> CredentialCache {
        CredentialCache { entries: Arc::default(), capacity }
    }

    /// Forgets Node `node`'s credential, and makes every lookup in flight forget what it found.
    pub fn revoke(&self, node: access::NodeId) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.retain(|_, (cached, _)| cached.node_id != node);
    }

    /// Forgets every credential (all Nodes were deleted at once).
    pub fn revoke_all(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.clear();
    }

    /// Revocations reach the cache again: start afresh, since any could have been missed.
    pub fn resume(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.clear();
        entries.listening = true;
    }

    /// Revocations may not reach the cache: forget everything and ask the store until
    /// [`CredentialCache::resume`].
    pub fn suspend(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.clear();
        entries.listening = false;
    }

    /// The Node `token_hash` authenticated recently, or a ticket to look it up with.
    pub(super) fn get(&self, token_hash: &[u8; 32]) -> Result<access::AuthenticatedNode, Lookup> {
        let entries = self.lock();
        match entries.nodes.get(token_hash) {
            Some((node, stored_at)) if entries.listening && stored_at.elapsed() < Self::TTL => Ok(*node),
            _ => Err(Lookup(entries.epoch)),
        }
    }

    /// Keeps what a lookup found, unless a revocation came while it ran: the store's answer may
    /// predate it.
    pub(super) fn insert(
        &self,
        Lookup(epoch): Lookup,
        token_hash: [u8; 32],
        node: access::AuthenticatedNode,
    ) {
        let mut entries = self.lock();
        if !entries.listening || entries.epoch != epoch {
            return;
        }
        if entries.nodes.len() >= self.capacity {
            entries.nodes.retain(|_, (_, stored_at)| stored_at.elapsed() < Self::TTL);
            if entries.nodes.len() >= self.capacity {
                // Still full of live entries: start over rather than track recency on the hot path.
                entries.nodes.clear();
            }
        }
        entries.nodes.insert(token_hash, (node, Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Entries are plain values; a panic elsewhere cannot leave one half-written.
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> access::AuthenticatedNode {
        access::AuthenticatedNode { node_id: access::NodeId::random(), domain_id: access::DomainId::random() }
    }

    fn listening_cache() -> CredentialCache {
        let cache = CredentialCache::new(10);
        cache.resume();
        cache
    }

    #[test]
    fn a_revocation_during_a_lookup_keeps_the_lookups_answer_out_of_the_cache() {
        let cache = listening_cache();
        let node = node();
        let Err(lookup) = cache.get(&[1; 32]) else { panic!("an empty cache holds nothing") };
        // The store answered before the revocation committed; the announcement arrives first.
        cache.revoke(node.node_id);
        cache.insert(lookup, [1; 32], node);
        assert!(cache.get(&[1; 32]).is_err());
    }

    #[test]
    fn a_revocation_forgets_only_that_nodes_credentials() {
        let cache = listening_cache();
        let (revoked, kept) = (node(), node());
        for (hash, node) in [([1; 32], revoked), ([2; 32], kept)] {
            let Err(lookup) = cache.get(&hash) else { panic!("not cached yet") };
            cache.insert(lookup, hash, node);
        }
        cache.revoke(revoked.node_id);
        assert!(cache.get(&[1; 32]).is_err());
        assert_eq!(cache.get(&[2; 32]).ok(), Some(kept));
    }

    #[test]
    fn while_revocations_cannot_arrive_the_cache_is_bypassed() {
        let cache = CredentialCache::new(10);
        let Err(lookup) = cache.get(&[1; 32]) else { panic!("not cached yet") };
        cache.insert(lookup, [1; 32], node());
        assert!(cache.get(&[1; 32]).is_err(), "a cache never resumed keeps nothing");
        cache.resume();
        let Err(lookup) = cache.get(&[1; 32]) else { panic!("not cached yet") };
        cache.insert(lookup, [1; 32], node());
        assert!(cache.get(&[1; 32]).is_ok());
        cache.suspend();
        assert!(cache.get(&[1; 32]).is_err());
    }

    #[test]
    fn an_operator_is_found_by_its_token_and_a_stranger_is_not() {
        let credential = |name: &str, token: &str| OperatorCredential {
            name: audit::Actor::operator(name).unwrap(),
            token: token.to_owned(),
        };
        let tokens = OperatorTokens::new(&[
            credential("alice", "alice-token-0123456789"),
            credential("bob", "bob-token-0123456789"),
        ]);
        assert_eq!(tokens.operator("bob-token-0123456789").unwrap().as_str(), "bob");
        assert!(tokens.operator("bob-token-012345678").is_none());
    }
}
