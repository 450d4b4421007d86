//! The values a take is made of: which bucket, and how it refills.

use std::fmt;
use std::str::FromStr;

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

    /// Seconds a bucket that is empty now needs before it covers `cost`: `cost / per_second`.
    ///
    /// It bounds how long any refused caller must wait, whatever is left in the bucket.
    /// `None` when the bucket never covers it (a zero rate, or a cost above the burst).
    pub fn seconds_to_cover(self, cost: f64) -> Option<f64> {
        if cost > self.burst || self.per_second <= 0.0 {
            return None;
        }
        Some(cost / self.per_second)
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
