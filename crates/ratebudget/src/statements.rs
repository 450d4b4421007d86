//! A pool for the statements beside the store (a service's own repositories) that answers
//! each statement only once it is committed, whether it reaches PostgreSQL directly or through
//! a transaction pooler.
//!
//! Behind a transaction pooler every use of a pooled connection is one transaction, opened
//! when the pool hands the connection out ([`through_transaction_pooler`]'s hooks), because sqlx runs a statement in two round trips and the
//! pooler may give each to another server connection between them. Committing that
//! transaction when the connection comes back (`after_release`) is too late for a write: sqlx
//! returns a connection in a task of its own, so the caller answered (a 201 for a Domain, a 204
//! for a revoked Node) before the write was committed; another replica reading at once did not
//! see it, and nobody learnt when the COMMIT failed. [`Statements`] commits on the connection,
//! before the statement answers, and answers the COMMIT's failure as the statement's.
//! Connected directly, a statement commits by itself and [`Statements`] is the pool.

use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgPoolOptions, PgQueryResult, PgRow, PgStatement, PgTransactionManager, PgTypeInfo};
use sqlx::{Connection, Either, Executor, PgPool, Postgres, TransactionManager};

use crate::connections::{transaction_begin, REFUSE_READ_ONLY_SERVER};

/// `options` for a pool that reaches PostgreSQL through a transaction pooler (PgBouncer's
/// `pool_mode = transaction`): every use of a connection is one transaction, opened with
/// `settings` as `SET LOCAL`s ([`transaction_begin`]) when the pool hands the connection out,
/// and committed when it comes back unless [`Statements`] committed it already. sqlx's own
/// transaction state tracks it, so a commit is never sent twice. The connect options must
/// have sqlx's statement cache off (`statement_cache_capacity(0)`). A server that cannot take
/// a write is refused as the connection is made ([`REFUSE_READ_ONLY_SERVER`]).
pub fn through_transaction_pooler(options: PgPoolOptions, settings: &[(&str, &str)]) -> PgPoolOptions {
    let begin: Arc<str> = transaction_begin(settings).into();
    let on_acquire = begin.clone();
    options
        .after_connect(move |connection, _| {
            let begin = begin.clone();
            Box::pin(async move {
                connection.execute(REFUSE_READ_ONLY_SERVER).await?;
                PgTransactionManager::begin(connection, Some(begin.to_string().into())).await
            })
        })
        .before_acquire(move |connection, _| {
            let begin = on_acquire.clone();
            Box::pin(async move {
                if !connection.is_in_transaction() {
                    PgTransactionManager::begin(connection, Some(begin.to_string().into())).await?;
                }
                Ok(true)
            })
        })
        // A connection whose COMMIT fails (after a failed statement it rolls back, and
        // succeeds) is closed rather than reused.
        .after_release(|connection, _| {
            Box::pin(async move { Ok(PgTransactionManager::commit(connection).await.is_ok()) })
        })
}

/// A pool whose every statement is committed before it answers; sqlx's executor for
/// `&Statements`, as for `&PgPool`.
#[derive(Clone, Debug)]
pub struct Statements {
    pool: PgPool,
    /// Each use of a connection is a transaction the pool opened (behind a transaction
    /// pooler): commit it before answering.
    commit_each: bool,
}

impl Statements {
    /// Statements on `pool`, connected directly: each commits by itself.
    pub fn new(pool: PgPool) -> Statements {
        Statements { pool, commit_each: false }
    }

    /// Statements on `pool`, whose hooks open a transaction on every connection they hand out
    /// (behind a transaction pooler): each statement's transaction is committed on its
    /// connection before the statement answers. One more round trip per statement.
    pub fn through_transaction_pooler(pool: PgPool) -> Statements {
        Statements { pool, commit_each: true }
    }

    /// The pool itself.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl From<PgPool> for Statements {
    fn from(pool: PgPool) -> Statements {
        Statements::new(pool)
    }
}

/// Ends the transaction the pool opened; a failed COMMIT is the statement's failure, since
/// what it wrote is not known to be there.
async fn commit(connection: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    PgTransactionManager::commit(connection).await
}

/// Commits the transaction a pool's hooks opened on `connection` when it was handed out
/// ([`through_transaction_pooler`]), if there is one: for a caller that runs its statement on
/// a connection of a pool it did not build, and so cannot know whether the pool commits each
/// statement by itself (connected directly) or only when the connection comes back, which is
/// after the caller answered (behind a transaction pooler). A failed COMMIT is the
/// statement's failure. Connected directly, the connection is in no transaction and this
/// sends nothing.
pub(crate) async fn commit_what_the_pool_opened(
    connection: &mut sqlx::PgConnection,
) -> Result<(), sqlx::Error> {
    if connection.is_in_transaction() {
        commit(connection).await?;
    }
    Ok(())
}

impl<'c> Executor<'c> for &'c Statements {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures_core::stream::BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + sqlx::Execute<'q, Postgres>,
    {
        if !self.commit_each {
            return self.pool.fetch_many(query);
        }
        // Every result is held until the COMMIT has answered: none may reach the caller of a
        // statement whose transaction could still roll back.
        let answered = async move {
            let mut connection = self.pool.acquire().await?;
            let results: Vec<_> = (&mut *connection).fetch_many(query).try_collect().await?;
            commit(&mut connection).await?;
            Ok::<_, sqlx::Error>(results)
        };
        futures_util::stream::once(answered)
            .map_ok(|results| futures_util::stream::iter(results.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures_core::future::BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + sqlx::Execute<'q, Postgres>,
    {
        if !self.commit_each {
            return self.pool.fetch_optional(query);
        }
        Box::pin(async move {
            let mut connection = self.pool.acquire().await?;
            let row = (&mut *connection).fetch_optional(query).await?;
            commit(&mut connection).await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> futures_core::future::BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> futures_core::future::BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}
