//! The secrets context: named secrets per Domain, written by operators and read by that
//! Domain's Nodes.
//!
//! A [`Secret`] is a [`SecretName`] and a [`SecretValue`] held under one Domain. Operators
//! write them with [`SecretsService::write`]; an authenticated Node reads them with
//! [`SecretsService::read`] as a [`Reader`].
//!
//! Invariants:
//! - A Node reads only its own Domain's secrets: the lookup is keyed by the reader's Domain,
//!   so there is no query that could return another Domain's value.
//! - Every read spends one read from the Node's budget and one from its Domain's, both or
//!   neither, before the secret is looked up; probing for names that do not exist costs
//!   budget like any other read. Writes are not rate limited.
//! - A refused read ([`ReadError::NodeRateLimited`], [`ReadError::DomainRateLimited`]) and a
//!   limiter or store that could not answer ([`ReadError::Unavailable`]) are different errors,
//!   and neither is ever reported as the other.
//! - A value is stored sealed ([`seal`](Keyring)): AES-256-GCM under the keyring's current
//!   key, with the key's id beside it and the Domain and name as associated data, so the store
//!   never holds a value in the clear and a value copied to another row does not open. Rows
//!   written before sealing existed read as they are until [`SecretsService::rekey_batch`]
//!   seals them; rekey also moves values from old keys to the current one.
//! - A secret's value and a key never appear in `Debug` output.
//!
//! Only [`persistence`](PgSecretRepository) names SQL or the rate-budget store; the model,
//! ports and service build and test without a database.

mod cache;
mod error;
mod model;
mod persistence;
mod ports;
mod seal;
mod service;

pub use cache::SecretCache;
pub use error::{BoxError, ReadError, ReadLimitError, RekeyError, RepositoryError, WriteError};
pub use model::{
    DomainId, InvalidInput, NodeId, Reader, Secret, SecretName, SecretRef, SecretValue, StoredSecret,
};
pub use persistence::{
    CachedSecretRepository, PgSecretRepository, RateBudgetReadLimiter, SECRET_CHANGED_CHANNEL,
};
pub use ports::{Limiter, SecretRepository};
pub use seal::{InvalidKey, KeyId, Keyring, OpenError, Sealed, SecretsKey, StoredValue};
pub use service::{RekeyBatch, SecretsService};
