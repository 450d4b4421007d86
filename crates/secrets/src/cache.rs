//! Recently read secrets, kept per replica so that a Node's reads cost no round trip while
//! nothing changes.
//!
//! What is kept is the stored form (sealed), never the opened value: a read still opens it, so
//! no secret sits in memory in the clear longer than a read takes. Every change to a secret is
//! announced by the database (migration 0010) and the composition root's listener calls
//! [`SecretCache::forget`] on every replica; announcements sent while the listener is not
//! connected are lost, so the cache is used only while it is ([`SecretCache::resume`],
//! [`SecretCache::suspend`]), as the credential cache is (docs/adr/0011).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::{DomainId, SecretName, StoredValue};

/// The secrets this replica read recently; cheap to clone, clones share it.
#[derive(Clone)]
pub struct SecretCache {
    entries: Arc<quick_cache::sync::Cache<(DomainId, SecretName), Option<StoredValue>>>,
    listening: Arc<AtomicBool>,
    /// Bumped by every forgetting, so a read that raced one does not keep what it found.
    epoch: Arc<AtomicU64>,
    /// A cache of capacity 0 is off: it never resumes, so every read goes to the database.
    enabled: bool,
}

impl std::fmt::Debug for SecretCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretCache").field("entries", &self.entries.len()).finish_non_exhaustive()
    }
}

impl SecretCache {
    /// An empty cache of at most `capacity` secrets (the least useful go first), suspended
    /// until its listener connects; with `capacity` 0 it is off for good.
    pub fn new(capacity: usize) -> SecretCache {
        SecretCache {
            entries: Arc::new(quick_cache::sync::Cache::new(capacity.max(1))),
            listening: Arc::new(AtomicBool::new(false)),
            epoch: Arc::new(AtomicU64::new(0)),
            enabled: capacity > 0,
        }
    }

    /// The stored form of `domain`'s secret `name` (`Some(None)`: known absent), if known
    /// and the cache is in use.
    pub(crate) fn get(&self, domain: DomainId, name: &SecretName) -> Option<Option<StoredValue>> {
        if !self.listening.load(Ordering::Acquire) {
            return None;
        }
        self.entries.get(&(domain, name.clone()))
    }

    /// The epoch to pass to [`SecretCache::insert`] with what a read is about to find.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Keeps what a read found, unless something was forgotten since it began (`epoch`).
    pub(crate) fn insert(&self, epoch: u64, domain: DomainId, name: SecretName, value: Option<StoredValue>) {
        if self.listening.load(Ordering::Acquire) && self.epoch.load(Ordering::Acquire) == epoch {
            self.entries.insert((domain, name), value);
        }
    }

    /// Forgets one secret: it changed.
    pub fn forget(&self, domain: DomainId, name: &SecretName) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.entries.remove(&(domain, name.clone()));
    }

    /// Forgets every secret.
    pub fn forget_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.entries.clear();
    }

    /// Uses the cache again, empty: the listener is connected.
    pub fn resume(&self) {
        self.forget_all();
        self.listening.store(self.enabled, Ordering::Release);
    }

    /// Stops using the cache: the listener is not connected, so changes may go unheard.
    pub fn suspend(&self) {
        self.listening.store(false, Ordering::Release);
        self.forget_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (DomainId, SecretName) {
        (DomainId::from(uuid::Uuid::new_v4()), SecretName::parse("db-password").unwrap())
    }

    #[test]
    fn nothing_is_served_until_the_listener_connects_nor_after_it_drops() {
        let cache = SecretCache::new(16);
        let (domain, name) = key();
        cache.insert(cache.epoch(), domain, name.clone(), None);
        assert_eq!(cache.get(domain, &name), None, "kept before the listener connected");

        cache.resume();
        cache.insert(cache.epoch(), domain, name.clone(), None);
        assert_eq!(cache.get(domain, &name), Some(None));

        cache.suspend();
        assert_eq!(cache.get(domain, &name), None, "served while changes could go unheard");
        cache.resume();
        assert_eq!(cache.get(domain, &name), None, "what was kept before the gap survived it");
    }

    #[test]
    fn a_read_that_raced_a_change_does_not_keep_what_it_found() {
        let cache = SecretCache::new(16);
        cache.resume();
        let (domain, name) = key();
        let before_the_change = cache.epoch();
        cache.forget(domain, &name);
        cache.insert(before_the_change, domain, name.clone(), None);
        assert_eq!(cache.get(domain, &name), None);
    }

    #[test]
    fn capacity_zero_is_off_for_good() {
        let cache = SecretCache::new(0);
        cache.resume();
        let (domain, name) = key();
        cache.insert(cache.epoch(), domain, name.clone(), None);
        assert_eq!(cache.get(domain, &name), None);
    }
}
