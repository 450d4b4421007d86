//! A tower layer that puts any axum or tonic service behind a rate budget shared through
//! PostgreSQL.
//!
//! ```text
//! let budget = NamedBudget::new(LimiterName::new("uploads")?, Limit::new(1e6, 4e6)?, guard, clock);
//! let app = Router::new()
//!     .route("/upload", post(upload))
//!     .layer(BudgetLayer::new(budget, HeaderKey::new(API_KEY), BodyLength));
//! ```
//!
//! A [`BudgetLayer`] finds each request's key ([`KeyExtractor`]: a header, the client's
//! address, a closure) and cost ([`CostExtractor`]: one, the body's length, a closure), and
//! spends it from a [`RequestBudget`]: a named (GCRA) limiter ([`NamedBudget`], any key) or a
//! scope's token buckets sized by rules ([`ScopeBudget`], a Node's or Domain's id). A refusal
//! is a 429 with `Retry-After` and the `RateLimit` fields, and the service is not called; a
//! budget that cannot be decided is a 500, unless its fail mode decides (every budget decides
//! through a [`ratebudget::Guard`], so its fail mode, pre-check and circuit apply). A budget
//! that counts only failures is charged after the response instead
//! ([`BudgetLayer::charge_only_responses`]), as the `plexsphere` binary counts failed
//! authentications.
//!
//! This crate depends on `ratebudget` and HTTP's crates only; it knows no context and no
//! table.

mod budget;
mod extract;
mod fields;
mod layer;
mod response;

pub use budget::{
    Answer, BucketBudget, NamedBudget, Refused, RequestBudget, RequestKey, ScopeBudget, SpendError,
};
pub use extract::{
    cost_fn, key_fn, BodyLength, CostExtractor, CostFn, EachRequest, HeaderKey, KeyExtractor, KeyFn,
    PeerAddress,
};
pub use fields::{bucket_fields, retry_after_seconds, Reading, RATELIMIT, RATELIMIT_POLICY};
pub use layer::{BudgetBody, BudgetLayer, Budgeted};
/// `error` and each of its sources on one line: `ratebudget`'s, the one the layer logs with.
pub use ratebudget::cause_chain;
pub use response::Rejection;
