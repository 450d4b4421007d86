//! How full each recently decided bucket was over the last minutes, as this replica saw it:
//! what the operator page (`/ui`) draws beside a bucket's level now.
//!
//! The shared table keeps one row per bucket and no history, and adding history there would
//! put a second write on every take. Every decision already tells the guard's observer what it
//! left in the bucket (a grant's remainder, a refusal's judged row), so the observer writes it
//! here instead, in memory, for free (docs/adr/0028). What it costs is completeness: a replica
//! knows only the decisions it made, so with several replicas each draws its own share of the
//! traffic (the level now, read from the table, is everyone's).
//!
//! Bounded twice: [`FillHistory::BUCKETS`] buckets at most (the cache forgets the least
//! useful first), each keeping [`FillHistory::SLOTS`] slots of [`FillHistory::SLOT`] (ten
//! minutes); a slot older than that is dropped when its bucket is next written or read.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use ratebudget::{Key, Scope};

/// One slot of a bucket's history: the decisions this replica made on it within
/// [`FillHistory::SLOT`] of `at`, and the level they left.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slot {
    /// The slot's start, on the decision clock.
    pub at: DateTime<Utc>,
    /// The level the slot's last decision left (after its debit, if it was a grant).
    pub tokens: f64,
    /// The lowest level any decision of the slot left.
    pub min_tokens: f64,
    /// The bucket's burst as the slot's last decision sized it.
    pub burst: f64,
    /// Grants in the slot.
    pub granted: u32,
    /// Refusals by this bucket in the slot (a pair refused by the other bucket is not one).
    pub refused: u32,
    /// Refusals by this bucket under a `SHADOW` rule: counted, and admitted.
    pub shadow_refused: u32,
}

/// What a decision did to a bucket, as its history counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    /// Granted and debited.
    Granted,
    /// Refused.
    Refused,
    /// Refused by a `SHADOW` budget, and so admitted.
    ShadowRefused,
}

impl Slot {
    fn count(&mut self, decided: Decided) {
        match decided {
            Decided::Granted => self.granted += 1,
            Decided::Refused => self.refused += 1,
            Decided::ShadowRefused => self.shadow_refused += 1,
        }
    }
}

type Track = Arc<Mutex<VecDeque<Slot>>>;

/// The recent levels of the buckets this replica decided on; cheap to clone, clones share.
#[derive(Clone)]
pub struct FillHistory {
    buckets: Arc<quick_cache::sync::Cache<(Scope, Key), Track>>,
}

impl std::fmt::Debug for FillHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillHistory").field("buckets", &self.buckets.len()).finish()
    }
}

impl FillHistory {
    /// The width of one slot.
    pub const SLOT: Duration = Duration::from_secs(10);
    /// Slots kept per bucket: ten minutes.
    pub const SLOTS: usize = 60;
    /// Buckets kept at most. A slot is about 48 bytes, so a full history is under 3 KiB a
    /// bucket and the whole under 12 MiB.
    pub const BUCKETS: usize = 4096;

    /// An empty history.
    pub fn new() -> FillHistory {
        FillHistory { buckets: Arc::new(quick_cache::sync::Cache::new(Self::BUCKETS)) }
    }

    /// The window kept, as a duration.
    pub fn window() -> Duration {
        Self::SLOT * Self::SLOTS as u32
    }

    /// Records that a decision at `now` left `tokens` (of `burst`) in `scope`'s bucket of
    /// `key`, and what it decided.
    pub fn record(
        &self,
        scope: Scope,
        key: Key,
        now: DateTime<Utc>,
        tokens: f64,
        burst: f64,
        decided: Decided,
    ) {
        let track = self
            .buckets
            .get_or_insert_with(&(scope, key), || Ok::<_, std::convert::Infallible>(Track::default()))
            .unwrap_or_else(|never| match never {});
        let at = slot_start(now);
        let mut slots = lock(&track);
        match slots.back_mut() {
            Some(last) if last.at == at => {
                last.tokens = tokens;
                last.min_tokens = last.min_tokens.min(tokens);
                last.burst = burst;
                last.count(decided);
            }
            // A decision whose clock is behind the last slot's (a replica's clock is
            // corrected now and then) joins that slot's counts but does not move its level:
            // the slots stay in order.
            Some(last) if last.at > at => last.count(decided),
            _ => {
                let mut slot =
                    Slot { at, tokens, min_tokens: tokens, burst, granted: 0, refused: 0, shadow_refused: 0 };
                slot.count(decided);
                slots.push_back(slot);
            }
        }
        expire(&mut slots, now);
    }

    /// `scope`'s bucket of `key` over the window before `now`, oldest slot first; empty when
    /// this replica decided nothing on it within the window.
    pub fn read(&self, scope: Scope, key: Key, now: DateTime<Utc>) -> Vec<Slot> {
        let Some(track) = self.buckets.get(&(scope, key)) else { return Vec::new() };
        let mut slots = lock(&track);
        expire(&mut slots, now);
        slots.iter().copied().collect()
    }
}

impl Default for FillHistory {
    fn default() -> Self {
        FillHistory::new()
    }
}

/// The start of the slot `now` falls in.
fn slot_start(now: DateTime<Utc>) -> DateTime<Utc> {
    let width = FillHistory::SLOT.as_secs() as i64;
    let seconds = now.timestamp().div_euclid(width) * width;
    DateTime::from_timestamp(seconds, 0).unwrap_or(now)
}

/// Drops the slots that ended before the window does, and any beyond [`FillHistory::SLOTS`].
fn expire(slots: &mut VecDeque<Slot>, now: DateTime<Utc>) {
    let window = TimeDelta::from_std(FillHistory::window()).unwrap_or(TimeDelta::MAX);
    let oldest = slot_start(now) - window;
    while slots.front().is_some_and(|slot| slot.at <= oldest) || slots.len() > FillHistory::SLOTS {
        slots.pop_front();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A slot is written field by field, but every field alone is a valid reading.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
