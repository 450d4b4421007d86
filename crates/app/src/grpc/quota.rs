//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`,
//! `StreamRateLimitQuotas`), beside `ShouldRateLimit` on `PLEXSPHERE_GRPC_LISTEN`, for Envoy's
//! `rate_limit_quota` filter: each Envoy decides its requests itself, from the token buckets
//! assigned here ([`service::quota`]), and reports its usage on one stream.
//!
//! A stream is a holder: its buckets' shares are counted under its own id. The stream's
//! `domain` (on every message; it may not change) is the service; the caller's decide token
//! (`authorization` metadata, `rlqs_server.initial_metadata` in Envoy) must name it. Every
//! report of a bucket is answered with its assignment (one statement), which renews its TTL.
//! When the rules change, a stream resolves its buckets again within [`RULES_CHECKED_EVERY`]
//! and pushes a new assignment to those whose rule did. On shutdown each stream sends its
//! buckets' assignments again with a TTL of zero, so its Envoy falls back at once and opens a
//! stream to another replica at its next report, and then ends. A report the store cannot
//! answer is answered with nothing: the Envoy keeps its last assignment until its TTL.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use uuid::Uuid;

use rules::Services;
use service::quota::{Assignment, BucketHolder, Governance, QuotaError, QuotaService, Usage};

use envoy_types::pb::envoy::r#type::v3::{rate_limit_strategy, RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};

use super::Callers;

/// How often a stream looks for a new rules snapshot: a changed rule reaches every stream's
/// Envoys within this and a round trip.
pub const RULES_CHECKED_EVERY: Duration = Duration::from_millis(250);

/// What the streams tell the metrics.
pub trait StreamObserver: Send + Sync {
    /// A stream opened (`true`) or ended (`false`).
    fn stream(&self, open: bool);
    /// What one stream holds changed by `change`.
    fn holding(&self, change: Holding);
}

/// What a stream holds: buckets with a token bucket, the rate those allow, and shrinks sent
/// that its Envoy has not reported under yet; or a change of it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Holding {
    /// Buckets holding a token bucket.
    pub buckets: i64,
    /// Requests a second their token buckets allow.
    pub rate: f64,
    /// Buckets sent a smaller share since their last report.
    pub shrinks: i64,
}

impl std::ops::Sub for Holding {
    type Output = Holding;

    fn sub(self, other: Holding) -> Holding {
        Holding {
            buckets: self.buckets - other.buckets,
            rate: self.rate - other.rate,
            shrinks: self.shrinks - other.shrinks,
        }
    }
}

/// The RLQS gRPC service.
#[derive(Clone)]
pub struct QuotaServer {
    quota: QuotaService,
    callers: Callers,
    observer: Arc<dyn StreamObserver>,
    rebalances: broadcast::Sender<Uuid>,
    shutdown: CancellationToken,
}

impl QuotaServer {
    /// Assigns with `quota` for `callers`; every stream holding a bucket `rebalances` names
    /// decides it again at once, and says goodbye on `shutdown`.
    pub fn new(
        quota: QuotaService,
        callers: Callers,
        observer: Arc<dyn StreamObserver>,
        rebalances: broadcast::Sender<Uuid>,
        shutdown: CancellationToken,
    ) -> QuotaServer {
        QuotaServer { quota, callers, observer, rebalances, shutdown }
    }
}

type Answers = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaServer {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let services = self.callers.authenticate(&request).await?;
        let reports = request.into_inner();
        let (answers, answered) = mpsc::channel(16);
        let stream = QuotaStream {
            quota: self.quota.clone(),
            services,
            stream: Uuid::new_v4(),
            domain: None,
            buckets: HashMap::new(),
            holding: Holding::default(),
            answers,
            observer: self.observer.clone(),
            rebalances: Some(self.rebalances.subscribe()),
        };
        tokio::spawn(stream.run(reports, self.shutdown.clone()));
        Ok(Response::new(ReceiverStream::new(answered)))
    }
}

/// One bucket of a stream: its id as sent, its holder, what governs it, what it was last sent.
struct Held {
    id: BucketId,
    holder: BucketHolder,
    governance: Governance,
    last: Option<Assignment>,
    /// The bucket the last token bucket was a share of.
    last_key: Option<Uuid>,
    /// Sent a smaller share since its last report.
    shrinking: bool,
    /// Since when its reports show no request (a bucket no budget governs; the store keeps a
    /// governed one's).
    idle_since: Option<tokio::time::Instant>,
}

impl Held {
    fn key(&self) -> Option<Uuid> {
        match &self.governance {
            Governance::Budget(budget) => Some(budget.key.as_uuid()),
            _ => None,
        }
    }
}

/// How long a statement of a stream may take before the stream gives up on it (and, since it
/// may have committed, can no longer vouch for what its bucket holds).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a stream waits to hand an answer to a client that does not read.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// One Envoy's stream: each of its buckets a holder of a share.
struct QuotaStream {
    quota: QuotaService,
    services: Services,
    stream: Uuid,
    domain: Option<String>,
    buckets: HashMap<BTreeMap<String, String>, Held>,
    holding: Holding,
    answers: Answers,
    observer: Arc<dyn StreamObserver>,
    /// Buckets to decide again now; `None` once the replica stopped announcing.
    rebalances: Option<broadcast::Receiver<Uuid>>,
}

impl QuotaStream {
    async fn run(mut self, mut reports: Streaming<RateLimitQuotaUsageReports>, shutdown: CancellationToken) {
        self.observer.stream(true);
        let mut revision = self.quota.revision();
        let mut rules_checked = tokio::time::interval(RULES_CHECKED_EVERY);
        rules_checked.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    self.goodbye().await;
                    break;
                }
                () = self.answers.closed() => break,
                message = reports.message() => match message {
                    Ok(Some(message)) => {
                        if let Err(status) = self.report(message).await {
                            let _ = tokio::time::timeout(SEND_TIMEOUT, self.answers.send(Err(status))).await;
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(stream = %self.stream, %status, "an RLQS stream broke");
                        break;
                    }
                },
                heard = heard(&mut self.rebalances) => match heard {
                    Ok(key) => self.rebalance(key).await,
                    // Missed some: each bucket still gets its answer at its next report.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => self.rebalances = None,
                },
                _ = rules_checked.tick() => {
                    let now = self.quota.revision();
                    if now != revision {
                        revision = now;
                        self.rules_changed().await;
                    }
                }
            }
        }
        self.observer.holding(Holding::default() - self.holding);
        self.observer.stream(false);
        // The response ends now (this stream's sender goes with it); the close is recorded
        // after, and what was sent counts until it expires whether or not it is.
        let (quota, stream) = (self.quota.clone(), self.stream);
        drop(self);
        tokio::spawn(async move {
            if let Err(error) = quota.close(stream).await {
                tracing::warn!(%stream, error = %ratebudget::cause_chain(&error), "an ended RLQS stream's shares could not be closed; they count until they expire");
            }
        });
    }

    /// Answers one message of reports: each bucket's assignment, sent as soon as it is decided
    /// (a send is recorded when its statement ran: it must leave then, not after the rest).
    async fn report(&mut self, message: RateLimitQuotaUsageReports) -> Result<(), Status> {
        let domain = match &self.domain {
            Some(domain) if message.domain.is_empty() || message.domain == *domain => domain.clone(),
            Some(domain) => {
                return Err(Status::invalid_argument(format!(
                    "a stream's domain may not change: it is {domain:?}, this report says {:?}",
                    message.domain
                )));
            }
            None if message.domain.is_empty() => {
                return Err(Status::invalid_argument("domain is required in a stream's first report"));
            }
            None => {
                self.quota
                    .permit(&self.services, &message.domain)
                    .map_err(|forbidden| Status::permission_denied(forbidden.to_string()))?;
                self.domain = Some(message.domain.clone());
                message.domain
            }
        };
        for usage in message.bucket_quota_usages {
            let Some(id) = usage.bucket_id.filter(|id| !id.bucket.is_empty()) else {
                // Envoy never sends one; nothing could be assigned to it.
                continue;
            };
            let map: BTreeMap<String, String> = id.bucket.clone().into_iter().collect();
            let elapsed = usage
                .time_elapsed
                .map(|elapsed| Duration::new(elapsed.seconds.max(0) as u64, elapsed.nanos.max(0) as u32))
                .unwrap_or_default();
            let reported =
                Usage { allowed: usage.num_requests_allowed, denied: usage.num_requests_denied, elapsed };
            let governance = match self.quota.govern(&domain, &map) {
                Ok(governance) => governance,
                Err(error) => {
                    tracing::warn!(error = %ratebudget::cause_chain(&error), "an RLQS report was not answered");
                    continue;
                }
            };
            let holder = BucketHolder::of(self.stream, &map);
            let held = self.buckets.entry(map.clone()).or_insert_with(|| Held {
                id: id.clone(),
                holder,
                governance: governance.clone(),
                last: None,
                last_key: None,
                shrinking: false,
                idle_since: None,
            });
            held.governance = governance;
            // Reported after what it was last sent: it has it, or will not be sent more.
            held.shrinking = false;
            let mut actions = Vec::new();
            if held.key().is_none() {
                // No budget governs it: the store does not see it, so its idleness is kept here.
                if reported.allowed + reported.denied == 0 {
                    let since = *held.idle_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() >= self.quota.settings().idle_after {
                        held.last = Some(Assignment::Abandon);
                        actions.push(action_of(held.id.clone(), Assignment::Abandon));
                        self.buckets.remove(&map);
                        self.answer(actions).await;
                        continue;
                    }
                } else {
                    held.idle_since = None;
                }
            }
            let Some(held) = self.buckets.get_mut(&map) else { continue };
            Self::decide(&self.quota, &domain, held, Some(reported), &mut actions).await;
            if held.last == Some(Assignment::Abandon) {
                self.buckets.remove(&map);
            }
            self.answer(actions).await;
        }
        self.recount();
        Ok(())
    }

    /// Decides `held`'s assignment (at a report of `usage`, or a push) and adds what to send.
    async fn decide(
        quota: &QuotaService,
        domain: &str,
        held: &mut Held,
        usage: Option<Usage>,
        actions: &mut Vec<BucketAction>,
    ) {
        let key = held.key();
        // Its last token bucket was another rule's: what the store knows of this holder under
        // this rule is not what the Envoy holds. It drops that bucket first (a blanket rule
        // drops one), so that the next is built full, and paid for whole.
        let elsewhere = matches!(held.last, Some(Assignment::TokenBucket { .. })) && held.last_key != key;
        if elsewhere {
            if let Some(Assignment::TokenBucket { ttl, .. }) = held.last {
                actions.push(action_of(held.id.clone(), Assignment::DenyAll { ttl }));
                held.last = Some(Assignment::DenyAll { ttl });
            }
        }
        // The store's row says what this rule's share last sent this holder; only a token
        // bucket of this rule, last sent, is the Envoy's bucket now (a blanket rule, or another
        // rule's bucket, since: not, though the row may still say so).
        let vouched = matches!(held.last, Some(Assignment::TokenBucket { .. })) && held.last_key == key;
        let holder = BucketHolder { builds_full: !vouched, ..held.holder };
        let assigning = quota.assign_governed(domain, &held.governance, holder, usage);
        let assigned = match tokio::time::timeout(STATEMENT_TIMEOUT, assigning).await {
            Ok(assigned) => assigned,
            Err(_) => Err(QuotaError::Store("the quota store did not answer in time".into())),
        };
        match assigned {
            Ok(Some(assignment)) => {
                let smaller = |new: Option<f64>, old: Option<f64>| match (new, old) {
                    (Some(new), Some(old)) => new < old,
                    (Some(_), None) => true,
                    _ => false,
                };
                held.shrinking |= smaller(assignment.rate(), held.last.and_then(Assignment::rate));
                held.last = Some(assignment);
                held.last_key = key;
                held.holder.unsure = false;
                actions.push(action_of(held.id.clone(), assignment));
            }
            Ok(None) => held.holder.unsure = false,
            Err(error) => {
                // The Envoy keeps its last assignment until its TTL, then its own defaults. The
                // statement may have committed a send that never left: until one succeeds, no
                // report proves anything and the next token bucket is paid for whole.
                held.holder.unsure = true;
                tracing::error!(stream = %held.holder.stream, error = %ratebudget::cause_chain(&error), "an RLQS bucket could not be assigned; nothing was sent");
            }
        }
    }

    /// The rules changed: every bucket whose governance did gets a new assignment.
    async fn rules_changed(&mut self) {
        let Some(domain) = self.domain.clone() else { return };
        let maps: Vec<BTreeMap<String, String>> = self.buckets.keys().cloned().collect();
        for map in maps {
            let Ok(governance) = self.quota.govern(&domain, &map) else { continue };
            let Some(held) = self.buckets.get_mut(&map) else { continue };
            if governance == held.governance {
                continue;
            }
            held.governance = governance;
            let mut actions = Vec::new();
            Self::decide(&self.quota, &domain, held, None, &mut actions).await;
            if held.last == Some(Assignment::Abandon) {
                self.buckets.remove(&map);
            }
            self.answer(actions).await;
        }
        self.recount();
    }

    /// Another holder's report freed capacity of bucket `key`, or needs it: this stream's
    /// shares of it are decided again and sent now.
    async fn rebalance(&mut self, key: Uuid) {
        let Some(domain) = self.domain.clone() else { return };
        let maps: Vec<BTreeMap<String, String>> = self
            .buckets
            .iter()
            .filter(|(_, held)| held.key() == Some(key))
            .map(|(map, _)| map.clone())
            .collect();
        for map in maps {
            let Some(held) = self.buckets.get_mut(&map) else { continue };
            let mut actions = Vec::new();
            Self::decide(&self.quota, &domain, held, None, &mut actions).await;
            self.answer(actions).await;
        }
        self.recount();
    }

    /// Sends `actions`, if any, as one response.
    async fn answer(&self, actions: Vec<BucketAction>) {
        if !actions.is_empty() {
            let response = RateLimitQuotaResponse { bucket_action: actions };
            let _ = tokio::time::timeout(SEND_TIMEOUT, self.answers.send(Ok(response))).await;
        }
    }

    /// Tells the metrics what this stream holds now: once a message or a round, not once a
    /// bucket (it reads every bucket).
    fn recount(&mut self) {
        let mut now = Holding::default();
        for held in self.buckets.values() {
            if let Some(Assignment::TokenBucket { .. }) = held.last {
                now.buckets += 1;
                now.rate += held.last.and_then(Assignment::rate).unwrap_or(0.0);
            }
            now.shrinks += i64::from(held.shrinking);
        }
        self.observer.holding(now - self.holding);
        self.holding = now;
    }

    /// Every bucket's assignment again, expiring at once: the Envoy applies it and falls back
    /// to its own defaults, until it reaches another replica.
    async fn goodbye(&mut self) {
        let actions: Vec<BucketAction> = self
            .buckets
            .values()
            .filter_map(|held| held.last.map(|last| action_of(held.id.clone(), last.expiring_now())))
            .filter(|action| {
                !matches!(action.bucket_action, Some(bucket_action::BucketAction::AbandonAction(_)))
            })
            .collect();
        if !actions.is_empty() {
            let response = RateLimitQuotaResponse { bucket_action: actions };
            let _ = tokio::time::timeout(SEND_TIMEOUT, self.answers.send(Ok(response))).await;
        }
    }
}

/// The next bucket announced, or never once announcements stopped.
async fn heard(
    rebalances: &mut Option<broadcast::Receiver<Uuid>>,
) -> Result<Uuid, broadcast::error::RecvError> {
    match rebalances {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

fn seconds(duration: Duration) -> ProtoDuration {
    ProtoDuration { seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX), nanos: 0 }
}

/// Envoy's action for `assignment`. Every quota assignment carries a strategy: Envoy ignores
/// one without.
fn action_of(id: BucketId, assignment: Assignment) -> BucketAction {
    use rate_limit_strategy::{BlanketRule, Strategy};
    let assign = |strategy: Strategy, ttl: Duration| {
        bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy { strategy: Some(strategy) }),
        })
    };
    let action = match assignment {
        Assignment::AllowAll { ttl } => assign(Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl),
        Assignment::DenyAll { ttl } => assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32), ttl),
        Assignment::TokenBucket { max_tokens, tokens_per_fill, fill_interval, ttl } => assign(
            Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(UInt32Value { value: tokens_per_fill }),
                fill_interval: Some(seconds(fill_interval)),
            }),
            ttl,
        ),
        Assignment::Abandon => bucket_action::BucketAction::AbandonAction(AbandonAction {}),
    };
    BucketAction { bucket_id: Some(id), bucket_action: Some(action) }
}
