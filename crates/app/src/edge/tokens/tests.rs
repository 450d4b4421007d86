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
