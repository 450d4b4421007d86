//! The RLQS allocator's metrics (`plexsphere_rlqs_*`): streams, the buckets they hold
//! assignments for and the rate those allow, what Envoys report, the assignments sent, the
//! shrinks not yet confirmed, SHADOW rules' estimated refusals, and reports the store could
//! not answer.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use service::quota::{Assignment, Usage};

use super::metrics::Metrics;
use crate::grpc::quota::{Holding, StreamObserver};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AssignmentLabels {
    service: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowLabels {
    service: String,
    rule: String,
}

/// The families.
pub struct QuotaFamilies {
    streams: Gauge,
    buckets: Gauge,
    assigned_rate: Gauge<f64, AtomicU64>,
    shrinks_pending: Gauge,
    reported_allowed: Family<ServiceLabels, Counter>,
    reported_denied: Family<ServiceLabels, Counter>,
    assignments: Family<AssignmentLabels, Counter>,
    shadow_refused: Family<ShadowLabels, Counter>,
    store_errors: Family<ServiceLabels, Counter>,
}

impl QuotaFamilies {
    /// Registers every family in `registry`.
    pub fn register(registry: &mut Registry) -> QuotaFamilies {
        let families = QuotaFamilies {
            streams: Gauge::default(),
            buckets: Gauge::default(),
            assigned_rate: Gauge::default(),
            shrinks_pending: Gauge::default(),
            reported_allowed: Family::default(),
            reported_denied: Family::default(),
            assignments: Family::default(),
            shadow_refused: Family::default(),
            store_errors: Family::default(),
        };
        registry.register(
            "rlqs_streams",
            "Envoys' RLQS streams open on this replica",
            families.streams.clone(),
        );
        registry.register(
            "rlqs_buckets_assigned",
            "Buckets of this replica's RLQS streams holding a token-bucket assignment",
            families.buckets.clone(),
        );
        registry.register(
            "rlqs_assigned_rate",
            "Requests a second the token buckets this replica's streams hold allow, summed",
            families.assigned_rate.clone(),
        );
        registry.register(
            "rlqs_shrinks_pending",
            "Buckets of this replica's streams sent a smaller share that their Envoy has not yet reported under (the old share still counts)",
            families.shrinks_pending.clone(),
        );
        registry.register(
            "rlqs_reported_allowed",
            "Requests Envoys reported allowed, by service (one with rules, else other)",
            families.reported_allowed.clone(),
        );
        registry.register(
            "rlqs_reported_denied",
            "Requests Envoys reported denied, by service",
            families.reported_denied.clone(),
        );
        registry.register(
            "rlqs_assignments",
            "Assignments sent, by service and kind (token_bucket, deny_all, allow_all, abandon)",
            families.assignments.clone(),
        );
        registry.register(
            "rlqs_shadow_refused",
            "Requests a SHADOW rule's Envoys admitted that their share would have refused, estimated from their reports",
            families.shadow_refused.clone(),
        );
        registry.register(
            "rlqs_store_errors",
            "Reports the store could not answer (nothing was sent; the Envoy kept its last assignment)",
            families.store_errors.clone(),
        );
        families
    }
}

fn kind(assignment: Assignment) -> &'static str {
    match assignment {
        Assignment::AllowAll { .. } => "allow_all",
        Assignment::DenyAll { .. } => "deny_all",
        Assignment::TokenBucket { .. } => "token_bucket",
        Assignment::Abandon => "abandon",
    }
}

impl service::quota::QuotaObserver for Metrics {
    fn reported(&self, service: &str, usage: Usage) {
        let labels = ServiceLabels { service: service.to_owned() };
        self.quota.reported_allowed.get_or_create(&labels).inc_by(usage.allowed);
        self.quota.reported_denied.get_or_create(&labels).inc_by(usage.denied);
    }

    fn assigned(&self, service: &str, assignment: Option<Assignment>) {
        if let Some(assignment) = assignment {
            let labels = AssignmentLabels { service: service.to_owned(), kind: kind(assignment) };
            self.quota.assignments.get_or_create(&labels).inc();
        }
    }

    fn shadow_refused(&self, service: &str, rule: &str, refused: u64) {
        let labels = ShadowLabels { service: service.to_owned(), rule: rule.to_owned() };
        self.quota.shadow_refused.get_or_create(&labels).inc_by(refused);
    }

    fn failed(&self, service: &str) {
        self.quota.store_errors.get_or_create(&ServiceLabels { service: service.to_owned() }).inc();
    }
}

impl StreamObserver for Metrics {
    fn stream(&self, open: bool) {
        if open {
            self.quota.streams.inc();
        } else {
            self.quota.streams.dec();
        }
    }

    fn holding(&self, change: Holding) {
        self.quota.buckets.inc_by(change.buckets);
        self.quota.assigned_rate.inc_by(change.rate);
        self.quota.shrinks_pending.inc_by(change.shrinks);
    }
}
