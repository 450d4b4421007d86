//! The knobs: environment variables read once at boot into a typed [`Config`].
//!
//! Nothing below the composition root reads the environment; every value is passed down
//! explicitly. `.env.example` documents each knob with its default.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use ratebudget::Budget;
use sqlx::postgres::PgConnectOptions;

/// `DATABASE_URL`: the PostgreSQL database every replica shares.
pub const DATABASE_URL: &str = "DATABASE_URL";
/// `PLEXSPHERE_LISTEN`: the address the HTTP API listens on.
pub const LISTEN: &str = "PLEXSPHERE_LISTEN";
/// `PLEXSPHERE_OPERATOR_TOKEN`: the bearer token of the operator routes.
pub const OPERATOR_TOKEN: &str = "PLEXSPHERE_OPERATOR_TOKEN";
/// `PLEXSPHERE_SWEEP_INTERVAL_SECS`: how often the leader runs `rate-budget-sweep`.
pub const SWEEP_INTERVAL_SECS: &str = "PLEXSPHERE_SWEEP_INTERVAL_SECS";
/// `PLEXSPHERE_DATABASE_TIMEOUT_MS`: the longest a request waits for the database.
pub const DATABASE_TIMEOUT_MS: &str = "PLEXSPHERE_DATABASE_TIMEOUT_MS";
/// `PLEXSPHERE_DATABASE_MAX_CONNECTIONS`: the request pool's size.
pub const DATABASE_MAX_CONNECTIONS: &str = "PLEXSPHERE_DATABASE_MAX_CONNECTIONS";
/// `PLEXSPHERE_INGEST_MAX_BATCH_BYTES`: the largest telemetry batch accepted (413 above it).
pub const INGEST_MAX_BATCH_BYTES: &str = "PLEXSPHERE_INGEST_MAX_BATCH_BYTES";

/// The rate and burst knobs of each scope, and their defaults.
///
/// The defaults refill an empty bucket to full in 2 s (secret reads), 5 s (issuance) and 4 s
/// (ingest). That is what makes the sweep's one-hour retention safe: a bucket idle for an
/// hour is a full bucket, and deleting it is what the next take would mint.
pub const BUDGET_KNOBS: [BudgetKnob; 5] = [
    BudgetKnob {
        per_second: "PLEXSPHERE_SECRET_READ_NODE_PER_SECOND",
        burst: "PLEXSPHERE_SECRET_READ_NODE_BURST",
        default: Budget { per_second: 10.0, burst: 20.0 },
    },
    BudgetKnob {
        per_second: "PLEXSPHERE_SECRET_READ_DOMAIN_PER_SECOND",
        burst: "PLEXSPHERE_SECRET_READ_DOMAIN_BURST",
        default: Budget { per_second: 100.0, burst: 200.0 },
    },
    BudgetKnob {
        per_second: "PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND",
        burst: "PLEXSPHERE_ACCESS_ISSUANCE_BURST",
        default: Budget { per_second: 2.0, burst: 10.0 },
    },
    BudgetKnob {
        per_second: "PLEXSPHERE_INGEST_NODE_BYTES_PER_SECOND",
        burst: "PLEXSPHERE_INGEST_NODE_BYTES_BURST",
        default: Budget { per_second: 262_144.0, burst: 1_048_576.0 },
    },
    BudgetKnob {
        per_second: "PLEXSPHERE_INGEST_DOMAIN_BYTES_PER_SECOND",
        burst: "PLEXSPHERE_INGEST_DOMAIN_BYTES_BURST",
        default: Budget { per_second: 2_097_152.0, burst: 8_388_608.0 },
    },
];

/// The two variables that size one scope's default budget.
#[derive(Clone, Copy, Debug)]
pub struct BudgetKnob {
    /// The rate variable.
    pub per_second: &'static str,
    /// The burst variable.
    pub burst: &'static str,
    /// The budget when neither is set.
    pub default: Budget,
}

/// The process-wide default budget of each scope.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budgets {
    /// `secret_read_node`, in reads.
    pub secret_read_node: Budget,
    /// `secret_read_domain`, in reads.
    pub secret_read_domain: Budget,
    /// `access_issuance_domain`, in enrolments; a Domain's own policy overrides it.
    pub access_issuance: Budget,
    /// `ingest_node`, in bytes.
    pub ingest_node: Budget,
    /// `ingest_domain`, in bytes.
    pub ingest_domain: Budget,
}

/// Everything the process reads from its environment, validated.
///
/// Its `Debug` leaves out the operator token and the database password.
#[derive(Clone)]
pub struct Config {
    /// The shared database.
    pub database: PgConnectOptions,
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// The operator routes' bearer token.
    pub operator_token: String,
    /// The default budgets.
    pub budgets: Budgets,
    /// How often the leader sweeps idle buckets.
    pub sweep_interval: Duration,
    /// The longest any request waits for the database before it answers 500.
    pub database_timeout: Duration,
    /// The request pool's size.
    pub database_max_connections: u32,
    /// The largest telemetry batch accepted.
    pub ingest_max_batch_bytes: usize,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("database_host", &self.database.get_host())
            .field("database_port", &self.database.get_port())
            .field("database_name", &self.database.get_database())
            .field("listen", &self.listen)
            .field("operator_token", &"<redacted>")
            .field("budgets", &self.budgets)
            .field("sweep_interval", &self.sweep_interval)
            .field("database_timeout", &self.database_timeout)
            .field("database_max_connections", &self.database_max_connections)
            .field("ingest_max_batch_bytes", &self.ingest_max_batch_bytes)
            .finish()
    }
}

/// A knob that is missing or unusable; `serve` prints it and refuses to start.
#[derive(Debug, thiserror::Error)]
#[error("{knob}: {problem}")]
pub struct ConfigError {
    /// The variable's name.
    pub knob: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl Config {
    /// Reads and validates every knob from the process environment.
    ///
    /// # Errors
    /// The first knob that is missing or invalid.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_vars(&std::env::vars().collect())
    }

    /// Reads and validates every knob from `vars`, as [`Config::from_env`] does.
    ///
    /// # Errors
    /// The first knob that is missing or invalid.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let get = |knob: &'static str| vars.get(knob).map(|value| value.trim()).filter(|v| !v.is_empty());

        let database_url = get(DATABASE_URL).ok_or_else(|| missing(DATABASE_URL))?;
        if !(database_url.starts_with("postgres://") || database_url.starts_with("postgresql://")) {
            return Err(ConfigError {
                knob: DATABASE_URL,
                problem: "must be a postgres:// or postgresql:// URL".into(),
            });
        }
        let database = PgConnectOptions::from_str(database_url).map_err(|error| ConfigError {
            knob: DATABASE_URL,
            problem: format!("not a PostgreSQL URL: {error}"),
        })?;

        let operator_token = get(OPERATOR_TOKEN).ok_or_else(|| missing(OPERATOR_TOKEN))?.to_owned();
        if operator_token.len() < 16 {
            return Err(ConfigError {
                knob: OPERATOR_TOKEN,
                problem: "must be at least 16 characters; generate one with `openssl rand -hex 32`".into(),
            });
        }

        let budget = |knob: &BudgetKnob| -> Result<Budget, ConfigError> {
            let per_second = parse_or(get(knob.per_second), knob.per_second, knob.default.per_second)?;
            let burst = parse_or(get(knob.burst), knob.burst, knob.default.burst)?;
            if !(per_second.is_finite() && per_second > 0.0) {
                return Err(ConfigError {
                    knob: knob.per_second,
                    problem: "must be a number above 0".into(),
                });
            }
            if !(burst.is_finite() && burst >= 1.0) {
                return Err(ConfigError {
                    knob: knob.burst,
                    problem: "must be a number of at least 1".into(),
                });
            }
            // The idle sweep deletes buckets idle for an hour because such a bucket is full;
            // a budget that takes longer to refill would be handed out early by the sweep.
            if burst / per_second > crate::sweep::RETENTION.num_seconds() as f64 {
                return Err(ConfigError {
                    knob: knob.burst,
                    problem: format!(
                        "{burst} at {per_second} a second takes over an hour to refill, and the idle sweep deletes buckets after an hour as if full; raise {} or lower the burst",
                        knob.per_second
                    ),
                });
            }
            Ok(Budget { per_second, burst })
        };
        let [secret_read_node, secret_read_domain, access_issuance, ingest_node, ingest_domain] =
            BUDGET_KNOBS;
        let budgets = Budgets {
            secret_read_node: budget(&secret_read_node)?,
            secret_read_domain: budget(&secret_read_domain)?,
            access_issuance: budget(&access_issuance)?,
            ingest_node: budget(&ingest_node)?,
            ingest_domain: budget(&ingest_domain)?,
        };

        let ingest_max_batch_bytes: usize =
            parse_or(get(INGEST_MAX_BATCH_BYTES), INGEST_MAX_BATCH_BYTES, 1_048_576)?;
        if ingest_max_batch_bytes == 0 {
            return Err(ConfigError { knob: INGEST_MAX_BATCH_BYTES, problem: "must be above 0".into() });
        }
        // A batch larger than a quota's burst could never be admitted: it would be refused
        // forever with a Retry-After that lies. Such a batch must be a 413 instead.
        for (knob, budget) in
            [(ingest_node.burst, budgets.ingest_node), (ingest_domain.burst, budgets.ingest_domain)]
        {
            if (ingest_max_batch_bytes as f64) > budget.burst {
                return Err(ConfigError {
                    knob,
                    problem: format!(
                        "{} is below {INGEST_MAX_BATCH_BYTES} ({ingest_max_batch_bytes}): the largest batch could never be admitted",
                        budget.burst
                    ),
                });
            }
        }

        let listen = parse_or(get(LISTEN), LISTEN, SocketAddr::from(([127, 0, 0, 1], 8080)))?;
        let sweep_secs: u64 = parse_or(get(SWEEP_INTERVAL_SECS), SWEEP_INTERVAL_SECS, 3600)?;
        if sweep_secs == 0 {
            return Err(ConfigError { knob: SWEEP_INTERVAL_SECS, problem: "must be at least 1".into() });
        }
        let timeout_ms: u64 = parse_or(get(DATABASE_TIMEOUT_MS), DATABASE_TIMEOUT_MS, 3000)?;
        if !(50..=60_000).contains(&timeout_ms) {
            return Err(ConfigError {
                knob: DATABASE_TIMEOUT_MS,
                problem: "must be between 50 and 60000".into(),
            });
        }
        let database_max_connections: u32 =
            parse_or(get(DATABASE_MAX_CONNECTIONS), DATABASE_MAX_CONNECTIONS, 16)?;
        if database_max_connections == 0 {
            return Err(ConfigError { knob: DATABASE_MAX_CONNECTIONS, problem: "must be at least 1".into() });
        }

        Ok(Config {
            database,
            listen,
            operator_token,
            budgets,
            sweep_interval: Duration::from_secs(sweep_secs),
            database_timeout: Duration::from_millis(timeout_ms),
            database_max_connections,
            ingest_max_batch_bytes,
        })
    }
}

fn missing(knob: &'static str) -> ConfigError {
    ConfigError { knob, problem: "is required and not set".into() }
}

fn parse_or<T: FromStr>(value: Option<&str>, knob: &'static str, default: T) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match value {
        None => Ok(default),
        Some(text) => text
            .parse()
            .map_err(|error| ConfigError { knob, problem: format!("cannot parse {text:?}: {error}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut vars: HashMap<String, String> = [
            (DATABASE_URL, "postgres://postgres@127.0.0.1:5432/postgres"),
            (OPERATOR_TOKEN, "0123456789abcdef0123"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (k, v) in pairs {
            vars.insert((*k).to_owned(), (*v).to_owned());
        }
        vars
    }

    #[track_caller]
    fn rejects(pairs: &[(&str, &str)], knob: &str) {
        let error = Config::from_vars(&vars(pairs)).unwrap_err();
        assert_eq!(error.knob, knob, "{error}");
    }

    #[test]
    fn defaults_refill_to_full_in_the_documented_seconds() {
        let config = Config::from_vars(&vars(&[])).unwrap();
        let seconds = |b: Budget| b.burst / b.per_second;
        assert_eq!(seconds(config.budgets.secret_read_node), 2.0);
        assert_eq!(seconds(config.budgets.secret_read_domain), 2.0);
        assert_eq!(seconds(config.budgets.access_issuance), 5.0);
        assert_eq!(seconds(config.budgets.ingest_node), 4.0);
        assert_eq!(seconds(config.budgets.ingest_domain), 4.0);
        assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(config.sweep_interval, Duration::from_secs(3600));
    }

    #[test]
    fn knobs_override_the_defaults() {
        let config = Config::from_vars(&vars(&[
            ("PLEXSPHERE_SECRET_READ_NODE_PER_SECOND", "2.5"),
            ("PLEXSPHERE_SECRET_READ_NODE_BURST", "5"),
            (SWEEP_INTERVAL_SECS, "60"),
            (LISTEN, "0.0.0.0:9000"),
        ]))
        .unwrap();
        assert_eq!(config.budgets.secret_read_node, Budget { per_second: 2.5, burst: 5.0 });
        assert_eq!(config.sweep_interval, Duration::from_secs(60));
        assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
    }

    #[test]
    fn invalid_knobs_are_named() {
        rejects(&[(OPERATOR_TOKEN, "")], OPERATOR_TOKEN);
        rejects(&[(OPERATOR_TOKEN, "short")], OPERATOR_TOKEN);
        rejects(&[(DATABASE_URL, "mysql://x")], DATABASE_URL);
        rejects(&[("PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND", "0")], "PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND");
        rejects(&[("PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND", "NaN")], "PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND");
        rejects(&[("PLEXSPHERE_SECRET_READ_DOMAIN_BURST", "0.5")], "PLEXSPHERE_SECRET_READ_DOMAIN_BURST");
        rejects(&[("PLEXSPHERE_SECRET_READ_DOMAIN_BURST", "lots")], "PLEXSPHERE_SECRET_READ_DOMAIN_BURST");
        rejects(&[(SWEEP_INTERVAL_SECS, "0")], SWEEP_INTERVAL_SECS);
        rejects(&[(LISTEN, "localhost")], LISTEN);
        rejects(&[(DATABASE_TIMEOUT_MS, "0")], DATABASE_TIMEOUT_MS);
        rejects(&[("PLEXSPHERE_INGEST_NODE_BYTES_BURST", "1000")], "PLEXSPHERE_INGEST_NODE_BYTES_BURST");
        // 20 reads at one every ten minutes: over an hour to refill.
        rejects(&[("PLEXSPHERE_SECRET_READ_NODE_PER_SECOND", "0.0016")], "PLEXSPHERE_SECRET_READ_NODE_BURST");
    }

    #[test]
    fn every_budget_must_refill_within_the_sweeps_retention_and_domain_policies_agree() {
        let config = Config::from_vars(&vars(&[
            ("PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND", "0.01"),
            ("PLEXSPHERE_ACCESS_ISSUANCE_BURST", "36"),
        ]))
        .unwrap();
        assert_eq!(config.budgets.access_issuance, Budget { per_second: 0.01, burst: 36.0 });
        rejects(
            &[
                ("PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND", "0.01"),
                ("PLEXSPHERE_ACCESS_ISSUANCE_BURST", "36.5"),
            ],
            "PLEXSPHERE_ACCESS_ISSUANCE_BURST",
        );
        // A Domain's own policy is checked by the access context against its own constant.
        assert_eq!(access::MAX_REFILL_SECONDS, crate::sweep::RETENTION.num_seconds() as f64);
    }

    #[test]
    fn debug_does_not_show_the_operator_token_or_the_database_password() {
        let config = Config::from_vars(&vars(&[(
            DATABASE_URL,
            "postgres://app:pa55word@db.internal:5433/plexsphere",
        )]))
        .unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("0123456789abcdef0123"), "{shown}");
        assert!(!shown.contains("pa55word"), "{shown}");
        assert!(shown.contains("db.internal"), "{shown}");
    }

    #[test]
    fn a_missing_database_url_is_named() {
        let mut without = vars(&[]);
        without.remove(DATABASE_URL);
        assert_eq!(Config::from_vars(&without).unwrap_err().knob, DATABASE_URL);
    }
}
