//! A PostgreSQL cluster of the test's own, for faults that touch the server itself (a restart,
//! a crash, listening inside a network namespace). The shared cluster on 127.0.0.1:5432 serves
//! every other test of every engineer on this machine and is never stopped or reconfigured.
//!
//! The cluster lives in a temporary directory owned by the `postgres` OS user (initdb refuses
//! to run as root), serves on a port of its own and on a Unix socket in its directory, and is
//! stopped and deleted when the guard drops, whether the test passed or not.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

/// Where PostgreSQL's server programs are: `PLEXSPHERE_TEST_PG_BINDIR`, else what
/// `pg_config --bindir` says. A machine without them, or a test run not as root (initdb runs as
/// the `postgres` OS user through `runuser`), fails here in one line saying what is missing.
fn bin() -> PathBuf {
    let bindir = std::env::var_os("PLEXSPHERE_TEST_PG_BINDIR").map(PathBuf::from).or_else(|| {
        let output = Command::new("pg_config").arg("--bindir").output().ok()?;
        output.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
    });
    let Some(bindir) = bindir.filter(|bindir| bindir.join("initdb").exists()) else {
        panic!(
            "a private PostgreSQL cluster needs initdb and pg_ctl: set PLEXSPHERE_TEST_PG_BINDIR to their directory, \
             or install pg_config (Debian: libpq-dev) beside the server"
        );
    };
    let root = Command::new("id").arg("-u").output().is_ok_and(|output| output.stdout.starts_with(b"0\n"));
    let runuser =
        Command::new("runuser").arg("--version").output().is_ok_and(|output| output.status.success());
    assert!(
        root && runuser,
        "a private PostgreSQL cluster runs initdb as the postgres OS user through runuser (util-linux), which needs root"
    );
    bindir
}

pub(crate) struct PrivateCluster {
    root: PathBuf,
    port: u16,
    /// `ip netns exec <name>` when the server runs inside a network namespace.
    namespace: Option<String>,
    listen: String,
    /// More `-c name=value` server options.
    settings: String,
}

impl PrivateCluster {
    /// initdb and start a cluster listening on `listen` (a `listen_addresses` value) and `port`,
    /// inside `namespace` when one is given.
    pub(crate) fn start(listen: &str, port: u16, namespace: Option<&str>) -> PrivateCluster {
        PrivateCluster::start_with(listen, port, namespace, "")
    }

    /// [`PrivateCluster::start`], with more server options (`-c name=value ...`).
    pub(crate) fn start_with(
        listen: &str,
        port: u16,
        namespace: Option<&str>,
        settings: &str,
    ) -> PrivateCluster {
        let cluster = PrivateCluster::empty(listen, port, namespace, settings);
        run(Command::new("chown").args(["postgres:postgres"]).arg(&cluster.root));
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin().join("initdb"))
            .args(["--auth=trust", "--username=postgres", "--no-sync", "--encoding=UTF8", "-D"])
            .arg(cluster.data()));
        // Replicas reach it at 127.0.0.x addresses of their own (a partition drops one).
        let hba = cluster.data().join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).unwrap();
        rules.push_str("\nhost all all 127.0.0.0/8 trust\n");
        std::fs::write(&hba, rules).unwrap();
        cluster.start_server();
        cluster
    }

    fn empty(listen: &str, port: u16, namespace: Option<&str>, settings: &str) -> PrivateCluster {
        let root = std::env::temp_dir().join(format!("plexsphere-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).unwrap();
        PrivateCluster {
            root,
            port,
            namespace: namespace.map(str::to_owned),
            listen: listen.to_owned(),
            settings: settings.to_owned(),
        }
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`, WAL streamed during the copy),
    /// serving read-only on 127.0.0.1 and `port` until [`PrivateCluster::promote`].
    pub(crate) fn standby_of(primary: &PrivateCluster, port: u16) -> PrivateCluster {
        let cluster = PrivateCluster::empty(&primary.listen, port, None, "");
        run(Command::new("chown").args(["postgres:postgres"]).arg(&cluster.root));
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin().join("pg_basebackup"))
            .arg("-h")
            .arg(primary.socket_dir())
            .args([
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",
                "--no-sync",
                "-D",
            ])
            .arg(cluster.data()));
        cluster.start_server();
        cluster
    }

    /// Promotes this standby to a primary and waits until it accepts writes.
    pub(crate) fn promote(&self) {
        run(&mut self.pg_ctl(&["promote", "-w", "-t", "30"]));
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The directory of the server's Unix socket: reachable from any network namespace.
    pub(crate) fn socket_dir(&self) -> &Path {
        &self.root
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Connect options over the Unix socket, to the `postgres` database.
    pub(crate) fn socket_options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(self.socket_dir())
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// Connect options over TCP to `host`, to the `postgres` database.
    pub(crate) fn tcp_options(&self, host: &str) -> PgConnectOptions {
        PgConnectOptions::new().host(host).port(self.port).username("postgres").database("postgres")
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut command = match &self.namespace {
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace, "runuser", "-u", "postgres", "--"]);
                command
            }
            None => {
                let mut command = Command::new("runuser");
                command.args(["-u", "postgres", "--"]);
                command
            }
        };
        command.arg(bin().join("pg_ctl")).arg("-D").arg(self.data()).args(args);
        command
    }

    /// Starts the server and waits until it accepts connections. fsync is off: a fault here
    /// kills server processes, never the machine, so what was written reaches the disk
    /// anyway, and the tests run faster; asynchronous commits still lose what the WAL writer
    /// had not yet written, which is the window the crash tests measure.
    pub(crate) fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses='{}' -c fsync=off -c max_connections=200 -c shared_buffers=32MB {}",
            self.port,
            self.root.display(),
            self.listen,
            self.settings,
        );
        let log = self.root.join("server.log");
        run(&mut self.pg_ctl(&["start", "-w", "-t", "30", "-l", log.to_str().unwrap(), "-o", &options]));
    }

    /// Kills every server process at once, as a crash would: nothing is flushed or checkpointed.
    pub(crate) fn crash(&self) {
        run(&mut self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]));
    }

    /// Stops the server cleanly: clients are disconnected, everything is flushed.
    pub(crate) fn stop_server(&self) {
        run(&mut self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "30"]));
    }

    /// Migrates the `postgres` database with the application's migrations.
    pub(crate) async fn migrate(&self) {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(self.socket_options())
            .await
            .unwrap();
        app::migrations::MIGRATOR.run(&pool).await.unwrap();
        pool.close().await;
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        // Stopped whatever state it is in; an already stopped server makes pg_ctl fail, which
        // is fine here.
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]).output();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A TCP port nobody on this machine's loopback listens on right now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[track_caller]
fn run(command: &mut Command) {
    let output = command.output().unwrap_or_else(|error| panic!("{command:?} did not start: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
