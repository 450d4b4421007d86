//! What every handler can reach, and the database time each of its steps is bounded by.

use std::future::Future;
use std::sync::Arc;

use access::CredentialCache;
use ratebudget::ClockStatus;
use service::RuleBudgets;

use super::error::ApiError;
use crate::config::HttpConfig;
use crate::edge::database_time::DatabaseTime;
use crate::edge::throttle;
use crate::edge::tokens::{DecideTokens, OperatorTokens};
use crate::observation::fill::FillHistory;
use crate::observation::metrics::Metrics;
use crate::runtime::leader::LeaderLookup;
use crate::runtime::readiness::Readiness;

/// What every handler can reach; cheap to clone (one reference count: axum clones the state
/// for every extractor and middleware of every request, and cloning each service's handles
/// was most of a request's CPU, BENCHMARKS.md section 8).
#[derive(Clone)]
pub struct AppState(Arc<Handles>);

impl AppState {
    /// The state of `handles`.
    pub fn new(handles: Handles) -> AppState {
        AppState(Arc::new(handles))
    }
}

impl std::ops::Deref for AppState {
    type Target = Handles;

    fn deref(&self) -> &Handles {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Handles {
    /// Domains, enrolment and Node credentials.
    pub access: access::AccessService,
    /// Secrets per Domain.
    pub secrets: secrets::SecretsService,
    /// Telemetry batches.
    pub ingest: ingest::IngestService,
    /// The rate budgets, for the operator page's readings of buckets.
    pub store: ratebudget::Store,
    /// This replica's pre-check and fallback in front of the store: a reset made here forgets
    /// the bucket at once (the others hear of it by notification).
    pub guard: Arc<ratebudget::Guard>,
    /// The operator routes' tokens, by operator.
    pub operator_tokens: OperatorTokens,
    /// The tokens of callers that ask for decisions (empty: the decide API is off).
    pub decide_tokens: DecideTokens,
    /// Decisions for other services.
    pub decide: service::DecideService,
    /// Every operator action (act, reload, audit).
    pub operations: service::Operations,
    /// Failed authentications per client address, across replicas.
    pub throttle: throttle::AuthThrottle,
    /// The audit log, for operators reading it (actions record through `operations`).
    pub audit: Arc<dyn audit::AuditLog>,
    /// Recently authenticated Node tokens.
    pub credentials: CredentialCache,
    /// What `/readyz` answers, from a recent probe of the database.
    pub readiness: Readiness,
    /// How long a request may wait for the database, in all.
    pub database_time: DatabaseTime,
    /// The largest telemetry batch accepted.
    pub ingest_max_batch_bytes: usize,
    /// This process's metrics.
    pub metrics: Metrics,
    /// The HTTP server's limits: a request's body deadline and its whole deadline among them.
    pub http: HttpConfig,
    /// Whether this replica's clock may be decided with; `/readyz` fails while it may not.
    pub clock: ClockStatus,
    /// The clock decisions are made on (usage minutes are counted on it).
    pub decision_clock: Arc<dyn ratebudget::Clock>,
    /// Rate-budget rules, their history and usage.
    pub rules: rules::RulesService,
    /// What every take is sized by on this replica: rules, tiers and knob defaults. A change
    /// made through this replica reloads it before the response.
    pub rule_budgets: Arc<RuleBudgets>,
    /// The levels this replica's decisions left in each bucket lately, for `/v1/fill`.
    pub fill: FillHistory,
    /// Who holds the leader lock, for `/v1/status`.
    pub leader: LeaderLookup,
    /// The RLQS allocator, for `/v1/quota/buckets`: its shares as every replica counts them.
    pub quota: service::quota::QuotaService,
}

impl AppState {
    /// Runs one step that may wait on the database within what is left of the request's
    /// database time (`crate::edge::database_time`), answering 500 when it runs out.
    pub async fn bounded<T>(
        &self,
        during: &'static str,
        call: impl Future<Output = T>,
    ) -> Result<T, ApiError> {
        Ok(self.database_time.bounded(during, call).await?)
    }
}
