use super::*;

#[track_caller]
fn check_name(name: &str, valid: bool) {
    match SecretName::parse(name) {
        Ok(parsed) => {
            assert!(valid, "{name:?} parsed but must be refused");
            assert_eq!(parsed.as_str(), name);
        }
        Err(error) => {
            assert!(!valid, "{name:?} refused but must parse");
            assert_eq!(
                error,
                InvalidInput {
                    field: "name",
                    reason: "must be 1 to 128 of A-Z a-z 0-9 . _ -, not only dots"
                }
            );
        }
    }
}

#[test]
fn names_of_1_to_128_url_safe_characters_parse() {
    check_name("a", true);
    check_name("DB_PASSWORD", true);
    check_name("tls.key-2026_v1", true);
    check_name("0123456789", true);
    check_name(".env", true);
    check_name("a..b", true);
    check_name(&"x".repeat(128), true);
}

#[test]
fn names_that_are_empty_too_long_or_have_other_characters_are_refused() {
    check_name("", false);
    check_name(".", false);
    check_name("..", false);
    check_name(&"x".repeat(129), false);
    for name in ["a/b", "a b", "a%2Fb", "a?b", "a#b", "é", "naïve", "a\n", "\0", "a+b", "a~b", "a:b"] {
        check_name(name, false);
    }
}

#[test]
fn a_name_too_long_in_characters_is_refused_even_when_each_is_allowed() {
    // 128 multi-byte characters: under the limit in characters, but not one is allowed.
    check_name(&"é".repeat(64), false);
}

#[test]
fn values_up_to_64_kib_are_accepted_and_larger_ones_refused() {
    assert_eq!(SecretValue::new("").unwrap().expose(), "");
    assert_eq!(SecretValue::new("s3cr3t").unwrap().expose(), "s3cr3t");
    let largest = "v".repeat(65_536);
    assert_eq!(SecretValue::new(largest.clone()).unwrap().expose(), largest);

    let refused = InvalidInput { field: "value", reason: "must be at most 65536 bytes" };
    assert_eq!(SecretValue::new("v".repeat(65_537)), Err(refused));
    // The limit is in bytes of UTF-8, not characters: 32,769 two-byte characters are too many.
    assert_eq!(SecretValue::new("é".repeat(32_769)), Err(refused));
    assert!(SecretValue::new("é".repeat(32_768)).is_ok());
}

#[test]
fn a_value_holding_a_nul_is_refused_because_the_store_cannot_hold_it() {
    assert_eq!(
        SecretValue::new("before\0after"),
        Err(InvalidInput { field: "value", reason: "must not contain NUL characters" })
    );
}

#[test]
fn debug_never_shows_a_value() {
    let value = SecretValue::new("hunter2").unwrap();
    assert_eq!(format!("{value:?}"), "SecretValue(<redacted>)");
    let secret = Secret { name: SecretName::parse("password").unwrap(), value };
    let shown = format!("{secret:?} {secret:#?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("password"), "{shown}");
}

#[test]
fn invalid_input_names_the_field_and_the_rule() {
    assert_eq!(
        SecretName::parse("a/b").unwrap_err().to_string(),
        "invalid name: must be 1 to 128 of A-Z a-z 0-9 . _ -, not only dots"
    );
    assert_eq!(
        SecretValue::new("v".repeat(70_000)).unwrap_err().to_string(),
        "invalid value: must be at most 65536 bytes"
    );
}

#[test]
fn ids_show_and_return_their_uuid() {
    let id = Uuid::new_v4();
    assert_eq!(DomainId::from(id).as_uuid(), id);
    assert_eq!(NodeId::from(id).as_uuid(), id);
    assert_eq!(DomainId::from(id).to_string(), id.to_string());
    assert_eq!(NodeId::from(id).to_string(), id.to_string());
}
