//! The circuit in front of the store: after a few failures in a row, takes that may skip the
//! store (they do not fail closed) decide by their fail mode at once, while one take at a
//! time probes it twice a second.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{lock, Guard};
use crate::{Decision, Take, Undecided};

/// The circuit in front of the store.
#[derive(Debug)]
pub(super) enum Circuit {
    /// The store answers; `failures` in a row so far.
    Closed { failures: u32 },
    /// The store is failing: it is not asked, but probed (one take at a time) from `next_probe`.
    Open { next_probe: Instant, probing: bool },
}

/// Failures in a row that open the circuit: one slow statement is not an outage, three are.
const FAILURES_TO_OPEN: u32 = 3;
/// How often an open circuit lets one take through to the store to see whether it answers.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Whether to ask the store.
enum Ask {
    Yes { probe: bool },
    No,
}

impl Guard {
    /// Asks the store, until the take's `deadline` (the decision timeout from when the take
    /// began: whatever it waited for before, a lease another take asked for, came out of the
    /// same timeout), unless the circuit is open and the take `may_skip` the store (every
    /// scope it spends decides locally): then `None`, at once.
    ///
    /// A take that fails closed always asks: skipping would only turn a wait into a 500, and
    /// it may be the one that finds the store answering again.
    pub(super) async fn ask_store(
        &self,
        take: &Take,
        now: DateTime<Utc>,
        may_skip: bool,
        deadline: tokio::time::Instant,
    ) -> Option<Result<Decision, Undecided>> {
        self.ask_store_with(may_skip, deadline, self.inner.decide(take.clone(), now)).await
    }

    /// [`Guard::ask_store`] for any call of the store: a take, or a lease.
    pub(super) async fn ask_store_with<T>(
        &self,
        may_skip: bool,
        deadline: tokio::time::Instant,
        call: impl std::future::Future<Output = Result<T, Undecided>>,
    ) -> Option<Result<T, Undecided>> {
        let probe = match self.ask(may_skip) {
            Ask::No => return None,
            Ask::Yes { probe } => probe,
        };
        // Dropped before the answer (the caller stopped waiting), a probe frees the circuit
        // for the next take to probe; see the module documentation on cancellation.
        let mut asking = Asking { guard: self, probe, answered: false };
        let answer = tokio::time::timeout_at(deadline, call).await;
        asking.answered = true;
        let answer = answer.unwrap_or(Err(Undecided::TimedOut(self.config.decision_timeout)));
        match &answer {
            Ok(_) => self.store_answered(),
            Err(undecided) if undecided.is_store_failure() => self.store_failed(probe),
            // Bad input never reached the store: it says nothing of whether it answers.
            Err(_) if probe => self.probe_inconclusive(),
            Err(_) => {}
        }
        Some(answer)
    }

    fn ask(&self, may_skip: bool) -> Ask {
        let mut circuit = lock(&self.circuit);
        match &mut *circuit {
            Circuit::Closed { .. } => Ask::Yes { probe: false },
            Circuit::Open { next_probe, probing } if !*probing && Instant::now() >= *next_probe => {
                *probing = true;
                Ask::Yes { probe: true }
            }
            Circuit::Open { .. } if !may_skip => Ask::Yes { probe: false },
            Circuit::Open { .. } => Ask::No,
        }
    }

    fn store_answered(&self) {
        let was_open = {
            let mut circuit = lock(&self.circuit);
            let was_open = matches!(*circuit, Circuit::Open { .. });
            *circuit = Circuit::Closed { failures: 0 };
            was_open
        };
        if was_open {
            tracing::info!("the rate-budget store answers again; deciding from it");
            self.observer.store_failing(false);
        }
    }

    fn store_failed(&self, probe: bool) {
        let opened = {
            let mut circuit = lock(&self.circuit);
            match &mut *circuit {
                Circuit::Closed { failures } => {
                    *failures += 1;
                    let open = *failures >= FAILURES_TO_OPEN;
                    if open {
                        *circuit =
                            Circuit::Open { next_probe: Instant::now() + PROBE_INTERVAL, probing: false };
                    }
                    open
                }
                Circuit::Open { next_probe, probing } => {
                    if probe {
                        *next_probe = Instant::now() + PROBE_INTERVAL;
                        *probing = false;
                    }
                    false
                }
            }
        };
        if opened {
            tracing::warn!(
                "the rate-budget store keeps failing; not asking it, probing every {PROBE_INTERVAL:?}"
            );
            self.observer.store_failing(true);
        }
    }

    /// A probe ended without saying whether the store answers (its caller stopped waiting, or
    /// its take was bad input): the next take may probe, at once.
    fn probe_inconclusive(&self) {
        if let Circuit::Open { probing, .. } = &mut *lock(&self.circuit) {
            *probing = false;
        }
    }
}

/// A question to the store in progress; see [`Guard::ask_store`].
struct Asking<'a> {
    guard: &'a Guard,
    probe: bool,
    answered: bool,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if self.probe && !self.answered {
            self.guard.probe_inconclusive();
        }
    }
}
