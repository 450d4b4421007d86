//! The secrets service: operators write secrets, Nodes read their own Domain's.

use std::fmt;
use std::sync::Arc;

use crate::{
    DomainId, Keyring, Limiter, ReadError, ReadLimitError, Reader, RekeyError, Secret, SecretName, SecretRef,
    SecretRepository, SecretValue, StoredValue, WriteError,
};

/// What one batch of [`SecretsService::rekey_batch`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RekeyBatch {
    /// Values moved from an old key to the current one.
    pub resealed: usize,
    /// Values written before sealing, now sealed.
    pub sealed_from_plaintext: usize,
    /// Values a write replaced while the batch ran; that write sealed them under the current
    /// key already.
    pub replaced_meanwhile: usize,
    /// Where the next batch starts; `None` when this one reached the end.
    pub next: Option<SecretRef>,
}

/// Writes and reads secrets through the context's ports.
///
/// Cloning is cheap and clones share the ports.
#[derive(Clone)]
pub struct SecretsService {
    repository: Arc<dyn SecretRepository>,
    limiter: Arc<dyn Limiter>,
    keyring: Arc<Keyring>,
}

impl fmt::Debug for SecretsService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsService").finish_non_exhaustive()
    }
}

impl SecretsService {
    /// A service keeping secrets in `repository`, sealed with `keyring`, and admitting reads
    /// through `limiter`.
    pub fn new(
        repository: Arc<dyn SecretRepository>,
        limiter: Arc<dyn Limiter>,
        keyring: Arc<Keyring>,
    ) -> SecretsService {
        SecretsService { repository, limiter, keyring }
    }

    /// Stores `value` as `domain`'s secret `name`, sealed under the keyring's current key,
    /// replacing any value it had.
    ///
    /// Writes come from operators and are not rate limited. The caller checks that `domain`
    /// exists: Domains belong to the access context, which this one does not see.
    ///
    /// # Errors
    /// [`WriteError::Unavailable`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(%domain, name = %name))]
    pub async fn write(
        &self,
        domain: DomainId,
        name: SecretName,
        value: SecretValue,
    ) -> Result<(), WriteError> {
        let sealed = self.keyring.seal(domain, &name, &value);
        self.repository
            .put(domain, &name, &sealed)
            .await
            .map_err(|error| WriteError::Unavailable(error.into()))
    }

    /// Reads `reader.domain`'s secret `name` for the Node `reader.node`.
    ///
    /// The read budget is spent first, so probing for names costs budget like any read and a
    /// refused read learns nothing about which names exist. The lookup is keyed by the
    /// reader's own Domain, so a Node can never read another Domain's secret.
    ///
    /// # Errors
    /// - [`ReadError::NodeRateLimited`] or [`ReadError::DomainRateLimited`] when a budget
    ///   refused the read; nothing was looked up.
    /// - [`ReadError::NotFound`] when the reader's Domain holds no secret `name`.
    /// - [`ReadError::Unavailable`] when the limiter or the store could not answer.
    /// - [`ReadError::Unreadable`] when the stored value does not open.
    #[tracing::instrument(level = "debug", skip_all, fields(node = %reader.node, domain = %reader.domain, name = %name))]
    pub async fn read(&self, reader: Reader, name: &SecretName) -> Result<Secret, ReadError> {
        self.limiter.spend_read(reader).await.map_err(|error| match error {
            ReadLimitError::NodeRateLimited { retry_after } => ReadError::NodeRateLimited { retry_after },
            ReadLimitError::DomainRateLimited { retry_after } => ReadError::DomainRateLimited { retry_after },
            ReadLimitError::Unavailable(source) => ReadError::Unavailable(source),
        })?;
        match self.repository.get(reader.domain, name).await {
            Ok(Some(stored)) => {
                let value = self.keyring.open(reader.domain, name, &stored).map_err(ReadError::Unreadable)?;
                Ok(Secret { name: name.clone(), value })
            }
            Ok(None) => Err(ReadError::NotFound),
            Err(error) => Err(ReadError::Unavailable(error.into())),
        }
    }

    /// Re-seals under the current key up to `limit` secrets that are not sealed under it
    /// (sealed under an old key, or written in plain text before sealing), in (Domain, name)
    /// order after `after`. Call it again with the batch's `next` until that is `None`.
    ///
    /// Each value is replaced only if it is still what was read, so a write racing the batch
    /// is never undone. Batches keep each round trip and each run of work short, and let a
    /// rekey that stopped resume where it was.
    ///
    /// # Errors
    /// - [`RekeyError::Unreadable`] when a value does not open (its key is not in the keyring,
    ///   or it was altered); the values before it in the batch are re-sealed, none after it.
    /// - [`RekeyError::Unavailable`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(limit))]
    pub async fn rekey_batch(
        &self,
        after: Option<&SecretRef>,
        limit: usize,
    ) -> Result<RekeyBatch, RekeyError> {
        let unavailable = |error: crate::RepositoryError| RekeyError::Unavailable(error.into());
        let current = self.keyring.current_key_id();
        let stale = self.repository.not_sealed_under(current, after, limit).await.map_err(unavailable)?;
        let mut batch =
            RekeyBatch { resealed: 0, sealed_from_plaintext: 0, replaced_meanwhile: 0, next: None };
        for stored in &stale {
            let secret = &stored.secret;
            let value = self
                .keyring
                .open(secret.domain, &secret.name, &stored.value)
                .map_err(|source| RekeyError::Unreadable { secret: secret.clone(), source })?;
            let sealed = self.keyring.seal(secret.domain, &secret.name, &value);
            if !self.repository.replace(stored, &sealed).await.map_err(unavailable)? {
                batch.replaced_meanwhile += 1;
            } else if matches!(stored.value, StoredValue::Plaintext(_)) {
                batch.sealed_from_plaintext += 1;
            } else {
                batch.resealed += 1;
            }
        }
        if stale.len() >= limit {
            batch.next = stale.last().map(|stored| stored.secret.clone());
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests;
