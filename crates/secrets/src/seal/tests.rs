use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use uuid::Uuid;

use super::*;

fn key(byte: u8) -> SecretsKey {
    SecretsKey::from_bytes(&[byte; KEY_BYTES])
}

fn domain() -> DomainId {
    DomainId::from(Uuid::new_v4())
}

fn name(text: &str) -> SecretName {
    SecretName::parse(text).unwrap()
}

fn value(text: &str) -> SecretValue {
    SecretValue::new(text).unwrap()
}

#[test]
fn a_sealed_value_opens_for_its_own_domain_and_name_only() {
    let keyring = Keyring::new(key(1), []);
    let (domain, other_domain) = (domain(), domain());
    let sealed = StoredValue::Sealed(keyring.seal(domain, &name("db-password"), &value("hunter2")));
    assert_eq!(keyring.open(domain, &name("db-password"), &sealed), Ok(value("hunter2")));

    let not_authentic = Err(OpenError::NotAuthentic(keyring.current_key_id().clone()));
    assert_eq!(keyring.open(other_domain, &name("db-password"), &sealed), not_authentic);
    assert_eq!(keyring.open(domain, &name("db-passwore"), &sealed), not_authentic);
}

#[test]
fn the_ciphertext_is_not_the_value_and_two_sealings_differ() {
    let keyring = Keyring::new(key(1), []);
    let domain = domain();
    let first = keyring.seal(domain, &name("n"), &value("hunter2hunter2"));
    let second = keyring.seal(domain, &name("n"), &value("hunter2hunter2"));
    assert_ne!(first.nonce(), second.nonce());
    assert_ne!(first.ciphertext(), second.ciphertext());
    assert!(!first.ciphertext().windows(7).any(|window| window == b"hunter2"));
    assert_eq!(first.ciphertext().len(), "hunter2hunter2".len() + TAG_BYTES);
}

#[test]
fn a_tampered_value_does_not_open() {
    let keyring = Keyring::new(key(1), []);
    let domain = domain();
    let sealed = keyring.seal(domain, &name("n"), &value("v"));
    let mut ciphertext = sealed.ciphertext().to_vec();
    ciphertext[0] ^= 1;
    let tampered = Sealed::new(sealed.key_id().clone(), sealed.nonce(), ciphertext).unwrap();
    assert!(matches!(
        keyring.open(domain, &name("n"), &StoredValue::Sealed(tampered)),
        Err(OpenError::NotAuthentic(_))
    ));
}

#[test]
fn old_keys_open_what_they_sealed_and_a_forgotten_key_is_named() {
    let (old, new) = (key(1), key(2));
    let domain = domain();
    let sealed = StoredValue::Sealed(Keyring::new(old.clone(), []).seal(domain, &name("n"), &value("v")));

    let rotated = Keyring::new(new.clone(), [old.clone()]);
    assert_eq!(rotated.current_key_id(), new.id());
    assert_eq!(rotated.open(domain, &name("n"), &sealed), Ok(value("v")));

    let forgot = Keyring::new(new, []);
    assert_eq!(forgot.open(domain, &name("n"), &sealed), Err(OpenError::UnknownKey(old.id().clone())));
}

#[test]
fn plaintext_written_before_sealing_reads_as_it_is() {
    let keyring = Keyring::new(key(1), []);
    assert_eq!(keyring.open(domain(), &name("n"), &StoredValue::Plaintext(value("old"))), Ok(value("old")));
}

#[test]
fn keys_are_read_from_padded_base64_of_32_bytes() {
    let text = STANDARD.encode([7u8; 32]);
    let key = SecretsKey::from_base64(&format!(" {text}\n")).unwrap();
    assert_eq!(key.id(), SecretsKey::from_bytes(&[7; 32]).id());
    assert_eq!(
        SecretsKey::from_base64(&STANDARD.encode([7u8; 31])).unwrap_err(),
        InvalidKey::WrongLength(31)
    );
    assert_eq!(
        SecretsKey::from_base64(&STANDARD.encode([7u8; 33])).unwrap_err(),
        InvalidKey::WrongLength(33)
    );
    assert_eq!(SecretsKey::from_base64("").unwrap_err(), InvalidKey::WrongLength(0));
    for garbage in ["not a key", "Bwc=Bwc=", &text[..43], "ÿÿÿÿ"] {
        assert_eq!(SecretsKey::from_base64(garbage).unwrap_err(), InvalidKey::NotBase64, "{garbage:?}");
    }
}

#[test]
fn key_ids_are_stable_hex_and_differ_between_keys() {
    let id = key(1).id().clone();
    assert_eq!(&id, key(1).id());
    assert_ne!(&id, key(2).id());
    assert_eq!(KeyId::parse(id.as_str()), Ok(id));
    assert!(KeyId::parse("0123456789ABCDEF").is_err());
    assert!(KeyId::parse("0123456789abcde").is_err());
}

#[test]
fn neither_keys_nor_keyrings_show_key_material_in_debug() {
    let bytes = [0x5a; 32];
    let text = STANDARD.encode(bytes);
    let key = SecretsKey::from_base64(&text).unwrap();
    let keyring = Keyring::new(key.clone(), [SecretsKey::from_bytes(&[1; 32])]);
    for shown in [format!("{key:?}"), format!("{keyring:?}"), format!("{:?}", InvalidKey::WrongLength(31))] {
        assert!(!shown.contains(&text) && !shown.contains("5a5a") && !shown.contains("90, 90"), "{shown}");
    }
    assert!(format!("{keyring:?}").contains(key.id().as_str()));
}

#[test]
fn a_keyring_keeps_each_key_once() {
    let keyring = Keyring::new(key(1), [key(1), key(2), key(2)]);
    assert_eq!(keyring.old.len(), 1);
}
