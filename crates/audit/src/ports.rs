//! What the audit context needs from outside: somewhere to append entries and read them back.

use crate::{Entry, NewEntry, Page};

/// The log could not answer.
#[derive(Debug, thiserror::Error)]
#[error("audit log could not answer")]
pub struct AuditLogError(#[source] pub Box<dyn std::error::Error + Send + Sync + 'static>);

/// An append-only log of entries.
#[async_trait::async_trait]
pub trait AuditLog: Send + Sync {
    /// Appends `entry`, stamped with the log's clock.
    ///
    /// # Errors
    /// [`AuditLogError`] when the log could not answer; `Ok` MUST mean it is recorded.
    async fn record(&self, entry: &NewEntry) -> Result<(), AuditLogError>;

    /// The entries `page` selects, newest first.
    ///
    /// # Errors
    /// [`AuditLogError`] when the log could not answer or holds an entry this build cannot
    /// read.
    async fn read(&self, page: Page) -> Result<Vec<Entry>, AuditLogError>;
}
