//! Fuzz targets for every parser the project owns: Node tokens, names (Domain, Node, secret,
//! operator), secret values, keys and key ids, the knobs, and the operator routes' request
//! bodies and query. Each must never panic, and whatever it accepts must meet the rules the
//! rest of the code relies on.
//!
//! bolero drives them with its random engine on the stable toolchain. `cargo test` runs each
//! for about a second (bolero's default); `bash bench/fuzz.sh [seconds]` runs each for as long
//! as it is told, in release mode. A failure prints the `BOLERO_RANDOM_SEED` that replays it.

use axum::http::StatusCode;

/// Whatever a parser refuses must be a client error, never a 500.
#[track_caller]
fn is_client_error(error: &app::http::ApiError) {
    assert!(error.status().is_client_error(), "{error:?}");
    assert_ne!(error.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[test]
fn node_tokens() {
    bolero::check!().for_each(|bytes: &[u8]| {
        let Ok(text) = std::str::from_utf8(bytes) else { return };
        if let Ok(token) = access::NodeToken::parse(text) {
            // One credential, one text, one hash.
            assert_eq!(token.expose(), text);
            assert!(text.starts_with("psn_") && text.len() == 47, "{text:?}");
            assert_eq!(token.hash(), access::NodeToken::parse(text).unwrap().hash());
            assert!(!format!("{token:?}").contains(text));
        }
    });
    // Generated tokens always parse back.
    bolero::check!().with_iterations(1000).for_each(|_: &[u8]| {
        let token = access::NodeToken::generate();
        assert_eq!(access::NodeToken::parse(token.expose()).unwrap().hash(), token.hash());
    });
}

#[test]
fn domain_and_node_names() {
    bolero::check!().with_type::<String>().for_each(|raw| {
        let domain = access::DomainName::parse(raw.clone());
        let node = access::NodeName::parse(raw.clone());
        assert_eq!(domain.is_ok(), node.is_ok());
        if let Ok(name) = domain {
            let name = name.as_str();
            assert_eq!(name, raw.trim());
            assert!((1..=100).contains(&name.chars().count()), "{name:?}");
            assert!(!name.chars().any(|c| c.is_control() || access::is_invisible(c)), "{name:?}");
        }
    });
}

#[test]
fn secret_names_and_values() {
    bolero::check!().with_type::<String>().for_each(|raw| {
        if let Ok(name) = secrets::SecretName::parse(raw.clone()) {
            let name = name.as_str();
            assert!((1..=128).contains(&name.len()));
            assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)), "{name:?}");
            assert!(name.bytes().any(|b| b != b'.'));
        }
        if let Ok(value) = secrets::SecretValue::new(raw.clone()) {
            assert!(value.expose().len() <= 65_536 && !value.expose().contains('\0'));
            assert_eq!(format!("{value:?}"), "SecretValue(<redacted>)");
        }
    });
}

#[test]
fn operator_names_audit_actors_and_actions() {
    bolero::check!().with_type::<String>().for_each(|raw| {
        if let Ok(actor) = audit::Actor::operator(raw) {
            assert_eq!(actor.as_str(), raw);
            assert_eq!(audit::Actor::parse(raw), Ok(actor));
        }
        if let Ok(action) = audit::Action::parse(raw) {
            assert_eq!(action.as_str(), raw);
        }
    });
}

#[test]
fn secrets_keys_and_key_ids() {
    bolero::check!().with_type::<String>().for_each(|raw| {
        match secrets::SecretsKey::from_base64(raw) {
            Ok(key) => {
                // The id names the key without showing it.
                assert_eq!(secrets::KeyId::parse(key.id().as_str()).as_ref(), Ok(key.id()));
                assert!(!format!("{key:?}").contains(raw.trim()));
            }
            Err(error) => {
                // Short text can be a word of the message by chance; a key-sized one never is.
                let shown = error.to_string();
                assert!(raw.trim().chars().count() < 8 || !shown.contains(raw.trim()), "{shown}");
            }
        }
        if let Ok(id) = secrets::KeyId::parse(raw) {
            assert_eq!(id.as_str(), raw);
        }
    });
    // Whatever is sealed opens again, for its own row only.
    bolero::check!().with_type::<(Vec<u8>, String, [u8; 32])>().for_each(|(name, value, key)| {
        let Ok(name) = secrets::SecretName::parse(String::from_utf8_lossy(name).into_owned()) else { return };
        let Ok(value) = secrets::SecretValue::new(value.clone()) else { return };
        let keyring = secrets::Keyring::new(secrets::SecretsKey::from_bytes(key), []);
        let domain = secrets::DomainId::from(uuid::Uuid::from_bytes([7; 16]));
        let sealed = secrets::StoredValue::Sealed(keyring.seal(domain, &name, &value));
        assert_eq!(keyring.open(domain, &name, &sealed).as_ref(), Ok(&value));
        let elsewhere = secrets::DomainId::from(uuid::Uuid::from_bytes([8; 16]));
        assert!(keyring.open(elsewhere, &name, &sealed).is_err());
    });
}

/// The knobs a fuzzed value goes into, each with a value the rest of the knobs start from.
const KNOBS: [&str; 8] = [
    app::config::OPERATOR_TOKEN,
    app::config::OPERATOR_TOKENS,
    app::config::SECRETS_KEY,
    app::config::SECRETS_OLD_KEYS,
    app::config::LISTEN,
    app::config::DATABASE_URL,
    app::config::SECRET_READ_NODE_BURST,
    app::config::DATABASE_TIMEOUT_MS,
];

#[test]
fn knobs() {
    bolero::check!().with_type::<(u8, String)>().for_each(|(which, value)| {
        let knob = KNOBS[usize::from(*which) % KNOBS.len()];
        let base = [
            (app::config::DATABASE_URL, "postgres://postgres@127.0.0.1:5432/postgres"),
            (app::config::OPERATOR_TOKEN, "operator-token-0123456789"),
            (app::config::SECRETS_KEY, "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI="),
        ];
        // Clap refuses what does not parse as its type; validation refuses the rest, by name.
        let Ok(knobs) = app::config::Knobs::from_pairs(base.into_iter().chain([(knob, value.as_str())]))
        else {
            return;
        };
        match app::config::Config::from_knobs(&knobs) {
            Ok(config) => assert!(!config.auth.operators.is_empty()),
            Err(error) => {
                // A secret knob's value never appears in the error.
                let secret = [
                    app::config::OPERATOR_TOKEN,
                    app::config::OPERATOR_TOKENS,
                    app::config::SECRETS_KEY,
                    app::config::SECRETS_OLD_KEYS,
                ];
                if secret.contains(&knob) && value.trim().chars().count() >= 8 {
                    assert!(!error.to_string().contains(value.trim()), "{error}");
                }
            }
        }
    });
}

#[test]
fn request_bodies_and_queries() {
    bolero::check!().for_each(|bytes: &[u8]| {
        match app::http::bodies::new_domain(bytes) {
            Ok(domain) => {
                if let Some(issuance) = domain.issuance {
                    // What passes is what a rule's CHECK and the store accept.
                    let draft = rules::RuleDraft {
                        service: None,
                        scope: ratebudget::Scope::AccessIssuanceDomain.as_str().to_owned(),
                        selector: rules::Selector::Domain(uuid::Uuid::nil()),
                        rate: issuance.per_second(),
                        per_ms: Some(1000),
                        burst: issuance.burst(),
                        algorithm: None,
                        mode: None,
                        fail_mode: None,
                        priority: None,
                        charge: None,
                    };
                    assert!(draft.validate().is_ok());
                }
            }
            Err(error) => is_client_error(&error),
        }
        if let Err(error) = app::http::bodies::node_name(bytes) {
            is_client_error(&error);
        }
        if let Err(error) = app::http::bodies::secret_value(bytes) {
            is_client_error(&error);
        }
        if let Ok(query) = std::str::from_utf8(bytes) {
            match app::http::bodies::audit_page(Some(query)) {
                Ok(page) => assert!((1..=1000).contains(&page.limit())),
                Err(error) => is_client_error(&error),
            }
        }
    });
    // Well-formed bodies with fuzzed fields reach the validation behind the JSON.
    bolero::check!().with_type::<(String, Option<f64>, Option<f64>)>().for_each(|(name, rate, burst)| {
        let body = serde_json::json!({ "name": name, "issuance_per_second": rate, "issuance_burst": burst });
        if let Err(error) = app::http::bodies::new_domain(body.to_string().as_bytes()) {
            is_client_error(&error);
        }
    });
}
