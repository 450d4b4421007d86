//! The audit log on `plexsphere.audit_events`. The only module of the context that names SQL.

use chrono::{DateTime, Utc};
use ratebudget::Statements;
use uuid::Uuid;

use crate::{Action, Actor, AuditLog, AuditLogError, Entry, NewEntry, Page, Subject};

const RECORD: &str = "\
INSERT INTO plexsphere.audit_events (actor, action, domain_id, node_id, secret_name, rule_id, rule_version)
VALUES ($1, $2, $3, $4, $5, $6, $7)";

const READ: &str = "\
SELECT id, at, actor, action, domain_id, node_id, secret_name, rule_id, rule_version
FROM plexsphere.audit_events
WHERE $1::bigint IS NULL OR id < $1
ORDER BY id DESC
LIMIT $2";

type Row = (
    i64,
    DateTime<Utc>,
    String,
    String,
    Option<Uuid>,
    Option<Uuid>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

/// The audit log in PostgreSQL, on the request pool (synchronous commits: an entry is a
/// record).
#[derive(Clone, Debug)]
pub struct PgAuditLog {
    pool: Statements,
}

impl PgAuditLog {
    /// A log on `pool`, which must have the workspace's migrations applied: a `PgPool` connected
    /// directly, or [`Statements`] for one behind a transaction pooler.
    pub fn new(pool: impl Into<Statements>) -> PgAuditLog {
        PgAuditLog { pool: pool.into() }
    }
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> AuditLogError {
    AuditLogError(Box::new(error))
}

#[async_trait::async_trait]
impl AuditLog for PgAuditLog {
    #[tracing::instrument(level = "debug", skip_all, fields(actor = %entry.actor, action = entry.action.as_str()))]
    async fn record(&self, entry: &NewEntry) -> Result<(), AuditLogError> {
        sqlx::query(RECORD)
            .bind(entry.actor.as_str())
            .bind(entry.action.as_str())
            .bind(entry.subject.domain_id)
            .bind(entry.subject.node_id)
            .bind(entry.subject.secret_name.as_deref())
            .bind(entry.subject.rule_id.as_deref())
            .bind(entry.subject.rule_version)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn read(&self, page: Page) -> Result<Vec<Entry>, AuditLogError> {
        let rows: Vec<Row> = sqlx::query_as(READ)
            .bind(page.before())
            .bind(i64::try_from(page.limit()).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
        rows.into_iter()
            .map(|(id, at, actor, action, domain_id, node_id, secret_name, rule_id, rule_version)| {
                Ok(Entry {
                    id,
                    at,
                    actor: Actor::parse(&actor).map_err(unavailable)?,
                    action: Action::parse(&action).map_err(unavailable)?,
                    subject: Subject { domain_id, node_id, secret_name, rule_id, rule_version },
                })
            })
            .collect()
    }
}
