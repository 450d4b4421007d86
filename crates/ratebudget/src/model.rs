//! The values a take is made of: which bucket, and how it refills.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::{Enforcement, Error, Name, NamedKey};

/// Which budget a bucket belongs to.
///
/// The set is closed: it is this enum and the CHECK on the table, and a sixth budget adds both
/// in one change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Secret reads by one Node; cost 1 per read.
    SecretReadNode,
    /// Secret reads by every Node of one Domain; cost 1 per read.
    SecretReadDomain,
    /// Node credentials issued in one Domain; cost 1 per enrolment.
    AccessIssuanceDomain,
    /// Telemetry sent by one Node; cost is the batch's wire bytes.
    IngestNode,
    /// Telemetry sent by every Node of one Domain; cost is the batch's wire bytes.
    IngestDomain,
}

impl Scope {
    /// Every scope, in the order the table's CHECK lists them.
    pub const ALL: [Scope; 5] = [
        Scope::SecretReadNode,
        Scope::SecretReadDomain,
        Scope::AccessIssuanceDomain,
        Scope::IngestNode,
        Scope::IngestDomain,
    ];

    /// The scope's text in the `scope` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::SecretReadNode => "secret_read_node",
            Scope::SecretReadDomain => "secret_read_domain",
            Scope::AccessIssuanceDomain => "access_issuance_domain",
            Scope::IngestNode => "ingest_node",
            Scope::IngestDomain => "ingest_domain",
        }
    }

    /// The scope's budget [`Name`]: its buckets are the table's rows under that name.
    pub fn name(self) -> Name {
        Name::of_scope(self)
    }

    /// The scope a budget name stands for, if it is one of the five.
    pub fn of_name(name: Name) -> Option<Scope> {
        name.scope()
    }

    /// Whether the scope's buckets are keyed by a Domain (rather than by one of its Nodes).
    pub fn is_per_domain(self) -> bool {
        match self {
            Scope::SecretReadDomain | Scope::AccessIssuanceDomain | Scope::IngestDomain => true,
            Scope::SecretReadNode | Scope::IngestNode => false,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == text)
            .ok_or_else(|| Error::UnknownScope(text.to_owned()))
    }
}

/// Whose bucket of a budget it is: 16 bytes, stored as the `bucket_key` uuid. This project's
/// keys are Node and Domain ids ([`From<uuid::Uuid>`]); any other key, a string or bytes, is
/// hashed to 16 bytes under its budget's name ([`Key::hashed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub [u8; 16]);

impl Key {
    /// `key` (an API key, a client address, a tenant: any bytes, of any length) under the
    /// budget `name`: the first 16 bytes of the SHA-256 of the name, a zero byte and the key,
    /// as [`NamedKey`] is for a named limiter. Two keys share a bucket only if their hashes do
    /// (1 in 2^64 for a billion keys); the table never holds the key itself.
    pub fn hashed(name: Name, key: &[u8]) -> Key {
        let digest = NamedKey::of(name, key).0;
        let mut bytes = [0; 16];
        bytes.copy_from_slice(&digest[..16]);
        Key(bytes)
    }

    /// The key as the uuid stored in `bucket_key`.
    pub fn as_uuid(self) -> uuid::Uuid {
        uuid::Uuid::from_bytes(self.0)
    }
}

impl From<uuid::Uuid> for Key {
    fn from(id: uuid::Uuid) -> Self {
        Key(id.into_bytes())
    }
}

/// How a bucket refills, as the pinned API spells it: `per_second` tokens a second up to a
/// ceiling of `burst`.
///
/// This is plain data, checked only when [`Store::take`](crate::Store::take) turns it into a
/// [`Limit`]; everything else in this crate takes a [`Limit`], which cannot be built invalid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Tokens added per second of elapsed time.
    pub per_second: f64,
    /// The ceiling: the most a bucket ever holds, and what a new bucket starts with.
    pub burst: f64,
}

/// The longest any budget may take to refill from empty to full, which is also how long a
/// bucket must sit idle before the sweep deletes it.
///
/// The two are one number on purpose: the sweep deletes a bucket idle this long because such a
/// bucket is full, so deleting it is exactly what the next take would mint. A budget that took
/// longer to refill would be handed tokens by the sweep. [`Limit::new`] enforces it, and every
/// table that stores a budget has a CHECK with the same comparison (`burst <= per_second *
/// 3600`, in float8, which is IEEE double arithmetic as in Rust), so a budget Rust accepts can
/// never trip a CHECK.
pub const IDLE_RETENTION: Duration = Duration::from_secs(3600);

/// [`IDLE_RETENTION`] in seconds, as the budget comparison uses it.
const IDLE_RETENTION_SECONDS: f64 = 3600.0;

/// [`Limit::MAX_REFILL_TIME`] in seconds, as the longer budgets' comparison uses it.
const MAX_REFILL_SECONDS: f64 = 366.0 * 86_400.0;

/// A budget that is known to be usable: how fast a bucket refills and how much it holds.
///
/// A bucket starts full, so `burst` back-to-back requests are admitted before the sustained
/// rate applies. Built only by [`Limit::new`] (refilled within the hour) or
/// [`Limit::for_any_period`] (within a year and a day), so a `Limit` in hand is valid and no
/// take checks it again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    per_second: f64,
    burst: f64,
}

/// Why numbers do not make a [`Limit`]: which field, and the rule it breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct InvalidLimit {
    /// `per_second` or `burst`.
    pub field: &'static str,
    /// The rule, phrased for whoever supplied the number.
    pub reason: &'static str,
}

impl Limit {
    /// The highest rate a budget may have, in tokens a second.
    ///
    /// With this and [`Limit::MAX_BURST`], the refill arithmetic (`tokens + elapsed * rate`)
    /// stays below 1e25 for any two instants PostgreSQL can store, far from float8's overflow,
    /// so no budget can make a take fail in the database. A terabyte a second is beyond any
    /// quota this service sets.
    pub const MAX_PER_SECOND: f64 = 1e12;

    /// The largest burst a budget may have, in tokens.
    pub const MAX_BURST: f64 = 1e15;

    /// The longest a budget of [`Limit::for_any_period`] may take to refill from empty: a
    /// year and a day, so a yearly quota (365 days, as envoyproxy/ratelimit's `year`) fits.
    pub const MAX_REFILL_TIME: Duration = Duration::from_secs(366 * 86_400);

    /// Checks a rate and a burst.
    ///
    /// # Errors
    /// [`InvalidLimit`] naming `per_second` unless it is a number above 0 and at most
    /// [`Limit::MAX_PER_SECOND`], or `burst` unless it is a number above 0, at most
    /// [`Limit::MAX_BURST`], and refilled from empty within [`IDLE_RETENTION`]
    /// (`burst <= per_second * 3600`).
    pub fn new(per_second: f64, burst: f64) -> Result<Limit, InvalidLimit> {
        // Every comparison is written so that NaN fails it.
        if !(per_second > 0.0 && per_second <= Limit::MAX_PER_SECOND) {
            return Err(InvalidLimit {
                field: "per_second",
                reason: "must be a number above 0 and at most 1e12",
            });
        }
        if !(burst > 0.0 && burst <= Limit::MAX_BURST) {
            return Err(InvalidLimit { field: "burst", reason: "must be a number above 0 and at most 1e15" });
        }
        if !Limit::refills_within_retention(per_second, burst) {
            return Err(InvalidLimit {
                field: "burst",
                reason: "must refill from empty within an hour: burst <= per_second * 3600",
            });
        }
        Ok(Limit { per_second, burst })
    }

    /// Checks a rate and a burst as [`Limit::new`] does, but for a budget that may take up to
    /// [`Limit::MAX_REFILL_TIME`] to refill from empty (a day's, a week's, a year's quota).
    ///
    /// Whoever sweeps the buckets of such a budget must keep them until they are full again:
    /// an idle bucket of it is not full after [`IDLE_RETENTION`], and deleting it would hand
    /// the next take what the budget has not refilled. [`IdleSweep::retaining`] keeps a name's
    /// buckets for longer.
    ///
    /// # Errors
    /// As [`Limit::new`], with the refill bound `burst <= per_second * 31622400` (366 days).
    ///
    /// [`IdleSweep::retaining`]: crate::IdleSweep::retaining
    pub fn for_any_period(per_second: f64, burst: f64) -> Result<Limit, InvalidLimit> {
        match Limit::new(per_second, burst) {
            Err(InvalidLimit { field: "burst", .. })
                if burst > 0.0 && burst <= Limit::MAX_BURST && burst <= per_second * MAX_REFILL_SECONDS =>
            {
                Ok(Limit { per_second, burst })
            }
            Err(InvalidLimit { field: "burst", .. }) if burst > 0.0 && burst <= Limit::MAX_BURST => {
                Err(InvalidLimit {
                    field: "burst",
                    reason: "must refill from empty within a year and a day: burst <= per_second * 31622400",
                })
            }
            built => built,
        }
    }

    /// The retention rule, exactly as the tables' CHECKs write it.
    fn refills_within_retention(per_second: f64, burst: f64) -> bool {
        burst <= per_second * IDLE_RETENTION_SECONDS
    }

    /// Whether a bucket of this budget is full again once idle for [`IDLE_RETENTION`]: true of
    /// every [`Limit::new`], not of a longer [`Limit::for_any_period`].
    pub fn refills_within_the_idle_retention(self) -> bool {
        Limit::refills_within_retention(self.per_second, self.burst)
    }

    /// Tokens added per second of elapsed time.
    pub fn per_second(self) -> f64 {
        self.per_second
    }

    /// The ceiling: the most a bucket holds, and what a new bucket starts with.
    pub fn burst(self) -> f64 {
        self.burst
    }

    /// How long an empty bucket takes to refill to full.
    pub fn refill_time(self) -> Duration {
        // Within MAX_REFILL_TIME by construction, so always representable.
        Duration::from_secs_f64(self.burst / self.per_second)
    }

    /// What a bucket holding `fill` holds at `now`: refilled by the elapsed time at this rate,
    /// capped at the burst, with a `now` before `fill.refilled_at` refilling nothing.
    ///
    /// This is the take statement's arithmetic operation for operation (`queries/take.sql`),
    /// including how PostgreSQL turns a timestamp difference into seconds, so the two agree
    /// exactly rather than approximately; the pre-check relies on that.
    pub fn level(self, fill: Fill, now: DateTime<Utc>) -> f64 {
        self.burst.min(fill.tokens + elapsed_seconds(fill.refilled_at, now).max(0.0) * self.per_second)
    }

    /// The earliest instant, to the microsecond and not before `now`, at which a bucket
    /// holding `fill` covers `cost` if nobody spends from it. `cost` must not exceed the burst.
    pub fn covered_at(self, fill: Fill, cost: f64, now: DateTime<Utc>) -> DateTime<Utc> {
        if cost > self.burst {
            // Never: the caller broke the precondition; the far future is the honest answer.
            return DateTime::<Utc>::MAX_UTC;
        }
        if self.level(fill, now) >= cost {
            return now;
        }
        let covers = |micros: i64| {
            self.level(fill, fill.refilled_at + chrono::TimeDelta::microseconds(micros)) >= cost
        };
        // The closed form lands within a few microseconds of the answer (float rounding); the
        // exact answer is then found by asking the level function itself, so the instant
        // returned is one at which the statement admits and the one before it refuses.
        let estimate = ((cost - fill.tokens) / self.per_second * 1e6).ceil();
        let mut micros = estimate.clamp(0.0, 1e15) as i64;
        let from = (now - fill.refilled_at).num_microseconds().unwrap_or(0).max(0);
        micros = micros.max(from);
        while !covers(micros) {
            micros += 1;
        }
        while micros > from && covers(micros - 1) {
            micros -= 1;
        }
        fill.refilled_at + chrono::TimeDelta::microseconds(micros)
    }

    /// How long after `now` a bucket holding `fill` covers `cost` if nobody spends from it.
    pub fn time_to_cover(self, fill: Fill, cost: f64, now: DateTime<Utc>) -> Duration {
        (self.covered_at(fill, cost, now) - now).to_std().unwrap_or(Duration::ZERO)
    }

    /// The plain-data form of this limit.
    pub fn budget(self) -> Budget {
        Budget { per_second: self.per_second, burst: self.burst }
    }
}

impl TryFrom<Budget> for Limit {
    type Error = InvalidLimit;

    fn try_from(budget: Budget) -> Result<Self, Self::Error> {
        Limit::new(budget.per_second, budget.burst)
    }
}

impl From<InvalidLimit> for Error {
    fn from(_: InvalidLimit) -> Self {
        Error::InvalidBudget
    }
}

/// `date_part('epoch', to - from)` as PostgreSQL 15 computes it: the difference is justified
/// into whole days and a remainder, and the two are added as float8.
fn elapsed_seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    const DAY: i64 = 86_400_000_000;
    let difference = (to - from).num_microseconds().unwrap_or(if to > from { i64::MAX } else { i64::MIN });
    let (days, rest) = (difference / DAY, difference % DAY);
    rest as f64 / 1_000_000.0 + 86_400.0 * days as f64
}

/// What a bucket held, and the instant it was last brought up to date: a row of the table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fill {
    /// Tokens held at `refilled_at`.
    pub tokens: f64,
    /// When the bucket was last refilled; it refills from here.
    pub refilled_at: DateTime<Utc>,
}

/// One bucket's part of a take: which bucket, what it costs, how that bucket refills, and how
/// the take is enforced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spend {
    /// The budget spent: one of this project's scopes, or a name of its user's own.
    pub name: Name,
    /// Whose bucket of that budget it is.
    pub key: Key,
    /// Tokens the request costs from this bucket.
    pub cost: f64,
    /// How this bucket refills.
    pub limit: Limit,
    /// Its mode and fail mode, and the rule they came from. The store ignores it: it decides
    /// every take alike; the guard, the spender and the observer act on it.
    pub enforcement: Enforcement,
}

impl Spend {
    /// A spend of `cost` from `key`'s bucket of the budget `name` (a [`Scope`] or a
    /// [`Name`]), enforced strictly (refusals refuse, the store failing fails the take), from
    /// no rule.
    pub fn new(name: impl Into<Name>, key: Key, cost: f64, limit: Limit) -> Spend {
        Spend { name: name.into(), key, cost, limit, enforcement: Enforcement::STRICT }
    }

    /// Rejects a spend that a query must never see: the zero key, a negative or NaN cost.
    pub(crate) fn validate(self) -> Result<Self, Error> {
        if self.key.0 == [0; 16] {
            return Err(Error::ZeroKey);
        }
        if self.cost.is_nan() || self.cost < 0.0 {
            return Err(Error::NegativeCost);
        }
        Ok(self)
    }

    /// Whether the bucket can never cover the cost: no bucket holds more than its burst, and
    /// the statement's insert arm would mint a negative balance and trip the table's CHECK.
    pub(crate) fn never_fits(self) -> bool {
        self.cost > self.limit.burst
    }

    /// A zero cost cannot exhaust a bucket, so a round trip for it would be waste.
    pub(crate) fn is_free(self) -> bool {
        self.cost == 0.0
    }
}

#[cfg(test)]
mod tests;
