//! The knobs: environment variables read once at boot.
//!
//! Two steps, as ripgrep separates low-level from high-level arguments: [`Knobs`] is what clap
//! parses (names, defaults and help text in one place, so `plexsphere serve --help` lists every
//! knob), and [`Config::from_knobs`] validates it into the typed [`Config`] the rest of the
//! process is built from. Nothing below the composition root reads the environment.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::{Args, FromArgMatches};
use ipnet::IpNet;

use ratebudget::{Limit, Scope};
use rules::Services;
use service::{DefaultBudget, DefaultBudgets};
use sqlx::postgres::PgConnectOptions;

mod redacted;

pub use redacted::{Database, Redacted};

/// `DATABASE_URL`: the PostgreSQL database every replica shares.
pub const DATABASE_URL: &str = "DATABASE_URL";
/// What marks the test suite's default `DATABASE_URL` (`.cargo/config.toml`): cargo hands it to
/// `cargo run` too, and no command may connect to a database its user did not name.
pub const TESTS_DEFAULT_DATABASE_MARK: &str = "application_name=plexsphere-tests-default";
/// `PLEXSPHERE_LISTEN`: the address the HTTP API listens on.
pub const LISTEN: &str = "PLEXSPHERE_LISTEN";
/// `PLEXSPHERE_OPERATOR_TOKEN`: one operator token, named `operator`.
pub const OPERATOR_TOKEN: &str = "PLEXSPHERE_OPERATOR_TOKEN";
/// `PLEXSPHERE_OPERATOR_TOKENS`: named operator tokens, `name:token,name:token`.
pub const OPERATOR_TOKENS: &str = "PLEXSPHERE_OPERATOR_TOKENS";
/// `PLEXSPHERE_SESSION_DATABASE_URL`: the database as a session reaches it (not through a
/// transaction pooler), for what needs one: LISTEN, the leader lock, migrations.
pub const SESSION_DATABASE_URL: &str = "PLEXSPHERE_SESSION_DATABASE_URL";
/// `PLEXSPHERE_DATABASE_POOLER`: what `DATABASE_URL` reaches: `none` (the server itself) or
/// `transaction` (a transaction-mode pooler such as PgBouncer).
pub const DATABASE_POOLER: &str = "PLEXSPHERE_DATABASE_POOLER";
/// `PLEXSPHERE_LIMITER_SYNCHRONOUS_COMMIT`: the limiters' commit mode (docs/adr/0004).
pub const LIMITER_SYNCHRONOUS_COMMIT: &str = "PLEXSPHERE_LIMITER_SYNCHRONOUS_COMMIT";
/// `PLEXSPHERE_DECIDE_TOKENS`: the tokens of services and proxies that ask for decisions,
/// `name:token` or `name:token:service|service`, comma-separated; unset, the decide API is off.
pub const DECIDE_TOKENS: &str = "PLEXSPHERE_DECIDE_TOKENS";
/// `PLEXSPHERE_GRPC_LISTEN`: where Envoy's rate limit service protocol is served; unset, it is
/// not.
pub const GRPC_LISTEN: &str = "PLEXSPHERE_GRPC_LISTEN";
/// `PLEXSPHERE_RLQS_TTL_SECONDS`: how long an RLQS assignment lasts (docs/adr/0041).
pub const RLQS_TTL_SECONDS: &str = "PLEXSPHERE_RLQS_TTL_SECONDS";
/// `PLEXSPHERE_RLQS_MAX_ROUND_TRIP_MS`: the longest an RLQS assignment or report takes to
/// arrive (docs/adr/0041).
pub const RLQS_MAX_ROUND_TRIP_MS: &str = "PLEXSPHERE_RLQS_MAX_ROUND_TRIP_MS";
/// The name `PLEXSPHERE_OPERATOR_TOKEN`'s token acts under.
pub const SINGLE_OPERATOR_NAME: &str = "operator";
/// The fewest characters of an operator token.
const OPERATOR_TOKEN_MIN_CHARS: usize = 16;
/// `PLEXSPHERE_SECRETS_KEY`: the key secret values are sealed with.
pub const SECRETS_KEY: &str = "PLEXSPHERE_SECRETS_KEY";
/// `PLEXSPHERE_SECRETS_OLD_KEYS`: keys that sealed values before a rotation.
pub const SECRETS_OLD_KEYS: &str = "PLEXSPHERE_SECRETS_OLD_KEYS";
/// The README quick start's `PLEXSPHERE_SECRETS_KEY`, base64 of
/// `development-key-never-production`: `serve` warns when it seals with it.
pub const DEVELOPMENT_SECRETS_KEY: &str = "ZGV2ZWxvcG1lbnQta2V5LW5ldmVyLXByb2R1Y3Rpb24=";
/// `PLEXSPHERE_SWEEP_INTERVAL_SECS`: how often the leader runs `rate-budget-sweep`.
pub const SWEEP_INTERVAL_SECS: &str = "PLEXSPHERE_SWEEP_INTERVAL_SECS";
/// `PLEXSPHERE_DATABASE_TIMEOUT_MS`: the longest a request waits for the database.
pub const DATABASE_TIMEOUT_MS: &str = "PLEXSPHERE_DATABASE_TIMEOUT_MS";
/// `PLEXSPHERE_DATABASE_MAX_CONNECTIONS`: the request pool's size.
pub const DATABASE_MAX_CONNECTIONS: &str = "PLEXSPHERE_DATABASE_MAX_CONNECTIONS";
/// `PLEXSPHERE_INGEST_MAX_BATCH_BYTES`: the largest telemetry batch accepted (413 above it).
pub const INGEST_MAX_BATCH_BYTES: &str = "PLEXSPHERE_INGEST_MAX_BATCH_BYTES";
/// `PLEXSPHERE_HTTP_HEADER_TIMEOUT_MS`: how long a connection may take to send a request's
/// headers (and how long a kept-alive connection may sit idle) before it is closed.
pub const HTTP_HEADER_TIMEOUT_MS: &str = "PLEXSPHERE_HTTP_HEADER_TIMEOUT_MS";
/// `PLEXSPHERE_HTTP_BODY_TIMEOUT_MS`: how long a request's whole body may take to arrive.
pub const HTTP_BODY_TIMEOUT_MS: &str = "PLEXSPHERE_HTTP_BODY_TIMEOUT_MS";
/// `PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS`: the deadline of a whole request, headers received to
/// response.
pub const HTTP_REQUEST_TIMEOUT_MS: &str = "PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS";
/// `PLEXSPHERE_HTTP_MAX_CONNECTIONS`: how many client connections a replica serves at once.
pub const HTTP_MAX_CONNECTIONS: &str = "PLEXSPHERE_HTTP_MAX_CONNECTIONS";
/// `PLEXSPHERE_SHUTDOWN_GRACE_SECS`: how long a stopping replica lets in-flight requests finish.
pub const SHUTDOWN_GRACE_SECS: &str = "PLEXSPHERE_SHUTDOWN_GRACE_SECS";
/// `PLEXSPHERE_MAX_CLOCK_SKEW_MS`: the largest error of the replica's database-corrected clock
/// it still decides with.
pub const MAX_CLOCK_SKEW_MS: &str = "PLEXSPHERE_MAX_CLOCK_SKEW_MS";
/// `PLEXSPHERE_SECRET_READ_NODE_PER_SECOND`.
pub const SECRET_READ_NODE_PER_SECOND: &str = "PLEXSPHERE_SECRET_READ_NODE_PER_SECOND";
/// `PLEXSPHERE_SECRET_READ_NODE_BURST`.
pub const SECRET_READ_NODE_BURST: &str = "PLEXSPHERE_SECRET_READ_NODE_BURST";
/// `PLEXSPHERE_SECRET_READ_DOMAIN_PER_SECOND`.
pub const SECRET_READ_DOMAIN_PER_SECOND: &str = "PLEXSPHERE_SECRET_READ_DOMAIN_PER_SECOND";
/// `PLEXSPHERE_SECRET_READ_DOMAIN_BURST`.
pub const SECRET_READ_DOMAIN_BURST: &str = "PLEXSPHERE_SECRET_READ_DOMAIN_BURST";
/// `PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND`.
pub const ACCESS_ISSUANCE_PER_SECOND: &str = "PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND";
/// `PLEXSPHERE_ACCESS_ISSUANCE_BURST`.
pub const ACCESS_ISSUANCE_BURST: &str = "PLEXSPHERE_ACCESS_ISSUANCE_BURST";
/// `PLEXSPHERE_INGEST_NODE_BYTES_PER_SECOND`.
pub const INGEST_NODE_BYTES_PER_SECOND: &str = "PLEXSPHERE_INGEST_NODE_BYTES_PER_SECOND";
/// `PLEXSPHERE_INGEST_NODE_BYTES_BURST`.
pub const INGEST_NODE_BYTES_BURST: &str = "PLEXSPHERE_INGEST_NODE_BYTES_BURST";
/// `PLEXSPHERE_INGEST_DOMAIN_BYTES_PER_SECOND`.
pub const INGEST_DOMAIN_BYTES_PER_SECOND: &str = "PLEXSPHERE_INGEST_DOMAIN_BYTES_PER_SECOND";
/// `PLEXSPHERE_INGEST_DOMAIN_BYTES_BURST`.
pub const INGEST_DOMAIN_BYTES_BURST: &str = "PLEXSPHERE_INGEST_DOMAIN_BYTES_BURST";
/// `PLEXSPHERE_AUTH_FAILURE_PER_SECOND`.
pub const AUTH_FAILURE_PER_SECOND: &str = "PLEXSPHERE_AUTH_FAILURE_PER_SECOND";
/// `PLEXSPHERE_AUTH_FAILURE_BURST`.
pub const AUTH_FAILURE_BURST: &str = "PLEXSPHERE_AUTH_FAILURE_BURST";
/// `PLEXSPHERE_TRUSTED_PROXIES`: proxies whose `X-Forwarded-For` is believed.
pub const TRUSTED_PROXIES: &str = "PLEXSPHERE_TRUSTED_PROXIES";
/// `PLEXSPHERE_TAKE_BATCH_MAX`: the most takes one coalesced call carries.
pub const TAKE_BATCH_MAX: &str = "PLEXSPHERE_TAKE_BATCH_MAX";
/// `PLEXSPHERE_SECRET_CACHE_CAPACITY`: how many secrets each replica keeps read (0: none).
pub const SECRET_CACHE_CAPACITY: &str = "PLEXSPHERE_SECRET_CACHE_CAPACITY";
/// `PLEXSPHERE_DECISION_TIMEOUT_MS`: how long a take waits for the shared store.
pub const DECISION_TIMEOUT_MS: &str = "PLEXSPHERE_DECISION_TIMEOUT_MS";
/// `PLEXSPHERE_SECRET_READ_NODE_FAIL_MODE`.
pub const SECRET_READ_NODE_FAIL_MODE: &str = "PLEXSPHERE_SECRET_READ_NODE_FAIL_MODE";
/// `PLEXSPHERE_SECRET_READ_DOMAIN_FAIL_MODE`.
pub const SECRET_READ_DOMAIN_FAIL_MODE: &str = "PLEXSPHERE_SECRET_READ_DOMAIN_FAIL_MODE";
/// `PLEXSPHERE_ACCESS_ISSUANCE_FAIL_MODE`.
pub const ACCESS_ISSUANCE_FAIL_MODE: &str = "PLEXSPHERE_ACCESS_ISSUANCE_FAIL_MODE";
/// `PLEXSPHERE_INGEST_NODE_FAIL_MODE`.
pub const INGEST_NODE_FAIL_MODE: &str = "PLEXSPHERE_INGEST_NODE_FAIL_MODE";
/// `PLEXSPHERE_INGEST_DOMAIN_FAIL_MODE`.
pub const INGEST_DOMAIN_FAIL_MODE: &str = "PLEXSPHERE_INGEST_DOMAIN_FAIL_MODE";
/// `PLEXSPHERE_RULES_POLL_INTERVAL_MS`: how often a replica checks, besides listening, that
/// its rules and Domain tiers are current.
pub const RULES_POLL_INTERVAL_MS: &str = "PLEXSPHERE_RULES_POLL_INTERVAL_MS";
/// `PLEXSPHERE_RULES_DIR`: a directory of envoyproxy/ratelimit configuration files the leader
/// applies (with prune) at start and within a few seconds of any change in it.
pub const RULES_DIR: &str = "PLEXSPHERE_RULES_DIR";
/// `PLEXSPHERE_RULES_DIR_INTERVAL_MS`: how often the leader looks at `PLEXSPHERE_RULES_DIR`.
pub const RULES_DIR_INTERVAL_MS: &str = "PLEXSPHERE_RULES_DIR_INTERVAL_MS";
/// `PLEXSPHERE_RULE_USAGE_FLUSH_INTERVAL_MS`: how often a replica adds the decisions it
/// counted per rule to the usage rows.
pub const RULE_USAGE_FLUSH_INTERVAL_MS: &str = "PLEXSPHERE_RULE_USAGE_FLUSH_INTERVAL_MS";
/// `PLEXSPHERE_LEASE_MS`: how long a replica's lease of a hot bucket lasts; 0 leases nothing.
pub const LEASE_MS: &str = "PLEXSPHERE_LEASE_MS";
/// `PLEXSPHERE_OTLP_ENDPOINT`: the OpenTelemetry collector metrics are pushed to, over
/// OTLP/HTTP; empty (the default) exports nothing.
pub const OTLP_ENDPOINT: &str = "PLEXSPHERE_OTLP_ENDPOINT";
/// `PLEXSPHERE_OTLP_INTERVAL_MS`: how often metrics are pushed there.
pub const OTLP_INTERVAL_MS: &str = "PLEXSPHERE_OTLP_INTERVAL_MS";

/// What a scope does when the shared store cannot answer, as a knob spells it: the rules'
/// words in lower case. A rule's own fail mode overrides it for the Domains the rule governs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailModeKnob {
    /// The request answers 500: no budget was evaluated, and none is invented.
    Closed,
    /// This replica's fallback bucket, an in-memory bucket of the same budget, decides until
    /// the store answers again (each replica then admits at most the whole budget on its own);
    /// a rule's `STATIC`. Spelt `local` before, which is still accepted.
    #[value(alias = "local")]
    Static,
    /// The request is admitted without a decision until the store answers again.
    Open,
}

impl From<FailModeKnob> for ratebudget::FailMode {
    fn from(knob: FailModeKnob) -> Self {
        match knob {
            FailModeKnob::Closed => ratebudget::FailMode::Closed,
            FailModeKnob::Static => ratebudget::FailMode::Static,
            FailModeKnob::Open => ratebudget::FailMode::Open,
        }
    }
}

/// What `DATABASE_URL` reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pooler {
    /// The PostgreSQL server itself: statements are prepared once per connection and kept,
    /// and each connection's settings (statement timeout, the limiters' commit mode) are
    /// startup parameters.
    None,
    /// A transaction-mode pooler (PgBouncer's `pool_mode = transaction`): consecutive
    /// transactions of one client connection may run on different server connections, so no
    /// prepared statement is kept across them (sqlx's statement cache is off: each statement
    /// is parsed unnamed in its own round trip's transaction), and no startup parameter is
    /// sent (PgBouncer refuses `options`): the server's own settings apply (README, "Behind
    /// PgBouncer").
    Transaction,
}

/// The limiters' `synchronous_commit` (docs/adr/0004): `off` by default; `on` (with a
/// synchronous standby, `remote_write` or `remote_apply`) when no granted take may be lost to
/// a crash or a failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SynchronousCommit {
    /// The commit returns before its WAL is flushed: a crash may lose the last moments' debits.
    Off,
    /// Flushed locally; a standby may still lack it.
    Local,
    /// Written (not flushed) by the synchronous standby too.
    RemoteWrite,
    /// Flushed locally and by the synchronous standby.
    On,
    /// Applied by the synchronous standby.
    RemoteApply,
}

impl SynchronousCommit {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            SynchronousCommit::Off => "off",
            SynchronousCommit::Local => "local",
            SynchronousCommit::RemoteWrite => "remote_write",
            SynchronousCommit::On => "on",
            SynchronousCommit::RemoteApply => "remote_apply",
        }
    }
}

/// Every knob of `plexsphere serve`, as parsed: each is an environment variable (or the flag
/// of the same name, for a one-off run). This is the one place knobs are named, defaulted and
/// described; validation is [`Config::from_knobs`].
///
/// The budget defaults refill an empty bucket to full in 2 s (secret reads), 5 s (issuance)
/// and 4 s (ingest). Every budget must refill within an hour, because the idle sweep deletes
/// a bucket idle for an hour as if it were full.
#[derive(Args, Clone)]
#[command(next_help_heading = "Knobs (environment variables)")]
pub struct Knobs {
    /// The PostgreSQL database every replica shares: postgres://user@host:port/database. Required.
    #[arg(long, env = DATABASE_URL, value_name = DATABASE_URL, hide_env_values = true)]
    pub database_url: Option<String>,
    /// A bearer token of the operator routes, acting as the operator named `operator`: at
    /// least 16 characters (`openssl rand -hex 32`). This or PLEXSPHERE_OPERATOR_TOKENS, or both.
    #[arg(long, env = OPERATOR_TOKEN, value_name = OPERATOR_TOKEN, hide_env_values = true)]
    pub operator_token: Option<String>,
    /// Named bearer tokens of the operator routes, `name:token` comma-separated (names of
    /// A-Z a-z 0-9 . _ -, tokens of at least 16 characters): each acts, and is audited, under
    /// its name, and one can be rotated while another works.
    #[arg(long, env = OPERATOR_TOKENS, value_name = OPERATOR_TOKENS, hide_env_values = true)]
    pub operator_tokens: Option<String>,
    /// The database as a session reaches it, for LISTEN, the leader lock and migrations,
    /// when DATABASE_URL names a transaction pooler: postgres://user@host:port/database.
    /// Unset: DATABASE_URL.
    #[arg(long, env = SESSION_DATABASE_URL, value_name = SESSION_DATABASE_URL, hide_env_values = true)]
    pub session_database_url: Option<String>,
    /// What DATABASE_URL reaches: `none`, the server itself, or `transaction`, a
    /// transaction-mode pooler such as PgBouncer (no statement kept prepared, no startup
    /// parameters).
    #[arg(long, env = DATABASE_POOLER, value_name = DATABASE_POOLER, value_enum, default_value_t = Pooler::None)]
    pub database_pooler: Pooler,
    /// The limiters' synchronous_commit: `off` (a crash or failover may lose the last moments'
    /// debits, docs/adr/0004), `local`, `remote_write`, `on` or `remote_apply` (with a
    /// synchronous standby, no granted take is lost to a failover). Behind a transaction
    /// pooler it is the server's own setting.
    #[arg(long, env = LIMITER_SYNCHRONOUS_COMMIT, value_name = LIMITER_SYNCHRONOUS_COMMIT, value_enum, default_value_t = SynchronousCommit::Off)]
    pub limiter_synchronous_commit: SynchronousCommit,
    /// Named bearer tokens of the services and proxies that ask for decisions
    /// (`POST /v1/decide`, Envoy's ShouldRateLimit, `GET /v1/snapshot`), comma-separated:
    /// `name:token` decides for every service but plexsphere's own, `name:token:a|b` for
    /// services a and b only (a token holds no `:`). Unset: the decide API is off.
    #[arg(long, env = DECIDE_TOKENS, value_name = DECIDE_TOKENS, hide_env_values = true)]
    pub decide_tokens: Option<String>,
    /// The address Envoy's rate limit service protocol (gRPC, `ShouldRateLimit`) is served on,
    /// such as 127.0.0.1:8081; it needs PLEXSPHERE_DECIDE_TOKENS. Unset: not served.
    #[arg(long, env = GRPC_LISTEN, value_name = GRPC_LISTEN, default_value = "")]
    pub grpc_listen: String,
    /// The keys secret values are sealed and opened with.
    #[command(flatten)]
    pub secrets_keys: SecretsKeys,
    /// The address the HTTP API listens on.
    #[arg(long, env = LISTEN, value_name = LISTEN, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// A Node's secret reads a second, sustained.
    #[arg(long, env = SECRET_READ_NODE_PER_SECOND, value_name = SECRET_READ_NODE_PER_SECOND, default_value_t = 10.0)]
    pub secret_read_node_per_second: f64,
    /// A Node's secret reads back to back (at least 1).
    #[arg(long, env = SECRET_READ_NODE_BURST, value_name = SECRET_READ_NODE_BURST, default_value_t = 20.0)]
    pub secret_read_node_burst: f64,
    /// All secret reads of a Domain a second, sustained.
    #[arg(long, env = SECRET_READ_DOMAIN_PER_SECOND, value_name = SECRET_READ_DOMAIN_PER_SECOND, default_value_t = 100.0)]
    pub secret_read_domain_per_second: f64,
    /// All secret reads of a Domain back to back (at least 1).
    #[arg(long, env = SECRET_READ_DOMAIN_BURST, value_name = SECRET_READ_DOMAIN_BURST, default_value_t = 200.0)]
    pub secret_read_domain_burst: f64,
    /// Node enrolments per Domain a second.
    #[arg(long, env = ACCESS_ISSUANCE_PER_SECOND, value_name = ACCESS_ISSUANCE_PER_SECOND, default_value_t = 2.0)]
    pub access_issuance_per_second: f64,
    /// Node enrolments per Domain back to back (at least 1).
    #[arg(long, env = ACCESS_ISSUANCE_BURST, value_name = ACCESS_ISSUANCE_BURST, default_value_t = 10.0)]
    pub access_issuance_burst: f64,
    /// A Node's telemetry bytes a second, sustained.
    #[arg(long, env = INGEST_NODE_BYTES_PER_SECOND, value_name = INGEST_NODE_BYTES_PER_SECOND, default_value_t = 262_144.0)]
    pub ingest_node_bytes_per_second: f64,
    /// A Node's telemetry bytes back to back (at least the largest batch).
    #[arg(long, env = INGEST_NODE_BYTES_BURST, value_name = INGEST_NODE_BYTES_BURST, default_value_t = 1_048_576.0)]
    pub ingest_node_bytes_burst: f64,
    /// All telemetry bytes of a Domain a second, sustained.
    #[arg(long, env = INGEST_DOMAIN_BYTES_PER_SECOND, value_name = INGEST_DOMAIN_BYTES_PER_SECOND, default_value_t = 2_097_152.0)]
    pub ingest_domain_bytes_per_second: f64,
    /// All telemetry bytes of a Domain back to back (at least the largest batch).
    #[arg(long, env = INGEST_DOMAIN_BYTES_BURST, value_name = INGEST_DOMAIN_BYTES_BURST, default_value_t = 8_388_608.0)]
    pub ingest_domain_bytes_burst: f64,
    /// The largest telemetry batch accepted, in bytes (413 above it).
    #[arg(long, env = INGEST_MAX_BATCH_BYTES, value_name = INGEST_MAX_BATCH_BYTES, value_parser = RangedU64ValueParser::<usize>::new().range(1..), default_value_t = 1_048_576)]
    pub ingest_max_batch_bytes: usize,
    /// How often the leader deletes buckets idle for over an hour (it also sweeps when it
    /// becomes leader).
    #[arg(long, env = SWEEP_INTERVAL_SECS, value_name = SWEEP_INTERVAL_SECS, value_parser = clap::value_parser!(u64).range(1..), default_value_t = 3600)]
    pub sweep_interval_secs: u64,
    /// The database time a request may spend in all before it answers 500 (50 to 60000).
    #[arg(long, env = DATABASE_TIMEOUT_MS, value_name = DATABASE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(50..=60_000), default_value_t = 3000)]
    pub database_timeout_ms: u64,
    /// The size of each of a replica's connection sets (the request pool and the limiters'
    /// take connections).
    #[arg(long, env = DATABASE_MAX_CONNECTIONS, value_name = DATABASE_MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 16)]
    pub database_max_connections: u32,
    /// Failed authentications a client address may make a second, sustained, across every
    /// replica (a missing, malformed, unknown or wrong token is one).
    #[arg(long, env = AUTH_FAILURE_PER_SECOND, value_name = AUTH_FAILURE_PER_SECOND, default_value_t = 0.2)]
    pub auth_failure_per_second: f64,
    /// Failed authentications a client address may make back to back (at least 1) before
    /// further attempts answer 429 without a credential lookup.
    #[arg(long, env = AUTH_FAILURE_BURST, value_name = AUTH_FAILURE_BURST, default_value_t = 20.0)]
    pub auth_failure_burst: f64,
    /// Comma-separated addresses or CIDR ranges of the proxies in front of the service; only
    /// their X-Forwarded-For is believed about a client's address (empty: none).
    #[arg(long, env = TRUSTED_PROXIES, value_name = TRUSTED_PROXIES, default_value = "")]
    pub trusted_proxies: String,
    /// The most takes one coalesced call to the database carries (1 to 1024; 1 sends every
    /// take as a statement of its own). Concurrent takes queue while a call is on the wire and
    /// go together as the next one.
    #[arg(long, env = TAKE_BATCH_MAX, value_name = TAKE_BATCH_MAX, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024), default_value_t = 64)]
    pub take_batch_max: usize,
    /// How many secrets each replica keeps read, so that reading one again costs no round
    /// trip while it does not change (0 to 10000000; 0 reads every secret from the database).
    #[arg(long, env = SECRET_CACHE_CAPACITY, value_name = SECRET_CACHE_CAPACITY, value_parser = RangedU64ValueParser::<usize>::new().range(0..=10_000_000), default_value_t = 100_000)]
    pub secret_cache_capacity: usize,
    /// How long a take waits for the shared store before it counts as not answered (and its
    /// scope's fail mode decides), in milliseconds (10 to 60000).
    #[arg(long, env = DECISION_TIMEOUT_MS, value_name = DECISION_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(10..=60_000), default_value_t = 250)]
    pub decision_timeout_ms: u64,
    /// `secret_read_node` when the store cannot answer.
    #[arg(long, env = SECRET_READ_NODE_FAIL_MODE, value_name = SECRET_READ_NODE_FAIL_MODE, value_enum, default_value_t = FailModeKnob::Closed)]
    pub secret_read_node_fail_mode: FailModeKnob,
    /// `secret_read_domain` when the store cannot answer.
    #[arg(long, env = SECRET_READ_DOMAIN_FAIL_MODE, value_name = SECRET_READ_DOMAIN_FAIL_MODE, value_enum, default_value_t = FailModeKnob::Closed)]
    pub secret_read_domain_fail_mode: FailModeKnob,
    /// `access_issuance_domain` when the store cannot answer.
    #[arg(long, env = ACCESS_ISSUANCE_FAIL_MODE, value_name = ACCESS_ISSUANCE_FAIL_MODE, value_enum, default_value_t = FailModeKnob::Closed)]
    pub access_issuance_fail_mode: FailModeKnob,
    /// `ingest_node` when the store cannot answer.
    #[arg(long, env = INGEST_NODE_FAIL_MODE, value_name = INGEST_NODE_FAIL_MODE, value_enum, default_value_t = FailModeKnob::Closed)]
    pub ingest_node_fail_mode: FailModeKnob,
    /// `ingest_domain` when the store cannot answer.
    #[arg(long, env = INGEST_DOMAIN_FAIL_MODE, value_name = INGEST_DOMAIN_FAIL_MODE, value_enum, default_value_t = FailModeKnob::Closed)]
    pub ingest_domain_fail_mode: FailModeKnob,
    /// How long a client may take to send a request's headers, and how long a kept-alive
    /// connection may sit idle, before the connection is closed (100 to 600000).
    #[arg(long, env = HTTP_HEADER_TIMEOUT_MS, value_name = HTTP_HEADER_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(100..=600_000), default_value_t = 5000)]
    pub http_header_timeout_ms: u64,
    /// How long a request's whole body may take to arrive before it answers 408 (100 to
    /// 600000).
    #[arg(long, env = HTTP_BODY_TIMEOUT_MS, value_name = HTTP_BODY_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(100..=600_000), default_value_t = 10_000)]
    pub http_body_timeout_ms: u64,
    /// The deadline of a whole request, from its headers to its response, after which it
    /// answers 503 (above the database timeout, up to 600000).
    #[arg(long, env = HTTP_REQUEST_TIMEOUT_MS, value_name = HTTP_REQUEST_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(100..=600_000), default_value_t = 15_000)]
    pub http_request_timeout_ms: u64,
    /// How many client connections are served at once; further ones wait in the listen queue
    /// until one closes (1 to 1000000).
    #[arg(long, env = HTTP_MAX_CONNECTIONS, value_name = HTTP_MAX_CONNECTIONS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000), default_value_t = 1024)]
    pub http_max_connections: usize,
    /// How long a stopping replica lets in-flight requests finish before it closes their
    /// connections and exits; a second SIGTERM or SIGINT exits at once (0 to 3600).
    #[arg(long, env = SHUTDOWN_GRACE_SECS, value_name = SHUTDOWN_GRACE_SECS, value_parser = clap::value_parser!(u64).range(0..=3600), default_value_t = 15)]
    pub shutdown_grace_secs: u64,
    /// The largest error of the replica's clock, corrected by its measured offset from the
    /// database's clock, with which it still decides; beyond it budgets answer 500 and /readyz
    /// 503 (10 to 60000).
    #[arg(long, env = MAX_CLOCK_SKEW_MS, value_name = MAX_CLOCK_SKEW_MS, value_parser = clap::value_parser!(u64).range(10..=60_000), default_value_t = 1000)]
    pub max_clock_skew_ms: u64,
    /// How often the replica checks that its rules and Domain tiers are current, besides
    /// hearing of each change at once: the backstop for a notification it missed (100 to
    /// 600000).
    #[arg(long, env = RULES_POLL_INTERVAL_MS, value_name = RULES_POLL_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(100..=600_000), default_value_t = 5000)]
    pub rules_poll_interval_ms: u64,
    /// A directory of envoyproxy/ratelimit configuration files (a mounted ConfigMap works as
    /// it is; hidden entries are skipped): the leader applies them as `plexsphere rules apply
    /// --prune` would, at start and within PLEXSPHERE_RULES_DIR_INTERVAL_MS of any change, and
    /// deletes the rules applied from files that it no longer holds. Empty: none.
    #[arg(long, env = RULES_DIR, value_name = RULES_DIR, default_value = "")]
    pub rules_dir: String,
    /// How often the leader looks for changes in PLEXSPHERE_RULES_DIR (100 to 600000).
    #[arg(long, env = RULES_DIR_INTERVAL_MS, value_name = RULES_DIR_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(100..=600_000), default_value_t = 2000)]
    pub rules_dir_interval_ms: u64,
    /// How often the replica adds the decisions it counted per rule and minute to the usage
    /// rows, in one statement (50 to 600000).
    #[arg(long, env = RULE_USAGE_FLUSH_INTERVAL_MS, value_name = RULE_USAGE_FLUSH_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(50..=600_000), default_value_t = 10_000)]
    pub rule_usage_flush_interval_ms: u64,
    /// How long a lease of a hot bucket lasts (docs/adr/0034): a replica that takes often from
    /// one bucket leases tokens of it in one statement and grants them from memory, never more
    /// than the budget; 0 (the default) leases nothing (0 to 10000).
    #[arg(long, env = LEASE_MS, value_name = LEASE_MS, value_parser = clap::value_parser!(u64).range(0..=10_000), default_value_t = 0)]
    pub lease_ms: u64,
    /// How long an RLQS assignment lasts, in whole seconds (Envoy reads only the seconds):
    /// above Envoy's report interval (5 s), so that each report renews it; what an Envoy cut
    /// off from every replica still admits after a rule changed is at most its share for this
    /// long (6 to 3600).
    #[arg(long, env = RLQS_TTL_SECONDS, value_name = RLQS_TTL_SECONDS, value_parser = clap::value_parser!(u64).range(6..=3600), default_value_t = 12)]
    pub rlqs_ttl_seconds: u64,
    /// The longest an RLQS assignment or report takes between a replica and an Envoy: an old
    /// share counts until its TTL plus this, and a report proves the Envoy has its latest
    /// assignment only when it arrives this long after it was sent (10 to 60000).
    #[arg(long, env = RLQS_MAX_ROUND_TRIP_MS, value_name = RLQS_MAX_ROUND_TRIP_MS, value_parser = clap::value_parser!(u64).range(10..=60_000), default_value_t = 1000)]
    pub rlqs_max_round_trip_ms: u64,
    /// The OpenTelemetry collector to push metrics to over OTLP/HTTP (protobuf), as its base
    /// URL, `http://host:4318`: `ratelimit.decisions` and `ratelimit.fallbacks` go to
    /// `<it>/v1/metrics`. Plain HTTP only (run a collector beside the replica); empty: none.
    #[arg(long, env = OTLP_ENDPOINT, value_name = OTLP_ENDPOINT, default_value = "")]
    pub otlp_endpoint: String,
    /// How often metrics are pushed to PLEXSPHERE_OTLP_ENDPOINT (100 to 3600000).
    #[arg(long, env = OTLP_INTERVAL_MS, value_name = OTLP_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(100..=3_600_000), default_value_t = 60_000)]
    pub otlp_interval_ms: u64,
}

impl Knobs {
    /// Parses knobs from `(variable, value)` pairs as if they were the whole environment:
    /// the process's own environment is not read, and a later pair for a variable replaces an
    /// earlier one. For tests and tools that hold knobs as data.
    ///
    /// # Errors
    /// The parse error clap reports (a missing required knob, a value that does not parse).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Knobs, clap::Error> {
        let command = Knobs::augment_args(clap::Command::new("plexsphere"));
        let mut set: Vec<(&str, &str)> = Vec::new();
        for (variable, value) in pairs {
            match set.iter_mut().find(|(known, _)| *known == variable) {
                Some(pair) => pair.1 = value,
                None => set.push((variable, value)),
            }
        }
        let mut args = vec!["plexsphere".to_owned()];
        for (variable, value) in set {
            let long = command
                .get_arguments()
                .find(|arg| arg.get_env().is_some_and(|env| env == variable))
                .and_then(|arg| arg.get_long())
                .ok_or_else(|| {
                    clap::Error::raw(
                        clap::error::ErrorKind::UnknownArgument,
                        format!("unknown knob {variable}\n"),
                    )
                })?;
            args.push(format!("--{long}={value}"));
        }
        let matches = command.mut_args(|arg| arg.env(None)).try_get_matches_from(args)?;
        Knobs::from_arg_matches(&matches)
    }

    /// Every knob's variable name, in the order `--help` lists them.
    pub fn names() -> Vec<String> {
        Knobs::augment_args(clap::Command::new("plexsphere"))
            .get_arguments()
            .filter_map(|arg| arg.get_env().map(|env| env.to_string_lossy().into_owned()))
            .collect()
    }
}

/// The keys of the secret store, which `serve` and `secrets rekey` share.
#[derive(Args, Clone)]
pub struct SecretsKeys {
    /// The key every secret value is sealed with (AES-256-GCM): 32 bytes in base64, as
    /// `openssl rand -base64 32` prints them. Required.
    #[arg(long, env = SECRETS_KEY, value_name = SECRETS_KEY, hide_env_values = true)]
    pub secrets_key: Option<String>,
    /// Keys that sealed values before a rotation, comma-separated base64: they only open what
    /// they sealed, until `plexsphere secrets rekey` has re-sealed it under the current key.
    #[arg(long, env = SECRETS_OLD_KEYS, value_name = SECRETS_OLD_KEYS, hide_env_values = true)]
    pub secrets_old_keys: Option<String>,
}

impl SecretsKeys {
    /// The keyring the knobs name.
    ///
    /// # Errors
    /// When the key is missing or either knob holds something that is not a key; the message
    /// names the knob and never repeats its value.
    pub fn keyring(&self) -> Result<secrets::Keyring, ConfigError> {
        let current = match self.secrets_key.as_deref().map(str::trim) {
            None | Some("") => {
                return Err(ConfigError::new(
                    SECRETS_KEY,
                    "is required: the key secret values are sealed with; generate one with \
                     `openssl rand -base64 32`",
                ))
            }
            Some(text) => secrets::SecretsKey::from_base64(text)
                .map_err(|invalid| ConfigError::new(SECRETS_KEY, invalid.to_string()))?,
        };
        let mut old = Vec::new();
        let listed = self.secrets_old_keys.as_deref().unwrap_or_default();
        for (position, text) in listed.split(',').map(str::trim).enumerate() {
            if text.is_empty() {
                continue;
            }
            let key = secrets::SecretsKey::from_base64(text).map_err(|invalid| {
                ConfigError::new(SECRETS_OLD_KEYS, format!("key {} of the list {invalid}", position + 1))
            })?;
            old.push(key);
        }
        Ok(secrets::Keyring::new(current, old))
    }
}

/// Where the HTTP API listens, and what its server allows each client, so that slow or idle
/// clients cannot hold a replica's sockets or its shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    /// Where it listens.
    pub listen: SocketAddr,
    /// How long a connection may take to send a request's headers, or sit idle between
    /// requests.
    pub header_timeout: Duration,
    /// How long a request's whole body may take to arrive.
    pub body_timeout: Duration,
    /// The deadline of a whole request.
    pub request_timeout: Duration,
    /// How many connections are served at once.
    pub max_connections: usize,
}

/// An operator's bearer token and the name it acts under.
#[derive(Clone, Debug)]
pub struct OperatorCredential {
    /// Who the token's bearer is, in the audit log and the request log.
    pub name: audit::Actor,
    /// The bearer token.
    pub token: Redacted<String>,
}

/// A caller that asks for decisions (a proxy, a load balancer): its name, its bearer token and
/// the services it may ask for.
#[derive(Clone, Debug)]
pub struct DecideCredential {
    /// Who the token's bearer is, in the request log.
    pub name: audit::Actor,
    /// The bearer token.
    pub token: Redacted<String>,
    /// The services it decides for.
    pub services: Services,
}

/// Reads the decide tokens: `name:token` (every service but plexsphere's own) or
/// `name:token:a|b` (those services only) entries, each name and token as the operator tokens.
fn decide_credentials(
    knobs: &Knobs,
    operators: &[OperatorCredential],
) -> Result<Vec<DecideCredential>, ConfigError> {
    let mut credentials: Vec<DecideCredential> = Vec::new();
    for entry in knobs.decide_tokens.as_deref().unwrap_or_default().split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        let mut fields = entry.splitn(3, ':');
        let (Some(name), Some(token)) = (fields.next(), fields.next()) else {
            return Err(ConfigError::new(
                DECIDE_TOKENS,
                "every entry must be name:token or name:token:service|service",
            ));
        };
        let (name, token) = (name.trim(), token.trim());
        let services = match fields.next() {
            None => Services::AllButOwn,
            Some(list) => decide_services(name, list)?,
        };
        let name = named_token(DECIDE_TOKENS, "caller", name, token)?;
        if credentials.iter().any(|known| known.name == name) {
            return Err(ConfigError::new(DECIDE_TOKENS, format!("caller {name} is named twice")));
        }
        // A decide token may not open the operator routes, nor the other way round.
        if credentials.iter().any(|known| known.token.as_str() == token)
            || operators.iter().any(|known| known.token.as_str() == token)
        {
            return Err(ConfigError::new(
                DECIDE_TOKENS,
                format!("the token of {name} is another caller's or an operator's too"),
            ));
        }
        credentials.push(DecideCredential { name, token: Redacted::new(token.to_owned()), services });
    }
    Ok(credentials)
}

/// The services of one decide token: `|`-separated service names, none of them plexsphere's
/// own (whose budgets only its own routes spend), none twice.
fn decide_services(name: &str, list: &str) -> Result<Services, ConfigError> {
    let mut services: Vec<String> = Vec::new();
    for service in list.split('|').map(str::trim) {
        let parsed = rules::Service::parse(service).map_err(|_| {
            ConfigError::new(
                DECIDE_TOKENS,
                format!("caller {name}: service {service:?} must be 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit"),
            )
        })?;
        if parsed.is_own() {
            return Err(ConfigError::new(
                DECIDE_TOKENS,
                format!("caller {name}: {service} is this project's own service, decided by its own routes; its snapshot needs an operator token"),
            ));
        }
        if services.iter().any(|known| known == service) {
            return Err(ConfigError::new(
                DECIDE_TOKENS,
                format!("caller {name}: service {service} is named twice"),
            ));
        }
        services.push(service.to_owned());
    }
    Ok(Services::Only(services.into()))
}

/// The name a token of `knob` acts under (`who`: operator or caller), once the name is one the
/// audit log records and the token long enough; a message names the caller, never the token.
fn named_token(knob: &'static str, who: &str, name: &str, token: &str) -> Result<audit::Actor, ConfigError> {
    let name = audit::Actor::operator(name).map_err(|_| {
        ConfigError::new(knob, format!("{who} name {name:?} must be 1 to 64 of A-Z a-z 0-9 . _ -"))
    })?;
    if token.chars().count() < OPERATOR_TOKEN_MIN_CHARS {
        return Err(ConfigError::new(
            knob,
            format!("the token of {name} must be at least 16 characters; generate one with `openssl rand -hex 32`"),
        ));
    }
    Ok(name)
}

/// Reads the operator tokens from both knobs.
fn operator_credentials(knobs: &Knobs) -> Result<Vec<OperatorCredential>, ConfigError> {
    let mut credentials: Vec<OperatorCredential> = Vec::new();
    let mut add = |knob: &'static str, name: &str, token: &str| -> Result<(), ConfigError> {
        let name = named_token(knob, "operator", name, token)?;
        if credentials.iter().any(|known| known.name == name) {
            return Err(ConfigError::new(knob, format!("operator {name} is named twice")));
        }
        if credentials.iter().any(|known| known.token.as_str() == token) {
            return Err(ConfigError::new(knob, format!("the token of {name} is another operator's too")));
        }
        credentials.push(OperatorCredential { name, token: Redacted::new(token.to_owned()) });
        Ok(())
    };
    if let Some(token) = knobs.operator_token.as_deref().map(str::trim).filter(|token| !token.is_empty()) {
        add(OPERATOR_TOKEN, SINGLE_OPERATOR_NAME, token)?;
    }
    for entry in knobs.operator_tokens.as_deref().unwrap_or_default().split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        let Some((name, token)) = entry.split_once(':') else {
            return Err(ConfigError::new(OPERATOR_TOKENS, "every entry must be name:token"));
        };
        add(OPERATOR_TOKENS, name.trim(), token.trim())?;
    }
    if credentials.is_empty() {
        return Err(ConfigError::new(
            OPERATOR_TOKENS,
            format!("no operator token: set {OPERATOR_TOKENS} (name:token,...) or {OPERATOR_TOKEN}"),
        ));
    }
    Ok(credentials)
}

/// Everything the process reads from its environment, validated.
///
/// Its `Debug` leaves out the operator tokens, the keys and the database password.
/// The typed configuration, read once at boot, grouped by subsystem. Its `Debug` never shows a
/// token, a key or the database's password: each is [`Redacted`].
#[derive(Clone, Debug)]
pub struct Config {
    /// The shared database and the pools on it.
    pub database: DatabaseConfig,
    /// The HTTP API's address and its server's limits.
    pub http: HttpConfig,
    /// Where Envoy's rate limit protocols (gRPC) are served, if anywhere.
    pub grpc_listen: Option<SocketAddr>,
    /// The RLQS allocator's settings.
    pub quota: service::quota::QuotaSettings,
    /// Who may call, and how failed authentications are limited.
    pub auth: AuthConfig,
    /// The rate budgets: the defaults where no rule governs, and how takes are decided.
    pub budgets: BudgetsConfig,
    /// Secret values: their keys and the read cache.
    pub secrets: SecretsConfig,
    /// The largest telemetry batch accepted.
    pub ingest_max_batch_bytes: usize,
    /// Where and how often metrics are pushed over OTLP, if anywhere.
    pub otlp: Option<OtlpConfig>,
    /// How long a stopping replica lets in-flight requests finish.
    pub shutdown_grace: Duration,
}

/// The shared database.
#[derive(Clone, Debug)]
pub struct DatabaseConfig {
    /// The database as requests reach it (a transaction pooler's address, when there is one).
    pub url: Database,
    /// The database as a session reaches it (LISTEN, the leader lock, migrations).
    pub session_url: Database,
    /// What `url` reaches.
    pub pooler: Pooler,
    /// The request pool's size.
    pub max_connections: u32,
    /// The longest any request waits for the database before it answers 500.
    pub timeout: Duration,
    /// The limiters' commit mode.
    pub limiter_synchronous_commit: SynchronousCommit,
}

/// Who may call.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// The operator routes' bearer tokens, each with the name it acts under.
    pub operators: Vec<OperatorCredential>,
    /// Who may ask for decisions; empty: the decide API is off.
    pub decide_callers: Vec<DecideCredential>,
    /// Failed authentications per client address.
    pub failures: Limit,
    /// Proxies whose X-Forwarded-For is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

/// The rate budgets.
#[derive(Clone, Debug)]
pub struct BudgetsConfig {
    /// Each scope's budget and fail mode where no rule governs.
    pub defaults: DefaultBudgets,
    /// How long a take waits for the shared store.
    pub decision_timeout: Duration,
    /// How concurrent takes are coalesced into calls.
    pub coalescing: ratebudget::Coalescing,
    /// How long a lease of a hot bucket lasts; `None`: nothing is leased.
    pub lease_period: Option<Duration>,
    /// The largest error of the corrected clock with which the replica still decides.
    pub max_clock_skew: Duration,
    /// How often the leader sweeps idle buckets.
    pub sweep_interval: Duration,
    /// How often the replica checks that its rules and tiers are current.
    pub rules_poll_interval: Duration,
    /// How often the replica flushes its rule usage counts.
    pub rule_usage_flush_interval: Duration,
    /// The directory of envoyproxy/ratelimit files the leader applies, if any.
    pub rules_dir: Option<std::path::PathBuf>,
    /// How often the leader looks at it.
    pub rules_dir_interval: Duration,
}

/// Secret values.
#[derive(Clone, Debug)]
pub struct SecretsConfig {
    /// The keys secret values are sealed and opened with (its `Debug` shows their ids only).
    pub keyring: secrets::Keyring,
    /// How many secrets each replica keeps read (0: none).
    pub cache_capacity: usize,
}

/// A knob that is unusable; `serve` prints it and refuses to start.
#[derive(Debug, thiserror::Error)]
#[error("{knob}: {problem}")]
pub struct ConfigError {
    /// The variable's name.
    pub knob: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl ConfigError {
    pub(crate) fn new(knob: &'static str, problem: impl Into<String>) -> ConfigError {
        ConfigError { knob, problem: problem.into() }
    }
}

impl Config {
    /// Validates parsed knobs, deriving the typed configuration.
    ///
    /// # Errors
    /// The first knob that is unusable, by name.
    pub fn from_knobs(knobs: &Knobs) -> Result<Config, ConfigError> {
        let database = database_options(knobs.database_url.as_deref())?;

        let operators = operator_credentials(knobs)?;
        let session_database = match knobs.session_database_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => database_options(Some(url))
                .map_err(|error| ConfigError::new(SESSION_DATABASE_URL, error.problem))?,
            _ => database.clone(),
        };
        let decide_callers = decide_credentials(knobs, &operators)?;
        let grpc_listen = match knobs.grpc_listen.trim() {
            "" => None,
            address => Some(address.parse().map_err(|error| {
                ConfigError::new(GRPC_LISTEN, format!("not an address and port: {error}"))
            })?),
        };
        if grpc_listen.is_some() && decide_callers.is_empty() {
            return Err(ConfigError::new(
                GRPC_LISTEN,
                format!("serves decisions only to callers with a token: set {DECIDE_TOKENS} too"),
            ));
        }

        let keyring = knobs.secrets_keys.keyring()?;

        let listen = knobs
            .listen
            .trim()
            .parse()
            .map_err(|error| ConfigError::new(LISTEN, format!("not an address and port: {error}")))?;

        let defaults = DefaultBudgets::try_from_fn(|scope| {
            let knobs = knobs.scope(scope);
            Ok::<_, ConfigError>(DefaultBudget {
                limit: limit(knobs.per_second, knobs.burst, knobs.least_cost)?,
                fail_mode: knobs.fail_mode.into(),
            })
        })?;

        // A failure costs one whole cell of a GCRA limiter.
        let auth_failures = limit(
            (AUTH_FAILURE_PER_SECOND, knobs.auth_failure_per_second),
            (AUTH_FAILURE_BURST, knobs.auth_failure_burst),
            1.0,
        )?;
        auth_failures.fits_gcra().map_err(|unfit| {
            let knob = if unfit.field == "per_second" { AUTH_FAILURE_PER_SECOND } else { AUTH_FAILURE_BURST };
            ConfigError::new(knob, unfit.reason)
        })?;
        let trusted_proxies = parse_trusted_proxies(&knobs.trusted_proxies)
            .map_err(|problem| ConfigError::new(TRUSTED_PROXIES, problem))?;
        let coalescing =
            ratebudget::Coalescing { max_batch: knobs.take_batch_max, ..ratebudget::Coalescing::DEFAULT };
        // A take must give up on the store before the request gives up on the take: a request
        // whose database time ran out first would drop the take mid-wait, and its fail mode
        // would never decide it (a 500 where STATIC or OPEN should have answered).
        if knobs.decision_timeout_ms >= knobs.database_timeout_ms {
            return Err(ConfigError::new(
                DECISION_TIMEOUT_MS,
                format!(
                    "must be below {DATABASE_TIMEOUT_MS} ({} ms), the request's database deadline it waits within; it is {} ms",
                    knobs.database_timeout_ms, knobs.decision_timeout_ms
                ),
            ));
        }
        let http = http_config(knobs, listen)?;
        let otlp = OtlpConfig::from_knobs(&knobs.otlp_endpoint, knobs.otlp_interval_ms)?;

        Ok(Config {
            database: DatabaseConfig {
                url: Database::new(database),
                session_url: Database::new(session_database),
                pooler: knobs.database_pooler,
                max_connections: knobs.database_max_connections,
                timeout: Duration::from_millis(knobs.database_timeout_ms),
                limiter_synchronous_commit: knobs.limiter_synchronous_commit,
            },
            http,
            grpc_listen,
            quota: service::quota::QuotaSettings {
                ttl: Duration::from_secs(knobs.rlqs_ttl_seconds),
                max_round_trip: Duration::from_millis(knobs.rlqs_max_round_trip_ms),
                ..service::quota::QuotaSettings::default()
            },
            auth: AuthConfig { operators, decide_callers, failures: auth_failures, trusted_proxies },
            budgets: BudgetsConfig {
                defaults,
                decision_timeout: Duration::from_millis(knobs.decision_timeout_ms),
                coalescing,
                lease_period: Some(Duration::from_millis(knobs.lease_ms)).filter(|period| !period.is_zero()),
                max_clock_skew: Duration::from_millis(knobs.max_clock_skew_ms),
                sweep_interval: Duration::from_secs(knobs.sweep_interval_secs),
                rules_poll_interval: Duration::from_millis(knobs.rules_poll_interval_ms),
                rule_usage_flush_interval: Duration::from_millis(knobs.rule_usage_flush_interval_ms),
                rules_dir: Some(knobs.rules_dir.trim())
                    .filter(|dir| !dir.is_empty())
                    .map(std::path::PathBuf::from),
                rules_dir_interval: Duration::from_millis(knobs.rules_dir_interval_ms),
            },
            secrets: SecretsConfig { keyring, cache_capacity: knobs.secret_cache_capacity },
            ingest_max_batch_bytes: knobs.ingest_max_batch_bytes,
            otlp,
            shutdown_grace: Duration::from_secs(knobs.shutdown_grace_secs),
        })
    }
}

/// The database `DATABASE_URL` (or `--database-url`) names, for every command.
///
/// # Errors
/// When it is missing, is the test suite's default (which cargo hands to `cargo run` as well:
/// nobody named it), or is not a PostgreSQL URL.
pub fn database_options(url: Option<&str>) -> Result<PgConnectOptions, ConfigError> {
    let url = url.map(str::trim).unwrap_or_default();
    if url.is_empty() {
        return Err(ConfigError::new(
            DATABASE_URL,
            "is required: the PostgreSQL database every replica shares, as postgres://user@host:port/database \
             (set the variable, or pass --database-url)",
        ));
    }
    if url.contains(TESTS_DEFAULT_DATABASE_MARK) {
        return Err(ConfigError::new(
            DATABASE_URL,
            "is not set: the value in effect is the test suite's default, which .cargo/config.toml gives every \
             cargo command; name the database to use, e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres",
        ));
    }
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(ConfigError::new(DATABASE_URL, "must be a postgres:// or postgresql:// URL"));
    }
    PgConnectOptions::from_str(url)
        .map_err(|error| ConfigError::new(DATABASE_URL, format!("not a PostgreSQL URL: {error}")))
}

/// The HTTP server's address and limits. The request deadline must exceed the database's, so
/// a request stuck on the database answers its own 500 (and logs its cause) before the
/// deadline's 503.
fn http_config(knobs: &Knobs, listen: SocketAddr) -> Result<HttpConfig, ConfigError> {
    let limits = HttpConfig {
        listen,
        header_timeout: Duration::from_millis(knobs.http_header_timeout_ms),
        body_timeout: Duration::from_millis(knobs.http_body_timeout_ms),
        request_timeout: Duration::from_millis(knobs.http_request_timeout_ms),
        max_connections: knobs.http_max_connections,
    };
    if knobs.http_request_timeout_ms <= knobs.database_timeout_ms {
        return Err(ConfigError::new(
            HTTP_REQUEST_TIMEOUT_MS,
            format!("must be above {DATABASE_TIMEOUT_MS} ({} ms)", knobs.database_timeout_ms),
        ));
    }
    Ok(limits)
}

/// Where metrics go, and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The collector's metrics URL: the knob's base URL and `/v1/metrics`.
    pub metrics_url: String,
    /// How often they are pushed.
    pub interval: Duration,
}

impl OtlpConfig {
    /// The export the knobs ask for: none when the endpoint is empty.
    ///
    /// # Errors
    /// An endpoint that is not an `http://` URL with a host.
    fn from_knobs(endpoint: &str, interval_ms: u64) -> Result<Option<OtlpConfig>, ConfigError> {
        let endpoint = endpoint.trim();
        if endpoint.is_empty() {
            return Ok(None);
        }
        // Its value is not repeated in the error: a URL may carry a credential.
        let uri: axum::http::Uri = endpoint
            .parse()
            .map_err(|_| ConfigError::new(OTLP_ENDPOINT, "must be a URL such as http://127.0.0.1:4318"))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() || uri.query().is_some() {
            return Err(ConfigError::new(
                OTLP_ENDPOINT,
                "must be an http:// URL with a host and no query (there is no TLS: use a collector beside the replica)",
            ));
        }
        Ok(Some(OtlpConfig {
            metrics_url: format!("{}/v1/metrics", endpoint.trim_end_matches('/')),
            interval: Duration::from_millis(interval_ms),
        }))
    }
}

/// The trusted proxies knob: comma-separated addresses or CIDR ranges (an address is a range
/// of one).
fn parse_trusted_proxies(text: &str) -> Result<Vec<IpNet>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{entry:?} is not an address or a CIDR range"))
        })
        .collect()
}

/// One scope's knobs: its rate and burst (each with its knob's name), the least its burst must
/// cover, and its fail mode.
struct ScopeKnobs {
    per_second: (&'static str, f64),
    burst: (&'static str, f64),
    least_cost: f64,
    fail_mode: FailModeKnob,
}

impl Knobs {
    /// `scope`'s knobs. A secret read and an enrolment cost one token each, so a smaller burst
    /// could never admit one; a batch larger than an ingest quota's burst could never be
    /// admitted, so it must be a 413 before it is ever offered to the quota.
    fn scope(&self, scope: Scope) -> ScopeKnobs {
        let batch = self.ingest_max_batch_bytes as f64;
        let (per_second, burst, least_cost, fail_mode) = match scope {
            Scope::SecretReadNode => (
                (SECRET_READ_NODE_PER_SECOND, self.secret_read_node_per_second),
                (SECRET_READ_NODE_BURST, self.secret_read_node_burst),
                1.0,
                self.secret_read_node_fail_mode,
            ),
            Scope::SecretReadDomain => (
                (SECRET_READ_DOMAIN_PER_SECOND, self.secret_read_domain_per_second),
                (SECRET_READ_DOMAIN_BURST, self.secret_read_domain_burst),
                1.0,
                self.secret_read_domain_fail_mode,
            ),
            Scope::AccessIssuanceDomain => (
                (ACCESS_ISSUANCE_PER_SECOND, self.access_issuance_per_second),
                (ACCESS_ISSUANCE_BURST, self.access_issuance_burst),
                1.0,
                self.access_issuance_fail_mode,
            ),
            Scope::IngestNode => (
                (INGEST_NODE_BYTES_PER_SECOND, self.ingest_node_bytes_per_second),
                (INGEST_NODE_BYTES_BURST, self.ingest_node_bytes_burst),
                batch,
                self.ingest_node_fail_mode,
            ),
            Scope::IngestDomain => (
                (INGEST_DOMAIN_BYTES_PER_SECOND, self.ingest_domain_bytes_per_second),
                (INGEST_DOMAIN_BYTES_BURST, self.ingest_domain_bytes_burst),
                batch,
                self.ingest_domain_fail_mode,
            ),
        };
        ScopeKnobs { per_second, burst, least_cost, fail_mode }
    }
}

/// A scope's budget from its two knobs: a [`Limit`] (the rate-budget store's own rules, among
/// them "refills within the idle sweep's hour"), whose burst must also cover `least_cost`.
fn limit(
    (rate_knob, per_second): (&'static str, f64),
    (burst_knob, burst): (&'static str, f64),
    least_cost: f64,
) -> Result<Limit, ConfigError> {
    let limit = Limit::new(per_second, burst).map_err(|invalid| {
        let knob = if invalid.field == "per_second" { rate_knob } else { burst_knob };
        ConfigError::new(knob, format!("{per_second}/s with a burst of {burst}: {invalid}"))
    })?;
    if burst < least_cost {
        return Err(ConfigError::new(
            burst_knob,
            format!("{burst} is below {least_cost}, the cost of the largest request it must admit"),
        ));
    }
    Ok(limit)
}

#[cfg(test)]
mod tests;
