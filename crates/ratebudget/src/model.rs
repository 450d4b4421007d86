//! The values a take is made of: which bucket, and how it refills.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::Error;

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

/// The Node or Domain whose budget a bucket is: a uuid's 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub [u8; 16]);

impl Key {
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

/// How a bucket refills: `per_second` tokens a second up to a ceiling of `burst`.
///
/// A bucket starts full, so `burst` back-to-back requests are admitted before the sustained
/// rate applies. A rate of zero is allowed (a bucket that never refills); a burst of zero is
/// not, since it could admit nothing but free requests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Tokens added per second of elapsed time.
    pub per_second: f64,
    /// The ceiling: the most a bucket ever holds, and what a new bucket starts with.
    pub burst: f64,
}

impl Budget {
    /// Checks the budget as a take does; `Err(Error::InvalidBudget)` when it is unusable.
    pub fn validate(self) -> Result<Self, Error> {
        let finite_non_negative = |x: f64| x.is_finite() && x >= 0.0;
        if finite_non_negative(self.per_second) && finite_non_negative(self.burst) && self.burst > 0.0 {
            Ok(self)
        } else {
            Err(Error::InvalidBudget)
        }
    }

    /// The wait a refusal reports when the bucket can never cover the cost (a zero rate, or a
    /// cost above the burst): waiting helps nothing, but a Retry-After must be finite, and an
    /// hour keeps a misbehaving caller from retrying in a loop.
    pub const NEVER_COVERS: Duration = Duration::from_secs(60 * 60);

    /// How long a caller refused `cost` should wait before asking again: the time an empty
    /// bucket takes to cover it, `cost / per_second`, which bounds the wait whatever the
    /// bucket holds now. [`Budget::NEVER_COVERS`] when the bucket can never cover it, or the
    /// wait is too long for a `Duration`.
    pub fn retry_after(self, cost: f64) -> Duration {
        if cost > self.burst || self.per_second <= 0.0 {
            return Budget::NEVER_COVERS;
        }
        Duration::try_from_secs_f64(cost / self.per_second).unwrap_or(Budget::NEVER_COVERS)
    }
}

/// One bucket's part of a take: which bucket, what it costs and how that bucket refills.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spend {
    /// The budget spent.
    pub scope: Scope,
    /// Whose budget it is.
    pub key: Key,
    /// Tokens the request costs from this bucket.
    pub cost: f64,
    /// How this bucket refills.
    pub budget: Budget,
}

impl Spend {
    /// Rejects a spend that a query must never see: the zero key, a negative or NaN cost, an
    /// unusable budget.
    pub(crate) fn validate(self) -> Result<Self, Error> {
        if self.key.0 == [0; 16] {
            return Err(Error::ZeroKey);
        }
        if self.cost.is_nan() || self.cost < 0.0 {
            return Err(Error::NegativeCost);
        }
        self.budget.validate()?;
        Ok(self)
    }

    /// What a take decides without asking the database, if anything.
    ///
    /// A zero cost cannot exhaust a bucket, so a round trip for it would be waste on a hot
    /// path. A cost above the ceiling can never be covered, and the statement's insert arm
    /// would mint a negative balance and trip the table's CHECK, answering a question with a
    /// constraint violation.
    pub(crate) fn decided_without_query(self) -> Option<bool> {
        if self.cost == 0.0 {
            Some(true)
        } else if self.cost > self.budget.burst {
            Some(false)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_the_time_an_empty_bucket_takes_to_cover_the_cost() {
        let budget = |per_second, burst| Budget { per_second, burst };
        assert_eq!(budget(2.0, 10.0).retry_after(1.0), Duration::from_millis(500));
        assert_eq!(budget(0.25, 1.0).retry_after(1.0), Duration::from_secs(4));
        assert_eq!(budget(100.0, 1000.0).retry_after(500.0), Duration::from_secs(5));
    }

    #[test]
    fn retry_after_is_an_hour_when_the_bucket_never_covers_the_cost() {
        let budget = |per_second, burst| Budget { per_second, burst };
        assert_eq!(budget(0.0, 10.0).retry_after(1.0), Budget::NEVER_COVERS);
        assert_eq!(budget(1.0, 0.5).retry_after(1.0), Budget::NEVER_COVERS);
        assert_eq!(budget(f64::MIN_POSITIVE, 10.0).retry_after(1.0), Budget::NEVER_COVERS);
    }
}
