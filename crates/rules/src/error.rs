//! The rules context's errors: a store that could not answer, and why a write was not made.

use crate::Version;

/// Any error from below a port, kept as the source of an `Unavailable` variant.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The rules store could not answer: nothing was decided either way.
#[derive(Debug, thiserror::Error)]
#[error("rules store could not answer")]
pub struct RepositoryError(#[source] pub BoxError);

/// Why a change to a rule was not made. Nothing was written in any case.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The rule exists and the writer named no version: replacing or deleting a rule takes
    /// the version the writer read (`If-Match`).
    #[error("the rule exists (version {current}); name the version you replace")]
    PreconditionRequired {
        /// The rule's version.
        current: Version,
    },
    /// The writer named a version that is not the rule's current one: someone changed it
    /// since, or it does not exist (`None`).
    #[error("the rule is not at the version named")]
    PreconditionFailed {
        /// The rule's version, if it exists.
        current: Option<Version>,
    },
    /// No rule of this id was ever written.
    #[error("no such rule")]
    UnknownRule,
    /// The rule has no such version.
    #[error("the rule has no version {0}")]
    UnknownVersion(Version),
    /// The version named deleted the rule: there is no content to roll back to.
    #[error("version {0} deleted the rule; roll back to a version that defined it")]
    DeletionVersion(Version),
    /// The store could not answer; the change may or may not have been made.
    #[error("the rule could not be written")]
    Unavailable(#[source] BoxError),
}

impl From<RepositoryError> for WriteError {
    fn from(error: RepositoryError) -> Self {
        WriteError::Unavailable(Box::new(error))
    }
}
