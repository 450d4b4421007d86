//! A network namespace of the test's own: its own loopback, nothing else, so a firewall rule
//! inside it partitions only what the test runs there, and nothing of the machine's.
//!
//! Inside, every 127.0.0.0/8 address is the namespace's loopback, so the test gives each
//! replica an address of its own to reach the database at (127.0.0.2, 127.0.0.3, ...) and
//! drops one address's packets with nftables: a silent partition (no reset, no ICMP) between
//! one replica and the database, while the others keep talking. Deleting the namespace removes
//! its rules and addresses; the guard does that even when the test fails.

use std::process::Command;

pub(crate) struct Namespace {
    name: String,
}

/// The nftables table partitions live in, inside the namespace.
const TABLE: &str = "plexsphere_partition";

impl Namespace {
    /// A fresh namespace with its loopback up, or `None` (after saying why on stderr) where the
    /// kernel or the sandbox forbids network namespaces or nftables.
    pub(crate) fn create() -> Option<Namespace> {
        let name = format!("plexsphere-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let created = Command::new("ip").args(["netns", "add", &name]).output();
        match created {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                eprintln!(
                    "skipped: this kernel or sandbox forbids network namespaces (ip netns add: {})",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                return None;
            }
            Err(error) => {
                eprintln!("skipped: iproute2's ip is not available ({error})");
                return None;
            }
        }
        let namespace = Namespace { name };
        namespace.run(&["ip", "link", "set", "lo", "up"]);
        // A missing nft is a missing install step (.ci/run installs nftables), not a kernel
        // restriction: fail, do not skip.
        assert!(
            Command::new("nft").arg("--version").output().is_ok_and(|output| output.status.success()),
            "nft is missing: apt-get install nftables (.ci/run does)"
        );
        if !namespace.try_run(&["nft", "add", "table", "inet", TABLE]) {
            eprintln!("skipped: this kernel forbids nftables inside a network namespace");
            return None;
        }
        namespace.run(&[
            "nft",
            "add chain inet plexsphere_partition output { type filter hook output priority 0 ; policy accept ; }",
        ]);
        Some(namespace)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Drops, silently, every packet to or from `address`:`port` inside the namespace.
    pub(crate) fn partition(&self, address: &str, port: u16) {
        for rule in [
            format!("add rule inet {TABLE} output ip daddr {address} tcp dport {port} drop"),
            format!("add rule inet {TABLE} output ip saddr {address} tcp sport {port} drop"),
        ] {
            self.run(&["nft", &rule]);
        }
    }

    /// Lets every packet through again.
    pub(crate) fn heal(&self) {
        self.run(&["nft", &format!("flush chain inet {TABLE} output")]);
    }

    /// Runs `command` inside the namespace and returns its standard output.
    pub(crate) fn output(&self, command: &[&str]) -> String {
        let output = Command::new("ip").args(["netns", "exec", &self.name]).args(command).output().unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn try_run(&self, command: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(command)
            .output()
            .is_ok_and(|output| output.status.success())
    }

    #[track_caller]
    fn run(&self, command: &[&str]) {
        assert!(self.try_run(command), "in {}: {command:?} failed", self.name);
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Its rules and loopback go with it. Processes the test started inside are gone by
        // now: their guards are declared after this one, so they drop first.
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}
