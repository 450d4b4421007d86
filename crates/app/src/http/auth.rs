//! Who is calling: an operator (by the name of its token) or a Node (its own credential).

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::error::ApiError;
use super::state::AppState;
use crate::edge::tokens::bearer_token;

/// The token of the request's Authorization header, if it has one.
pub(super) fn bearer(parts: &Parts) -> Option<&str> {
    bearer_token(parts.headers.get(AUTHORIZATION)?.to_str().ok()?)
}

/// A request an operator made, and which operator; extracting it answers 401 for anyone else.
pub(super) struct Operator(pub(super) audit::Actor);

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
