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
mod tests {
    use super::*;
    use crate::config::{DecideCredential, OperatorCredential};

    #[test]
    fn an_operator_is_found_by_its_token_and_a_stranger_is_not() {
        let credential = |name: &str, token: &str| OperatorCredential {
            name: audit::Actor::operator(name).unwrap(),
            token: crate::config::Redacted::new(token.to_owned()),
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
                token: crate::config::Redacted::new("envoy-token-0123456789".into()),
                services: Services::AllButOwn,
            },
            DecideCredential {
                name: audit::Actor::operator("edge").unwrap(),
                token: crate::config::Redacted::new("edge-token-0123456789".into()),
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
