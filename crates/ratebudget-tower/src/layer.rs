//! [`BudgetLayer`]: a service behind a budget.
//!
//! By default every request is charged before the service sees it: admitted requests reach
//! the service and their responses carry the `RateLimit` fields; refused ones are answered
//! 429 with `Retry-After` and never reach it. Some budgets only count failures (failed
//! authentications, say), which are known only once the service has answered:
//! [`BudgetLayer::charge_only_responses`] charges after the response, and only responses of
//! the given statuses, turning the ones the budget refuses into 429s; a key whose budget this
//! replica already knows to be spent is refused before the service is called, so a flood of
//! failures costs the service nothing (docs/adr/0025).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use tower_layer::Layer;
use tower_service::Service;

use crate::response::is_grpc;
use crate::{Answer, CostExtractor, KeyExtractor, Refused, Rejection, RequestBudget, RequestKey, SpendError};

/// The body of a budgeted service's responses: the service's own, or the layer's answer.
pub type BudgetBody<B> = Either<B, Full<Bytes>>;

/// A [`Layer`] that puts a service behind a [`RequestBudget`], keyed and priced per request.
pub struct BudgetLayer<K, C> {
    settings: Settings<K, C>,
}

impl<K, C> Clone for BudgetLayer<K, C> {
    fn clone(&self) -> Self {
        BudgetLayer { settings: self.settings.clone() }
    }
}

impl<K, C> fmt::Debug for BudgetLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

/// When requests are charged.
#[derive(Clone, Debug)]
enum Charge {
    /// Before the service is called.
    Before,
    /// After it answered, and only answers of these statuses.
    Responses(Arc<[StatusCode]>),
}

type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;
type RefusalHook = Arc<dyn Fn(&RequestKey) + Send + Sync>;

struct Settings<K, C> {
    budget: Arc<dyn RequestBudget>,
    key: Arc<K>,
    cost: Arc<C>,
    charge: Charge,
    skip_precheck: Option<Predicate>,
    refusal_code: &'static str,
    refusal_message: &'static str,
    on_refusal: Option<RefusalHook>,
}

impl<K, C> Clone for Settings<K, C> {
    fn clone(&self) -> Self {
        Settings {
            budget: self.budget.clone(),
            key: self.key.clone(),
            cost: self.cost.clone(),
            charge: self.charge.clone(),
            skip_precheck: self.skip_precheck.clone(),
            refusal_code: self.refusal_code,
            refusal_message: self.refusal_message,
            on_refusal: self.on_refusal.clone(),
        }
    }
}

impl<K, C> fmt::Debug for Settings<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetLayer")
            .field("budget", &self.budget)
            .field("charge", &self.charge)
            .field("refusal_code", &self.refusal_code)
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor, C: CostExtractor> BudgetLayer<K, C> {
    /// Every request spends what `cost` says from `budget`, under the key `key` finds, before
    /// the service is called; a refusal is a 429 `rate_limited`.
    pub fn new(budget: impl RequestBudget + 'static, key: K, cost: C) -> BudgetLayer<K, C> {
        BudgetLayer {
            settings: Settings {
                budget: Arc::new(budget),
                key: Arc::new(key),
                cost: Arc::new(cost),
                charge: Charge::Before,
                skip_precheck: None,
                refusal_code: "rate_limited",
                refusal_message: "too many requests; retry after the time Retry-After says",
                on_refusal: None,
            },
        }
    }

    /// Refusals are answered with this `code` and `message` (`rate_limited` unless told).
    pub fn refusal(mut self, code: &'static str, message: &'static str) -> BudgetLayer<K, C> {
        self.settings.refusal_code = code;
        self.settings.refusal_message = message;
        self
    }

    /// Charges only responses of these `statuses`, after the service answered them: a charge
    /// the budget refuses turns the response into a 429, and a key this replica already knows
    /// to be spent is refused before the service is called. A charge that cannot be decided
    /// leaves the service's response as it is (logged): it was already given.
    pub fn charge_only_responses(
        mut self,
        statuses: impl IntoIterator<Item = StatusCode>,
    ) -> BudgetLayer<K, C> {
        self.settings.charge = Charge::Responses(statuses.into_iter().collect());
        self
    }

    /// With [`BudgetLayer::charge_only_responses`]: requests `vouched_for` holds for (a
    /// credential this replica already knows to be valid, say) are never refused before the
    /// service answers; if their response is charged after all, it is charged as any other.
    pub fn skip_precheck_when(
        mut self,
        vouched_for: impl Fn(&Parts) -> bool + Send + Sync + 'static,
    ) -> BudgetLayer<K, C> {
        self.settings.skip_precheck = Some(Arc::new(vouched_for));
        self
    }

    /// Calls `hook` with the key of every request this layer refuses (to log them, say; the
    /// layer itself logs no key, since keys may be credentials).
    pub fn on_refusal(mut self, hook: impl Fn(&RequestKey) + Send + Sync + 'static) -> BudgetLayer<K, C> {
        self.settings.on_refusal = Some(Arc::new(hook));
        self
    }
}

impl<S, K, C> Layer<S> for BudgetLayer<K, C> {
    type Service = Budgeted<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Budgeted { inner, settings: Arc::new(self.settings.clone()) }
    }
}

/// A service behind a budget; see [`BudgetLayer`].
pub struct Budgeted<S, K, C> {
    inner: S,
    settings: Arc<Settings<K, C>>,
}

impl<S: Clone, K, C> Clone for Budgeted<S, K, C> {
    fn clone(&self) -> Self {
        Budgeted { inner: self.inner.clone(), settings: self.settings.clone() }
    }
}

impl<S: fmt::Debug, K, C> fmt::Debug for Budgeted<S, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budgeted").field("inner", &self.inner).field("settings", &self.settings).finish()
    }
}

impl<S, K, C, ReqBody, ResBody> Service<Request<ReqBody>> for Budgeted<S, K, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: KeyExtractor,
    C: CostExtractor,
    ReqBody: http_body::Body + Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<BudgetBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service polled ready is the one to call; a clone takes its place.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        let settings = self.settings.clone();
        Box::pin(async move { settings.serve(inner, request).await })
    }
}

impl<K: KeyExtractor, C: CostExtractor> Settings<K, C> {
    async fn serve<S, ReqBody, ResBody>(
        &self,
        mut inner: S,
        request: Request<ReqBody>,
    ) -> Result<Response<BudgetBody<ResBody>>, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        ReqBody: http_body::Body,
    {
        let (parts, body) = request.into_parts();
        let grpc = is_grpc(&parts.headers);
        let answer = |rejection: Rejection| Ok(rejection.into_response(grpc).map(Either::Right));
        let priced = self.key.key(&parts).and_then(|key| {
            let Some(key) = key else { return Ok(None) };
            Ok(Some((key, self.cost.cost(&parts, body.size_hint().exact())?)))
        });
        let (key, cost) = match priced {
            Ok(Some(priced)) => priced,
            // Not limited: the service answers as if the layer were not there.
            Ok(None) => return Ok(inner.call(Request::from_parts(parts, body)).await?.map(Either::Left)),
            Err(rejection) => return answer(rejection),
        };
        match &self.charge {
            Charge::Before => match self.budget.spend(&key, cost).await {
                Ok(Answer::Admitted(fields)) => {
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    if let Some(fields) = fields {
                        fields.append_to(response.headers_mut());
                    }
                    Ok(response.map(Either::Left))
                }
                Ok(Answer::Refused(refused)) => answer(self.refused(&key, refused)),
                Ok(Answer::NeverFits(never)) => answer(never_fits(&never)),
                Err(SpendError::InvalidKey(why)) => answer(Rejection::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_key",
                    format!("the key is {why}"),
                )),
                Err(SpendError::Undecided(undecided)) => {
                    tracing::error!(error = %ratebudget::cause_chain(&undecided), "request failed: its budget could not be decided");
                    answer(Rejection::undecided())
                }
            },
            Charge::Responses(statuses) => {
                let vouched_for = self.skip_precheck.as_ref().is_some_and(|vouched_for| vouched_for(&parts));
                if !vouched_for {
                    if let Some(refused) = self.budget.known_refusal(&key, cost) {
                        return answer(self.refused(&key, refused));
                    }
                }
                let mut response = inner.call(Request::from_parts(parts, body)).await?;
                if !statuses.contains(&response.status()) {
                    return Ok(response.map(Either::Left));
                }
                match self.budget.spend(&key, cost).await {
                    Ok(Answer::Admitted(fields)) => {
                        if let Some(fields) = fields {
                            fields.append_to(response.headers_mut());
                        }
                        Ok(response.map(Either::Left))
                    }
                    Ok(Answer::Refused(refused)) => answer(self.refused(&key, refused)),
                    Ok(Answer::NeverFits(never)) => answer(never_fits(&never)),
                    Err(error) => {
                        tracing::warn!(error = %ratebudget::cause_chain(&error), status = response.status().as_u16(), "a response could not be charged to its budget; it stands");
                        Ok(response.map(Either::Left))
                    }
                }
            }
        }
    }

    fn refused(&self, key: &RequestKey, refused: Refused) -> Rejection {
        if let Some(hook) = &self.on_refusal {
            hook(key);
        }
        Rejection::refusal(self.refusal_code, self.refusal_message, refused.retry_after, refused.fields)
    }
}

/// A request whose cost no wait will ever cover: too large for its budget, not too early.
fn never_fits(never: &ratebudget::InsufficientCapacity) -> Rejection {
    Rejection::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "cost_above_burst",
        format!("this request costs {}, more than its budget ever holds ({})", never.cost, never.burst),
    )
}
