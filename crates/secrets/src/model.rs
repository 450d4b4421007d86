//! The values the secrets context is made of, each validated when it is built.

use std::fmt;

use uuid::Uuid;

/// The longest [`SecretName`], in characters.
const NAME_MAX_CHARS: usize = 128;

/// The largest [`SecretValue`], in bytes of UTF-8: 64 KiB.
const VALUE_MAX_BYTES: usize = 65_536;

/// The Domain a secret belongs to and a reading Node is enrolled in.
///
/// The secrets context's own id type: it does not borrow the access context's, so neither
/// context depends on the other. The composition root converts between them by uuid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainId(Uuid);

impl DomainId {
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

/// The Node reading a secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Uuid);

impl NodeId {
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

/// Input that does not make a valid value: which field, and the rule it breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct InvalidInput {
    /// The field that was refused, as a caller names it (`name`, `value`).
    pub field: &'static str,
    /// The rule it breaks, phrased so it can be shown to whoever sent it.
    pub reason: &'static str,
}

/// A secret's name: 1 to 128 characters of `A-Z a-z 0-9 . _ -`.
///
/// The alphabet is what a URL path segment carries without escaping, so a name is its own
/// path segment. The table's CHECK holds the same rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretName(String);

impl SecretName {
    /// Checks `name` against the name rule.
    ///
    /// # Errors
    /// [`InvalidInput`] with field `name` when it is empty, longer than 128 characters or has
    /// a character outside `A-Z a-z 0-9 . _ -`.
    pub fn parse(name: impl Into<String>) -> Result<SecretName, InvalidInput> {
        let name = name.into();
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        // Every allowed character is one byte, so on a valid name bytes count characters.
        // "." and ".." are path segments URL normalisers collapse, so no client could address
        // them; a name of dots only is refused.
        let only_dots = name.bytes().all(|b| b == b'.');
        if (1..=NAME_MAX_CHARS).contains(&name.len()) && name.bytes().all(allowed) && !only_dots {
            Ok(SecretName(name))
        } else {
            Err(InvalidInput {
                field: "name",
                reason: "must be 1 to 128 of A-Z a-z 0-9 . _ -, not only dots",
            })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A secret's value: at most 64 KiB (65,536 bytes) of UTF-8, with no NUL character.
///
/// NUL is refused because PostgreSQL `text` cannot hold it: accepting it here would turn a
/// caller's bad input into a store error at write time. `Debug` prints `<redacted>`, so a
/// value cannot leak through a log line or a panic message; read it with
/// [`SecretValue::expose`], which says at the call site that it is being read.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Checks `value` against the size and character rules.
    ///
    /// # Errors
    /// [`InvalidInput`] with field `value` when it is longer than 65,536 bytes of UTF-8 or
    /// holds a NUL character.
    pub fn new(value: impl Into<String>) -> Result<SecretValue, InvalidInput> {
        let value = value.into();
        if value.len() > VALUE_MAX_BYTES {
            return Err(InvalidInput { field: "value", reason: "must be at most 65536 bytes" });
        }
        if value.contains('\0') {
            return Err(InvalidInput { field: "value", reason: "must not contain NUL characters" });
        }
        Ok(SecretValue(value))
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// The authenticated Node reading a secret, and the Domain it is enrolled in.
///
/// Both come from the Node's credential, never from the request, so the Domain a read is
/// looked up in is the Node's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reader {
    /// The Node reading; its own read budget is spent.
    pub node: NodeId,
    /// The Node's Domain; its read budget is spent and its secrets are the only ones visible.
    pub domain: DomainId,
}

/// Which secret: a Domain and a name within it. Where `rekey` resumes, too.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretRef {
    /// The Domain the secret belongs to.
    pub domain: DomainId,
    /// Its name within the Domain.
    pub name: SecretName,
}

/// A secret as the store holds it, sealed or (written before sealing) in plain text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSecret {
    /// Which secret.
    pub secret: SecretRef,
    /// Its value as stored.
    pub value: crate::StoredValue,
}

/// A named secret as a Node reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Secret {
    /// The secret's name within its Domain.
    pub name: SecretName,
    /// The secret itself; redacted in `Debug`.
    pub value: SecretValue,
}

#[cfg(test)]
mod tests;
