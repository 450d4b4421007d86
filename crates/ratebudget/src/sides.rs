//! What a take of token buckets comes to before any statement: the store and the guard reduce
//! it here, in one place, so that whatever the store is asked goes through the guard's
//! pre-check, circuit and fail mode exactly as sent.

use smallvec::SmallVec;

use crate::{Decision, Enforcement, Error, Grant, InsufficientCapacity, Mode, Spend, Take, Which};

/// One bucket as sent: the position its answers name, and the spend (every cost the take
/// names for that bucket, summed).
pub(crate) type Side = (Which, Spend);

/// A take of token buckets, reduced.
#[derive(Debug)]
pub(crate) enum Sides {
    /// Answered without a query: every cost zero, or one above its burst.
    Answered(Decision),
    /// At least one bucket to send, each once, in the order of the take's first spend of it.
    Send(SmallVec<[Side; 2]>),
}

/// Reduces the bucket spends of `take` (none for a named take): each spend validated, a cost
/// above its burst answered without a query (the first such position), the spends of one
/// bucket summed into one side, and zero costs left out.
///
/// A bucket named at several positions is one side: its costs summed in position order, its
/// mode `ENFORCE` if any of them is, its fail mode the strictest of theirs, and the position
/// its answers name the first of them whose mode is `SHADOW` (else the first): a shadow
/// descriptor's cost on a bucket an enforced one shares must not refuse the request, and
/// naming it lets the [`Spender`](crate::Spender) take the rest without it, as for any
/// shadow refusal. A pair naming one bucket twice reduces the same way.
///
/// # Errors
/// [`Error::ZeroKey`] and [`Error::NegativeCost`] for a bad spend; [`Error::InvalidBudget`] for
/// one bucket named with two different limits.
pub(crate) fn of(take: &Take) -> Result<Sides, Error> {
    for (_, spend) in take.spends() {
        spend.validate()?;
    }
    if let Some((which, spend)) = take.spends().find(|(_, spend)| spend.never_fits()) {
        return Ok(Sides::Answered(never(which, spend.cost, spend)));
    }
    let sides: SmallVec<[Side; 2]> = match take {
        Take::Single(spend) => SmallVec::from_iter([(Which::First, *spend)]),
        Take::Pair(first, second) if (first.name, first.key) != (second.name, second.key) => {
            SmallVec::from_iter([(Which::First, *first), (Which::Second, *second)])
        }
        _ => fold(take)?,
    };
    for (which, spend) in &sides {
        if spend.never_fits() {
            return Ok(Sides::Answered(never(*which, spend.cost, *spend)));
        }
    }
    let sides: SmallVec<[Side; 2]> = sides.into_iter().filter(|(_, spend)| !spend.is_free()).collect();
    Ok(if sides.is_empty() { Sides::Answered(Decision::Granted(Grant::FREE)) } else { Sides::Send(sides) })
}

/// The spends of `take`, one side per bucket (see [`of`]).
fn fold(take: &Take) -> Result<SmallVec<[Side; 2]>, Error> {
    let spends: SmallVec<[Side; 2]> = take.spends().collect();
    let mut sides: SmallVec<[Side; 2]> = SmallVec::with_capacity(spends.len());
    // Per side, whether its position is already a shadow spend's (kept), and whether it has
    // a spend that costs something.
    let mut named_by_shadow: SmallVec<[bool; 2]> = SmallVec::with_capacity(spends.len());
    for (which, spend) in spends {
        let Some(at) = sides.iter().position(|(_, side)| (side.name, side.key) == (spend.name, spend.key))
        else {
            named_by_shadow.push(spend.enforcement.is_shadow() && !spend.is_free());
            sides.push((which, spend));
            continue;
        };
        let (position, side) = &mut sides[at];
        if side.limit != spend.limit {
            return Err(Error::InvalidBudget);
        }
        if !named_by_shadow[at] && spend.enforcement.is_shadow() && !spend.is_free() {
            // The first shadow spend of the bucket names it, unless an earlier spend of it
            // costs nothing (then it named nothing that matters) or was one already.
            *position = which;
            named_by_shadow[at] = true;
        } else if side.is_free() && !spend.is_free() && !named_by_shadow[at] {
            *position = which;
        }
        side.cost += spend.cost;
        side.enforcement = stricter(side.enforcement, spend.enforcement);
    }
    Ok(sides)
}

/// The enforcement of one bucket spent under two: enforced if either is, failing by the
/// stricter mode, and the first one's rule.
fn stricter(one: Enforcement, other: Enforcement) -> Enforcement {
    let mode =
        if one.mode == Mode::Enforce || other.mode == Mode::Enforce { Mode::Enforce } else { Mode::Shadow };
    Enforcement { mode, fail_mode: one.fail_mode.stricter(other.fail_mode), rule: one.rule.or(other.rule) }
}

fn never(which: Which, cost: f64, spend: Spend) -> Decision {
    Decision::InsufficientCapacity(InsufficientCapacity { which, cost, burst: spend.limit.burst() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FailMode, Key, Limit, Scope};

    fn spend(key: u8, cost: f64) -> Spend {
        Spend::new(Scope::IngestNode, Key([key; 16]), cost, Limit::new(1.0, 10.0).unwrap())
    }

    fn shadow(spend: Spend) -> Spend {
        Spend { enforcement: Enforcement { mode: Mode::Shadow, ..spend.enforcement }, ..spend }
    }

    fn sent(take: &Take) -> Vec<(Which, Key, f64)> {
        match of(take).unwrap() {
            Sides::Send(sides) => {
                sides.into_iter().map(|(which, spend)| (which, spend.key, spend.cost)).collect()
            }
            Sides::Answered(decision) => panic!("answered: {decision:?}"),
        }
    }

    #[test]
    fn a_take_of_many_sends_each_bucket_once_in_the_order_first_named() {
        let take = Take::many([spend(1, 1.0), spend(2, 2.0), spend(1, 3.0), spend(3, 0.0), spend(2, 0.5)]);
        assert_eq!(
            sent(&take),
            [(Which::First, Key([1; 16]), 4.0), (Which::Second, Key([2; 16]), 2.5)],
            "bucket 3 costs nothing and is not sent"
        );
    }

    #[test]
    fn a_bucket_named_twice_is_answered_by_its_first_shadow_spend_and_enforced_if_either_is() {
        let take = Take::many([spend(9, 1.0), spend(1, 1.0), shadow(spend(1, 2.0)), shadow(spend(1, 1.0))]);
        let Sides::Send(sides) = of(&take).unwrap() else { panic!() };
        assert_eq!(sides[1].0, Which::at(2), "the first shadow spend of bucket 1 names it");
        assert_eq!(sides[1].1.cost, 4.0);
        assert_eq!(sides[1].1.enforcement.mode, Mode::Enforce);
        // A pair naming one bucket twice reduces the same way.
        let pair = Take::Pair(spend(1, 1.0), shadow(spend(1, 2.0)));
        assert_eq!(sent(&pair), [(Which::Second, Key([1; 16]), 3.0)]);
        let free_first = Take::many([spend(1, 0.0), spend(1, 2.0)]);
        assert_eq!(sent(&free_first), [(Which::Second, Key([1; 16]), 2.0)]);
    }

    #[test]
    fn a_fail_mode_is_the_strictest_of_a_buckets_spends() {
        let open = |spend: Spend| Spend {
            enforcement: Enforcement { fail_mode: FailMode::Open, ..spend.enforcement },
            ..spend
        };
        let take = Take::many([open(spend(1, 1.0)), spend(1, 1.0)]);
        let Sides::Send(sides) = of(&take).unwrap() else { panic!() };
        assert_eq!(sides[0].1.enforcement.fail_mode, FailMode::Closed);
    }

    #[test]
    fn what_needs_no_query_is_answered() {
        assert_eq!(
            of(&Take::many([spend(1, 0.0), spend(2, 0.0)]))
                .map(|sides| matches!(sides, Sides::Answered(Decision::Granted(_))))
                .ok(),
            Some(true)
        );
        let Sides::Answered(Decision::InsufficientCapacity(never)) =
            of(&Take::many([spend(1, 1.0), spend(2, 11.0)])).unwrap()
        else {
            panic!()
        };
        assert_eq!(never.which, Which::Second);
        let Sides::Answered(Decision::InsufficientCapacity(never)) =
            of(&Take::many([spend(1, 1.0), spend(2, 1.0), spend(2, 9.5)])).unwrap()
        else {
            panic!()
        };
        assert_eq!((never.which, never.cost), (Which::Second, 10.5), "the sum of one bucket's costs");
        let other_limit = Spend { limit: Limit::new(2.0, 10.0).unwrap(), ..spend(1, 1.0) };
        assert!(matches!(of(&Take::many([spend(1, 1.0), other_limit])), Err(Error::InvalidBudget)));
        assert!(matches!(of(&Take::many([spend(0, 1.0)])), Err(Error::ZeroKey)));
    }
}
