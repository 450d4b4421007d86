//! The architecture invariants of ARCHITECTURE.md, checked on the source tree (in the spirit
//! of rust-analyzer's tidy tests): cheap greps that fail when a boundary is crossed.

use std::fs;
use std::path::{Path, PathBuf};

const CONTEXTS: [&str; 5] = ["secrets", "access", "ingest", "audit", "rules"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
    files
}

/// The lines of `file` that are code, not comments.
fn code_lines(file: &Path) -> Vec<String> {
    fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn context_domains_never_name_sqlx_or_ratebudget() {
    // Rules are written in ratebudget's vocabulary (its scopes, and `Limit::new`, the one
    // home of the refill rule): that context may name ratebudget, never sqlx.
    for context in CONTEXTS {
        let src = workspace().join("crates").join(context).join("src");
        for file in rust_files(&src) {
            if file.file_name().unwrap() == "persistence.rs" {
                continue;
            }
            let forbidden: &[&str] = if context == "rules" { &["sqlx"] } else { &["sqlx", "ratebudget"] };
            for line in code_lines(&file) {
                for forbidden in forbidden {
                    assert!(!line.contains(forbidden), "{} names {forbidden}: {line}", file.display());
                }
            }
        }
    }
}

#[test]
fn no_context_depends_on_another_and_the_rate_budget_crates_on_none() {
    // The tower layer is HTTP over ratebudget: no context may need it, and it needs none.
    for crate_name in CONTEXTS.iter().chain(&["ratebudget", "ratebudget-tower"]) {
        let manifest =
            fs::read_to_string(workspace().join("crates").join(crate_name).join("Cargo.toml")).unwrap();
        for other in CONTEXTS.iter().chain(&["app", "ratebudget-tower"]).filter(|other| *other != crate_name)
        {
            // `other.workspace = true`, `other = { ... }` and `other = "..."` all name it.
            let depends = manifest.lines().any(|line| {
                line.trim_start()
                    .strip_prefix(*other)
                    .is_some_and(|rest| rest.trim_start().starts_with('=') || rest.starts_with('.'))
            });
            assert!(!depends, "{crate_name} depends on {other}");
        }
    }
}

#[test]
fn only_ratebudget_touches_the_rate_budgets_table() {
    for crate_name in CONTEXTS.iter().chain(&["app", "ratebudget-tower"]) {
        let src = workspace().join("crates").join(crate_name).join("src");
        for file in rust_files(&src) {
            for line in code_lines(&file) {
                assert!(!line.contains("rate_budgets"), "{} touches the table: {line}", file.display());
            }
        }
    }
}

#[test]
fn decisions_never_read_the_database_clock() {
    // `now` is the caller's clock, a bind parameter; the statements must not call now().
    // The statements, and every decision function's current definition.
    let sql_files = |directory: &str| {
        fs::read_dir(workspace().join(directory)).unwrap().map(|entry| entry.unwrap().path())
    };
    let queries = sql_files("crates/ratebudget/queries");
    for path in queries.chain(sql_files("crates/ratebudget/sql/functions")) {
        let sql: String = fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
            .to_lowercase();
        for clock in ["now()", "current_timestamp", "clock_timestamp", "statement_timestamp"] {
            assert!(!sql.contains(clock), "{} reads the database clock ({clock})", path.display());
        }
    }
}

#[test]
fn the_readme_documents_every_knob() {
    // `serve --help` is generated from the knobs themselves; the README is written by hand, so
    // this keeps it from missing one.
    let readme = fs::read_to_string(workspace().join("README.md")).unwrap();
    for knob in app::config::Knobs::names() {
        assert!(readme.contains(&format!("`{knob}`")), "README.md does not document {knob}");
    }
}
