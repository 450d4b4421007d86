//! The queue of takes waiting for a call, and the drivers that send it (see [`super`]).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use super::{statements, Coalescing, Statement};
use crate::connections::TakeConnections;
use crate::error::Failure;
use crate::{Decision, Key, Name};

/// One queued take and where its answer goes.
struct Queued {
    statement: Statement,
    now: DateTime<Utc>,
    answer: oneshot::Sender<Result<Decision, Failure>>,
}

struct State {
    queue: VecDeque<Queued>,
    drivers: usize,
    /// The buckets of the calls on the wire. A take of one of them waits for the next call
    /// instead of going in a call of its own beside it: that call would only wait for the row
    /// lock and the commit of the first, one hot bucket's takes would go as many small calls
    /// each paying a commit under the lock, and they are worth more together (BENCHMARKS.md
    /// section 6: one hot bucket at 16 callers, 11,995 takes a second before this rule,
    /// 20,717 with it).
    in_flight: HashSet<(Name, Key)>,
}

impl State {
    /// The next call: the queued takes in order, at most `max_batch`, without those whose
    /// caller stopped waiting (a take whose caller stopped waiting is not sent: its request was
    /// already answered without it, and under a slow database this is what lets the queue
    /// drain instead of spending budgets for requests nobody waits on). A take of a bucket on
    /// the wire stays queued, and so does every later take of any of its buckets, so each
    /// bucket's takes are still decided in queue order.
    fn next_batch(&mut self, max_batch: usize) -> Vec<Queued> {
        let mut batch = Vec::with_capacity(self.queue.len().min(max_batch));
        let mut held_back: Vec<Queued> = Vec::new();
        let mut blocked: HashSet<(Name, Key)> = HashSet::new();
        while batch.len() < max_batch {
            let Some(queued) = self.queue.pop_front() else { break };
            if queued.answer.is_closed() {
                continue;
            }
            if buckets(&queued.statement)
                .any(|bucket| self.in_flight.contains(&bucket) || blocked.contains(&bucket))
            {
                blocked.extend(buckets(&queued.statement));
                held_back.push(queued);
            } else {
                batch.push(queued);
            }
        }
        for queued in held_back.into_iter().rev() {
            self.queue.push_front(queued);
        }
        batch
    }
}

/// The buckets a take debits.
fn buckets(statement: &Statement) -> impl Iterator<Item = (Name, Key)> + '_ {
    statement.sides().iter().map(|(_, spend)| (spend.name, spend.key))
}

/// The queue and its drivers.
pub(crate) struct Coalescer {
    takes: Arc<TakeConnections>,
    coalescing: Coalescing,
    state: Mutex<State>,
}

impl Coalescer {
    pub(crate) fn new(takes: Arc<TakeConnections>, coalescing: Coalescing) -> Coalescer {
        let coalescing = Coalescing {
            max_batch: coalescing.max_batch.max(1),
            max_in_flight: coalescing.max_in_flight.max(1),
        };
        Coalescer {
            takes,
            coalescing,
            state: Mutex::new(State { queue: VecDeque::new(), drivers: 0, in_flight: HashSet::new() }),
        }
    }

    pub(crate) fn coalescing(&self) -> Coalescing {
        self.coalescing
    }

    /// Decides `statement` at `now`, in a call with whatever else is queued when a driver
    /// next sends one.
    pub(crate) async fn decide(
        self: &Arc<Self>,
        statement: Statement,
        now: DateTime<Utc>,
    ) -> Result<Decision, Failure> {
        let (answer, answered) = oneshot::channel();
        let start_driver = {
            let mut state = self.lock();
            let on_the_wire = buckets(&statement).any(|bucket| state.in_flight.contains(&bucket));
            state.queue.push_back(Queued { statement, now, answer });
            // With nothing on the wire the take goes at once. Otherwise it waits for a call to
            // return, unless a quarter of a call's worth is waiting: a second call beside the
            // first pays when the database has room for it, and one started for a take or two
            // splits the queue into small calls that each pay a commit (at 64 callers on random
            // keys, 18.9k takes/s when only a whole call's worth started one, 28.8k at a
            // quarter, 24.8k at an eighth). A take of a bucket on the wire goes in the call
            // after it: its driver sends it.
            let start = state.drivers == 0
                || (state.drivers < self.coalescing.max_in_flight
                    && state.queue.len() >= self.coalescing.second_call_after()
                    && !on_the_wire);
            if start {
                state.drivers += 1;
            }
            start
        };
        if start_driver {
            tokio::spawn(self.clone().drive());
        }
        // A driver answers every take it pops, or its task panicked or the runtime is ending.
        answered.await.unwrap_or(Err(Failure::Unanswered))
    }

    /// Sends the queue, call after call, until nothing in it can go. The check for "nothing"
    /// and the driver count change under one lock, so a take queued meanwhile is always picked
    /// up: by this driver, or by the one whose call holds its bucket.
    async fn drive(self: Arc<Self>) {
        let mut on_the_wire = OnTheWire { coalescer: &self, buckets: Vec::new() };
        loop {
            let batch = {
                let mut state = self.lock();
                // The last call's buckets count as on the wire until this driver has picked
                // the next call, so the takes its callers queued meanwhile wait for it rather
                // than start a call beside it.
                for bucket in on_the_wire.buckets.drain(..) {
                    state.in_flight.remove(&bucket);
                }
                let batch = state.next_batch(self.coalescing.max_batch);
                if batch.is_empty() {
                    state.drivers -= 1;
                    return;
                }
                on_the_wire.buckets = batch.iter().flat_map(|queued| buckets(&queued.statement)).collect();
                state.in_flight.extend(on_the_wire.buckets.iter().copied());
                batch
            };
            let statements: Vec<(Statement, DateTime<Utc>)> =
                batch.iter().map(|queued| (queued.statement.clone(), queued.now)).collect();
            match statements::run(&self.takes, &statements).await {
                Ok(decisions) => {
                    for (queued, decision) in batch.into_iter().zip(decisions) {
                        // A caller that stopped waiting dropped its receiver; nothing to do.
                        let _ = queued.answer.send(Ok(decision));
                    }
                }
                // A take sent alone failed by its own statement.
                Err(failure) if batch.len() == 1 => {
                    if let Some(queued) = batch.into_iter().next() {
                        let _ = queued.answer.send(Err(failure));
                    }
                }
                Err(failure) => {
                    let shared = failure.shared();
                    for queued in batch {
                        let _ = queued.answer.send(Err(shared.one()));
                    }
                }
            }
            // One turn of the runtime before the next call: the callers just answered run,
            // and those that take again (the next request of a busy connection) join it
            // instead of waiting a whole call behind it. Not a timer: nothing waits when no
            // task is ready, and a lone take never comes here before it is sent.
            tokio::task::yield_now().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Between statements the queue and the count are whole; a panic cannot tear them.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The buckets of a driver's last call, in `State::in_flight` until the driver picks its next
/// call. Dropped with buckets still in it, the driver ended without going back to its loop:
/// it panicked, or its task was dropped mid-call (the runtime shutting down). It then takes
/// them out and ends the driver, starting another when takes are left and a runtime can run
/// it, so no take waits on a call that will never return.
struct OnTheWire<'a> {
    coalescer: &'a Arc<Coalescer>,
    buckets: Vec<(Name, Key)>,
}

impl Drop for OnTheWire<'_> {
    fn drop(&mut self) {
        if self.buckets.is_empty() && !std::thread::panicking() {
            // The driver's own end: it emptied `buckets` and counted itself out under the lock.
            return;
        }
        let mut state = self.coalescer.lock();
        for bucket in &self.buckets {
            state.in_flight.remove(bucket);
        }
        state.drivers -= 1;
        if !state.queue.is_empty() && state.drivers < self.coalescer.coalescing.max_in_flight {
            // `tokio::spawn` panics outside a runtime, and a panic while unwinding aborts.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                state.drivers += 1;
                runtime.spawn(self.coalescer.clone().drive());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scope;
    use crate::{Limit, Spend, Which};

    fn spend(scope: Scope, key: u128) -> Spend {
        Spend::new(scope, Key::from(uuid::Uuid::from_u128(key)), 1.0, Limit::new(1.0, 10.0).unwrap())
    }

    fn single(key: u128) -> Statement {
        Statement::Single((Which::First, spend(Scope::IngestNode, key)))
    }

    fn pair(node: u128, domain: u128) -> Statement {
        Statement::of(&[
            (Which::First, spend(Scope::IngestNode, node)),
            (Which::Second, spend(Scope::IngestDomain, domain)),
        ])
    }

    fn many(keys: &[u128]) -> Statement {
        let sides: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| (Which::at(i), spend(Scope::IngestDomain, *key)))
            .collect();
        Statement::of(&sides)
    }

    /// A state whose queue holds `statements` in order (each with a caller still waiting, its
    /// receiver returned) and whose calls on the wire hold `in_flight`.
    fn state(
        statements: &[Statement],
        in_flight: &[Statement],
    ) -> (State, Vec<oneshot::Receiver<Result<Decision, Failure>>>) {
        let mut receivers = Vec::new();
        let queue = statements
            .iter()
            .map(|statement| {
                let (answer, answered) = oneshot::channel();
                receivers.push(answered);
                Queued { statement: statement.clone(), now: Utc::now(), answer }
            })
            .collect();
        let in_flight = in_flight.iter().flat_map(buckets).collect();
        (State { queue, drivers: 1, in_flight }, receivers)
    }

    fn keys(queued: &[Queued]) -> Vec<Vec<(Name, Key)>> {
        queued.iter().map(|queued| buckets(&queued.statement).collect()).collect()
    }

    #[test]
    fn a_call_takes_the_queue_in_order_up_to_its_maximum() {
        let (mut state, _callers) = state(&[single(1), single(2), single(1), single(3)], &[]);
        let batch = state.next_batch(3);
        assert_eq!(keys(&batch), keys_of(&[single(1), single(2), single(1)]));
        assert_eq!(keys(state.queue.make_contiguous()), keys_of(&[single(3)]));
    }

    #[test]
    fn takes_of_a_bucket_on_the_wire_wait_and_so_do_later_takes_of_their_buckets() {
        // Node 1 is on the wire: its takes wait, and the pair (1, 9) waiting makes the later
        // pair (8, 9) wait behind it for domain 9. The pair (7, 9) came before them, so it
        // goes, and so do node 2 and node 7, which nothing waiting touches.
        let queue = [single(1), pair(7, 9), single(2), pair(1, 9), pair(8, 9), single(7)];
        let (mut state, _callers) = state(&queue, &[single(1)]);
        let batch = state.next_batch(64);
        assert_eq!(keys(&batch), keys_of(&[pair(7, 9), single(2), single(7)]));
        assert_eq!(keys(state.queue.make_contiguous()), keys_of(&[single(1), pair(1, 9), pair(8, 9)]));
    }

    #[test]
    fn a_take_whose_caller_stopped_waiting_is_not_sent() {
        let (mut state, mut callers) = state(&[single(1), single(2), single(3)], &[]);
        callers[1].close();
        let batch = state.next_batch(64);
        assert_eq!(keys(&batch), keys_of(&[single(1), single(3)]));
        assert!(state.queue.is_empty());
    }

    #[test]
    fn when_everything_waits_for_the_wire_the_call_is_empty_and_the_queue_intact() {
        let (mut state, _callers) = state(&[single(1), single(1)], &[single(1)]);
        assert!(state.next_batch(64).is_empty());
        assert_eq!(state.queue.len(), 2);
    }

    #[test]
    fn a_take_of_many_buckets_waits_for_any_of_them_and_holds_back_later_takes_of_each() {
        // Domain 3 is on the wire: the take of 1, 2, 3 and 4 waits, and so does the later take
        // of 4 and 5 (and would any later take of 5); 6 and 7 go.
        let queue = [many(&[1, 2, 3, 4]), many(&[4, 5]), many(&[6, 7]), single(9)];
        let (mut state, _callers) = state(&queue, &[many(&[3])]);
        let batch = state.next_batch(64);
        assert_eq!(keys(&batch), keys_of(&[many(&[6, 7]), single(9)]));
        assert_eq!(keys(state.queue.make_contiguous()), keys_of(&[many(&[1, 2, 3, 4]), many(&[4, 5])]));
    }

    fn keys_of(statements: &[Statement]) -> Vec<Vec<(Name, Key)>> {
        statements.iter().map(|statement| buckets(statement).collect()).collect()
    }
}
