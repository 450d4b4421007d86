//! Secret values at rest: sealed with AES-256-GCM under a keyring, bound to their row.
//!
//! A value is stored as a [`Sealed`]: the id of the key that sealed it, a random 96-bit nonce
//! and the ciphertext with its 128-bit tag. The Domain and the name are the associated data,
//! so a sealed value copied to another row (another Domain, or another name) does not open:
//! whoever can write the table cannot move one Domain's secret under another's name.
//!
//! The [`Keyring`] holds the current key, which seals every write, and the old keys, which
//! only open what they sealed before a rotation; re-sealing under the current key is the
//! service's `rekey`. A key is never printed: `Debug` shows its id only, and the id is derived
//! from the key by a one-way hash, so it tells nothing about the key.

use std::fmt;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

use crate::{DomainId, InvalidInput, SecretName, SecretValue};

/// Bytes of an AES-256 key.
const KEY_BYTES: usize = 32;

/// Bytes of an AES-GCM nonce (96 bits, the size GCM is defined for).
pub(crate) const NONCE_BYTES: usize = 12;

/// Bytes of the authentication tag AES-GCM appends to every ciphertext.
const TAG_BYTES: usize = 16;

/// Hex characters of a [`KeyId`]: 64 bits of the key's hash, so two keys of one deployment
/// never share an id by chance.
const KEY_ID_CHARS: usize = 16;

/// What the associated data of every sealed value starts with; a later format changes it, so
/// values of two formats can never be confused.
const ASSOCIATED_DATA_PREFIX: &[u8] = b"plexsphere secret v1\0";

/// Names the key a value was sealed under: 16 lowercase hex characters, the first 64 bits of
/// SHA-256 over a fixed label and the key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyId(String);

impl KeyId {
    /// Reads a key id as stored beside a value.
    ///
    /// # Errors
    /// [`InvalidInput`] with field `key_id` unless it is 16 lowercase hex characters.
    pub fn parse(text: &str) -> Result<KeyId, InvalidInput> {
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if text.len() == KEY_ID_CHARS && text.bytes().all(hex) {
            Ok(KeyId(text.to_owned()))
        } else {
            Err(InvalidInput { field: "key_id", reason: "must be 16 lowercase hex characters" })
        }
    }

    /// The id as text, as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a key's text is not a key. The message never repeats the text: it is the key, or a
/// typo of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidKey {
    /// Not standard, padded base64.
    #[error("is not base64 (standard alphabet, padded); generate a key with `openssl rand -base64 32`")]
    NotBase64,
    /// Base64 of the wrong number of bytes.
    #[error("decodes to {0} bytes, and a key is 32; generate one with `openssl rand -base64 32`")]
    WrongLength(usize),
}

/// An AES-256 key and its id.
///
/// `Debug` shows the id only. The key's bytes live in the cipher's expanded key schedule,
/// which is zeroed when the key is dropped; the decoded bytes are zeroed as soon as the
/// schedule is built.
#[derive(Clone)]
pub struct SecretsKey {
    id: KeyId,
    cipher: Aes256Gcm,
}

impl SecretsKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8; KEY_BYTES]) -> SecretsKey {
        let digest =
            Sha256::new().chain_update(b"plexsphere secrets key id\0").chain_update(bytes).finalize();
        let id = digest[..KEY_ID_CHARS / 2].iter().map(|byte| format!("{byte:02x}")).collect();
        SecretsKey { id: KeyId(id), cipher: Aes256Gcm::new(bytes.into()) }
    }

    /// A key from its base64 text (what `openssl rand -base64 32` prints), surrounding
    /// whitespace ignored.
    ///
    /// # Errors
    /// [`InvalidKey`] unless the text is standard padded base64 of exactly 32 bytes.
    pub fn from_base64(text: &str) -> Result<SecretsKey, InvalidKey> {
        let decoded = Zeroizing::new(STANDARD.decode(text.trim()).map_err(|_| InvalidKey::NotBase64)?);
        let bytes: &[u8; KEY_BYTES] =
            decoded.as_slice().try_into().map_err(|_| InvalidKey::WrongLength(decoded.len()))?;
        Ok(SecretsKey::from_bytes(bytes))
    }

    /// The key's id, stored beside every value it seals.
    pub fn id(&self) -> &KeyId {
        &self.id
    }
}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsKey").field("id", &self.id.as_str()).finish_non_exhaustive()
    }
}

/// A value as stored: sealed under a key, by its id.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    key_id: KeyId,
    nonce: [u8; NONCE_BYTES],
    ciphertext: Vec<u8>,
}

impl Sealed {
    /// A sealed value as read back from the store.
    ///
    /// # Errors
    /// [`InvalidInput`] with field `nonce` unless the nonce is 12 bytes, or `ciphertext` when it
    /// is shorter than a tag.
    pub fn new(key_id: KeyId, nonce: &[u8], ciphertext: Vec<u8>) -> Result<Sealed, InvalidInput> {
        let nonce =
            nonce.try_into().map_err(|_| InvalidInput { field: "nonce", reason: "must be 12 bytes" })?;
        if ciphertext.len() < TAG_BYTES {
            return Err(InvalidInput { field: "ciphertext", reason: "must hold at least a tag" });
        }
        Ok(Sealed { key_id, nonce, ciphertext })
    }

    /// The id of the key it was sealed under.
    pub fn key_id(&self) -> &KeyId {
        &self.key_id
    }

    /// The nonce it was sealed with; unique to this sealing.
    pub fn nonce(&self) -> &[u8; NONCE_BYTES] {
        &self.nonce
    }

    /// The ciphertext and its tag.
    pub fn ciphertext(&self) -> &[u8] {
        &self.ciphertext
    }
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("key_id", &self.key_id.as_str())
            .field("ciphertext_bytes", &self.ciphertext.len())
            .finish_non_exhaustive()
    }
}

/// A secret's value as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredValue {
    /// Sealed under a key of the keyring (every value written since migration 0030).
    Sealed(Sealed),
    /// Written in plain text before values were sealed; readable as it is until `rekey`
    /// seals it.
    Plaintext(SecretValue),
}

/// Why a stored value did not open.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Sealed under a key the keyring does not hold: a key retired too early, or a keyring
    /// configured without it.
    #[error("sealed under key {0}, which the keyring does not hold")]
    UnknownKey(KeyId),
    /// The ciphertext does not authenticate under its key for this Domain and name: it was
    /// altered, or copied from another row.
    #[error("sealed value under key {0} does not authenticate for its domain and name")]
    NotAuthentic(KeyId),
    /// It opened, but to something no value could be (not UTF-8, or breaking the value rules).
    #[error("opened value is not a secret value")]
    NotAValue,
}

/// The keys values are sealed and opened with: the current key seals every write, the old
/// keys only open what they sealed.
#[derive(Clone)]
pub struct Keyring {
    current: SecretsKey,
    old: Vec<SecretsKey>,
}

impl Keyring {
    /// A keyring sealing under `current` and opening under it and every key of `old`.
    ///
    /// An old key equal to the current one, or named twice, is kept once: listing the new key
    /// among the old ones during a rotation is harmless.
    pub fn new(current: SecretsKey, old: impl IntoIterator<Item = SecretsKey>) -> Keyring {
        let mut keyring = Keyring { current, old: Vec::new() };
        for key in old {
            if keyring.key(&key.id).is_none() {
                keyring.old.push(key);
            }
        }
        keyring
    }

    /// The id of the key every write is sealed under.
    pub fn current_key_id(&self) -> &KeyId {
        &self.current.id
    }

    /// Seals `value` as `domain`'s secret `name` under the current key, with a fresh random
    /// nonce.
    ///
    /// # Panics
    /// Never for a valid [`SecretValue`]: AES-GCM seals up to 64 GiB, and a value is at most
    /// 64 KiB.
    pub fn seal(&self, domain: DomainId, name: &SecretName, value: &SecretValue) -> Sealed {
        // Random 96-bit nonces are safe for up to 2^32 sealings under one key (NIST SP 800-38D,
        // 8.3); a deployment that wrote that many secrets would have rotated long before.
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = associated_data(domain, name);
        let ciphertext = self
            .current
            .cipher
            .encrypt(&nonce, Payload { msg: value.expose().as_bytes(), aad: &aad })
            .expect("AES-GCM seals any value of at most 64 KiB");
        Sealed { key_id: self.current.id.clone(), nonce: nonce.into(), ciphertext }
    }

    /// The value `stored` holds as `domain`'s secret `name`.
    ///
    /// # Errors
    /// [`OpenError`] when the key is not in the keyring, the value does not authenticate for
    /// this Domain and name, or it opens to something that is not a value.
    pub fn open(
        &self,
        domain: DomainId,
        name: &SecretName,
        stored: &StoredValue,
    ) -> Result<SecretValue, OpenError> {
        let sealed = match stored {
            StoredValue::Plaintext(value) => return Ok(value.clone()),
            StoredValue::Sealed(sealed) => sealed,
        };
        let key = self.key(&sealed.key_id).ok_or_else(|| OpenError::UnknownKey(sealed.key_id.clone()))?;
        let aad = associated_data(domain, name);
        let opened = key
            .cipher
            .decrypt(Nonce::from_slice(&sealed.nonce), Payload { msg: &sealed.ciphertext, aad: &aad })
            .map_err(|_| OpenError::NotAuthentic(sealed.key_id.clone()))?;
        let text = String::from_utf8(opened).map_err(|_| OpenError::NotAValue)?;
        SecretValue::new(text).map_err(|_| OpenError::NotAValue)
    }

    fn key(&self, id: &KeyId) -> Option<&SecretsKey> {
        std::iter::once(&self.current).chain(&self.old).find(|key| key.id == *id)
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let old: Vec<&str> = self.old.iter().map(|key| key.id.as_str()).collect();
        f.debug_struct("Keyring").field("current", &self.current.id.as_str()).field("old", &old).finish()
    }
}

/// What a value is bound to: the format, the Domain's 16 bytes, then the name. The only
/// variable-length field comes last, so no two (Domain, name) pairs give the same bytes.
fn associated_data(domain: DomainId, name: &SecretName) -> Vec<u8> {
    let mut aad = Vec::with_capacity(ASSOCIATED_DATA_PREFIX.len() + 16 + name.as_str().len());
    aad.extend_from_slice(ASSOCIATED_DATA_PREFIX);
    aad.extend_from_slice(domain.as_uuid().as_bytes());
    aad.extend_from_slice(name.as_str().as_bytes());
    aad
}

#[cfg(test)]
mod tests;
