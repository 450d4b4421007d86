//! What a rule governs: one of this project's own budgets for some Domains, or another
//! service's requests (`../shared/seeds/limit-data-model.txt`: a rule names a `service`, an
//! `api` and a selector of attributes).
//!
//! Both are matched the same way ([`crate::Snapshot::matching`]): a request is a service, an
//! API and an ordered list of attributes from general to specific (Envoy's descriptor
//! entries), and a rule matches when its API is the request's (or `*`) and every pair of its
//! selector is among the attributes. This project's own takes are the service
//! [`OWN_SERVICE`], the scope as the API, and the attributes `tier` then `domain`, so a
//! Domain's override outranks its tier's template, which outranks an all-Domains rule.

use std::fmt;
use std::sync::Arc;

use ratebudget::Scope;

use super::{invalid, InvalidRule, Selector};

/// The service whose rules size this project's own budgets (its five scopes).
pub const OWN_SERVICE: &str = "plexsphere";

/// The most pairs a service rule's selector holds, and the most entries a descriptor may have.
pub const MAX_ATTRIBUTES: usize = 16;

/// Whether `text` is 1 to `max` characters, none of them control characters.
fn printable(text: &str, max: usize) -> bool {
    (1..=max).contains(&text.chars().count()) && !text.chars().any(char::is_control)
}

/// A service's name (Envoy's rate limit `domain`): 1 to 128 of `A-Z a-z 0-9 . _ -`, starting
/// with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Service(Arc<str>);

impl Service {
    /// Checks a service name.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `service` unless it follows the rule above.
    pub fn parse(text: &str) -> Result<Service, InvalidRule> {
        let bytes = text.as_bytes();
        let valid = (1..=128).contains(&bytes.len())
            && bytes[0].is_ascii_alphanumeric()
            && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(Service(text.into()))
        } else {
            Err(invalid("service", "must be 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit"))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is [`OWN_SERVICE`].
    pub fn is_own(&self) -> bool {
        &*self.0 == OWN_SERVICE
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The services a decide caller may ask for (`PLEXSPHERE_DECIDE_TOKENS`: `name:token` for
/// every service but plexsphere's own, `name:token:a|b` for those only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Services {
    /// Every service except [`OWN_SERVICE`], whose budgets this project spends itself.
    AllButOwn,
    /// Only these (never [`OWN_SERVICE`]).
    Only(Arc<[String]>),
}

impl Services {
    /// Whether a caller with these may ask for `service`.
    pub fn permits(&self, service: &str) -> bool {
        match self {
            Services::AllButOwn => service != OWN_SERVICE,
            Services::Only(services) => services.iter().any(|named| named == service),
        }
    }
}

/// Which of a service's APIs a rule governs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// Every API: `*`.
    Any,
    /// One, by its name (`GET /v1/users`): 1 to 256 characters, none of them control
    /// characters.
    Named(Arc<str>),
}

impl Api {
    /// Checks an API's text; `*` is every API.
    ///
    /// # Errors
    /// [`InvalidRule`] on field `api` unless it is `*` or 1 to 256 characters, none of them
    /// control characters.
    pub fn parse(text: &str) -> Result<Api, InvalidRule> {
        if text == "*" {
            Ok(Api::Any)
        } else if printable(text, 256) {
            Ok(Api::Named(text.into()))
        } else {
            Err(invalid("api", "must be \"*\" or 1 to 256 characters, none of them control characters"))
        }
    }

    /// The API's text: its name, or `*`.
    pub fn as_str(&self) -> &str {
        match self {
            Api::Any => "*",
            Api::Named(name) => name,
        }
    }
}

/// What one pair of a selector matches of its key's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pattern {
    /// Any value: `*`.
    Any,
    /// Exactly this value.
    Exactly(Arc<str>),
}

impl Pattern {
    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Exactly(wanted) => &**wanted == value,
        }
    }

    /// The pattern's text: the value, or `*`.
    pub fn as_str(&self) -> &str {
        match self {
            Pattern::Any => "*",
            Pattern::Exactly(value) => value,
        }
    }
}

/// Which of a service's requests a rule governs: pairs of an attribute and a pattern, every
/// one of which must be among a request's attributes. Sorted by attribute, each at most once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Attributes(Arc<[(Arc<str>, Pattern)]>);

impl Attributes {
    /// A selector from its JSON object's members: at most [`MAX_ATTRIBUTES`], each key 1 to
    /// 128 characters and each value up to 256, none of them control characters, and no key
    /// `api` (the rule's own field).
    ///
    /// # Errors
    /// [`InvalidRule`] on field `selector` otherwise.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Attributes, InvalidRule> {
        let shape = "must be a flat object of at most 16 attributes, each key 1 to 128 characters (not \"api\") and each value a string of at most 256 (\"*\" matches any value), none of them control characters";
        let mut checked: Vec<(Arc<str>, Pattern)> = Vec::new();
        for (key, value) in pairs {
            let value_ok = value.chars().count() <= 256 && !value.chars().any(char::is_control);
            if !printable(key, 128) || key == "api" || !value_ok || checked.len() == MAX_ATTRIBUTES {
                return Err(invalid("selector", shape));
            }
            let pattern = if value == "*" { Pattern::Any } else { Pattern::Exactly(value.into()) };
            checked.push((key.into(), pattern));
        }
        checked.sort();
        if checked.windows(2).any(|two| two[0].0 == two[1].0) {
            return Err(invalid("selector", shape));
        }
        Ok(Attributes(checked.into()))
    }

    /// The pairs, by attribute.
    pub fn pairs(&self) -> &[(Arc<str>, Pattern)] {
        &self.0
    }
}

/// What a rule governs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// One of this project's own budgets, for the Domains the selector picks.
    Own {
        /// The budget.
        scope: Scope,
        /// The Domains.
        selector: Selector,
    },
    /// Another service's requests whose descriptor a file's path matches to its full depth
    /// (envoyproxy/ratelimit's configuration).
    Descriptor(Arc<super::DescriptorRule>),
    /// Another service's requests.
    Service {
        /// The service (never [`OWN_SERVICE`]).
        service: Service,
        /// The API, or every one.
        api: Api,
        /// The attributes every request it governs has.
        selector: Attributes,
    },
}

impl Target {
    /// The service the rule belongs to.
    pub fn service(&self) -> &str {
        match self {
            Target::Own { .. } => OWN_SERVICE,
            Target::Service { service, .. } => service.as_str(),
            Target::Descriptor(rule) => rule.service.as_str(),
        }
    }

    /// The API it governs; `None` for every API. An own rule's API is its scope.
    pub fn api(&self) -> Option<&str> {
        match self {
            Target::Own { scope, .. } => Some(scope.as_str()),
            Target::Service { api: Api::Any, .. } => None,
            Target::Service { api: Api::Named(name), .. } => Some(name),
            Target::Descriptor(_) => None,
        }
    }

    /// The selector's pairs as attributes and patterns: an own rule's `tier` or `domain`.
    pub fn pairs(&self) -> Vec<(&str, Pattern)> {
        match self {
            Target::Own { selector, .. } => match selector {
                Selector::AllDomains => Vec::new(),
                Selector::Tier(tier) => vec![("tier", Pattern::Exactly(tier.as_str().into()))],
                Selector::Domain(domain) => vec![("domain", Pattern::Exactly(domain.to_string().into()))],
            },
            Target::Service { selector, .. } => {
                selector.pairs().iter().map(|(key, pattern)| (&**key, pattern.clone())).collect()
            }
            Target::Descriptor(_) => Vec::new(),
        }
    }
}

/// A service rule as its writer gives it, before any check; see [`crate::RuleDraft`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ServiceDraft {
    /// The service's name.
    pub service: String,
    /// The API's name, or `*` (the default).
    pub api: Option<String>,
    /// The selector's members, each a key and a string value.
    pub selector: Vec<(String, String)>,
}

impl ServiceDraft {
    /// Checks the three fields.
    ///
    /// # Errors
    /// [`InvalidRule`] naming `service` (not a service name, or [`OWN_SERVICE`], whose rules
    /// name a scope), `api` or `selector`.
    pub fn validate(&self) -> Result<Target, InvalidRule> {
        let service = Service::parse(&self.service)?;
        if service.is_own() {
            return Err(invalid(
                "service",
                "plexsphere's own rules name a scope and a Domain selector, not an api",
            ));
        }
        let api = Api::parse(self.api.as_deref().unwrap_or("*"))?;
        let selector =
            Attributes::from_pairs(self.selector.iter().map(|(key, value)| (key.as_str(), value.as_str())))?;
        Ok(Target::Service { service, api, selector })
    }
}

#[cfg(test)]
mod services_tests {
    use super::*;

    #[test]
    fn a_caller_decides_for_every_service_but_our_own_or_only_those_its_token_names() {
        assert!(Services::AllButOwn.permits("directory"));
        assert!(!Services::AllButOwn.permits(OWN_SERVICE));
        let only = Services::Only(vec!["directory".to_owned(), "billing".to_owned()].into());
        assert!(only.permits("billing"));
        assert!(!only.permits("directory2"));
        assert!(!only.permits(OWN_SERVICE));
    }
}
