//! The contexts' ports bound to their adapters: each limiter to the spender over the guard,
//! each repository to its statements.

use std::sync::Arc;

use ratebudget::{Spender, Statements};

use crate::config::Config;

pub(super) fn bind_secrets(
    config: &Config,
    statements: &Statements,
    spender: &Spender,
    cache: &secrets::SecretCache,
) -> secrets::SecretsService {
    let limiter = secrets::RateBudgetReadLimiter::new(spender.clone());
    let repository = secrets::CachedSecretRepository::new(
        secrets::PgSecretRepository::new(statements.clone()),
        cache.clone(),
    );
    secrets::SecretsService::new(
        Arc::new(repository),
        Arc::new(limiter),
        Arc::new(config.secrets.keyring.clone()),
    )
}

pub(super) fn bind_ingest(statements: &Statements, spender: &Spender) -> ingest::IngestService {
    let limiter = ingest::RateBudgetQuotaLimiter::new(spender.clone());
    ingest::IngestService::new(
        Arc::new(ingest::PgBatchRepository::new(statements.clone())),
        Arc::new(limiter),
    )
}
