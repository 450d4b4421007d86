//! Who is calling: an operator (by the name of its token) or a Node (its own credential).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};
use crate::config::{DecideCredential, OperatorCredential};
use rules::Services;

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

    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.operators.is_empty()
    }

    /// The name whose token `presented` is.
    pub(super) fn find(&self, presented: &str) -> Option<audit::Actor> {
        find_in_constant_time(&self.operators, |(_, digest)| digest, presented).map(|(name, _)| name.clone())
    }
}

/// The decide callers' bearer tokens, each kept only as a digest beside the caller's name and
/// the services it may ask for; compared as [`OperatorTokens`] compares.
#[derive(Clone)]
pub struct DecideTokens {
    callers: Arc<[(audit::Actor, [u8; 32], Services)]>,
}

impl DecideTokens {
    /// Keeps the digest of each caller's token.
    pub fn new(callers: &[DecideCredential]) -> DecideTokens {
        DecideTokens {
            callers: callers
                .iter()
                .map(|caller| {
                    (
                        caller.name.clone(),
                        Sha256::digest(caller.token.as_bytes()).into(),
                        caller.services.clone(),
                    )
                })
                .collect(),
        }
    }

    /// Whether no token is configured (the decide API is off).
    pub fn is_empty(&self) -> bool {
        self.callers.is_empty()
    }

    /// The caller whose token `presented` is, and the services it may ask for.
    pub fn find(&self, presented: &str) -> Option<(audit::Actor, Services)> {
        find_in_constant_time(&self.callers, |(_, digest, _)| digest, presented)
            .map(|(name, _, services)| (name.clone(), services.clone()))
    }
}

/// The entry of `entries` whose digest is `presented`'s, comparing every one in constant time
/// whether or not an earlier one matched.
fn find_in_constant_time<'a, T>(
    entries: &'a [T],
    digest: impl Fn(&T) -> &[u8; 32],
    presented: &str,
) -> Option<&'a T> {
    let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    let mut found = None;
    for entry in entries {
        if bool::from(digest(entry).ct_eq(&presented)) {
            found = Some(entry);
        }
    }
    found
}

/// The token of an `Authorization` value (or gRPC `authorization` metadata) `Bearer <token>`:
/// the scheme in any case, the token trimmed and never empty.
pub(super) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|token| !token.is_empty())
}

/// The token of the request's Authorization header, if it has one.
pub(super) fn bearer(parts: &Parts) -> Option<&str> {
    bearer_token(parts.headers.get(AUTHORIZATION)?.to_str().ok()?)
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
            .and_then(|token| state.operator_tokens.find(token))
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
    state.operator_tokens.find(presented).is_some()
        || state.decide_tokens.find(presented).is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(tokens.find("bob-token-0123456789").unwrap().as_str(), "bob");
        assert!(tokens.find("bob-token-012345678").is_none());
    }

    #[test]
    fn a_decide_caller_is_found_with_the_services_its_token_names() {
        let only = Services::Only(vec!["directory".to_owned()].into());
        let tokens = DecideTokens::new(&[
            DecideCredential {
                name: audit::Actor::operator("envoy").unwrap(),
                token: "envoy-token-0123456789".into(),
                services: Services::AllButOwn,
            },
            DecideCredential {
                name: audit::Actor::operator("edge").unwrap(),
                token: "edge-token-0123456789".into(),
                services: only.clone(),
            },
        ]);
        let (name, services) = tokens.find("edge-token-0123456789").unwrap();
        assert_eq!((name.as_str(), services), ("edge", only));
        assert_eq!(tokens.find("envoy-token-0123456789").unwrap().1, Services::AllButOwn);
        assert!(tokens.find("envoy-token-012345678").is_none());
    }

    #[test]
    fn a_bearer_token_is_the_text_after_the_scheme_in_any_case_and_never_empty() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
    }
}
