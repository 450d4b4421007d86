//! Charges and peeks (docs/adr/0040): a cost charged whatever the bucket holds, which may
//! leave it in debt, and a bucket read without spending.

use chrono::{DateTime, Utc};

use super::{detached, Store};
use crate::error::Failure;
use crate::{Error, Fill, Spend};

const CHARGE: &str = include_str!("../../queries/charge.sql");
const PEEK: &str = include_str!("../../queries/peek.sql");

impl Store {
    /// Charges `spend.cost` to its bucket at the caller's `now`, whatever the bucket holds:
    /// for a cost known only once the work it pays for is done (an LLM's tokens, counted from
    /// its response), which is accepted, never refused. Returns the row as charged.
    ///
    /// A cost the bucket covers is debited as a take's. One it does not cover leaves the
    /// bucket in debt: its tokens stay at 0 (never negative in the table) and its
    /// `refilled_at` moves ahead of `now` by the time its rate takes to repay what was
    /// missing, so every take refuses until then (with the exact wait, [`Limit::covered_at`])
    /// and the bucket refills as an empty one from then on. A charge on a bucket in debt adds
    /// to the debt; the debt is capped at [`Limit::MAX_REFILL_TIME`] ahead of `now`. A missing
    /// bucket is minted full and charged. A cost above the burst is charged like any other.
    ///
    /// One statement (`queries/charge.sql`), exact under concurrency with takes, coalesced
    /// calls, leases and other charges of the bucket: it judges the latest row under its lock.
    /// Like a take's, it runs to its end on a task of its own if its caller stops waiting.
    ///
    /// # Errors
    /// [`Error::ZeroKey`] and [`Error::NegativeCost`] (a negative, NaN or infinite cost) before
    /// any query; [`Error::Database`] when the database did not answer.
    ///
    /// [`Limit::covered_at`]: crate::Limit::covered_at
    /// [`Limit::MAX_REFILL_TIME`]: crate::Limit::MAX_REFILL_TIME
    pub async fn charge(&self, spend: Spend, now: DateTime<Utc>) -> Result<Fill, Error> {
        Ok(self.charge_bucket(spend, now).await?)
    }

    /// What `spend`'s bucket holds, read without a lock or a write: the row as stored, or, when
    /// there is none, a full bucket at `now` (what a take would mint). `spend.cost` is not
    /// used. [`Limit::level`](crate::Limit::level) of the fill at `now` is the level a take
    /// would judge, concurrent takes aside.
    ///
    /// # Errors
    /// [`Error::ZeroKey`] before any query; [`Error::Database`] when the database did not
    /// answer.
    pub async fn peek(&self, spend: Spend, now: DateTime<Utc>) -> Result<Fill, Error> {
        Ok(self.peek_bucket(spend, now).await?)
    }

    pub(crate) async fn charge_bucket(&self, spend: Spend, now: DateTime<Utc>) -> Result<Fill, Failure> {
        let spend = spend.validate()?;
        if !spend.cost.is_finite() {
            return Err(Error::NegativeCost.into());
        }
        let takes = self.takes.clone();
        let (tokens, refilled_at): (f64, DateTime<Utc>) = detached(async move {
            let mut lease = takes.lease().await?;
            let row = sqlx::query_as(CHARGE)
                .bind(spend.name.as_str())
                .bind(spend.key.as_uuid())
                .bind(spend.cost)
                .bind(spend.limit.per_second())
                .bind(spend.limit.burst())
                .bind(now)
                .fetch_one(lease.connection())
                .await?;
            lease.finish().await?;
            Ok(row)
        })
        .await?;
        Ok(Fill { tokens, refilled_at })
    }

    pub(crate) async fn peek_bucket(&self, spend: Spend, now: DateTime<Utc>) -> Result<Fill, Failure> {
        if spend.key.0 == [0; 16] {
            return Err(Error::ZeroKey.into());
        }
        let takes = self.takes.clone();
        let row: Option<(f64, DateTime<Utc>)> = detached(async move {
            let mut lease = takes.lease().await?;
            let row = sqlx::query_as(PEEK)
                .bind(spend.name.as_str())
                .bind(spend.key.as_uuid())
                .fetch_optional(lease.connection())
                .await?;
            lease.finish().await?;
            Ok(row)
        })
        .await?;
        Ok(match row {
            Some((tokens, refilled_at)) => Fill { tokens, refilled_at },
            None => Fill { tokens: spend.limit.burst(), refilled_at: now },
        })
    }
}
