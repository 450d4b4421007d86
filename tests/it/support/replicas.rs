//! Replicas of the real application, started in-process on a test's database, and a small
//! HTTP client to talk to them over their sockets.

use std::sync::Arc;
use std::time::Duration;

use app::config::{self, Config, Knobs};
use app::runtime::leader::{LeaderTiming, Leadership};
use app::startup::TimeSource;
use app::startup::{Application, Wiring};
use ratebudget::Clock;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::postgres::PgConnectOptions;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) const OPERATOR_TOKEN: &str = "operator-token-for-tests-0123456789";

/// The tests' secrets key: base64 of 32 bytes of 0x42.
pub(crate) const SECRETS_KEY: &str = "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI=";

/// Leader timing for tests: elections in a tenth of a second instead of seconds.
pub(crate) const FAST_LEADER: LeaderTiming = LeaderTiming {
    retry: Duration::from_millis(100),
    ping: Duration::from_millis(100),
    timeout: Duration::from_secs(1),
};

/// A configuration as `serve` would read it, on `database`, with `knobs` set on top.
pub(crate) fn config(database: &PgConnectOptions, knobs: &[(&str, &str)]) -> Config {
    let base = [
        // Parsed and then replaced by the test's own database below.
        (config::DATABASE_URL, "postgres://postgres@127.0.0.1:5432/postgres"),
        (config::OPERATOR_TOKEN, OPERATOR_TOKEN),
        (config::SECRETS_KEY, SECRETS_KEY),
        (config::LISTEN, "127.0.0.1:0"),
        (config::DATABASE_TIMEOUT_MS, "1000"),
        // Tests run debug builds side by side on two cores: the production 250 ms would turn
        // a slow machine into 500s. Tests about the timeout set their own. It must stay below
        // the database time above, within which a take waits.
        (config::DECISION_TIMEOUT_MS, "800"),
    ];
    // A test that shortens the database time gets a decision timeout below it (four fifths),
    // as `serve` requires, unless it sets one itself.
    let database_timeout = knobs.iter().find(|(knob, _)| *knob == config::DATABASE_TIMEOUT_MS);
    let decision_set = knobs.iter().any(|(knob, _)| *knob == config::DECISION_TIMEOUT_MS);
    let derived = database_timeout
        .filter(|_| !decision_set)
        .map(|(_, millis)| (millis.parse::<u64>().unwrap() * 4 / 5).min(800).to_string());
    let derived = derived.as_deref().map(|millis| (config::DECISION_TIMEOUT_MS, millis));
    let knobs = Knobs::from_pairs(base.iter().chain(knobs).chain(derived.as_ref()).copied()).unwrap();
    let mut config = Config::from_knobs(&knobs).unwrap();
    // Both URLs name the test's own database: the listener and the leader lock live on the
    // session URL, and a session on another database hears none of this test's announcements.
    *config.database.url = database.clone();
    *config.database.session_url = database.clone();
    config
}

/// The answer to one request.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) retry_after: Option<u64>,
    pub(crate) body: Value,
}

impl Answer {
    pub(crate) fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }

    /// A response header's text, if it came.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }
}

pub(crate) struct Replica {
    api: Api,
    /// Where Envoy's rate limit service protocol is served, when it is.
    pub(crate) grpc: Option<std::net::SocketAddr>,
    pub(crate) leadership: Leadership,
    stop: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

/// The API of one replica, in-process or not, over its socket.
#[derive(Clone)]
pub(crate) struct Api {
    base: String,
    client: reqwest::Client,
}

impl std::ops::Deref for Replica {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Replica {
    pub(crate) async fn start(config: Config, clock: Arc<dyn Clock>) -> Replica {
        Replica::start_with(config, Wiring { time: TimeSource::Given(clock), leader_timing: FAST_LEADER })
            .await
    }

    pub(crate) async fn start_with(config: Config, wiring: Wiring) -> Replica {
        let application = Application::build(config, wiring).await.unwrap();
        let api = Api::new(application.local_addr());
        let grpc = application.grpc_addr();
        let leadership = application.leadership();
        let stop = application.shutdown_token();
        let task = tokio::spawn(application.run_until_stopped());
        Replica { api, grpc, leadership, stop, task }
    }

    /// Stops the replica gracefully and waits until it has released everything.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

impl Api {
    pub(crate) fn new(address: std::net::SocketAddr) -> Api {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
        Api { base: format!("http://{address}"), client }
    }

    /// The base URL, `http://address`.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// A request that may fail at the transport (refused, reset, timed out): for load under
    /// faults, where that is an outcome to count rather than a test failure.
    pub(crate) async fn try_get(&self, path: &str, bearer: &str) -> Result<StatusCode, reqwest::Error> {
        let response = self.client.get(format!("{}{path}", self.base)).bearer_auth(bearer).send().await?;
        let status = response.status();
        response.bytes().await?;
        Ok(status)
    }

    pub(crate) async fn request(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Answer {
        self.send(self.client.request(method, format!("{}{path}", self.base)), bearer, body).await
    }

    /// A GET's body as the bytes came, for checks a parsed value cannot make (a key named
    /// twice in one object, say).
    pub(crate) async fn get_text(&self, path: &str, bearer: &str) -> String {
        let response =
            self.client.get(format!("{}{path}", self.base)).bearer_auth(bearer).send().await.unwrap();
        response.text().await.unwrap()
    }

    /// A GET that names its request id, so the test can find the request's log lines.
    pub(crate) async fn get_as_request(&self, path: &str, bearer: Option<&str>, request_id: &str) -> Answer {
        let request = self.client.get(format!("{}{path}", self.base)).header("x-request-id", request_id);
        self.send(request, bearer, None).await
    }

    /// A GET as if it came through a trusted proxy from `client` (its X-Forwarded-For).
    pub(crate) async fn get_from(&self, path: &str, bearer: Option<&str>, client: &str) -> Answer {
        let request = self.client.get(format!("{}{path}", self.base)).header("x-forwarded-for", client);
        self.send(request, bearer, None).await
    }

    async fn send(
        &self,
        mut request: reqwest::RequestBuilder,
        bearer: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Answer {
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .map(|value| value.to_str().unwrap().parse().unwrap());
        let bytes = response.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Answer { status, headers, retry_after, body }
    }

    /// A request with exactly these headers besides the client's own (a header named twice is
    /// sent twice), for tests of hostile or ambiguous headers.
    pub(crate) async fn request_with_headers(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request, None, body).await
    }

    pub(crate) async fn operator(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        self.request(method, path, Some(OPERATOR_TOKEN), body.map(|body| body.to_string().into_bytes())).await
    }

    /// An operator request sending `If-Match: <if_match>` when one is given.
    pub(crate) async fn operator_if_match(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        if_match: Option<&str>,
    ) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(tag) = if_match {
            request = request.header(reqwest::header::IF_MATCH, tag);
        }
        self.send(request, Some(OPERATOR_TOKEN), body.map(|body| body.to_string().into_bytes())).await
    }

    pub(crate) async fn get(&self, path: &str, bearer: Option<&str>) -> Answer {
        self.request(Method::GET, path, bearer, None).await
    }

    /// Creates a Domain (with `policy` as its own issuance policy) and returns its id.
    pub(crate) async fn create_domain(&self, name: &str, policy: Option<(f64, f64)>) -> String {
        let mut body = serde_json::json!({ "name": name });
        if let Some((per_second, burst)) = policy {
            body["issuance_per_second"] = per_second.into();
            body["issuance_burst"] = burst.into();
        }
        let answer = self.operator(Method::POST, "/v1/domains", Some(body)).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        answer.body["id"].as_str().unwrap().to_owned()
    }

    /// Enrols a Node in `domain` and returns (node id, token).
    pub(crate) async fn enrol(&self, domain: &str, name: &str) -> (String, String) {
        let path = format!("/v1/domains/{domain}/nodes");
        let answer = self.operator(Method::POST, &path, Some(serde_json::json!({ "name": name }))).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        (answer.body["id"].as_str().unwrap().to_owned(), answer.body["token"].as_str().unwrap().to_owned())
    }

    pub(crate) async fn put_secret(&self, domain: &str, name: &str, value: &str) {
        let path = format!("/v1/domains/{domain}/secrets/{name}");
        let answer = self.operator(Method::PUT, &path, Some(serde_json::json!({ "value": value }))).await;
        assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
    }

    /// The value of an unlabelled metric this replica exposes, if it exposes it.
    pub(crate) async fn metric(&self, name: &str) -> Option<f64> {
        let text = self.get("/metrics", None).await.body.as_str().unwrap_or_default().to_owned();
        let prefix = format!("{name} ");
        text.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map(|value| value.trim().parse().unwrap())
    }

    /// The value of the `plexsphere_leader` gauge this replica exposes.
    pub(crate) async fn leader_gauge(&self) -> i64 {
        self.gauge("plexsphere_leader").await
    }

    /// The value of a gauge this replica exposes.
    pub(crate) async fn gauge(&self, name: &str) -> i64 {
        let answer = self.get("/metrics", None).await;
        let text = answer.body.as_str().unwrap().to_owned();
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map(|value| value.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("the metrics name {name}"))
    }
}

/// Polls `condition` until it holds, failing the test after `within`. For states that change
/// in the background (leadership, a sweep, a reconnect), where there is nothing to await.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition().await {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The backend holding the leader lock in this database, if any.
pub(crate) async fn leader_backend(pool: &sqlx::PgPool) -> Option<i32> {
    let key = app::runtime::leader::LEADER_LOCK_KEY;
    // pg_locks shows a bigint advisory key as its high and low 32 bits.
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks
         WHERE locktype = 'advisory' AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1
           AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .bind(key >> 32)
    .bind(key & 0xffff_ffff)
    .fetch_optional(pool)
    .await
    .unwrap()
}
