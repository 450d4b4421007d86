//! The secrets service: operators write secrets, Nodes read their own Domain's.

use std::fmt;
use std::sync::Arc;

use crate::{
    DomainId, Limiter, ReadError, ReadLimitError, Reader, Secret, SecretName, SecretRepository, SecretValue,
    WriteError,
};

/// Writes and reads secrets through the context's ports.
///
/// Cloning is cheap and clones share the ports.
#[derive(Clone)]
pub struct SecretsService {
    repository: Arc<dyn SecretRepository>,
    limiter: Arc<dyn Limiter>,
}

impl fmt::Debug for SecretsService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsService").finish_non_exhaustive()
    }
}

impl SecretsService {
    /// A service keeping secrets in `repository` and admitting reads through `limiter`.
    pub fn new(repository: Arc<dyn SecretRepository>, limiter: Arc<dyn Limiter>) -> SecretsService {
        SecretsService { repository, limiter }
    }

    /// Stores `value` as `domain`'s secret `name`, replacing any value it had.
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
        self.repository
            .put(domain, &name, &value)
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
    #[tracing::instrument(level = "debug", skip_all, fields(node = %reader.node, domain = %reader.domain, name = %name))]
    pub async fn read(&self, reader: Reader, name: &SecretName) -> Result<Secret, ReadError> {
        self.limiter.spend_read(reader).await.map_err(|error| match error {
            ReadLimitError::NodeRateLimited { retry_after } => ReadError::NodeRateLimited { retry_after },
            ReadLimitError::DomainRateLimited { retry_after } => ReadError::DomainRateLimited { retry_after },
            ReadLimitError::Unavailable(source) => ReadError::Unavailable(source),
        })?;
        match self.repository.get(reader.domain, name).await {
            Ok(Some(value)) => Ok(Secret { name: name.clone(), value }),
            Ok(None) => Err(ReadError::NotFound),
            Err(error) => Err(ReadError::Unavailable(error.into())),
        }
    }
}

#[cfg(test)]
mod tests;
