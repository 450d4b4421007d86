//! Leases for hot buckets (docs/adr/0034): a replica that takes often from one bucket leases
//! many of its tokens in one statement and grants them from memory, never more than the
//! budget.
//!
//! # Why a leased grant never exceeds the budget
//!
//! Think of the bucket one-at-a-time decisions would keep (`V`, debited when a grant is
//! made), the shared row (`S`), and the tokens replicas hold leased and not granted (`H`, the
//! sum over replicas). Every grant, direct or leased, is one `V` admits if `S + H <= V` holds
//! at every instant, since a direct grant needs `S`, and a leased one `H`. A lease moves
//! tokens from `S` to `H`, a leased grant spends `H` and `V` alike, a refund moves them back:
//! none raises `S + H`. Refill raises `S` and `V` at the same rate, but `V` stops at the
//! burst: so `S + H` must stay at most the burst too. Each holder keeps to that for itself: it
//! grants from its lease no more than the burst less the level the row it leased from would
//! have by now (`usable`). That level bounds `S` from above (every later take and lease only
//! lowered it), and the holder that leased first counts every later lease in it, so the
//! holders together keep `S + H` within the burst. A refund would add tokens a holder's row
//! does not count if it came from a lease made before that holder's, so the store credits a
//! refund only to the bucket's latest lease (`lease_serial`, drawn from a sequence, so that
//! no lease of a row a reset deleted and a take minted again shares a number with one of the
//! row before), and forfeits it otherwise. A refund alone (a cooled bucket's lease going back,
//! under the limit it was leased under, which a lowered rule may have changed since) refills
//! nothing: the next take refills the row at its own limit, the current one.
//!
//! What can be lost is grants, never budget: a lease's tokens the burst no longer leaves room
//! for, a forfeited refund, a lease dropped with its entry (a reset, a changed rule, eviction,
//! a lease whose caller went away mid-statement) or held by a replica that died (until the
//! bucket refills them).
//!
//! # When a bucket is leased
//!
//! Each replica measures each bucket's demand (tokens asked over the last lease period, or
//! over the current one so far when that is more). A bucket is hot when a lease of one
//! period's demand would serve at least
//! [`HOT_TAKES`] takes; its next take then asks for that much (at least its own cost, at most
//! [`MAX_SHARE`] of the burst), and gives back in the same statement what the previous lease
//! did not grant. A lease lasts one period, and after that for as long as the bucket stays
//! hot here; what a lease of a bucket that cooled did not grant goes back
//! ([`super::Guard::return_leases`]). While one take of the bucket waits for a lease, the
//! others take directly, as a cold bucket's do.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use chrono::{DateTime, Utc};

use crate::{Fill, Key, LeaseRequest, Leased, Limit, Name, Spend};

/// A lease is worth its statement when one period's demand is at least this many takes.
pub(super) const HOT_TAKES: f64 = 2.0;
/// The most of a bucket's burst one replica leases at once, so that replicas sharing a hot
/// bucket each find some of it (docs/adr/0034 has the simulation that chose it).
pub(super) const MAX_SHARE: f64 = 0.25;

/// One bucket's lease on this replica, and how busy the bucket is here.
#[derive(Debug, Default)]
pub(super) struct Lease {
    /// Tokens leased and not granted (of which `usable` may grant).
    held: f64,
    /// The lease's number, under which `held` may be given back.
    serial: i64,
    /// The limit it was leased under; a take under another limit does not spend it.
    limit: Option<Limit>,
    /// The row as the lease left it: refilled to an instant, the most the shared row can hold.
    row: Option<Fill>,
    /// When it stops being spent.
    expires: Option<Instant>,
    /// A take of this bucket is asking the store for a lease: closed when it has its answer
    /// (or went away), so that takes waiting for the lease go on.
    asking: Option<watch::Receiver<()>>,
    /// Tokens asked of this bucket here since `window_started`.
    asked: f64,
    window_started: Option<Instant>,
    /// Tokens asked per second over the last whole window.
    rate: f64,
    /// The cost of the last take: what a lease of this bucket must serve twice to be worth it.
    last_cost: f64,
}

/// What a take does when its bucket's lease cannot grant it.
pub(super) enum Ask {
    /// Ask the store for this lease; dropping the sender tells the takes waiting for it.
    Request(LeaseRequest, watch::Sender<()>),
    /// Wait until the lease another take asks for is answered (or that take went away).
    Wait(watch::Receiver<()>),
    /// Take directly, as a cold bucket's take does.
    Direct,
}

impl Lease {
    /// Counts `cost` asked at `instant`, ending the demand window once it is `period` old.
    fn count(&mut self, cost: f64, instant: Instant, period: Duration) {
        let started = *self.window_started.get_or_insert(instant);
        let elapsed = instant.saturating_duration_since(started);
        if elapsed >= period {
            self.rate = self.asked / elapsed.as_secs_f64();
            self.asked = 0.0;
            self.window_started = Some(instant);
        }
        self.asked += cost;
    }

    /// Tokens a period asks of this bucket here: the last whole window's demand, or this
    /// one's so far when more (so a bucket that turns hot is leased within its first period);
    /// a window left open longer than a period (nobody asked since) counts its idle time.
    fn demand(&self, instant: Instant, period: Duration) -> f64 {
        let elapsed =
            self.window_started.map_or(Duration::ZERO, |started| instant.saturating_duration_since(started));
        if elapsed >= period {
            self.asked / elapsed.as_secs_f64() * period.as_secs_f64()
        } else {
            (self.rate * period.as_secs_f64()).max(self.asked)
        }
    }

    /// What of `held` may still be granted at `now`: no more than the burst leaves room for
    /// above the level the leased-from row would have by now.
    fn usable(&self, limit: Limit, now: DateTime<Utc>) -> f64 {
        match self.row {
            Some(row) => self.held.min(limit.burst() - limit.level(row, now)).max(0.0),
            None => 0.0,
        }
    }

    /// Grants `spend` at `now` (`instant` on the monotonic clock) from this lease if it can:
    /// the row as the lease left it. A take's first try counts its demand (`first`); one that
    /// waited for a lease and tries again is counted already.
    pub(super) fn grant(
        &mut self,
        spend: &Spend,
        now: DateTime<Utc>,
        instant: Instant,
        period: Duration,
        first: bool,
    ) -> Option<Fill> {
        if first {
            self.count(spend.cost, instant, period);
            self.last_cost = spend.cost;
        }
        // A lease is spent until its period ends, and after that for as long as the bucket
        // stays hot here: going back to the store with what is left would only forfeit it
        // (a refund is credited only to the bucket's latest lease) and lease it again.
        let hot = self.demand(instant, period) >= HOT_TAKES * spend.cost;
        let live = self.expires.is_some_and(|expires| instant < expires) || (hot && self.expires.is_some());
        let row = self.row?;
        if self.limit == Some(spend.limit) && live && self.usable(spend.limit, now) >= spend.cost {
            self.held -= spend.cost;
            return Some(row);
        }
        None
    }

    /// What `spend` at `now` does when its bucket's lease cannot grant it: ask the store for
    /// a lease, if its bucket is hot here and no other take is asking already; wait for the
    /// lease another take is asking for; or take directly.
    pub(super) fn request(
        &mut self,
        spend: &Spend,
        now: DateTime<Utc>,
        instant: Instant,
        period: Duration,
    ) -> Ask {
        let wanted = self.demand(instant, period);
        if wanted < HOT_TAKES * spend.cost {
            return Ask::Direct;
        }
        if let Some(asking) = &self.asking {
            return Ask::Wait(asking.clone());
        }
        let burst = spend.limit.burst();
        // At least a tenth of a period's refill: a bucket others do not draw down refills
        // over a lease as fast as the rate, and a lease smaller than that would leave no room
        // to grant from within a tenth of a period. A bucket drawn dry leases what it holds.
        let lasting = spend.limit.per_second() * period.as_secs_f64() / 10.0;
        let at_most = wanted.max(lasting).min(burst * MAX_SHARE).max(spend.cost).min(burst);
        // Only what may still be granted goes back; the rest the burst has no room for.
        let refund = if self.limit == Some(spend.limit) { self.usable(spend.limit, now) } else { 0.0 };
        self.held = 0.0;
        let (answered, asking) = watch::channel(());
        self.asking = Some(asking);
        Ask::Request(
            LeaseRequest { spend: *spend, at_least: spend.cost, at_most, refund, refund_serial: self.serial },
            answered,
        )
    }

    /// The store answered the request `spend` made: a lease, whose first `spend.cost` tokens
    /// are that take's, or nothing (the level could not cover the take).
    pub(super) fn leased(&mut self, spend: &Spend, leased: &Leased, instant: Instant, period: Duration) {
        self.asking = None;
        self.serial = leased.serial;
        self.row = Some(leased.row);
        self.limit = Some(spend.limit);
        if leased.leased >= spend.cost {
            self.held = leased.leased - spend.cost;
            self.expires = Some(instant + period);
        } else {
            self.held = 0.0;
            self.expires = None;
        }
    }

    /// The request was not answered (the store failed, or its caller went away): whatever
    /// it may have leased or given back is forfeited.
    pub(super) fn unanswered(&mut self) {
        self.asking = None;
        self.held = 0.0;
        self.expires = None;
    }

    /// Gives up what an expired lease of `name`'s bucket of `key` still holds, for it to go
    /// back: the request, if there is anything to give back (the entry is marked as asking).
    pub(super) fn take_back(
        &mut self,
        name: Name,
        key: Key,
        instant: Instant,
        now: DateTime<Utc>,
        period: Duration,
    ) -> Option<LeaseRequest> {
        // Still hot here: the lease is kept, and goes back with the next lease if any.
        let cooled = self.demand(instant, period) < HOT_TAKES * self.last_cost;
        let expired = self.expires.is_some_and(|expires| instant >= expires) && cooled;
        let limit = self.limit?;
        if !expired || self.asking.is_some() {
            return None;
        }
        let refund = self.usable(limit, now);
        self.held = 0.0;
        self.expires = None;
        (refund > 0.0).then(|| {
            // Nobody waits for a refund: a take of the bucket meanwhile takes directly.
            LeaseRequest {
                spend: Spend::new(name, key, 0.0, limit),
                at_least: 0.0,
                at_most: 0.0,
                refund,
                refund_serial: self.serial,
            }
        })
    }

    /// Tokens held and not granted (for the operator page and metrics).
    pub(super) fn held(&self) -> f64 {
        self.held
    }
}
