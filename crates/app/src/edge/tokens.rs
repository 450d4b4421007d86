//! Who is calling, by bearer token: operators and decide callers, each token kept only as a
//! digest, and the one parser of `Bearer <token>` both transports use.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

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
    pub fn find(&self, presented: &str) -> Option<audit::Actor> {
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
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests;
