//! What a take is decided on beyond its bucket: the limit, the algorithm, whether a refusal
//! refuses, and what to do when the store cannot answer; and the port that supplies it.
//!
//! A [`Policy`] is asked for on every take ([`Budgets::policy`]), as the ratelimitpg
//! reference reads a limiter's limit on every decision, so a changed rule applies at the next
//! take and no budget is ever stored. It travels inside the take ([`Spend::enforcement`],
//! [`NamedSpend::enforcement`]), so the [`Guard`](crate::Guard) applies each take's own fail
//! mode and its observer sees each take's own mode and rule.
//!
//! [`Spend::enforcement`]: crate::Spend::enforcement
//! [`NamedSpend::enforcement`]: crate::NamedSpend::enforcement

use std::collections::HashMap;
use std::fmt;

use crate::{Key, Limit, Scope};

/// Any cause a [`Budgets`] implementation gives for not answering.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How a take decides when the store cannot answer (it failed, timed out, or its circuit is
/// open). Each has one name everywhere, the data model's: `CLOSED`, `STATIC`, `OPEN` (a rule's
/// `fail_mode`, and in lower case the knobs').
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailMode {
    /// `CLOSED`: the take is [`Undecided`](crate::Undecided), callers answer 500. The
    /// reference's rule.
    Closed,
    /// `STATIC`: this replica's fallback bucket, an in-memory bucket of the same limit,
    /// decides until the store answers. (Spelt `local` as a knob before; still accepted there.)
    Static,
    /// `OPEN`: the take is admitted without a decision and nothing is debited.
    Open,
}

impl FailMode {
    /// The stricter of two modes, for a take that spends two budgets: `Closed` over `Static`
    /// over `Open`. A pair admitted from fallback buckets when one of its budgets would fail
    /// open is still decided; one that fails closed is never decided by anything but the store.
    pub fn stricter(self, other: FailMode) -> FailMode {
        match (self, other) {
            (FailMode::Closed, _) | (_, FailMode::Closed) => FailMode::Closed,
            (FailMode::Static, _) | (_, FailMode::Static) => FailMode::Static,
            (FailMode::Open, FailMode::Open) => FailMode::Open,
        }
    }
}

/// The texts of [`Algorithm`], [`Mode`] and [`FailMode`], each in one place: the data model's
/// words, which the rules, their table and the operator API use.
macro_rules! texts {
    ($type:ty, $($variant:path => $text:literal),+) => {
        impl $type {
            /// Every value, in the order their texts are listed.
            pub const ALL: &'static [$type] = &[$($variant),+];

            /// The value's text.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($variant => $text),+
                }
            }

            /// The value a text names, if any.
            pub fn from_text(text: &str) -> Option<$type> {
                match text {
                    $($text => Some($variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

texts!(Algorithm, Algorithm::TokenBucket => "TOKEN_BUCKET", Algorithm::Gcra => "GCRA");
texts!(Mode, Mode::Enforce => "ENFORCE", Mode::Shadow => "SHADOW");
texts!(FailMode, FailMode::Closed => "CLOSED", FailMode::Static => "STATIC", FailMode::Open => "OPEN");

/// Whether a refusal refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A refusal refuses: the caller answers 429.
    Enforce,
    /// The take is decided and debited exactly as if enforced, but a refusal admits the
    /// request anyway ([`Spender`](crate::Spender)); the observer counts and logs what would
    /// have been refused. How a new limit is tried on real traffic.
    Shadow,
}

/// Which algorithm decides a budget's takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The token bucket of `plexsphere.rate_budgets`, keyed by the Node or Domain.
    TokenBucket,
    /// GCRA on `plexsphere.named_limits`, under a limiter named after the scope
    /// ([`LimiterName::of_scope`](crate::LimiterName::of_scope)). Whole cells only, and single
    /// takes only: two budgets taken together must share one statement, which only the token
    /// bucket's table has.
    Gcra,
}

/// An opaque number naming the rule a policy came from. This crate never reads it; it hands it
/// back to the [`Observer`](crate::Observer) with every decision, so whoever supplied the
/// policy can count decisions per rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleRef(pub u32);

/// How a take is enforced: its mode, its fail mode, and the rule that set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enforcement {
    /// Whether a refusal refuses.
    pub mode: Mode,
    /// What decides when the store cannot answer.
    pub fail_mode: FailMode,
    /// The rule this came from; `None` for a process-wide default.
    pub rule: Option<RuleRef>,
}

impl Enforcement {
    /// Enforced, failing closed, from no rule: the reference's behaviour.
    pub const STRICT: Enforcement =
        Enforcement { mode: Mode::Enforce, fail_mode: FailMode::Closed, rule: None };

    /// Whether this take's refusals are only counted, not applied.
    pub fn is_shadow(self) -> bool {
        self.mode == Mode::Shadow
    }
}

/// Everything a take is decided on besides its bucket and cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// How the bucket refills.
    pub limit: Limit,
    /// Which algorithm decides.
    pub algorithm: Algorithm,
    /// Mode, fail mode and rule.
    pub enforcement: Enforcement,
}

impl Policy {
    /// A token-bucket policy of `limit`, enforced and failing closed.
    pub fn strict(limit: Limit) -> Policy {
        Policy { limit, algorithm: Algorithm::TokenBucket, enforcement: Enforcement::STRICT }
    }
}

/// Where every take's [`Policy`] comes from: asked on every take, so a change applies at the
/// next one. The composition root implements it over its rules; contexts never see it.
pub trait Budgets: Send + Sync + fmt::Debug {
    /// The policy of `scope`'s buckets for `domain`: the bucket's own key for a Domain's
    /// budget, the Node's Domain for a Node's.
    ///
    /// # Errors
    /// When no policy can be given (the rules are not loaded yet, say): the take is then not
    /// decided, an HTTP 500, never a refusal.
    fn policy(&self, scope: Scope, domain: Key) -> Result<Policy, BoxError>;
}

/// One policy per scope, the same for every Domain: what a process without rules binds, and
/// what tests bind.
#[derive(Clone, Debug)]
pub struct FixedBudgets(HashMap<Scope, Policy>);

impl FixedBudgets {
    /// These scopes' policies; a scope not named has none, and its takes are not decided.
    pub fn new(policies: impl IntoIterator<Item = (Scope, Policy)>) -> FixedBudgets {
        FixedBudgets(policies.into_iter().collect())
    }
}

/// A scope a [`FixedBudgets`] was given no policy for.
#[derive(Debug, thiserror::Error)]
#[error("no budget is configured for scope {0}")]
struct NoPolicy(Scope);

impl Budgets for FixedBudgets {
    fn policy(&self, scope: Scope, _: Key) -> Result<Policy, BoxError> {
        self.0.get(&scope).copied().ok_or_else(|| NoPolicy(scope).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_fails_by_its_stricter_mode() {
        use FailMode::{Closed, Open, Static};
        for (a, b, both) in [
            (Closed, Closed, Closed),
            (Closed, Static, Closed),
            (Open, Closed, Closed),
            (Static, Static, Static),
            (Static, Open, Static),
            (Open, Static, Static),
            (Open, Open, Open),
        ] {
            assert_eq!(a.stricter(b), both, "{a:?} with {b:?}");
        }
    }
}
