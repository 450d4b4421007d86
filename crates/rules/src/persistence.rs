//! The rules context's adapter: rules, their versions, the revision and the usage rows in
//! PostgreSQL.
//!
//! This is the only module of the context that names `sqlx`. Every change is one statement
//! (`queries/`): the conditional write, the history row, the revision and the notification
//! together, so none of them can happen without the others.

use chrono::{DateTime, Utc};
use ratebudget::Scope;
use ratebudget::Statements;
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::ports::{Created, Replaced, RolledBack, Write};
use crate::{
    Actor, Change, DescriptorRule, PathEntry, PathLimit, RepositoryError, Rule, RuleDraft, RuleId, RuleSpec,
    RuleVersion, RulesRepository, Selector, Service, ServiceDraft, Target, Unit, UsageCount, UsageMinute,
    Version, OWN_SERVICE,
};

/// The channel every rule change is announced on, at commit; the payload is the rules'
/// revision the change made. A listener that reconnects must assume it missed some.
pub const CHANGES_CHANNEL: &str = "plexsphere_rules";

const CREATE: &str = include_str!("../queries/create.sql");
const REPLACE: &str = include_str!("../queries/replace.sql");
const DELETE: &str = include_str!("../queries/delete.sql");
const ROLLBACK: &str = include_str!("../queries/rollback.sql");
const ROLLBACK_IF_MATCH: &str = include_str!("../queries/rollback_if_match.sql");
const ROLLBACK_REFUSAL: &str = include_str!("../queries/rollback_refusal.sql");
const CURRENT_VERSION: &str = include_str!("../queries/current_version.sql");
const GET: &str = include_str!("../queries/get.sql");
const LIST: &str = include_str!("../queries/list.sql");
const LOAD: &str = include_str!("../queries/load.sql");
const HISTORY: &str = include_str!("../queries/history.sql");
const REVISION: &str = include_str!("../queries/revision.sql");
const ADD_USAGE: &str = include_str!("../queries/add_usage.sql");
const USAGE: &str = include_str!("../queries/usage.sql");
const PRUNE_USAGE: &str = include_str!("../queries/prune_usage.sql");

/// How many times a write that may create a rule is tried when it lost a race with a
/// deletion of the same id (it computed the version the deletion took): the next try sees the
/// deletion and takes the version after it.
const CREATE_ATTEMPTS: usize = 3;

/// Rules in `plexsphere.rules`, `plexsphere.rule_versions`, `plexsphere.rule_revision` and
/// `plexsphere.rule_usage`.
#[derive(Clone, Debug)]
pub struct PgRulesRepository {
    pool: Statements,
}

impl PgRulesRepository {
    /// A repository on `pool`, which must have the workspace's migrations applied: a `PgPool` connected
    /// directly, or [`Statements`] for one behind a transaction pooler.
    pub fn new(pool: impl Into<Statements>) -> PgRulesRepository {
        PgRulesRepository { pool: pool.into() }
    }

    async fn current_version(&self, id: &RuleId) -> Result<Option<Version>, RepositoryError> {
        let current: Option<i64> = sqlx::query_scalar(CURRENT_VERSION)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        current.map(stored_version).transpose()
    }

    /// Runs a statement that may insert a rule's next version, again when it lost the race
    /// with a deletion that took that version.
    async fn retrying_version_races(
        &self,
        statement: impl Fn() -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Option<PgRow>, RepositoryError> {
        let mut attempt = 1;
        loop {
            match statement().fetch_optional(&self.pool).await {
                Err(error) if attempt < CREATE_ATTEMPTS && is_version_taken(&error) => attempt += 1,
                result => return result.map_err(unavailable),
            }
        }
    }
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> RepositoryError {
    RepositoryError(Box::new(error))
}

/// Whether `error` is the history refusing a version that already exists.
fn is_version_taken(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.is_unique_violation() && error.constraint() == Some("rule_versions_pkey"))
}

/// A stored version: the table's CHECK keeps it at least 1, so anything else is drift.
fn stored_version(number: i64) -> Result<Version, RepositoryError> {
    Version::new(number).map_err(unavailable)
}

/// The binds every statement that writes a rule's content shares, `$2` to `$13`.
fn bind_spec<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    spec: &RuleSpec,
    actor: &Actor,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let target = spec.target();
    let (api, scope) = match target {
        Target::Own { scope, .. } => (None, Some(scope.as_str())),
        Target::Service { api, .. } => (Some(api.as_str().to_owned()), None),
        Target::Descriptor(_) => (None, None),
    };
    // A file's rule that never spends stores no rate, per_ms or burst.
    let spends = spec.spends();
    let selector: serde_json::Map<String, serde_json::Value> = target
        .pairs()
        .into_iter()
        .map(|(attribute, pattern)| (attribute.to_owned(), serde_json::Value::from(pattern.as_str())))
        .collect();
    query
        .bind(target.service().to_owned())
        .bind(api)
        .bind(scope)
        .bind(serde_json::Value::Object(selector).to_string())
        .bind(spends.then_some(spec.rate()))
        .bind(spends.then_some(i32::try_from(spec.per_ms()).unwrap_or(i32::MAX)))
        .bind(spends.then_some(spec.burst()))
        .bind(spec.algorithm().as_str())
        .bind(spec.mode().as_str())
        .bind(spec.fail_mode().as_str())
        .bind(spec.priority())
        .bind(actor.as_str().to_owned())
}

/// The binds of a file rule's descriptor and source (NULL for any other rule), and of every
/// rule's charge, after the statement's others.
fn bind_descriptor<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    spec: &RuleSpec,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let descriptor = spec.descriptor();
    query
        .bind(descriptor.map(|rule| descriptor_json(rule).to_string()))
        .bind(descriptor.map(|rule| rule.source.clone()))
        .bind(spec.charge().as_str())
}

/// A file rule's path and what its file says of it, as its row's `descriptor` holds them.
fn descriptor_json(rule: &DescriptorRule) -> serde_json::Value {
    use serde_json::json;
    let path: Vec<serde_json::Value> = rule
        .path
        .iter()
        .map(|entry| {
            json!({
                "key": &*entry.key,
                "value": entry.value.as_deref(),
                "share_threshold": entry.share_threshold,
                "order": entry.order,
            })
        })
        .collect();
    let limit = match rule.limit {
        PathLimit::PerUnit { requests_per_unit, unit } => {
            json!({"requests_per_unit": requests_per_unit, "unit": unit.as_str()})
        }
        PathLimit::Unlimited => json!("unlimited"),
        PathLimit::Unset => serde_json::Value::Null,
    };
    json!({
        "path": path,
        "limit": limit,
        "name": rule.name,
        "replaces": rule.replaces,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
        "detailed_metric": rule.detailed_metric,
        "value_to_metric": rule.value_to_metric,
    })
}

/// A file rule from its row's `descriptor`, `service` and `source`.
fn descriptor_from_json(
    service: &str,
    source: String,
    text: &str,
) -> Result<DescriptorRule, RepositoryError> {
    let drift = |what: &str| RepositoryError(format!("a rule's descriptor {what}").into());
    let value: serde_json::Value = serde_json::from_str(text).map_err(unavailable)?;
    let flag = |name: &str| value.get(name).and_then(serde_json::Value::as_bool).unwrap_or(false);
    let text_of = |value: &serde_json::Value| value.as_str().map(str::to_owned);
    let mut path = Vec::new();
    for entry in
        value.get("path").and_then(serde_json::Value::as_array).ok_or_else(|| drift("has no path"))?
    {
        path.push(PathEntry {
            key: entry
                .get("key")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| drift("has a path entry without a key"))?
                .into(),
            value: entry.get("value").and_then(serde_json::Value::as_str).map(Into::into),
            share_threshold: entry
                .get("share_threshold")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
            order: entry
                .get("order")
                .and_then(serde_json::Value::as_u64)
                .and_then(|order| u32::try_from(order).ok())
                .unwrap_or(0),
        });
    }
    let limit = match value.get("limit") {
        None | Some(serde_json::Value::Null) => PathLimit::Unset,
        Some(serde_json::Value::String(text)) if text == "unlimited" => PathLimit::Unlimited,
        Some(limit) => PathLimit::PerUnit {
            requests_per_unit: limit
                .get("requests_per_unit")
                .and_then(serde_json::Value::as_u64)
                .and_then(|count| u32::try_from(count).ok())
                .ok_or_else(|| drift("has a limit without requests_per_unit"))?,
            unit: limit
                .get("unit")
                .and_then(serde_json::Value::as_str)
                .and_then(Unit::parse)
                .ok_or_else(|| drift("has a limit without a unit"))?,
        },
    };
    Ok(DescriptorRule {
        service: Service::parse(service).map_err(unavailable)?,
        path,
        limit,
        name: value.get("name").and_then(text_of),
        replaces: value
            .get("replaces")
            .and_then(serde_json::Value::as_array)
            .map(|names| names.iter().filter_map(text_of).collect())
            .unwrap_or_default(),
        shadow_mode: flag("shadow_mode"),
        quota_mode: flag("quota_mode"),
        detailed_metric: flag("detailed_metric"),
        value_to_metric: flag("value_to_metric"),
        source,
    })
}

/// A rule's content from the columns every query names alike. The table's CHECKs hold the
/// model's rules, so content that fails them means the two have drifted apart: the store
/// failing to answer, not a rule to act on.
fn spec_from_row(row: &PgRow) -> Result<RuleSpec, RepositoryError> {
    let service: String = row.try_get("service").map_err(unavailable)?;
    let descriptor: Option<String> = row.try_get("descriptor_json").map_err(unavailable)?;
    if let Some(descriptor) = descriptor {
        let source: Option<String> = row.try_get("source").map_err(unavailable)?;
        let rule = descriptor_from_json(&service, source.unwrap_or_default(), &descriptor)?;
        return RuleSpec::from_descriptor(rule).map_err(unavailable);
    }
    let selector_json: String = row.try_get("selector_json").map_err(unavailable)?;
    let members: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&selector_json).map_err(unavailable)?;
    let mut pairs = Vec::with_capacity(members.len());
    for (attribute, value) in members {
        let serde_json::Value::String(value) = value else {
            return Err(RepositoryError(format!("a selector value of {attribute:?} is not a string").into()));
        };
        pairs.push((attribute, value));
    }
    let (service, scope, selector) = if service == OWN_SERVICE {
        let selector = Selector::from_pairs(pairs.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .map_err(unavailable)?;
        let scope: Option<String> = row.try_get("scope").map_err(unavailable)?;
        (None, scope.unwrap_or_default(), selector)
    } else {
        let api: Option<String> = row.try_get("api").map_err(unavailable)?;
        (Some(ServiceDraft { service, api, selector: pairs }), String::new(), Selector::AllDomains)
    };
    let per_ms: i32 = row.try_get("per_ms").map_err(unavailable)?;
    let priority: i32 = row.try_get("priority").map_err(unavailable)?;
    RuleDraft {
        service,
        scope,
        selector,
        rate: row.try_get("rate").map_err(unavailable)?,
        per_ms: Some(i64::from(per_ms)),
        burst: row.try_get("burst").map_err(unavailable)?,
        algorithm: Some(row.try_get("algorithm").map_err(unavailable)?),
        mode: Some(row.try_get("mode").map_err(unavailable)?),
        fail_mode: Some(row.try_get("fail_mode").map_err(unavailable)?),
        priority: Some(i64::from(priority)),
        charge: Some(row.try_get("charge").map_err(unavailable)?),
    }
    .validate()
    .map_err(unavailable)
}

fn rule_from_row(row: &PgRow) -> Result<Rule, RepositoryError> {
    let id: String = row.try_get("rule_id").map_err(unavailable)?;
    let created_by: String = row.try_get("created_by").map_err(unavailable)?;
    Ok(Rule {
        id: RuleId::parse(id).map_err(unavailable)?,
        spec: spec_from_row(row)?,
        version: stored_version(row.try_get("version").map_err(unavailable)?)?,
        created_by: Actor::new(created_by).map_err(unavailable)?,
        updated_at: row.try_get("updated_at").map_err(unavailable)?,
    })
}

fn version_from_row(row: &PgRow) -> Result<RuleVersion, RepositoryError> {
    let change: String = row.try_get("change").map_err(unavailable)?;
    let rolled_back_to: Option<i64> = row.try_get("rolled_back_to").map_err(unavailable)?;
    let change = match (change.as_str(), rolled_back_to) {
        ("created", None) => Change::Created,
        ("replaced", None) => Change::Replaced,
        ("rolled_back", Some(to)) => Change::RolledBack { to: stored_version(to)? },
        ("deleted", None) => Change::Deleted,
        _ => return Err(RepositoryError(format!("unknown change {change:?} in rule_versions").into())),
    };
    let created_by: String = row.try_get("created_by").map_err(unavailable)?;
    Ok(RuleVersion {
        version: stored_version(row.try_get("version").map_err(unavailable)?)?,
        change,
        spec: spec_from_row(row)?,
        created_by: Actor::new(created_by).map_err(unavailable)?,
        created_at: row.try_get("created_at").map_err(unavailable)?,
        revision: row.try_get("revision").map_err(unavailable)?,
    })
}

fn count(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn stored_count(row: &PgRow, column: &str) -> Result<u64, RepositoryError> {
    let value: i64 = row.try_get(column).map_err(unavailable)?;
    u64::try_from(value).map_err(unavailable)
}

#[async_trait::async_trait]
impl RulesRepository for PgRulesRepository {
    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id))]
    async fn create(&self, id: &RuleId, spec: &RuleSpec, actor: &Actor) -> Result<Created, RepositoryError> {
        for _ in 0..CREATE_ATTEMPTS {
            let statement = || {
                bind_descriptor(
                    bind_spec(sqlx::query(CREATE).bind(id.as_str().to_owned()), spec, actor)
                        .bind(CHANGES_CHANNEL),
                    spec,
                )
            };
            if let Some(row) = self.retrying_version_races(statement).await? {
                return Ok(Created::Created(rule_from_row(&row)?));
            }
            // A rule of this id stood when the insert ran; say which version, unless it was
            // deleted in between, in which case the insert is worth another try.
            if let Some(current) = self.current_version(id).await? {
                return Ok(Created::Exists(current));
            }
        }
        Err(RepositoryError("the rule kept being created and deleted while it was written".into()))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id, expected = %expected))]
    async fn replace(
        &self,
        id: &RuleId,
        spec: &RuleSpec,
        expected: Version,
        actor: &Actor,
    ) -> Result<Replaced<Rule>, RepositoryError> {
        let row = bind_descriptor(
            bind_spec(sqlx::query(REPLACE).bind(id.as_str()), spec, actor)
                .bind(CHANGES_CHANNEL)
                .bind(expected.get()),
            spec,
        )
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        match row {
            Some(row) => Ok(Replaced::Applied(rule_from_row(&row)?)),
            None => Ok(Replaced::Stale { current: self.current_version(id).await? }),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id, expected = %expected))]
    async fn delete(
        &self,
        id: &RuleId,
        expected: Version,
        actor: &Actor,
    ) -> Result<Replaced<Version>, RepositoryError> {
        let deleted: Option<(i64, i64)> = sqlx::query_as(DELETE)
            .bind(id.as_str())
            .bind(expected.get())
            .bind(actor.as_str())
            .bind(CHANGES_CHANNEL)
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        match deleted {
            Some((version, _)) => Ok(Replaced::Applied(stored_version(version)?)),
            None => Ok(Replaced::Stale { current: self.current_version(id).await? }),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id, to = %to))]
    async fn rollback(
        &self,
        id: &RuleId,
        to: Version,
        expected: Option<Version>,
        actor: &Actor,
    ) -> Result<RolledBack, RepositoryError> {
        let statement = || {
            let query = sqlx::query(if expected.is_some() { ROLLBACK_IF_MATCH } else { ROLLBACK })
                .bind(id.as_str().to_owned())
                .bind(to.get())
                .bind(actor.as_str().to_owned())
                .bind(CHANGES_CHANNEL);
            match expected {
                Some(expected) => query.bind(expected.get()),
                None => query,
            }
        };
        if let Some(row) = self.retrying_version_races(statement).await? {
            let recreated: bool = row.try_get("recreated").map_err(unavailable)?;
            return Ok(RolledBack::Applied { rule: rule_from_row(&row)?, recreated });
        }
        let (known, target, current): (bool, Option<String>, Option<i64>) = sqlx::query_as(ROLLBACK_REFUSAL)
            .bind(id.as_str())
            .bind(to.get())
            .fetch_one(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(match (known, target.as_deref()) {
            (false, _) => RolledBack::UnknownRule,
            (true, None) => RolledBack::UnknownVersion,
            (true, Some("deleted")) => RolledBack::DeletionVersion,
            (true, Some(_)) => RolledBack::Stale { current: current.map(stored_version).transpose()? },
        })
    }

    #[tracing::instrument(level = "debug", skip_all, fields(writes = writes.len()))]
    async fn apply(&self, writes: &[Write], actor: &Actor) -> Result<Option<Vec<Version>>, RepositoryError> {
        // One transaction on one connection: behind a transaction pooler the pool's hooks
        // opened one already, and BEGIN inside it only warns.
        let mut transaction = self.pool.pool().begin().await.map_err(unavailable)?;
        let mut versions = Vec::with_capacity(writes.len());
        for write in writes {
            let made = match write {
                Write::Create { id, spec } => bind_descriptor(
                    bind_spec(sqlx::query(CREATE).bind(id.as_str().to_owned()), spec, actor)
                        .bind(CHANGES_CHANNEL),
                    spec,
                )
                .fetch_optional(&mut *transaction)
                .await
                .map_err(unavailable)?
                .map(|row| row.try_get::<i64, _>("version"))
                .transpose()
                .map_err(unavailable)?,
                Write::Replace { id, spec, expected } => bind_descriptor(
                    bind_spec(sqlx::query(REPLACE).bind(id.as_str()), spec, actor)
                        .bind(CHANGES_CHANNEL)
                        .bind(expected.get()),
                    spec,
                )
                .fetch_optional(&mut *transaction)
                .await
                .map_err(unavailable)?
                .map(|row| row.try_get::<i64, _>("version"))
                .transpose()
                .map_err(unavailable)?,
                Write::Delete { id, expected } => sqlx::query_as::<_, (i64, i64)>(DELETE)
                    .bind(id.as_str())
                    .bind(expected.get())
                    .bind(actor.as_str())
                    .bind(CHANGES_CHANNEL)
                    .fetch_optional(&mut *transaction)
                    .await
                    .map_err(unavailable)?
                    .map(|(version, _)| version),
            };
            match made {
                Some(version) => versions.push(stored_version(version)?),
                None => {
                    transaction.rollback().await.map_err(unavailable)?;
                    return Ok(None);
                }
            }
        }
        transaction.commit().await.map_err(unavailable)?;
        Ok(Some(versions))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id))]
    async fn get(&self, id: &RuleId) -> Result<Option<Rule>, RepositoryError> {
        let row = sqlx::query(GET).bind(id.as_str()).fetch_optional(&self.pool).await.map_err(unavailable)?;
        row.as_ref().map(rule_from_row).transpose()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list<'a>(
        &self,
        scope: Option<Scope>,
        service: Option<&'a str>,
    ) -> Result<Vec<Rule>, RepositoryError> {
        let rows = sqlx::query(LIST)
            .bind(scope.map(Scope::as_str))
            .bind(service)
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
        rows.iter().map(rule_from_row).collect()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id))]
    async fn history(&self, id: &RuleId) -> Result<Vec<RuleVersion>, RepositoryError> {
        let rows = sqlx::query(HISTORY).bind(id.as_str()).fetch_all(&self.pool).await.map_err(unavailable)?;
        rows.iter().map(version_from_row).collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn load(&self) -> Result<(i64, Vec<Rule>), RepositoryError> {
        // The revision and the rules must agree: one statement reads both from one snapshot.
        let rows = sqlx::query(LOAD).fetch_all(&self.pool).await.map_err(unavailable)?;
        let first =
            rows.first().ok_or_else(|| RepositoryError("the rules' revision row is missing".into()))?;
        let revision: i64 = first.try_get("snapshot_revision").map_err(unavailable)?;
        let mut rules = Vec::with_capacity(rows.len());
        for row in &rows {
            let rule_id: Option<String> = row.try_get("rule_id").map_err(unavailable)?;
            if rule_id.is_some() {
                rules.push(rule_from_row(row)?);
            }
        }
        Ok((revision, rules))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn revision(&self) -> Result<i64, RepositoryError> {
        sqlx::query_scalar(REVISION).fetch_one(&self.pool).await.map_err(unavailable)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(counts = counts.len()))]
    async fn add_usage(&self, counts: &[UsageCount]) -> Result<(), RepositoryError> {
        let rule_ids: Vec<&str> = counts.iter().map(|count| count.rule.as_str()).collect();
        let minutes: Vec<DateTime<Utc>> = counts.iter().map(|count| count.minute).collect();
        let granted: Vec<i64> = counts.iter().map(|c| count(c.granted)).collect();
        let refused: Vec<i64> = counts.iter().map(|c| count(c.refused)).collect();
        let shadow_refused: Vec<i64> = counts.iter().map(|c| count(c.shadow_refused)).collect();
        sqlx::query(ADD_USAGE)
            .bind(rule_ids)
            .bind(minutes)
            .bind(granted)
            .bind(refused)
            .bind(shadow_refused)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id))]
    async fn usage(&self, id: &RuleId, since: DateTime<Utc>) -> Result<Vec<UsageMinute>, RepositoryError> {
        let rows = sqlx::query(USAGE)
            .bind(id.as_str())
            .bind(since)
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                Ok(UsageMinute {
                    minute: row.try_get("minute").map_err(unavailable)?,
                    granted: stored_count(row, "granted")?,
                    refused: stored_count(row, "refused")?,
                    shadow_refused: stored_count(row, "shadow_refused")?,
                })
            })
            .collect()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn prune_usage(&self, before: DateTime<Utc>) -> Result<u64, RepositoryError> {
        let done = sqlx::query(PRUNE_USAGE).bind(before).execute(&self.pool).await.map_err(unavailable)?;
        Ok(done.rows_affected())
    }
}
