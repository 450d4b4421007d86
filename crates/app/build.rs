//! Rebuilds the crate when a migration changes, since `sqlx::migrate!` embeds them, and names
//! the commit the binary is built from for `plexsphere --version`.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
    // A new commit moves HEAD or the branch it names; a build outside a git checkout (a source
    // archive) says so rather than failing.
    // A path that does not exist (packed-refs before the first `git gc`) would rerun this
    // script, and rebuild the crate, on every build.
    for path in ["../../.git/HEAD", "../../.git/refs/heads", "../../.git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|commit| commit.trim().to_owned())
        .filter(|commit| !commit.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PLEXSPHERE_COMMIT={commit}");
}
