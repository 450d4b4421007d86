//! The ingest context: telemetry batches from Nodes.
//!
//! It owns `plexsphere.ingest_batches` and the rule that admits a batch: a batch costs its
//! wire bytes (the body's length as received) against two quotas, the sending Node's
//! (`ingest_node`) and its Domain's (`ingest_domain`).
//!
//! Invariants:
//! - Both quotas are spent in one all-or-nothing call: a refused batch debits neither, so a
//!   Node never pays for a batch its Domain refused, nor the Domain for one the Node's quota
//!   refused.
//! - A refused batch is not stored. An accepted batch is committed before
//!   [`IngestService::accept`] returns, with its byte count equal to its payload's length.
//! - A quota that could not be evaluated, or a batch store that did not answer, is
//!   [`IngestError::Unavailable`], never a quota refusal: a refusal tells a Node to back off
//!   from a cap it reached, and an outage must not tell a whole fleet that.
//! - An empty batch costs nothing; the quotas are not asked.
//!
//! The domain modules (model, ports, errors, service) never name the database; only the
//! adapters in `persistence` do.

mod error;
mod model;
mod persistence;
mod ports;
mod service;

pub use error::{BoxError, IngestError, Quota, QuotaError, RepositoryError};
pub use model::{byte_cost, Batch, BatchId, DomainId, NodeId, Sender};
pub use persistence::{PgBatchRepository, RateBudgetQuotaLimiter};
pub use ports::{BatchRepository, Limiter};
pub use service::IngestService;
