//! The guard's timing, on tokio's paused clock: what a take waits for, and for how long, is
//! exact there, whatever else the machine is doing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{Guard, Observer, Source};
use crate::{
    Decider, Decision, Enforcement, FailMode, Fill, Grant, Key, LeaseRequest, Leased, Limit, Name, Spend,
    Take, Undecided, Which,
};

/// A store that answers its first take at once, and then nothing, ever: no other take and no
/// lease.
#[derive(Debug, Default)]
struct AnswersOnce {
    takes: AtomicUsize,
}

#[async_trait]
impl Decider for AnswersOnce {
    async fn decide(&self, _: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        if self.takes.fetch_add(1, Ordering::SeqCst) > 0 {
            std::future::pending::<()>().await;
        }
        let row = Fill { tokens: 99.0, refilled_at: now };
        Ok(Decision::Granted(Grant::of([(Which::First, row)])))
    }

    async fn lease(&self, _: LeaseRequest, _: DateTime<Utc>) -> Result<Option<Leased>, Undecided> {
        std::future::pending().await
    }
}

/// Remembers where the last decision came from.
#[derive(Debug, Default)]
struct LastSource(std::sync::Mutex<Option<Source>>);

impl Observer for LastSource {
    fn decided(
        &self,
        _: &Take,
        _: DateTime<Utc>,
        outcome: Result<(&Decision, Source), &Undecided>,
        _: Duration,
    ) {
        *self.0.lock().unwrap() = outcome.ok().map(|(_, source)| source);
    }
    fn abandoned(&self, _: &Take, _: Duration) {}
    fn store_failing(&self, _: bool) {}
}

#[tokio::test(start_paused = true)]
async fn a_take_waiting_for_another_takes_lease_is_decided_by_its_fail_mode_within_one_decision_timeout() {
    // Issue 32, item 6. A take that met a lease being asked for waited for its answer (up to
    // the asking take's decision timeout), then asked the store with a decision timeout of
    // its own: two in all, past a caller's deadline of one and a half, which answered 500
    // where the take's OPEN fail mode should have admitted it.
    let timeout = Duration::from_secs(1);
    let observer = Arc::new(LastSource::default());
    let guard = Guard::builder(AnswersOnce::default())
        .decision_timeout(timeout)
        .leases(Duration::from_secs(60))
        .observer(observer.clone())
        .build();
    let limit = Limit::new(100.0, 100.0).unwrap();
    let spend = Spend::new(Name::new("hot").unwrap(), Key([7; 16]), 1.0, limit);
    let open = Take::Single(Spend {
        enforcement: Enforcement { fail_mode: FailMode::Open, ..Enforcement::STRICT },
        ..spend
    });
    let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();

    // The store answers the first take; the second finds the bucket hot and asks for a lease,
    // which never comes; the third waits for that lease.
    assert!(guard.decide(open.clone(), now).await.unwrap().is_granted());
    let caller_deadline = timeout * 3 / 2;
    let (asking, waiting) = tokio::join!(
        guard.decide(open.clone(), now),
        tokio::time::timeout(caller_deadline, guard.decide(open, now))
    );
    assert!(asking.unwrap().is_granted(), "the asking take times out and is admitted open");
    let waiting = waiting.expect("the waiting take is answered within its caller's deadline");
    assert!(waiting.unwrap().is_granted());
    assert_eq!(*observer.0.lock().unwrap(), Some(Source::Open), "decided by its fail mode");
}
