//! Debian's PgBouncer in transaction mode, started by a test in front of a PostgreSQL server,
//! and stopped (and its directory deleted) when the guard drops.
//!
//! It runs as the `postgres` OS user (PgBouncer refuses to run as root), serves one TCP port of
//! its own on 127.0.0.1, lets anyone in (`auth_type = any`: the tests' server trusts them too)
//! and logs in to the server as `postgres`. A few server connections serve many clients, so
//! consecutive transactions of one client do land on different server connections.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::support::cluster::free_port;

pub(crate) struct PgBouncer {
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// PgBouncer in transaction mode on a free port, in front of `host:port`, with at most
    /// `server_connections` server connections per database.
    pub(crate) fn start(host: &str, port: u16, server_connections: u32) -> PgBouncer {
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists());
        let Some(binary) = binary else {
            panic!("this test needs PgBouncer (Debian: apt-get install pgbouncer)");
        };
        let dir =
            std::env::temp_dir().join(format!("plexsphere-pgbouncer-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let bouncer = PgBouncer { dir, port: free_port() };
        bouncer.write_config(host, port, server_connections);
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&bouncer.dir));
        run(Command::new("runuser")
            .args(["-u", "postgres", "--", binary, "-d", "-q"])
            .arg(bouncer.dir.join("pgbouncer.ini")));
        // Daemonized: up once its port accepts connections.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", bouncer.port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "PgBouncer did not start: {}", bouncer.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    fn write_config(&self, host: &str, port: u16, server_connections: u32) {
        let config = format!(
            "[databases]\n\
             * = host={host} port={port} user=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {listen}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = transaction\n\
             default_pool_size = {server_connections}\n\
             max_client_conn = 1000\n\
             server_lifetime = 3600\n\
             ignore_startup_parameters = extra_float_digits\n\
             pidfile = {dir}/pgbouncer.pid\n\
             logfile = {dir}/pgbouncer.log\n",
            listen = self.port,
            dir = self.dir.display(),
        );
        std::fs::write(self.dir.join("pgbouncer.ini"), config).unwrap();
    }

    /// The port clients connect to.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// What PgBouncer has logged so far (connections it made and closed, and why).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn pid(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("pgbouncer.pid")).ok().map(|pid| pid.trim().to_owned())
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill").arg(&pid).output();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while Command::new("kill").args(["-0", &pid]).output().is_ok_and(|out| out.status.success())
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
