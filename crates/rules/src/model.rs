//! The rules context's values: rule ids, selectors, validated rule specifications, versions,
//! actors, history entries and usage counts.

use std::fmt;

use chrono::{DateTime, Utc};
use ratebudget::{Limit, Scope};
use uuid::Uuid;

mod descriptor;
mod target;

pub use descriptor::{wildcard_matches, DescriptorRule, PathEntry, PathLimit, Unit, MAX_DEPTH};
pub use target::{
    Api, Attributes, Pattern, Service, ServiceDraft, Services, Target, MAX_ATTRIBUTES, OWN_SERVICE,
};

#[cfg(test)]
mod tests;

/// Why a rule, or a part of one, was rejected: which field, and the rule it breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct InvalidRule {
    /// The field as the API names it: `rule_id`, `service`, `api`, `scope`, `selector`, `rate`, `per_ms`,
    /// `burst`, `algorithm`, `mode`, `fail_mode`, `priority`, `charge`, `version` or `created_by`.
    pub field: &'static str,
    /// What it must be.
    pub reason: &'static str,
}

pub(crate) fn invalid(field: &'static str, reason: &'static str) -> InvalidRule {
    InvalidRule { field, reason }
}

/// A rule's caller-chosen id: 1 to 128 of `A-Z a-z 0-9 . _ -`, starting with a letter or
/// digit, so it is a path segment as it stands and a PUT of the same id is idempotent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(String);

impl RuleId {
    /// Checks `raw` as a rule id.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `rule_id` unless it follows the rule above (the table's CHECK).
    pub fn parse(raw: impl Into<String>) -> Result<RuleId, InvalidRule> {
        let raw = raw.into();
        let bytes = raw.as_bytes();
        let valid = (1..=128).contains(&bytes.len())
            && bytes[0].is_ascii_alphanumeric()
            && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(RuleId(raw))
        } else {
            Err(invalid("rule_id", "must be 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit"))
        }
    }

    /// The id that `POST /v1/domains` gives the issuance override it writes for a Domain.
    pub fn issuance_override(domain: Uuid) -> RuleId {
        RuleId(format!("domain-{domain}-issuance"))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A service tier a template rule selects. The access context owns which tier a Domain is in;
/// these are the same four, by text (`free`, `standard`, `premium`, `enterprise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// `free`.
    Free,
    /// `standard`.
    Standard,
    /// `premium`.
    Premium,
    /// `enterprise`.
    Enterprise,
}

impl Tier {
    /// Every tier, cheapest first.
    pub const ALL: [Tier; 4] = [Tier::Free, Tier::Standard, Tier::Premium, Tier::Enterprise];

    /// The tier's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Free => "free",
            Tier::Standard => "standard",
            Tier::Premium => "premium",
            Tier::Enterprise => "enterprise",
        }
    }

    /// The tier `text` names, if any.
    pub fn parse(text: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|tier| tier.as_str() == text)
    }
}

/// Which Domains a rule governs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Selector {
    /// Every Domain: `{}`.
    AllDomains,
    /// The Domains of one tier: `{"tier": "premium"}`; a template.
    Tier(Tier),
    /// One Domain: `{"domain": "<uuid>"}`; an override.
    Domain(Uuid),
}

impl Selector {
    /// Reads a selector from its JSON object's members, each a key and a string value.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `selector` unless the members are none, exactly `tier` naming
    /// one of the four tiers, or exactly `domain` naming a (non-nil) uuid.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Selector, InvalidRule> {
        let shape =
            "must be {}, {\"tier\": \"<free|standard|premium|enterprise>\"} or {\"domain\": \"<uuid>\"}";
        let mut pairs = pairs.into_iter();
        let selector = match pairs.next() {
            None => Selector::AllDomains,
            Some(("tier", text)) => Selector::Tier(Tier::parse(text).ok_or(invalid("selector", shape))?),
            Some(("domain", text)) => match Uuid::parse_str(text) {
                Ok(id) if !id.is_nil() => Selector::Domain(id),
                _ => return Err(invalid("selector", shape)),
            },
            Some(_) => return Err(invalid("selector", shape)),
        };
        match pairs.next() {
            None => Ok(selector),
            Some(_) => Err(invalid("selector", shape)),
        }
    }
}

/// Which algorithm decides a rule's takes: ratebudget's, by the same texts
/// (`TOKEN_BUCKET`, the default; `GCRA`, only for `access_issuance_domain`, the one scope
/// spent alone).
pub use ratebudget::Algorithm;
/// What a rule's takes do when the shared store cannot answer: `CLOSED` (HTTP 500, the
/// default), `OPEN` (admitted) or `STATIC` (this replica's fallback bucket decides).
pub use ratebudget::FailMode;
/// Whether a rule's refusals refuse: `ENFORCE` (the default) or `SHADOW` (decided and
/// counted, every request admitted).
pub use ratebudget::Mode;

/// Reads one of the three from its text, or names `field` and what it must be.
fn parse_text<T>(
    text: &str,
    from_text: fn(&str) -> Option<T>,
    field: &'static str,
    reason: &'static str,
) -> Result<T, InvalidRule> {
    from_text(text).ok_or(invalid(field, reason))
}

/// A rule's algorithm from its text.
///
/// # Errors
/// [`InvalidRule`] on field `algorithm` for any other text.
pub(crate) fn parse_algorithm(text: &str) -> Result<Algorithm, InvalidRule> {
    parse_text(text, Algorithm::from_text, "algorithm", "must be TOKEN_BUCKET or GCRA")
}

/// A rule's mode from its text.
///
/// # Errors
/// [`InvalidRule`] on field `mode` for any other text.
pub(crate) fn parse_mode(text: &str) -> Result<Mode, InvalidRule> {
    parse_text(text, Mode::from_text, "mode", "must be ENFORCE or SHADOW")
}

/// A rule's fail mode from its text.
///
/// # Errors
/// [`InvalidRule`] on field `fail_mode` for any other text.
pub(crate) fn parse_fail_mode(text: &str) -> Result<FailMode, InvalidRule> {
    parse_text(text, FailMode::from_text, "fail_mode", "must be CLOSED, OPEN or STATIC")
}

/// When a rule's costs are charged to its bucket (docs/adr/0040).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Charge {
    /// `WHEN_COVERED`, the default: a cost is spent only when the bucket covers it, and a
    /// request it does not cover is refused, nothing spent.
    #[default]
    WhenCovered,
    /// `ALWAYS`: a cost is charged whatever the bucket holds, and accepted. One the bucket
    /// cannot cover leaves it in debt, refusing every request until refill has repaid it: for
    /// costs known only after the response (an LLM's tokens, which Envoy sends with
    /// `apply_on_stream_done`). Another service's rules only.
    Always,
}

impl Charge {
    /// Its text: `WHEN_COVERED` or `ALWAYS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Charge::WhenCovered => "WHEN_COVERED",
            Charge::Always => "ALWAYS",
        }
    }

    /// The charge `text` names, if any.
    pub fn from_text(text: &str) -> Option<Charge> {
        [Charge::WhenCovered, Charge::Always].into_iter().find(|charge| charge.as_str() == text)
    }
}

/// A rule as its writer gives it, before any check. `None` takes the default: `per_ms` 1000,
/// `TOKEN_BUCKET`, `ENFORCE`, `CLOSED`, priority 0, `WHEN_COVERED`.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleDraft {
    /// Another service's rule: its service, API and selector. `None`: one of this project's
    /// own budgets, which `scope` and `selector` name.
    pub service: Option<ServiceDraft>,
    /// The scope's text, e.g. `secret_read_node` (own rules only; empty otherwise).
    pub scope: String,
    /// The Domains governed (own rules only; [`Selector::AllDomains`] otherwise).
    pub selector: Selector,
    /// Tokens added every `per_ms` milliseconds.
    pub rate: f64,
    /// The period `rate` is counted over, in milliseconds.
    pub per_ms: Option<i64>,
    /// The most a bucket holds.
    pub burst: f64,
    /// `TOKEN_BUCKET` or `GCRA`.
    pub algorithm: Option<String>,
    /// `ENFORCE` or `SHADOW`.
    pub mode: Option<String>,
    /// `CLOSED`, `OPEN` or `STATIC`.
    pub fail_mode: Option<String>,
    /// Which rule wins among several at one level: the highest.
    pub priority: Option<i64>,
    /// `WHEN_COVERED` or `ALWAYS` (another service's rules only).
    pub charge: Option<String>,
}

/// The longest `per_ms`: a day. Any longer and a rate worth having would round to nothing.
const MAX_PER_MS: i64 = 86_400_000;

impl RuleDraft {
    /// Checks every field, in the order the struct lists them, and applies the defaults.
    ///
    /// # Errors
    /// [`InvalidRule`] naming the first field that is wrong: `service`, `api` or `selector`
    /// (of another service's rule: [`ServiceDraft::validate`]), `scope` (not one of the five),
    /// `rate` (not above 0, or above 1e12 a second once divided by `per_ms`), `per_ms` (not 1
    /// to 86400000), `burst` (below 1, above 1e15, or not refilled from empty at `rate` within
    /// an hour for our own budgets, `ratebudget::Limit::new`'s rule, or within a year and a day
    /// for another service's, `ratebudget::Limit::for_any_period`'s), `algorithm`,
    /// `mode`, `fail_mode` (not one of their texts; `GCRA` for a scope other than
    /// `access_issuance_domain`, or for another service), `priority` (outside a 32-bit
    /// integer), `charge` (not one of its texts; `ALWAYS` for one of this project's own
    /// budgets).
    pub fn validate(self) -> Result<RuleSpec, InvalidRule> {
        let target = match &self.service {
            Some(service) => service.validate()?,
            None => Target::Own {
                scope: self.scope.parse().map_err(|_| {
                    invalid(
                        "scope",
                        "must be one of secret_read_node, secret_read_domain, access_issuance_domain, ingest_node, ingest_domain",
                    )
                })?,
                selector: self.selector,
            },
        };
        // Written so that NaN fails each comparison.
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return Err(invalid("rate", "must be a number above 0"));
        }
        let per_ms = self.per_ms.unwrap_or(1000);
        if !(1..=MAX_PER_MS).contains(&per_ms) {
            return Err(invalid("per_ms", "must be a whole number of milliseconds from 1 to 86400000"));
        }
        let per_ms = u32::try_from(per_ms).map_err(|_| invalid("per_ms", "must fit 32 bits"))?;
        if self.burst.is_nan() || self.burst < 1.0 {
            return Err(invalid("burst", "must be at least 1: every request costs at least one token"));
        }
        if self.burst > Limit::MAX_BURST {
            return Err(invalid("burst", "must be at most 1e15"));
        }
        // Our own budgets' buckets are swept after an hour idle, so they must be full by then;
        // another service's may take up to a year and a day (a day's, a week's, a year's quota),
        // and the sweep keeps its buckets until the slowest of its rules has refilled them.
        let (limit, refill) = match &target {
            Target::Descriptor(_) => {
                return Err(invalid(
                    "service",
                    "a file's rule is read from its file (rules apply), not written as a draft",
                ))
            }
            Target::Own { .. } => (
                Limit::new(per_second(self.rate, per_ms), self.burst),
                "must refill from empty within an hour: burst <= rate / (per_ms / 1000) * 3600",
            ),
            Target::Service { .. } => (
                Limit::for_any_period(per_second(self.rate, per_ms), self.burst),
                "must refill from empty within a year and a day: burst <= rate / (per_ms / 1000) * 31622400",
            ),
        };
        let limit = limit.map_err(|invalid_limit| {
            if invalid_limit.field == "per_second" {
                invalid("rate", "must come to above 0 and at most 1e12 a second (rate / (per_ms / 1000))")
            } else {
                invalid("burst", refill)
            }
        })?;
        let algorithm = self.algorithm.as_deref().map_or(Ok(Algorithm::TokenBucket), parse_algorithm)?;
        match &target {
            Target::Own { scope, .. }
                if algorithm == Algorithm::Gcra && *scope != Scope::AccessIssuanceDomain =>
            {
                return Err(invalid(
                    "algorithm",
                    "GCRA governs only access_issuance_domain: the other scopes are spent two at a time, in one token-bucket statement",
                ));
            }
            Target::Service { .. } if algorithm == Algorithm::Gcra => {
                return Err(invalid(
                    "algorithm",
                    "a service's rules are TOKEN_BUCKET: the descriptors of one request are decided together, in one token-bucket statement",
                ));
            }
            _ => {}
        }
        if algorithm == Algorithm::Gcra {
            // GCRA counts whole cells and whole microseconds: a rate it cannot enforce within
            // 1% is refused here rather than enforced as another (ratebudget::Limit::fits_gcra).
            limit.fits_gcra().map_err(|unfit| {
                let field = if unfit.field == "per_second" { "rate" } else { "burst" };
                invalid(field, unfit.reason)
            })?;
        }
        let mode = self.mode.as_deref().map_or(Ok(Mode::Enforce), parse_mode)?;
        let fail_mode = self.fail_mode.as_deref().map_or(Ok(FailMode::Closed), parse_fail_mode)?;
        let priority = i32::try_from(self.priority.unwrap_or(0))
            .map_err(|_| invalid("priority", "must be a whole number from -2147483648 to 2147483647"))?;
        let charge = self.charge.as_deref().map_or(Ok(Charge::WhenCovered), |text| {
            Charge::from_text(text).ok_or(invalid("charge", "must be WHEN_COVERED or ALWAYS"))
        })?;
        if charge == Charge::Always && matches!(target, Target::Own { .. }) {
            return Err(invalid(
                "charge",
                "plexsphere's own budgets charge only what a bucket covers: ALWAYS is for another service's rules",
            ));
        }
        Ok(RuleSpec {
            target,
            rate: self.rate,
            per_ms,
            burst: self.burst,
            limit,
            algorithm,
            mode,
            fail_mode,
            priority,
            charge,
        })
    }
}

/// `rate` tokens every `per_ms` milliseconds, in tokens a second, exactly as the table's CHECK
/// computes it (`rate / (per_ms / 1000)`, in this order, in float8), so the two always agree.
/// Dividing by the period in seconds keeps the commonest period, a second, exact: `rate / 1.0`
/// is `rate`, where `rate * 1000 / 1000` may not be.
fn per_second(rate: f64, per_ms: u32) -> f64 {
    rate / (f64::from(per_ms) / 1000.0)
}

/// A rule's content, checked: everything but its id, version and authorship.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSpec {
    target: Target,
    rate: f64,
    per_ms: u32,
    burst: f64,
    limit: Limit,
    algorithm: Algorithm,
    mode: Mode,
    fail_mode: FailMode,
    priority: i32,
    charge: Charge,
}

impl RuleSpec {
    /// What it governs.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// A rule read from an envoyproxy/ratelimit configuration file: its path and limit as the
    /// file says them, stored with a rate and burst when it spends (`requests_per_unit` a
    /// `unit` is a bucket of burst `requests_per_unit`, refilled at that many a unit), ENFORCE
    /// or SHADOW by `shadow_mode`, CLOSED, priority 0.
    ///
    /// # Errors
    /// [`InvalidRule`] as [`DescriptorRule::validate`] says.
    pub fn from_descriptor(rule: DescriptorRule) -> Result<RuleSpec, InvalidRule> {
        rule.validate()?;
        let budget = rule.budget();
        let (rate, per_ms, burst, limit) = match (rule.limit, budget) {
            (PathLimit::PerUnit { requests_per_unit, unit }, Some(limit)) => {
                // The table's `per_ms` runs to a day: a week's, a month's or a year's rate is
                // stored per day, which the CHECK's arithmetic reads as the same rate.
                let per_ms = unit.millis().min(MAX_PER_MS);
                let rate = f64::from(requests_per_unit) * per_ms as f64 / unit.millis() as f64;
                (rate, per_ms as u32, f64::from(requests_per_unit), limit)
            }
            // Never spent: no rate or burst is stored, and none is shown.
            _ => (0.0, 1000, 0.0, Limit::for_any_period(1.0, 1.0).expect("one a second is a limit")),
        };
        let mode = if rule.shadow_mode { Mode::Shadow } else { Mode::Enforce };
        Ok(RuleSpec {
            target: Target::Descriptor(std::sync::Arc::new(rule)),
            rate,
            per_ms,
            burst,
            limit,
            algorithm: Algorithm::TokenBucket,
            mode,
            fail_mode: FailMode::Closed,
            priority: 0,
            charge: Charge::WhenCovered,
        })
    }

    /// The file rule it is, if it was read from a file.
    pub fn descriptor(&self) -> Option<&DescriptorRule> {
        match &self.target {
            Target::Descriptor(rule) => Some(rule),
            _ => None,
        }
    }

    /// Whether its requests spend from a bucket: every rule but a file's unlimited, unset or
    /// zero-a-unit limit.
    pub fn spends(&self) -> bool {
        self.descriptor().is_none_or(|rule| rule.budget().is_some())
    }

    /// The own budget governed; `None` for another service's rule.
    pub fn scope(&self) -> Option<Scope> {
        match &self.target {
            Target::Own { scope, .. } => Some(*scope),
            Target::Service { .. } | Target::Descriptor(_) => None,
        }
    }

    /// The Domains governed; `None` for another service's rule.
    pub fn selector(&self) -> Option<Selector> {
        match &self.target {
            Target::Own { selector, .. } => Some(*selector),
            Target::Service { .. } | Target::Descriptor(_) => None,
        }
    }

    /// Tokens added every [`RuleSpec::per_ms`] milliseconds.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The period [`RuleSpec::rate`] is counted over.
    pub fn per_ms(&self) -> u32 {
        self.per_ms
    }

    /// The most a bucket holds.
    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// The budget as the rate-budget store takes it: tokens a second and burst.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// Which algorithm decides.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Whether refusals refuse.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What happens when the store cannot answer.
    pub fn fail_mode(&self) -> FailMode {
        self.fail_mode
    }

    /// Which rule wins among several at one level: the highest.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// When its costs are charged: only when covered, or always (docs/adr/0040).
    pub fn charge(&self) -> Charge {
        self.charge
    }

    /// The policy a take governed by this rule carries; its decisions are counted under
    /// `rule`, the number the take hands back to the observer.
    pub fn policy(&self, rule: ratebudget::RuleRef) -> ratebudget::Policy {
        ratebudget::Policy {
            limit: self.limit,
            algorithm: self.algorithm,
            enforcement: ratebudget::Enforcement {
                mode: self.mode,
                fail_mode: self.fail_mode,
                rule: Some(rule),
            },
        }
    }

    /// Whether a change of a rule from `old` to `new` (either absent: added or deleted) may
    /// let a budget grow: anything but the same rule selecting the same Domains at the same
    /// priority with the same algorithm, at a rate and burst no larger. (A rule added or
    /// removed changes which rule governs, which may grow a budget.) What a replica's
    /// pre-check learned under the old rule must then be forgotten, or it would refuse, for a
    /// moment, what the new one admits.
    pub fn may_grow(old: Option<&RuleSpec>, new: Option<&RuleSpec>) -> bool {
        let (Some(old), Some(new)) = (old, new) else {
            return old.is_some() || new.is_some();
        };
        let same_place =
            (&old.target, old.priority, old.algorithm) == (&new.target, new.priority, new.algorithm);
        let no_larger =
            new.limit.per_second() <= old.limit.per_second() && new.limit.burst() <= old.limit.burst();
        !(same_place && no_larger)
    }
}

/// A rule's version: 1 when first written, one more with every change (a deletion too), and
/// never reused by the same id. Its ETag is the number in quotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version(i64);

impl Version {
    /// Checks a version number.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `version` unless it is at least 1.
    pub fn new(number: i64) -> Result<Version, InvalidRule> {
        if number >= 1 {
            Ok(Version(number))
        } else {
            Err(invalid("version", "must be a whole number of at least 1"))
        }
    }

    /// The number.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The version as an entity tag: `"3"`.
    pub fn etag(self) -> String {
        format!("\"{}\"", self.0)
    }

    /// The version an entity tag names: `"3"` is version 3. A weak tag (`W/"3"`) never
    /// matches, as `If-Match` compares strongly.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `version` unless `tag` is a quoted version number.
    pub fn from_etag(tag: &str) -> Result<Version, InvalidRule> {
        let shape =
            invalid("version", "an entity tag of a rule is a version number in quotes, such as \"3\"");
        let number = tag.trim().strip_prefix('"').and_then(|rest| rest.strip_suffix('"')).ok_or(shape)?;
        if !number.bytes().all(|b| b.is_ascii_digit()) {
            return Err(shape);
        }
        Version::new(number.parse().map_err(|_| shape)?)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Who made a change: recorded with every version.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Actor(String);

impl Actor {
    /// Checks an actor's name: 1 to 200 characters, none of them control characters.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `created_by` otherwise.
    pub fn new(name: impl Into<String>) -> Result<Actor, InvalidRule> {
        let name = name.into();
        let chars = name.chars().count();
        if (1..=200).contains(&chars) && !name.chars().any(char::is_control) {
            Ok(Actor(name))
        } else {
            Err(invalid("created_by", "must be 1 to 200 characters, none of them control characters"))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A rule as it stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Its id.
    pub id: RuleId,
    /// Its content.
    pub spec: RuleSpec,
    /// Its current version.
    pub version: Version,
    /// Who wrote the current version.
    pub created_by: Actor,
    /// When the current version was written.
    pub updated_at: DateTime<Utc>,
}

/// What a version did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The rule was written where none stood (first, or after a deletion).
    Created,
    /// A writer holding the previous version replaced it.
    Replaced,
    /// The rule was set back to an earlier version's content.
    RolledBack {
        /// The version whose content it took.
        to: Version,
    },
    /// The rule was deleted; the version holds the content it had.
    Deleted,
}

impl Change {
    /// The change's text: `created`, `replaced`, `rolled_back` or `deleted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Created => "created",
            Change::Replaced => "replaced",
            Change::RolledBack { .. } => "rolled_back",
            Change::Deleted => "deleted",
        }
    }
}

/// One entry of a rule's history: a version, what it did, and who did it when.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleVersion {
    /// The version.
    pub version: Version,
    /// What it did.
    pub change: Change,
    /// The content the rule had from this version on (for a deletion, the content deleted).
    pub spec: RuleSpec,
    /// Who made the change.
    pub created_by: Actor,
    /// When.
    pub created_at: DateTime<Utc>,
    /// The rules' revision this change made: the first snapshot version that holds it.
    pub revision: i64,
}

/// How many decisions one rule made in one minute, as one replica counted them: what a flush
/// adds to the stored counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageCount {
    /// The rule.
    pub rule: RuleId,
    /// The minute, truncated (seconds and below are zero).
    pub minute: DateTime<Utc>,
    /// Takes it granted.
    pub granted: u64,
    /// Takes it refused.
    pub refused: u64,
    /// Takes it would have refused, in shadow mode, and admitted.
    pub shadow_refused: u64,
}

/// One minute of a rule's usage, summed over every replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageMinute {
    /// The minute.
    pub minute: DateTime<Utc>,
    /// Takes granted.
    pub granted: u64,
    /// Takes refused.
    pub refused: u64,
    /// Takes that would have been refused, in shadow mode, and were admitted.
    pub shadow_refused: u64,
}
