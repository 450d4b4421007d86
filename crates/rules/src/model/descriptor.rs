//! Rules as envoyproxy/ratelimit's configuration files write them: a descriptor path from a
//! domain's root, matched against a request's descriptor entry by entry, in order, to its full
//! depth ([`crate::Snapshot::walk`]), and the limit the path's last node sets.
//!
//! Each node of a file's tree that sets a limit, and each leaf that sets none (which
//! envoyproxy/ratelimit treats as "no limit here", stopping the walk), is one rule whose id is
//! derived from the domain and the path ([`crate::RuleId::for_descriptor`]), so applying the
//! same files again changes nothing. Nodes in between are implied by the paths through them.

use std::fmt;
use std::sync::Arc;

use ratebudget::Limit;
use sha2::{Digest, Sha256};

use super::{invalid, InvalidRule, RuleId, Service};

/// The unit a limit is said in, as Envoy's `RateLimitResponse.RateLimit.Unit` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Per second.
    Second,
    /// Per minute.
    Minute,
    /// Per hour.
    Hour,
    /// Per day.
    Day,
    /// Per week.
    Week,
    /// Per month of 30 days, as envoyproxy/ratelimit counts one.
    Month,
    /// Per year of 365 days, as envoyproxy/ratelimit counts one.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] =
        [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year];

    /// Envoy's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// A unit from its name, in any case (envoyproxy/ratelimit upper-cases a file's `unit`).
    pub fn parse(text: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|unit| unit.as_str().eq_ignore_ascii_case(text))
    }

    /// The unit in seconds.
    pub fn seconds(self) -> f64 {
        match self {
            Unit::Second => 1.0,
            Unit::Minute => 60.0,
            Unit::Hour => 3600.0,
            Unit::Day => 86_400.0,
            Unit::Week => 7.0 * 86_400.0,
            Unit::Month => 30.0 * 86_400.0,
            Unit::Year => 365.0 * 86_400.0,
        }
    }

    /// The unit in milliseconds.
    pub fn millis(self) -> i64 {
        (self.seconds() as i64) * 1000
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one node of a configured path matches of a descriptor entry: its key, and its value
/// when it names one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PathEntry {
    /// The entry's key; never empty.
    pub key: Arc<str>,
    /// The value it must have: exactly, or, with a `*` in it, as a wildcard (`*` matches any
    /// run of characters, anywhere, any number of times). `None`: any value, a bucket each.
    pub value: Option<Arc<str>>,
    /// Every value the wildcard matches shares one bucket (envoyproxy/ratelimit's
    /// `share_threshold`); only on a wildcard.
    pub share_threshold: bool,
    /// The node's position among its siblings in the file: wildcards are tried in this order,
    /// as envoyproxy/ratelimit tries them.
    pub order: u32,
}

impl PathEntry {
    /// Whether the value is a wildcard.
    pub fn is_wildcard(&self) -> bool {
        self.value.as_deref().is_some_and(|value| value.contains('*'))
    }

    /// The entry as envoyproxy/ratelimit's stats keys write it: `key`, or `key_value`.
    pub fn stats_name(&self) -> String {
        match &self.value {
            Some(value) => format!("{}_{value}", self.key),
            None => self.key.to_string(),
        }
    }
}

/// Whether `value` matches `pattern`, each `*` of which matches any run of characters.
pub fn wildcard_matches(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*` at all: the whole value.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// What a configured path's last node answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathLimit {
    /// `requests_per_unit` a `unit`, in a token bucket of that burst; 0 refuses every request.
    PerUnit {
        /// Requests per unit.
        requests_per_unit: u32,
        /// The unit.
        unit: Unit,
    },
    /// `unlimited: true`: every request is OK, with no statement.
    Unlimited,
    /// No `rate_limit` (a leaf without one): a descriptor that ends here has no limit.
    Unset,
}

/// A rule read from an envoyproxy/ratelimit configuration file: its domain, its path and what
/// its last node says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DescriptorRule {
    /// The domain (the service).
    pub service: Service,
    /// The path from the domain's root, one entry per level; never empty.
    pub path: Vec<PathEntry>,
    /// The limit at its end.
    pub limit: PathLimit,
    /// The limit's `name` (Envoy's `current_limit.name`), which `replaces` refers to.
    pub name: Option<String>,
    /// The names of limits this one drops from a request that matches both.
    pub replaces: Vec<String>,
    /// `shadow_mode`: counted, never refused.
    pub shadow_mode: bool,
    /// `quota_mode`: the request is over the limit only when every quota-mode descriptor is.
    pub quota_mode: bool,
    /// `detailed_metric`: its metrics name each value rather than the configured path.
    pub detailed_metric: bool,
    /// `value_to_metric`: its metrics name the value of each entry matched without one.
    pub value_to_metric: bool,
    /// The file it was applied from, as the apply named it.
    pub source: String,
}

/// The most levels a path may have: a descriptor has at most [`crate::MAX_ATTRIBUTES`]
/// entries.
pub const MAX_DEPTH: usize = super::MAX_ATTRIBUTES;

impl DescriptorRule {
    /// The path as envoyproxy/ratelimit's stats keys and error messages name it:
    /// `domain.key_value.key`.
    pub fn stats_key(&self) -> String {
        let mut key = self.service.to_string();
        for entry in &self.path {
            key.push('.');
            key.push_str(&entry.stats_name());
        }
        key
    }

    /// The name its decisions are counted under for a descriptor whose entries have `values`
    /// (one a level, as the walk matched them): its [`DescriptorRule::stats_key`], where
    /// `value_to_metric` writes each entry matched without an exact value as `key_value` with
    /// the request's value, and `detailed_metric` adds the last entry's value when its node
    /// names none (envoyproxy/ratelimit's stats keys).
    pub fn metric_name<'a>(&self, values: impl IntoIterator<Item = &'a str>) -> String {
        let mut name = self.service.to_string();
        let values: Vec<&str> = values.into_iter().collect();
        for (position, entry) in self.path.iter().enumerate() {
            name.push('.');
            let given = values.get(position).copied().unwrap_or_default();
            let exact = entry.value.is_some() && !entry.is_wildcard();
            if self.value_to_metric && !exact {
                name.push_str(&format!("{}_{given}", entry.key));
            } else {
                name.push_str(&entry.stats_name());
            }
        }
        if self.detailed_metric && !self.value_to_metric {
            if let (Some(last), Some(given)) = (self.path.last(), values.get(self.path.len().wrapping_sub(1)))
            {
                if last.value.is_none() || last.is_wildcard() {
                    name.push('_');
                    name.push_str(given);
                }
            }
        }
        name
    }

    /// Checks what a file cannot say in YAML's types alone.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `descriptor` for an empty path or one deeper than
    /// [`MAX_DEPTH`], an empty key, a key or value over 256 characters or with control
    /// characters, a `share_threshold` without a wildcard, or a `replaces` naming nothing or
    /// its own name.
    pub fn validate(&self) -> Result<(), InvalidRule> {
        if self.path.is_empty() || self.path.len() > MAX_DEPTH {
            return Err(invalid("descriptor", "a path has 1 to 16 levels"));
        }
        let printable = |text: &str| text.chars().count() <= 256 && !text.chars().any(char::is_control);
        for entry in &self.path {
            if entry.key.is_empty() || !printable(&entry.key) {
                return Err(invalid(
                    "descriptor",
                    "a key is 1 to 256 characters, none of them control characters",
                ));
            }
            if entry.value.as_deref().is_some_and(|value| value.is_empty() || !printable(value)) {
                return Err(invalid(
                    "descriptor",
                    "a value is 1 to 256 characters, none of them control characters",
                ));
            }
            if entry.share_threshold && !entry.is_wildcard() {
                return Err(invalid("descriptor", "share_threshold needs a value with a wildcard (*)"));
            }
        }
        for replaced in &self.replaces {
            if replaced.is_empty() {
                return Err(invalid("descriptor", "a replaces entry names a limit"));
            }
            if Some(replaced) == self.name.as_ref() {
                return Err(invalid("descriptor", "replaces names the limit's own name"));
            }
        }
        Ok(())
    }

    /// The budget its takes spend: `requests_per_unit` refilled over a `unit`; `None` when its
    /// descriptors never spend (unlimited, no limit, or 0 a unit, which refuses them all).
    pub fn budget(&self) -> Option<Limit> {
        match self.limit {
            PathLimit::PerUnit { requests_per_unit, unit } if requests_per_unit > 0 => {
                let burst = f64::from(requests_per_unit);
                Limit::for_any_period(burst / unit.seconds(), burst).ok()
            }
            _ => None,
        }
    }
}

impl RuleId {
    /// The stable id of the rule a file's node becomes: its domain and path, readable, then 12
    /// hex digits of SHA-256 over the two, so that ids never collide however the readable part
    /// was shortened or had its characters replaced.
    pub fn for_descriptor(service: &Service, path: &[PathEntry]) -> RuleId {
        let mut hash = Sha256::new();
        for field in std::iter::once(service.as_str()).chain(path.iter().flat_map(|entry| {
            [Some(&*entry.key), Some(entry.value.as_deref().unwrap_or("")), entry.value.as_ref().map(|_| "=")]
                .into_iter()
                .flatten()
        })) {
            hash.update((field.len() as u64).to_be_bytes());
            hash.update(field.as_bytes());
        }
        let digest = hash.finalize();
        let hex: String = digest[..6].iter().map(|byte| format!("{byte:02x}")).collect();
        let mut readable = service.to_string();
        for entry in path {
            readable.push('.');
            readable.push_str(&entry.stats_name());
        }
        let mut readable: String = readable
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
            .take(128 - 13)
            .collect();
        readable.push('-');
        readable.push_str(&hex);
        RuleId(readable)
    }
}
