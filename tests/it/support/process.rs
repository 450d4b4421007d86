//! The real `plexsphere` binary as a separate process, for faults that need one: a signal
//! (SIGTERM, SIGKILL), a faked clock (libfaketime) or a network namespace.
//!
//! Its log goes to a file the test reads; the guard kills the process (by its pid) when it
//! drops, so a failing test leaves nothing running.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::replicas::{Api, OPERATOR_TOKEN, SECRETS_KEY};

/// The binary tests/Cargo.toml builds from `app::cli::main`.
pub(crate) const BINARY: &str = env!("CARGO_BIN_EXE_plexsphere-under-test");

/// libfaketime's preload library, from Debian's `faketime` package (.ci/run installs it).
pub(crate) const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How a process is started: its knobs, and what it runs under.
pub(crate) struct Launch {
    env: Vec<(String, String)>,
    namespace: Option<String>,
}

impl Launch {
    /// `serve` on `database`, listening on a port of its own on 127.0.0.1.
    pub(crate) fn serve(database: &str) -> Launch {
        let env = [
            ("DATABASE_URL", database),
            ("PLEXSPHERE_OPERATOR_TOKEN", OPERATOR_TOKEN),
            ("PLEXSPHERE_SECRETS_KEY", SECRETS_KEY),
            ("PLEXSPHERE_LISTEN", "127.0.0.1:0"),
            ("RUST_LOG", "info"),
            ("NO_COLOR", "1"),
        ];
        Launch {
            env: env.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect(),
            namespace: None,
        }
    }

    pub(crate) fn knob(mut self, name: &str, value: &str) -> Launch {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Runs it with its wall clock `offset` away (libfaketime's syntax: "+30s").
    pub(crate) fn faked_clock(self, offset: &str) -> Launch {
        self.knob("LD_PRELOAD", LIBFAKETIME).knob("FAKETIME", offset)
    }

    /// Runs it inside a network namespace (its pid stays the binary's: `ip netns exec` execs).
    pub(crate) fn inside(mut self, namespace: &str) -> Launch {
        self.namespace = Some(namespace.to_owned());
        self
    }

    pub(crate) async fn start(self) -> ServiceProcess {
        let log =
            std::env::temp_dir().join(format!("plexsphere-replica-{}.log", uuid::Uuid::new_v4().simple()));
        let mut command = match &self.namespace {
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace, BINARY]);
                command
            }
            None => Command::new(BINARY),
        };
        command
            .args(["serve", "--no-migrate"])
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = command.spawn().unwrap();
        let mut process = ServiceProcess { child, log, address: None };
        let serving = process.wait_for_log("serving", Duration::from_secs(20)).await;
        let address = serving.split("local_addr=").nth(1).and_then(|rest| rest.split_whitespace().next());
        process.address = address.map(|address| address.parse().unwrap());
        // Ready means the database answers and the clock is measured: before that, decisions
        // answer 500. A process inside a namespace is not reachable from here to ask.
        if self.namespace.is_none() {
            let api = process.api();
            super::replicas::eventually(Duration::from_secs(20), "the process is ready", || async {
                api.get("/readyz", None).await.status == reqwest::StatusCode::OK
            })
            .await;
        }
        process
    }
}

/// A running `plexsphere serve`; killed when dropped.
pub(crate) struct ServiceProcess {
    child: Child,
    log: PathBuf,
    address: Option<SocketAddr>,
}

impl ServiceProcess {
    pub(crate) fn address(&self) -> SocketAddr {
        self.address.expect("the process logged its address")
    }

    /// Its API, for a process in this network namespace.
    pub(crate) fn api(&self) -> Api {
        Api::new(self.address())
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` ("TERM", "KILL", ...) to the process, by its pid.
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill").args(["-s", signal, &self.pid().to_string()]).status().unwrap();
        assert!(status.success(), "kill -s {signal} failed");
    }

    /// Its exit status, once it has exited within `within`; `None` if it is still running then.
    pub(crate) async fn exited_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything it has logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The first log line containing `needle`, waiting for it up to `within`.
    pub(crate) async fn wait_for_log(&mut self, needle: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(line) = self.log().lines().find(|line| line.contains(needle)) {
                return line.to_owned();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the process exited ({status}) before logging {needle:?}:\n{}", self.log());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {needle:?} within {within:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `postgres://user@host:port/database` for a child process's DATABASE_URL.
pub(crate) fn database_url(options: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("postgres")
    )
}
