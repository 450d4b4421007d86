//! How often each rule granted and refused: counted in memory as decisions are made, and
//! added to the usage rows (`plexsphere.rule_usage`) in one statement per flush, every
//! `PLEXSPHERE_RULE_USAGE_FLUSH_INTERVAL_MS`, never one per decision.
//!
//! A flush that fails keeps its counts for the next one, so a database outage loses none; a
//! flush whose commit succeeded but whose answer was lost is counted again (the rarer error,
//! and the one that over-reports rather than hides). What waits is bounded: past
//! [`MAX_PENDING`] (rule, minute) counts, the oldest minutes are dropped, with a warning.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ratebudget::RuleRef;

use crate::{RuleId, RulesService, UsageCount};

/// The small numbers takes carry for rules ([`RuleRef`]) and the rule ids they stand for.
///
/// A rule keeps its number for the life of the process, across snapshots, so a count made
/// under one snapshot is still the same rule's when it is flushed under the next. The table
/// grows by one id per rule ever loaded: rules are operator-written, thousands at most.
#[derive(Clone, Debug, Default)]
pub struct RuleRefs(Arc<RwLock<Interned>>);

#[derive(Debug, Default)]
struct Interned {
    ids: Vec<RuleId>,
    numbers: HashMap<RuleId, u32>,
}

impl RuleRefs {
    /// The number of `id`, given it the first time it is seen.
    pub fn intern(&self, id: &RuleId) -> RuleRef {
        if let Some(number) = read(&self.0).numbers.get(id) {
            return RuleRef(*number);
        }
        let mut interned = self.0.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(number) = interned.numbers.get(id) {
            return RuleRef(*number);
        }
        let number = u32::try_from(interned.ids.len()).unwrap_or(u32::MAX);
        interned.ids.push(id.clone());
        interned.numbers.insert(id.clone(), number);
        RuleRef(number)
    }

    /// The id `reference` stands for.
    pub fn id(&self, reference: RuleRef) -> Option<RuleId> {
        read(&self.0).ids.get(reference.0 as usize).cloned()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // The table is extended whole under the write lock; a panic cannot tear it.
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The most (rule, minute) counts a replica keeps while flushes fail: a day of a thousand
/// busy rules is 1.4 million; this is a few megabytes.
pub const MAX_PENDING: usize = 100_000;

/// How long the last flush, at shutdown, may take before its counts are given up.
const LAST_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What one decision counts as, for its rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Granted, by any means (the store, a fallback, or failing open).
    Granted,
    /// Refused, by any means (the store, the pre-check, a fallback).
    Refused,
    /// Refused by a rule in shadow mode, and admitted.
    ShadowRefused,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    granted: u64,
    refused: u64,
    shadow_refused: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.granted += other.granted;
        self.refused += other.refused;
        self.shadow_refused += other.shadow_refused;
    }
}

/// The counts not flushed yet, per rule and minute (seconds since the epoch). Cheap to share.
#[derive(Debug, Default)]
pub struct Usage {
    pending: Mutex<HashMap<(RuleRef, i64), Counts>>,
}

impl Usage {
    /// Counts one decision of `rule`, made at `at`.
    pub fn count(&self, rule: RuleRef, at: DateTime<Utc>, counted: Counted) {
        let minute = at.timestamp().div_euclid(60) * 60;
        let mut pending = lock(&self.pending);
        let counts = pending.entry((rule, minute)).or_default();
        match counted {
            Counted::Granted => counts.granted += 1,
            Counted::Refused => counts.refused += 1,
            Counted::ShadowRefused => counts.shadow_refused += 1,
        }
    }

    fn drain(&self) -> HashMap<(RuleRef, i64), Counts> {
        std::mem::take(&mut *lock(&self.pending))
    }

    /// Puts back counts a flush could not add, beside whatever was counted meanwhile; drops
    /// the oldest minutes past [`MAX_PENDING`].
    fn restore(&self, batch: HashMap<(RuleRef, i64), Counts>) {
        let mut pending = lock(&self.pending);
        for (key, counts) in batch {
            pending.entry(key).or_default().add(counts);
        }
        if pending.len() > MAX_PENDING {
            let mut minutes: Vec<i64> = pending.keys().map(|(_, minute)| *minute).collect();
            minutes.sort_unstable();
            let cutoff = minutes[pending.len() - MAX_PENDING];
            let before = pending.len();
            pending.retain(|(_, minute), _| *minute >= cutoff);
            tracing::warn!(
                dropped = before - pending.len(),
                "rule usage could not be flushed for long; dropped the oldest minutes' counts"
            );
        }
    }

    /// Adds everything counted so far to the usage rows, in one statement; on failure, keeps
    /// it for the next flush.
    ///
    /// # Errors
    /// What the store failed with; the counts wait for the next flush.
    pub async fn flush(&self, refs: &RuleRefs, rules: &RulesService) -> Result<(), crate::RepositoryError> {
        let batch = self.drain();
        if batch.is_empty() {
            return Ok(());
        }
        let mut counts: Vec<UsageCount> = batch
            .iter()
            .filter_map(|((rule, minute), counts)| {
                Some(UsageCount {
                    rule: refs.id(*rule)?,
                    minute: DateTime::from_timestamp(*minute, 0)?,
                    granted: counts.granted,
                    refused: counts.refused,
                    shadow_refused: counts.shadow_refused,
                })
            })
            .collect();
        counts.sort_by(|a, b| (&a.rule, a.minute).cmp(&(&b.rule, b.minute)));
        let flushed = rules.add_usage(&counts).await;
        if flushed.is_err() {
            self.restore(batch);
        }
        flushed
    }
}

/// Flushes `usage` every `interval` until `shutdown`, and once more then (for at most a few
/// seconds), so a replica that stops loses what it counted only if the database is down;
/// `flushed` hears whether each flush succeeded.
pub async fn flush_every(
    usage: Arc<Usage>,
    refs: RuleRefs,
    rules: RulesService,
    interval: Duration,
    flushed: impl Fn(bool) + Send,
    shutdown: impl Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    let flush = || async {
        let result = usage.flush(&refs, &rules).await;
        if let Err(error) = &result {
            tracing::warn!(error = %ratebudget::cause_chain(error), "cannot flush rule usage; keeping it for the next flush");
        }
        flushed(result.is_ok());
    };
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(interval) => {}
        }
        flush().await;
    }
    if tokio::time::timeout(LAST_FLUSH_TIMEOUT, flush()).await.is_err() {
        tracing::warn!("the last rule usage flush did not finish in time; its counts are lost");
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counts are added whole under the lock; a panic cannot leave one half-added.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_count_per_rule_and_minute() {
        let usage = Usage::default();
        let at = DateTime::from_timestamp(120, 0).unwrap();
        usage.count(RuleRef(1), at, Counted::Granted);
        usage.count(RuleRef(1), at + chrono::TimeDelta::seconds(59), Counted::Refused);
        usage.count(RuleRef(1), at + chrono::TimeDelta::seconds(60), Counted::ShadowRefused);
        usage.count(RuleRef(2), at, Counted::Granted);
        let pending = usage.drain();
        assert_eq!(pending[&(RuleRef(1), 120)], Counts { granted: 1, refused: 1, shadow_refused: 0 });
        assert_eq!(pending[&(RuleRef(1), 180)], Counts { granted: 0, refused: 0, shadow_refused: 1 });
        assert_eq!(pending.len(), 3);
        assert!(usage.drain().is_empty());
    }

    #[test]
    fn counts_a_flush_could_not_add_wait_beside_new_ones_and_the_oldest_go_first() {
        let usage = Usage::default();
        let minute = |n: i64| DateTime::from_timestamp(n * 60, 0).unwrap();
        usage.count(RuleRef(0), minute(1), Counted::Granted);
        let batch = usage.drain();
        usage.count(RuleRef(0), minute(1), Counted::Granted);
        usage.restore(batch);
        assert_eq!(usage.drain()[&(RuleRef(0), 60)].granted, 2);

        let batch: HashMap<_, _> =
            (0..=MAX_PENDING as i64).map(|n| ((RuleRef(0), n * 60), Counts::default())).collect();
        usage.restore(batch);
        let kept = usage.drain();
        assert_eq!(kept.len(), MAX_PENDING);
        assert!(!kept.contains_key(&(RuleRef(0), 0)), "the oldest minute is dropped first");
    }
}
