//! Names of budgets: the name of a token bucket's budget (every bucket of it shares the name
//! and differs by its key) or of a named (GCRA) limiter.
//!
//! A name is part of every bucket's identity in the table, so two budgets never share a
//! bucket. It is 1 to 63 of `a-z 0-9 _`, starting with a letter: the tables' CHECKs, and what
//! reads the same in a metric label, a log line and SQL. This project's five scopes are names
//! ([`Scope::name`]); a user of the crate names budgets of their own ([`Name::new`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use crate::Scope;

/// A budget's name. `Copy`, and compared by its text.
///
/// Names are few (a program's budgets), so each distinct one is kept for the life of the
/// process once made: a name costs its text once, and copying one costs nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(&'static str);

/// A name that breaks the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid name {0:?}: 1 to 63 of a-z 0-9 _, starting with a letter")]
pub struct InvalidName(pub String);

impl Name {
    /// Checks `name`.
    ///
    /// # Errors
    /// [`InvalidName`] unless `name` is 1 to 63 of `a-z 0-9 _` starting with a letter.
    pub fn new(name: &str) -> Result<Name, InvalidName> {
        if !Name::is_valid(name) {
            return Err(InvalidName(name.to_owned()));
        }
        static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let mut names =
            NAMES.get_or_init(Mutex::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let kept = match names.get(name) {
            Some(kept) => *kept,
            None => {
                let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
                names.insert(kept);
                kept
            }
        };
        Ok(Name(kept))
    }

    /// Whether `name` follows the rule (the tables' CHECKs).
    pub fn is_valid(name: &str) -> bool {
        let bytes = name.as_bytes();
        (1..=63).contains(&bytes.len())
            && bytes[0].is_ascii_lowercase()
            && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
    }

    /// The name as the tables store it.
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// The name of one of this project's scopes: the scope's own text, for its token buckets
    /// and for the named limiter its takes go to when a policy decides it with GCRA.
    pub fn of_scope(scope: Scope) -> Name {
        // Every scope's text is lowercase letters and underscores, a valid name.
        Name(scope.as_str())
    }

    /// The scope this name stands for, when it is one.
    pub fn scope(self) -> Option<Scope> {
        self.0.parse().ok()
    }
}

impl From<Scope> for Name {
    fn from(scope: Scope) -> Name {
        Name::of_scope(scope)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Name({:?})", self.0)
    }
}

impl std::str::FromStr for Name {
    type Err = InvalidName;

    fn from_str(text: &str) -> Result<Name, InvalidName> {
        Name::new(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_tables_rule_and_compare_by_their_text() {
        for good in ["auth_failure", "a", "login2", "secret_read_node"] {
            assert_eq!(Name::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "Auth", "2fa", "auth-failure", "auth failure", "é", &"a".repeat(64)] {
            assert!(Name::new(bad).is_err(), "{bad}");
        }
        assert_eq!(Name::new("uploads").unwrap(), Name::new(&String::from("uploads")).unwrap());
        assert_ne!(Name::new("uploads").unwrap(), Name::new("downloads").unwrap());
    }

    #[test]
    fn a_scopes_name_is_its_text_and_back() {
        for scope in Scope::ALL {
            let name = Name::of_scope(scope);
            assert_eq!(Name::new(scope.as_str()), Ok(name));
            assert_eq!(name.scope(), Some(scope));
        }
        assert_eq!(Name::new("uploads").unwrap().scope(), None);
    }
}
