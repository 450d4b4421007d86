//! The audit log's values, each validated when it is built.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The longest operator name, in characters.
const ACTOR_MAX_CHARS: usize = 64;

/// The actor of what the command line does; its angle brackets are outside the operator-name
/// alphabet, so no operator can be mistaken for it.
const COMMAND_LINE: &str = "<cli>";

/// The actor of what the leader applies from `PLEXSPHERE_RULES_DIR`; as [`COMMAND_LINE`], no
/// operator's name.
const RULES_DIRECTORY: &str = "<rules-dir>";

/// The longest page of entries one read returns.
const MAX_PAGE: usize = 1000;

/// Input that does not make a valid value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct InvalidInput {
    /// The field that was refused.
    pub field: &'static str,
    /// The rule it breaks.
    pub reason: &'static str,
}

/// Who acted: an operator, by the name its token was given, or the command line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Actor(String);

impl Actor {
    /// An operator's name: 1 to 64 of `A-Z a-z 0-9 . _ -`, so it reads the same in a log line,
    /// a JSON body and a terminal.
    ///
    /// # Errors
    /// [`InvalidInput`] with field `name` otherwise.
    pub fn operator(name: &str) -> Result<Actor, InvalidInput> {
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        if (1..=ACTOR_MAX_CHARS).contains(&name.len()) && name.bytes().all(allowed) {
            Ok(Actor(name.to_owned()))
        } else {
            Err(InvalidInput { field: "name", reason: "must be 1 to 64 of A-Z a-z 0-9 . _ -" })
        }
    }

    /// The command line (`plexsphere secrets rekey`).
    pub fn command_line() -> Actor {
        Actor(COMMAND_LINE.to_owned())
    }

    /// The leader applying `PLEXSPHERE_RULES_DIR`'s files.
    pub fn rules_directory() -> Actor {
        Actor(RULES_DIRECTORY.to_owned())
    }

    /// An actor as stored.
    ///
    /// # Errors
    /// [`InvalidInput`] unless it is an operator's name or the command line's.
    pub fn parse(text: &str) -> Result<Actor, InvalidInput> {
        if text == COMMAND_LINE {
            Ok(Actor::command_line())
        } else if text == RULES_DIRECTORY {
            Ok(Actor::rules_directory())
        } else {
            Actor::operator(text)
        }
    }

    /// The actor's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `POST /v1/domains`.
    CreateDomain,
    /// `POST /v1/domains/{domain_id}/nodes`: a credential was issued.
    EnrolNode,
    /// `DELETE /v1/domains/{domain_id}/nodes/{node_id}`: a credential was revoked.
    RevokeNode,
    /// `PUT /v1/domains/{domain_id}/secrets/{name}`.
    PutSecret,
    /// `plexsphere secrets rekey`: every secret re-sealed under the current key.
    RekeySecrets,
    /// `DELETE /v1/budgets/{scope}/{key}` or `plexsphere budgets reset`: a bucket forgotten
    /// (the subject is the Node or the Domain whose bucket it was).
    ResetBudget,
    /// `PATCH /v1/domains/{domain_id}`: the Domain moved to another tier.
    RetierDomain,
    /// `PUT /v1/rules/{rule_id}`: a rule created or replaced (the subject names the version
    /// written).
    PutRule,
    /// `POST /v1/rules/{rule_id}/rollback`: a rule given an earlier version's content again,
    /// as a new version (the subject names the version written).
    RollBackRule,
    /// `DELETE /v1/rules/{rule_id}`: a rule deleted (the subject names the deletion's version
    /// in the rule's history).
    DeleteRule,
    /// `POST /v1/decide/reset` or `plexsphere budgets reset --service`: another service's
    /// bucket forgotten (the subject names the rule that governs it, at its version).
    ResetServiceBucket,
}

impl Action {
    const ALL: [Action; 11] = [
        Action::CreateDomain,
        Action::EnrolNode,
        Action::RevokeNode,
        Action::PutSecret,
        Action::RekeySecrets,
        Action::ResetBudget,
        Action::RetierDomain,
        Action::PutRule,
        Action::RollBackRule,
        Action::DeleteRule,
        Action::ResetServiceBucket,
    ];

    /// The action as stored and shown: `noun.verb`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::CreateDomain => "domain.create",
            Action::EnrolNode => "node.enrol",
            Action::RevokeNode => "node.revoke",
            Action::PutSecret => "secret.put",
            Action::RekeySecrets => "secrets.rekey",
            Action::ResetBudget => "budget.reset",
            Action::RetierDomain => "domain.retier",
            Action::PutRule => "rule.put",
            Action::RollBackRule => "rule.rollback",
            Action::DeleteRule => "rule.delete",
            Action::ResetServiceBucket => "bucket.reset",
        }
    }

    /// An action as stored.
    ///
    /// # Errors
    /// [`InvalidInput`] when no action has this name.
    pub fn parse(text: &str) -> Result<Action, InvalidInput> {
        Action::ALL
            .into_iter()
            .find(|action| action.as_str() == text)
            .ok_or(InvalidInput { field: "action", reason: "is not a known action" })
    }
}

/// What an action acted on; each part only where it applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    /// The Domain.
    pub domain_id: Option<Uuid>,
    /// The Node.
    pub node_id: Option<Uuid>,
    /// The secret's name (never its value).
    pub secret_name: Option<String>,
    /// The rule's id.
    pub rule_id: Option<String>,
    /// The version of the rule the action made in its history.
    pub rule_version: Option<i64>,
}

/// An entry to append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEntry {
    /// Who.
    pub actor: Actor,
    /// What.
    pub action: Action,
    /// On what.
    pub subject: Subject,
}

/// An entry as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its place in the log: later entries have larger ids.
    pub id: i64,
    /// When it was recorded, by the database's clock.
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: Actor,
    /// What.
    pub action: Action,
    /// On what.
    pub subject: Subject,
}

/// Which entries to read: the newest `limit` of those before `before` (all, when `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Page {
    before: Option<i64>,
    limit: usize,
}

impl Page {
    /// A page of at most `limit` entries, older than entry `before` when it is given.
    ///
    /// # Errors
    /// [`InvalidInput`] with field `limit` unless it is 1 to 1000.
    pub fn new(before: Option<i64>, limit: usize) -> Result<Page, InvalidInput> {
        if (1..=MAX_PAGE).contains(&limit) {
            Ok(Page { before, limit })
        } else {
            Err(InvalidInput { field: "limit", reason: "must be 1 to 1000" })
        }
    }

    /// Entries older than this one only.
    pub fn before(&self) -> Option<i64> {
        self.before
    }

    /// The most entries returned.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names_are_short_and_plain_and_never_the_command_line() {
        for good in ["operator", "alice", "ops-2026.b_1", &"x".repeat(64)] {
            assert_eq!(Actor::operator(good).unwrap().as_str(), good);
        }
        for bad in ["", "<cli>", "al ice", "al:ice", "ålice", "a\u{202e}b", &"x".repeat(65)] {
            assert!(Actor::operator(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Actor::parse("<cli>"), Ok(Actor::command_line()));
    }

    #[test]
    fn actions_read_back_as_written() {
        for action in Action::ALL {
            assert_eq!(Action::parse(action.as_str()), Ok(action));
        }
        assert!(Action::parse("domain.delete").is_err());
    }

    #[test]
    fn a_page_holds_one_to_a_thousand_entries() {
        assert!(Page::new(None, 0).is_err());
        assert!(Page::new(None, 1001).is_err());
        assert_eq!(Page::new(Some(7), 1000).unwrap().before(), Some(7));
    }
}
