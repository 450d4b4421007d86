//! The access context's values: ids, validated names, tiers and credentials.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::TryRngCore as _;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use crate::AuthError;

#[cfg(test)]
mod tests;

/// The longest Domain or Node name, in characters.
const MAX_NAME_CHARS: usize = 100;

/// What every token starts with, so that a leaked token is recognisable for what it is (by a
/// secret scanner, in a log, in a paste).
const TOKEN_PREFIX: &str = "psn_";

/// Random bytes in a token: 256 bits, beyond any guessing.
const TOKEN_BYTES: usize = 32;

/// Characters of base64url, unpadded, that encode [`TOKEN_BYTES`] bytes.
const TOKEN_ENCODED_CHARS: usize = 43;

/// Identifies a Domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainId(Uuid);

impl DomainId {
    /// A new random (v4) id.
    pub fn random() -> DomainId {
        DomainId(Uuid::new_v4())
    }

    /// The id as a uuid.
    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for DomainId {
    fn from(id: Uuid) -> Self {
        DomainId(id)
    }
}

impl fmt::Display for DomainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Identifies a Node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Uuid);

impl NodeId {
    /// A new random (v4) id.
    pub fn random() -> NodeId {
        NodeId(Uuid::new_v4())
    }

    /// The id as a uuid.
    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for NodeId {
    fn from(id: Uuid) -> Self {
        NodeId(id)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why a value given to the access context was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct InvalidInput {
    /// The input that was rejected, e.g. `name` or `burst`.
    pub field: &'static str,
    /// What it must be, e.g. `must be 1 to 100 characters`.
    pub reason: &'static str,
}

/// Characters a name refuses besides control characters: every Unicode format character
/// (general category Cf: bidi embeddings, overrides, isolates and marks, zero-width spaces and
/// joiners, the byte-order mark, soft hyphen, tags), the other default-ignorable code points
/// (variation selectors, Hangul fillers, combining grapheme joiner, ...) and the line and
/// paragraph separators. Each renders as nothing or reorders the text around it, so a name
/// holding one can look like another name, or make a log line or a terminal read differently
/// from what it holds. The table's CHECKs hold the same list (migration 0033).
pub const INVISIBLE: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),
    ('\u{034F}', '\u{034F}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{115F}', '\u{1160}'),
    ('\u{17B4}', '\u{17B5}'),
    ('\u{180B}', '\u{180F}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{2028}', '\u{202E}'),
    ('\u{2060}', '\u{206F}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{FE00}', '\u{FE0F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFA0}', '\u{FFA0}'),
    ('\u{FFF0}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0000}', '\u{E0FFF}'),
];

/// Whether `c` is one of the [`INVISIBLE`] characters.
pub fn is_invisible(c: char) -> bool {
    INVISIBLE.iter().any(|&(first, last)| (first..=last).contains(&c))
}

/// Trims `raw` and checks it is a name: 1 to 100 characters, none of them control characters
/// or [`INVISIBLE`] ones.
fn parse_name(raw: String) -> Result<String, InvalidInput> {
    let trimmed = raw.trim();
    let chars = trimmed.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err(InvalidInput { field: "name", reason: "must be 1 to 100 characters" });
    }
    // Control characters would let a name rewrite a terminal or forge a log line.
    if trimmed.chars().any(char::is_control) {
        return Err(InvalidInput { field: "name", reason: "must not contain control characters" });
    }
    if trimmed.chars().any(is_invisible) {
        return Err(InvalidInput {
            field: "name",
            reason: "must not contain invisible characters (format, bidi, zero-width, variation selectors)",
        });
    }
    Ok(if trimmed.len() == raw.len() { raw } else { trimmed.to_owned() })
}

/// A Domain's display name: trimmed, 1 to 100 characters, no control or [`INVISIBLE`]
/// characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DomainName(String);

impl DomainName {
    /// Validates `raw` as a Domain name, trimming surrounding whitespace first.
    ///
    /// # Errors
    /// [`InvalidInput`] on field `name` when the trimmed text is empty, longer than 100
    /// characters, or holds a control character.
    pub fn parse(raw: impl Into<String>) -> Result<DomainName, InvalidInput> {
        parse_name(raw.into()).map(DomainName)
    }

    /// The name's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Node's display name: trimmed, 1 to 100 characters, no control or [`INVISIBLE`]
/// characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeName(String);

impl NodeName {
    /// Validates `raw` as a Node name, trimming surrounding whitespace first.
    ///
    /// # Errors
    /// [`InvalidInput`] on field `name` when the trimmed text is empty, longer than 100
    /// characters, or holds a control character.
    pub fn parse(raw: impl Into<String>) -> Result<NodeName, InvalidInput> {
        parse_name(raw.into()).map(NodeName)
    }

    /// The name's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Domain's service tier: which tier template of the rate-budget rules governs it when it
/// has no override of its own.
///
/// The set is closed: this enum and the `domains` table's CHECK. Operators write the templates;
/// a tier without one is governed by the all-Domains rules and the defaults, like any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// The free tier.
    Free,
    /// The standard tier: what a Domain is created with when no tier is named.
    Standard,
    /// The premium tier.
    Premium,
    /// The enterprise tier.
    Enterprise,
}

impl Tier {
    /// Every tier, cheapest first.
    pub const ALL: [Tier; 4] = [Tier::Free, Tier::Standard, Tier::Premium, Tier::Enterprise];

    /// The tier a Domain gets when none is named, and the one every Domain had before tiers.
    pub const DEFAULT: Tier = Tier::Standard;

    /// The tier's text in the `tier` column and over HTTP.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Free => "free",
            Tier::Standard => "standard",
            Tier::Premium => "premium",
            Tier::Enterprise => "enterprise",
        }
    }

    /// Reads a tier's text.
    ///
    /// # Errors
    /// [`InvalidInput`] on field `tier` unless `text` is one of the four tiers' texts.
    pub fn parse(text: &str) -> Result<Tier, InvalidInput> {
        Tier::ALL.into_iter().find(|tier| tier.as_str() == text).ok_or(InvalidInput {
            field: "tier",
            reason: "must be one of free, standard, premium, enterprise",
        })
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a caller asks for when creating a Domain.
#[derive(Clone, Debug, PartialEq)]
pub struct NewDomain {
    /// The Domain's id, chosen by the caller ([`DomainId::random`]) so that whatever it
    /// writes for the Domain elsewhere (an issuance override, say) can name it first.
    pub id: DomainId,
    /// The Domain's name.
    pub name: DomainName,
    /// Its tier.
    pub tier: Tier,
}

/// A tenant that Nodes are enrolled into.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    /// The Domain's id.
    pub id: DomainId,
    /// The Domain's name.
    pub name: DomainName,
    /// Its tier.
    pub tier: Tier,
}

/// Every Domain whose tier is not [`Tier::DEFAULT`], as of one revision of the tiers.
///
/// The revision counts tier changes; a reader holding revision `r` has heard of every change up
/// to `r` and can tell, from the current revision alone, whether it missed one.
#[derive(Clone, Debug, PartialEq)]
pub struct TierDirectory {
    /// How many tier changes this reflects.
    pub revision: i64,
    /// Each Domain whose tier is not the default, with its tier.
    pub tiers: Vec<(DomainId, Tier)>,
}

/// A machine enrolled into a Domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The Node's id.
    pub id: NodeId,
    /// The Domain the Node belongs to.
    pub domain_id: DomainId,
    /// The Node's name.
    pub name: NodeName,
}

/// A Node's bearer credential: `psn_` followed by 32 random bytes in unpadded base64url.
///
/// `Debug` does not print it, so a token in a struct that gets logged stays secret. There is
/// deliberately no `Display` and no `PartialEq`: the text is reached only through
/// [`NodeToken::expose`], and tokens are never compared, only hashed and looked up.
#[derive(Clone)]
pub struct NodeToken(String);

impl NodeToken {
    /// A fresh token from the operating system's random number generator.
    ///
    /// # Panics
    /// When the operating system cannot supply randomness. No credential can be issued safely
    /// then, and `rand`'s own generators panic in the same case.
    pub fn generate() -> NodeToken {
        let mut bytes = [0u8; TOKEN_BYTES];
        if let Err(error) = rand::rngs::OsRng.try_fill_bytes(&mut bytes) {
            panic!("the operating system's random number generator failed: {error}");
        }
        NodeToken(format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
    }

    /// Reads a token a Node presented.
    ///
    /// Only the exact form [`NodeToken::generate`] produces is accepted (no whitespace, no
    /// padding, canonical trailing bits), so one credential has one text and one hash.
    ///
    /// # Errors
    /// [`AuthError::MalformedToken`] unless `text` is `psn_` followed by 43 base64url
    /// characters that decode to 32 bytes.
    pub fn parse(text: &str) -> Result<NodeToken, AuthError> {
        let encoded = text.strip_prefix(TOKEN_PREFIX).ok_or(AuthError::MalformedToken)?;
        if encoded.len() != TOKEN_ENCODED_CHARS {
            return Err(AuthError::MalformedToken);
        }
        match URL_SAFE_NO_PAD.decode(encoded) {
            Ok(bytes) if bytes.len() == TOKEN_BYTES => Ok(NodeToken(text.to_owned())),
            _ => Err(AuthError::MalformedToken),
        }
    }

    /// The token's text, to hand to the Node it was issued to, once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The SHA-256 of the token's text: what the store keeps and looks Nodes up by.
    pub fn hash(&self) -> TokenHash {
        // A fast, unsalted hash is right here, unlike for passwords: the token is 256 random
        // bits, so there is no dictionary to try and no brute force a slow hash would slow
        // down meaningfully, and an unsalted hash lets the store look a token up by its hash.
        TokenHash(Sha256::digest(self.0.as_bytes()).into())
    }
}

impl fmt::Debug for NodeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NodeToken(<redacted>)")
    }
}

/// The SHA-256 of a [`NodeToken`]'s text: what is stored in place of the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// A hash from its 32 bytes, as read back from the store.
    pub fn from_bytes(bytes: [u8; 32]) -> TokenHash {
        TokenHash(bytes)
    }

    /// The hash's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// A Node just enrolled and its credential.
///
/// This is the only time the token exists outside the Node: the store keeps its hash.
#[derive(Clone, Debug)]
pub struct Enrolment {
    /// The Node as stored.
    pub node: Node,
    /// The Node's bearer credential.
    pub token: NodeToken,
}

/// Who presented a valid token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthenticatedNode {
    /// The Node the token was issued to.
    pub node_id: NodeId,
    /// The Domain that Node belongs to.
    pub domain_id: DomainId,
}
