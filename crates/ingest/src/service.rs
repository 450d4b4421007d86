//! Accepting a batch: spend its bytes, then store it.

use std::fmt;
use std::sync::Arc;

use crate::{Batch, BatchId, BatchRepository, IngestError, Limiter, Sender};

/// Accepts telemetry batches from Nodes against their ingest quotas.
///
/// Cloning is cheap and clones share their ports.
#[derive(Clone)]
pub struct IngestService {
    repository: Arc<dyn BatchRepository>,
    limiter: Arc<dyn Limiter>,
}

impl IngestService {
    /// A service storing batches in `repository` and spending quotas through `limiter`.
    pub fn new(repository: Arc<dyn BatchRepository>, limiter: Arc<dyn Limiter>) -> IngestService {
        IngestService { repository, limiter }
    }

    /// Accepts `payload` from `sender`: spends its wire bytes from the Node's and the
    /// Domain's quota, then commits it, and returns the id it is stored under.
    ///
    /// An empty batch is refused: it would cost nothing, so accepting it would let a Node
    /// write rows without limit.
    ///
    /// The bytes are spent before the batch is stored so that a refused batch never reaches
    /// the table. The price is that a store failure after a grant leaves the bytes spent;
    /// the Node retries against a quota that refills within seconds.
    ///
    /// # Errors
    /// [`IngestError::EmptyBatch`] before anything else; [`IngestError::QuotaExceeded`] or
    /// [`IngestError::LargerThanQuota`] when a quota refused the batch (nothing is stored);
    /// [`IngestError::Unavailable`] when a quota could not be evaluated (nothing is stored) or
    /// the batch store did not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(node = %sender.node, domain = %sender.domain, bytes = payload.len()))]
    pub async fn accept(&self, sender: Sender, payload: &[u8]) -> Result<BatchId, IngestError> {
        let batch = Batch { id: BatchId::random(), sender, payload };
        let cost = batch.byte_cost();
        if cost == 0 {
            return Err(IngestError::EmptyBatch);
        }
        self.limiter.spend_bytes(batch.sender, cost).await?;
        self.repository.insert(batch.id, batch.sender, batch.payload).await?;
        Ok(batch.id)
    }
}

impl fmt::Debug for IngestService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The ports are trait objects without Debug; naming the type is what a log needs.
        f.debug_struct("IngestService").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
