use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use ratebudget::{Key, Scope};

use super::{Decided, FillHistory};

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap() + TimeDelta::seconds(seconds)
}

fn key() -> Key {
    Key([7; 16])
}

#[test]
fn decisions_within_one_slot_share_it_keeping_the_last_and_the_lowest_level() {
    let history = FillHistory::new();
    history.record(Scope::SecretReadNode, key(), at(1), 19.0, 20.0, Decided::Granted);
    history.record(Scope::SecretReadNode, key(), at(2), 3.0, 20.0, Decided::Granted);
    history.record(Scope::SecretReadNode, key(), at(3), 0.5, 20.0, Decided::Refused);
    history.record(Scope::SecretReadNode, key(), at(9), 7.0, 20.0, Decided::Granted);
    let slots = history.read(Scope::SecretReadNode, key(), at(9));
    assert_eq!(slots.len(), 1, "{slots:?}");
    let slot = slots[0];
    assert_eq!((slot.at, slot.tokens, slot.min_tokens, slot.burst), (at(0), 7.0, 0.5, 20.0));
    assert_eq!((slot.granted, slot.refused), (3, 1));
}

#[test]
fn each_bucket_keeps_its_own_history() {
    let history = FillHistory::new();
    history.record(Scope::SecretReadNode, key(), at(0), 1.0, 20.0, Decided::Granted);
    history.record(Scope::IngestNode, key(), at(0), 2.0, 20.0, Decided::Granted);
    history.record(Scope::SecretReadNode, Key([8; 16]), at(0), 3.0, 20.0, Decided::Granted);
    assert_eq!(history.read(Scope::SecretReadNode, key(), at(0))[0].tokens, 1.0);
    assert_eq!(history.read(Scope::IngestNode, key(), at(0))[0].tokens, 2.0);
    assert_eq!(history.read(Scope::SecretReadNode, Key([8; 16]), at(0))[0].tokens, 3.0);
    assert!(history.read(Scope::IngestDomain, key(), at(0)).is_empty());
}

#[test]
fn slots_older_than_ten_minutes_are_forgotten() {
    let history = FillHistory::new();
    for second in (0..900).step_by(5) {
        history.record(Scope::SecretReadNode, key(), at(second), second as f64, 1000.0, Decided::Granted);
    }
    let slots = history.read(Scope::SecretReadNode, key(), at(900));
    assert!(slots.len() <= FillHistory::SLOTS, "{}", slots.len());
    assert!(slots.iter().all(|slot| slot.at > at(300)), "{:?}", slots.first());
    assert!(slots.windows(2).all(|pair| pair[0].at < pair[1].at));
    // Reading later forgets more, without a write.
    assert!(history.read(Scope::SecretReadNode, key(), at(2000)).is_empty());
}

#[test]
fn a_decision_behind_the_last_slot_counts_there_without_reordering() {
    let history = FillHistory::new();
    history.record(Scope::SecretReadNode, key(), at(25), 5.0, 20.0, Decided::Granted);
    history.record(Scope::SecretReadNode, key(), at(12), 9.0, 20.0, Decided::Refused);
    let slots = history.read(Scope::SecretReadNode, key(), at(25));
    assert_eq!(slots.len(), 1);
    assert_eq!((slots[0].at, slots[0].tokens, slots[0].granted, slots[0].refused), (at(20), 5.0, 1, 1));
}

#[test]
fn the_number_of_buckets_is_bounded() {
    let history = FillHistory::new();
    for n in 0..(3 * FillHistory::BUCKETS as u32) {
        let mut bytes = [1; 16];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        history.record(Scope::IngestNode, Key(bytes), at(0), 1.0, 2.0, Decided::Granted);
    }
    assert!(
        history.buckets.len() <= FillHistory::BUCKETS + FillHistory::BUCKETS / 10,
        "{}",
        history.buckets.len()
    );
}
