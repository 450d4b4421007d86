use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use super::*;

#[track_caller]
fn check_name(raw: &str, expected: Result<&str, InvalidInput>) {
    let domain = DomainName::parse(raw);
    let node = NodeName::parse(raw);
    assert_eq!(domain.as_ref().map(DomainName::as_str).map_err(|e| *e), expected, "domain name {raw:?}");
    assert_eq!(node.as_ref().map(NodeName::as_str).map_err(|e| *e), expected, "node name {raw:?}");
}

const TOO_LONG: InvalidInput = InvalidInput { field: "name", reason: "must be 1 to 100 characters" };
const CONTROL: InvalidInput = InvalidInput { field: "name", reason: "must not contain control characters" };

#[test]
fn names_are_trimmed_and_must_be_one_to_a_hundred_characters() {
    check_name("edge-eu-1", Ok("edge-eu-1"));
    check_name("  edge eu 1 \t\n", Ok("edge eu 1"));
    check_name("", Err(TOO_LONG));
    check_name(" \t ", Err(TOO_LONG));
    let hundred = "é".repeat(100);
    check_name(&hundred, Ok(&hundred));
    check_name(&"é".repeat(101), Err(TOO_LONG));
}

#[test]
fn names_must_not_contain_control_characters() {
    check_name("edge\u{0}1", Err(CONTROL));
    check_name("edge\n1", Err(CONTROL));
    check_name("edge\u{1b}[2J", Err(CONTROL));
    check_name("edge\u{7f}", Err(CONTROL));
    check_name("edge\u{85}x", Err(CONTROL));
}

#[test]
fn names_refuse_invisible_and_bidi_override_characters() {
    let invisible = InvalidInput {
        field: "name",
        reason: "must not contain invisible characters (format, bidi, zero-width, variation selectors)",
    };
    for sneaky in [
        "admin\u{200B}",         // zero-width space
        "ad\u{200D}min",         // zero-width joiner
        "\u{202E}nimda",         // right-to-left override
        "edge\u{2066}1\u{2069}", // isolates
        "\u{FEFF}edge",          // byte-order mark
        "ed\u{00AD}ge",          // soft hyphen
        "edge\u{FE0F}",          // variation selector
        "edge\u{E0041}",         // tag character
        "edge\u{3164}",          // Hangul filler
        "edge\u{2028}1",         // line separator
    ] {
        check_name(sneaky, Err(invisible));
    }
    // Visible text of any script stays welcome.
    check_name("édge-東京-αβγ-مرحبا", Ok("édge-東京-αβγ-مرحبا"));
}

#[test]
fn the_invisible_ranges_are_sorted_and_disjoint() {
    for pair in INVISIBLE.windows(2) {
        assert!(pair[0].0 <= pair[0].1 && pair[0].1 < pair[1].0, "{pair:?}");
    }
}

#[test]
fn invalid_input_reads_as_field_then_reason() {
    assert_eq!(TOO_LONG.to_string(), "invalid name: must be 1 to 100 characters");
}

#[test]
fn tiers_read_back_from_their_text_and_nothing_else_is_a_tier() {
    for tier in Tier::ALL {
        assert_eq!(Tier::parse(tier.as_str()), Ok(tier));
    }
    for bad in ["", "Premium", "gold", " free"] {
        assert_eq!(Tier::parse(bad).unwrap_err().field, "tier", "{bad:?}");
    }
    assert_eq!(Tier::DEFAULT.as_str(), "standard");
}

#[test]
fn a_generated_token_is_the_prefix_and_32_random_bytes_in_base64url() {
    let token = NodeToken::generate();
    let encoded = token.expose().strip_prefix("psn_").unwrap();
    assert_eq!(encoded.len(), 43);
    assert_eq!(URL_SAFE_NO_PAD.decode(encoded).unwrap().len(), 32);
    assert_ne!(token.expose(), NodeToken::generate().expose());
}

#[test]
fn a_generated_token_parses_back_to_the_same_text_and_hash() {
    let token = NodeToken::generate();
    let parsed = NodeToken::parse(token.expose()).unwrap();
    assert_eq!(parsed.expose(), token.expose());
    assert_eq!(parsed.hash(), token.hash());
}

#[test]
fn the_hash_is_the_sha256_of_the_token_text() {
    let token = NodeToken::generate();
    let expected: [u8; 32] = Sha256::digest(token.expose().as_bytes()).into();
    assert_eq!(token.hash().as_bytes(), &expected);
    assert_eq!(TokenHash::from_bytes(expected), token.hash());
    assert_ne!(NodeToken::generate().hash(), token.hash());
}

#[test]
fn parse_rejects_anything_but_the_exact_token_form() {
    let valid = NodeToken::generate().expose().to_owned();
    let encoded = &valid["psn_".len()..];
    let malformed = [
        String::new(),
        "psn_".to_owned(),
        encoded.to_owned(),
        format!("psk_{encoded}"),
        format!("PSN_{encoded}"),
        format!("{valid}A"),
        valid[..valid.len() - 1].to_owned(),
        format!(" {valid}"),
        format!("{valid}\n"),
        format!("Bearer {valid}"),
        // Padding, and the standard alphabet's '+' and '/', are not base64url without padding.
        format!("psn_{}=", &encoded[..42]),
        format!("psn_+{}", &encoded[1..]),
        format!("psn_/{}", &encoded[1..]),
        format!("psn_{}", "A".repeat(44)),
        // 43 characters whose last one carries non-zero bits past the 32nd byte.
        format!("psn_{}B", "A".repeat(42)),
    ];
    for text in malformed {
        assert!(matches!(NodeToken::parse(&text), Err(AuthError::MalformedToken)), "accepted {text:?}");
    }
    assert!(NodeToken::parse(&format!("psn_{}A", "A".repeat(42))).is_ok());
}

#[test]
fn debug_of_a_token_does_not_show_it() {
    let token = NodeToken::generate();
    let encoded = &token.expose()["psn_".len()..];
    for debug in [format!("{token:?}"), format!("{token:#?}")] {
        assert!(!debug.contains(encoded), "{debug}");
        assert!(debug.contains("redacted"), "{debug}");
    }
    let node = Node {
        id: NodeId::random(),
        domain_id: DomainId::random(),
        name: NodeName::parse("edge-1").unwrap(),
    };
    let enrolment = format!("{:?}", Enrolment { node, token: token.clone() });
    assert!(!enrolment.contains(encoded), "{enrolment}");
}

#[test]
fn ids_display_as_their_uuid_and_convert_back() {
    let uuid = uuid::Uuid::new_v4();
    assert_eq!(DomainId::from(uuid).to_string(), uuid.to_string());
    assert_eq!(NodeId::from(uuid).as_uuid(), uuid);
    assert_ne!(DomainId::random(), DomainId::random());
    assert_eq!(DomainId::random().as_uuid().get_version_num(), 4);
}
