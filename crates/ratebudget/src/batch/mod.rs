//! Coalesced takes: client-side group commit.
//!
//! A take costs a round trip and a commit; the row work is cheap (PERF-NOTES.md: one statement
//! taking from 16 buckets ran 5.4 times the takes a second of 16 single statements). So while
//! a call is on the wire, concurrent takes wait in a queue, and when it returns the queue goes
//! as the next call: `plexsphere.decide_rate_budget_takes` (docs/adr/0038, which generalised
//! migrations/0009's `decide_rate_budget_batch` from two buckets a take to any number), which
//! decides them in order exactly as one at a time, or, for a call of single takes all of one bucket or
//! all of distinct keys, a function made for that shape which decides the same in fewer steps
//! (migrations/0014). There is no timer: a lone take is sent at once, as itself (take.sql, or
//! `plexsphere.decide_rate_budget_takes` for a take of several buckets), and pays only a task
//! hand-off. A take of several buckets (a pair, or any number: docs/adr/0038) is one take of
//! the call like any other.
//!
//! The calls run on tasks of their own ("drivers"), each looping while the queue is not
//! empty: one while the queue is short, more (up to `max_in_flight`) once a quarter of a
//! call's worth waits. A take of a bucket already on the wire waits for the next call rather than
//! race it to the row lock. A caller waits for its answer on a channel; one whose
//! deadline passes stops waiting and nobody else notices: its take, if not yet sent, is
//! dropped from the queue, and if already sent is decided with the rest of its call.

//!
//! The queue and its drivers are `queue`; the statements a call sends, and how their rows
//! read as decisions, are `statements`.

mod queue;
mod statements;

use std::sync::Arc;

use crate::sides::Side;

pub(crate) use queue::Coalescer;
pub(crate) use statements::run;

/// A take that needs the database, as sent: one bucket, or any number all-or-nothing.
#[derive(Clone, Debug)]
pub(crate) enum Statement {
    /// One bucket, with the position its answers name (a pair with a free side is a single
    /// take of its other side).
    Single(Side),
    /// Two or more distinct buckets (`sides::of`), every one debited or none.
    Many(Arc<[Side]>),
}

impl Statement {
    /// The statement of `sides` (at least one, distinct buckets).
    pub(crate) fn of(sides: &[Side]) -> Statement {
        match sides {
            [side] => Statement::Single(*side),
            sides => Statement::Many(sides.into()),
        }
    }

    /// The buckets it debits, each with the position its answers name.
    pub(crate) fn sides(&self) -> &[Side] {
        match self {
            Statement::Single(side) => std::slice::from_ref(side),
            Statement::Many(sides) => sides,
        }
    }
}

/// How many takes one call may carry, and how many calls may be on the wire at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalescing {
    /// The most takes in one call; 1 sends every take as its own statement.
    pub max_batch: usize,
    /// The most calls on the wire at once, each on a connection of its own.
    pub max_in_flight: usize,
}

impl Coalescing {
    /// What a store does unless told otherwise: up to 64 takes a call (PERF-NOTES.md: 79k
    /// takes a second at 64 a statement on this machine), and a second call beside the first
    /// when a quarter of a call's worth is waiting (one call per core of the database's
    /// machine here; BENCHMARKS.md section 6 has the figures).
    pub const DEFAULT: Coalescing = Coalescing { max_batch: 64, max_in_flight: 2 };

    /// Every take its own statement, at once: the store before coalescing, for comparison.
    pub const OFF: Coalescing = Coalescing { max_batch: 1, max_in_flight: usize::MAX };

    /// How many takes must wait before a call goes beside one already on the wire.
    pub(super) fn second_call_after(self) -> usize {
        (self.max_batch / 4).max(1)
    }
}
