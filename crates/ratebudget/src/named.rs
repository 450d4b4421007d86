//! Named limiters: GCRA budgets keyed by arbitrary strings, shared by every replica.
//!
//! The token buckets of [`Scope`](crate::Scope) are keyed by a Node or a Domain, a uuid, and
//! spend fractional costs such as bytes. Some limits are keyed by things that are not ids at
//! all, such as the address a failed authentication came from, and count whole events; for
//! those, a named limiter keeps one row per key in `plexsphere.named_limits` holding the
//! key's theoretical arrival time (GCRA), as the ratelimitpg reference does.
//!
//! When to use which: a token bucket when the cost varies per request or two budgets must be
//! spent together (reads, bytes); a named limiter when the key is any string and each event
//! costs a whole number of cells (attempts, logins). Both decide in one statement, refuse
//! without locking or writing when the snapshot foresees it, take the limit with every
//! decision, and sit behind the same [`Guard`](crate::Guard).
//!
//! The arithmetic is governor's, in integer microseconds: emission interval
//! `t = ceil(1e6 / rate)`, tolerance `tau = t * (burst - 1)` with the burst rounded down to
//! whole cells. The interval is rounded up, so the rate a limiter enforces is never above the
//! one it was given (rounded to the nearest microsecond, 7e5 a second would have been 1e6 a
//! second); a limit whose rate would lose more than 1% that way, or whose burst is below one
//! cell, is refused ([`Limit::fits_gcra`]). `n` cells conform at `now` when
//! `now >= tat + (n - 1) * t - tau`, and a grant moves `tat` to `max(tat, now) + n * t`.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

use crate::{Enforcement, InvalidLimit, Limit, Name};

/// A named limiter's name: a [`Name`], as a token bucket's budget has. The name is part of
/// every key, so limiters never share keys.
pub type LimiterName = Name;

/// A key of a named limiter, as stored: the SHA-256 of the limiter's name, a zero byte, and
/// the key's bytes. Any key, 3 bytes or 10 kB, is one 32-byte value; the table never holds
/// the key itself. (It is not a keyed hash: a small key space, such as IPv4 addresses, can be
/// enumerated by whoever reads the table.)
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamedKey(pub [u8; 32]);

impl NamedKey {
    /// `key` under `limiter`.
    pub fn of(limiter: Name, key: &[u8]) -> NamedKey {
        let mut digest = Sha256::new();
        digest.update(limiter.as_str().as_bytes());
        digest.update([0]);
        digest.update(key);
        NamedKey(digest.finalize().into())
    }
}

impl fmt::Debug for NamedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight bytes identify a key in a log well enough, and say nothing of what it hashes.
        write!(f, "NamedKey(")?;
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "…)")
    }
}

/// One request against a named limiter: which key, how many cells, and the limit, which
/// travels with every decision so a changed setting applies at the next one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NamedSpend {
    /// The limiter.
    pub limiter: LimiterName,
    /// The key, hashed.
    pub key: NamedKey,
    /// Whole cells this request costs (usually 1).
    pub cells: u32,
    /// The limit: cells a second, and the burst (rounded down to whole cells).
    pub limit: Limit,
    /// Its mode and fail mode, and the rule they came from.
    pub enforcement: Enforcement,
}

/// A limit in GCRA's terms, microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// The emission interval: microseconds per cell.
    pub(crate) t: i64,
    /// The tolerance: `t * (burst - 1)`.
    pub(crate) tau: i64,
    /// Whole cells of burst.
    pub(crate) burst: u32,
}

impl Gcra {
    /// `limit` in GCRA's terms; `None` when it does not fit them ([`Limit::fits_gcra`]).
    pub(crate) fn of(limit: Limit) -> Option<Gcra> {
        let (t, burst) = Gcra::interval_and_burst(limit).ok()?;
        Some(Gcra { t, tau: t.saturating_mul(i64::from(burst) - 1), burst })
    }

    /// The emission interval (µs, rounded up) and the whole cells of burst of `limit`.
    fn interval_and_burst(limit: Limit) -> Result<(i64, u32), InvalidLimit> {
        let burst = limit.burst().floor();
        if burst < 1.0 {
            return Err(InvalidLimit { field: "burst", reason: "must be at least one whole cell for GCRA" });
        }
        let exact = 1e6 / limit.per_second();
        if exact < GCRA_MIN_INTERVAL_US {
            return Err(InvalidLimit {
                field: "per_second",
                reason: "must be at most 1e6 a second for GCRA, which counts whole microseconds",
            });
        }
        // A rate of at most 1e12 a second and a burst refilled within the hour keep these far
        // inside i64: t <= 3.6e9 µs, tau <= 3.6e9 µs.
        // An interval a whole number of microseconds apart from the division's rounding
        // (1e6 / (1e6 / 7) is 7.000000000000001) is that number; any other is rounded up.
        let nearest = exact.round();
        let t = if (exact - nearest).abs() <= nearest * 1e-12 { nearest } else { exact.ceil() };
        if t > exact * GCRA_MAX_ROUNDING {
            return Err(InvalidLimit {
                field: "per_second",
                reason:
                    "must have an emission interval within 1% of whole microseconds for GCRA (1e6 / rate): \
                         above 1e4 a second, choose a rate that divides 1e6, or the token bucket",
            });
        }
        Ok((t as i64, burst.min(f64::from(u32::MAX)) as u32))
    }

    /// The first instant (µs) at which `cells` conform, for a key whose TAT is `tat`.
    pub(crate) fn earliest(self, tat: i64, cells: u32) -> i64 {
        tat + (i64::from(cells) - 1) * self.t - self.tau
    }

    /// Cells left at `now` for a key whose TAT is `tat`, as governor counts them.
    pub(crate) fn remaining(self, tat: i64, now: i64) -> u32 {
        let capacity = self.tau + self.t;
        let left = (now + capacity - tat).clamp(0, capacity) / self.t;
        u32::try_from(left).unwrap_or(u32::MAX)
    }
}

/// The shortest emission interval a GCRA limiter counts: one microsecond, a million cells a
/// second.
const GCRA_MIN_INTERVAL_US: f64 = 1.0;

/// How much longer than exact an interval may be once rounded up to whole microseconds: a
/// limiter may enforce at most 1% less than its rate.
const GCRA_MAX_ROUNDING: f64 = 1.01;

impl Limit {
    /// Checks that a named (GCRA) limiter can enforce this limit exactly enough: a burst of
    /// at least one whole cell, and a rate whose emission interval rounded up to whole
    /// microseconds loses at most 1% of it (every rate up to 1e4 a second; above that, up to
    /// 1e6 a second, rates whose interval is close to whole, such as any that divides 1e6).
    /// The interval is rounded up, never down, so no limiter admits above its rate.
    ///
    /// # Errors
    /// [`InvalidLimit`] naming `burst` or `per_second`.
    pub fn fits_gcra(self) -> Result<(), InvalidLimit> {
        Gcra::interval_and_burst(self).map(|_| ())
    }
}

/// Microseconds since the epoch, as the table stores instants.
pub(crate) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// The instant `micros` stands for.
pub(crate) fn instant(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// How long from `now` until `at` (zero if `at` has passed).
pub(crate) fn until(now: i64, at: i64) -> Duration {
    Duration::from_micros(u64::try_from(at - now).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_any_length_hash_to_32_bytes_and_limiters_never_share_one() {
        let a = Name::new("a").unwrap();
        let b = Name::new("b").unwrap();
        assert_eq!(NamedKey::of(a, &[7; 10_000]).0.len(), 32);
        assert_ne!(NamedKey::of(a, b"10.0.0.1"), NamedKey::of(b, b"10.0.0.1"));
        assert_ne!(NamedKey::of(a, b"x"), NamedKey::of(a, b"y"));
    }

    #[test]
    fn no_gcra_limit_enforces_above_its_rate_or_more_than_one_percent_below_it() {
        // Rounded to the nearest microsecond, 7e5 a second was a 1 µs interval: 1e6 a second,
        // 1.43 times the limit; and 2e6 a second was capped at 1e6.
        for rate in [7e5, 6.7e5, 9.9e5, 2e6, 3e4, 1e12] {
            let refused = Limit::new(rate, rate).unwrap().fits_gcra();
            assert_eq!(refused.map_err(|invalid| invalid.field), Err("per_second"), "{rate}/s");
        }
        let mut rate = 0.01;
        while rate <= 1e6 {
            let limit = Limit::new(rate, rate.max(1.0)).unwrap();
            if let Some(gcra) = Gcra::of(limit) {
                let enforced = 1e6 / gcra.t as f64;
                assert!(enforced <= rate, "{rate}/s enforced as {enforced}/s");
                assert!(enforced >= rate / 1.01, "{rate}/s enforced as {enforced}/s");
            } else {
                assert!(rate > 1e4, "{rate}/s refused");
            }
            rate *= 1.37;
        }
        for rate in [1e6, 5e5, 2.5e5, 1e5, 5e4] {
            assert!(Limit::new(rate, 10.0).unwrap().fits_gcra().is_ok(), "{rate}/s divides 1e6");
        }
    }

    #[test]
    fn a_limit_in_gcra_terms() {
        let gcra = Gcra::of(Limit::new(0.2, 20.0).unwrap()).unwrap();
        assert_eq!(gcra, Gcra { t: 5_000_000, tau: 95_000_000, burst: 20 });
        assert_eq!(Gcra::of(Limit::new(1.0, 0.5).unwrap()), None);
        // An interval that is not whole is rounded up: 3 a second is 333,334 µs a cell.
        assert_eq!(Gcra::of(Limit::new(3.0, 1.0).unwrap()).unwrap().t, 333_334);
        // A fresh key (tat = now) has the whole burst; each cell moves tat by t.
        assert_eq!(gcra.remaining(1_000, 1_000), 20);
        assert_eq!(gcra.earliest(1_000, 20), 1_000);
    }
}
