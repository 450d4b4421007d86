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

/// The lines of every `.rs` file under `crates/<name>/src` that are code, with the file.
fn crate_code(name: &str) -> Vec<(PathBuf, String)> {
    let src = workspace().join("crates").join(name).join("src");
    rust_files(&src)
        .into_iter()
        .flat_map(|file| code_lines(&file).into_iter().map(move |line| (file.clone(), line)))
        .collect()
}

/// Whether a manifest's `[dependencies]` (not its dev-dependencies) names `dependency`.
fn depends_on(manifest: &str, dependency: &str) -> bool {
    let mut in_dependencies = false;
    manifest.lines().any(|line| {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            return false;
        }
        in_dependencies
            && line
                .strip_prefix(dependency)
                .is_some_and(|rest| rest.trim_start().starts_with('=') || rest.starts_with('.'))
    })
}

#[test]
fn the_service_crate_names_no_transport_environment_or_database_driver() {
    // Issue 33: what plexsphere decides lives in `service`, which tests without sockets and
    // PostgreSQL; the binary is the only crate that knows its protocols.
    let manifest = fs::read_to_string(workspace().join("crates/service/Cargo.toml")).unwrap();
    for forbidden in ["sqlx", "axum", "tonic", "clap", "hyper", "prost"] {
        assert!(!depends_on(&manifest, forbidden), "service depends on {forbidden}");
        for (file, line) in crate_code("service") {
            assert!(
                !line.contains(&format!("{forbidden}::")),
                "{} names {forbidden}: {line}",
                file.display()
            );
        }
    }
    for (file, line) in crate_code("service") {
        assert!(!line.contains("std::env::var"), "{} reads the environment: {line}", file.display());
    }
}

#[test]
fn only_app_and_the_service_crate_depend_on_every_context() {
    for entry in fs::read_dir(workspace().join("crates")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let Ok(manifest) = fs::read_to_string(path.join("Cargo.toml")) else { continue };
        let all = CONTEXTS.iter().all(|context| depends_on(&manifest, context));
        assert!(!all || name == "app" || name == "service", "{name} depends on every context");
        assert!(name == "app" || !depends_on(&manifest, "app"), "{name} depends on app");
    }
}

#[test]
fn app_holds_no_decision() {
    // The budgets every take is sized by, rule resolution and the operator actions are the
    // service crate's; app wires, configures, translates, runs and observes.
    let decisions = [
        "impl ratebudget::Budgets",
        "impl Budgets for",
        ".matching(",
        ".resolve(",
        ".candidates(",
        ".keyed_by(",
        "fn runtime_key",
        "issuance_override(",
    ];
    for (file, line) in crate_code("app") {
        for decision in decisions {
            assert!(!line.contains(decision), "{} holds a decision ({decision}): {line}", file.display());
        }
    }
}

#[test]
fn only_ratebudget_touches_the_rate_budgets_table() {
    for crate_name in CONTEXTS.iter().chain(&["app", "service", "ratebudget-tower"]) {
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

/// The top-level module `file` belongs to (`http` for `src/http/auth.rs`), or `None` for the
/// crate root.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str().to_str().unwrap();
    let module = first.trim_end_matches(".rs");
    (module != "lib" && module != "main").then(|| module.to_owned())
}

/// The crate's top-level modules each of `files` names through `crate::` (a path, or a
/// `use crate::{...}` list).
fn crate_imports(code: &str) -> Vec<String> {
    let mut named = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(list.len())];
            named.extend(list.split(',').filter_map(|item| {
                let module = item.trim().split("::").next()?.trim();
                (!module.is_empty() && module != "self").then(|| module.to_owned())
            }));
        } else {
            let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
            named.push(rest[..end.unwrap_or(rest.len())].to_owned());
        }
    }
    named.retain(|module| module.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    named
}

#[test]
fn only_the_root_modules_name_the_http_adapter() {
    // Issue 22: app's modules sit under its HTTP adapter; only the command line and the
    // wiring reach up to it.
    let src = workspace().join("crates/app/src");
    for file in rust_files(&src) {
        let module = top_module(&src, &file);
        // Issue 33: gRPC is a transport beside HTTP, not under it; what both share is `edge`.
        if matches!(module.as_deref(), Some("cli" | "startup" | "http") | None) {
            continue;
        }
        for line in code_lines(&file) {
            assert!(
                !crate_imports(&line).iter().any(|named| named == "http"),
                "{} names crate::http: {line}",
                file.display()
            );
        }
    }
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    for entry in fs::read_dir(workspace().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut imports: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            std::collections::BTreeMap::new();
        for file in rust_files(&src) {
            let Some(module) = top_module(&src, &file) else { continue };
            let code = code_lines(&file).join("\n");
            let named: Vec<String> =
                crate_imports(&code).into_iter().filter(|named| *named != module).collect();
            imports.entry(module).or_default().extend(named);
        }
        assert_no_cycle(&imports, &src.display().to_string());
    }
}

/// The sibling modules each of `code`'s lines names through `super::` (a path, or a
/// `use super::{...}` list).
fn sibling_imports(code: &str) -> Vec<String> {
    let mut named = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("super::") {
        rest = &rest[at + "super::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(list.len())];
            named.extend(list.split(',').filter_map(|item| {
                let module = item.trim().split("::").next()?.trim();
                (!module.is_empty()).then(|| module.to_owned())
            }));
        } else {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            named.push(rest[..end.unwrap_or(rest.len())].to_owned());
        }
    }
    named
}

#[test]
fn the_http_handlers_import_neither_the_router_nor_each_other_in_a_circle() {
    // Issue 33: twelve of the arrows inside http/ ran back up to its mod.rs for the state and
    // the error, and operator.rs and rule_routes.rs imported each other.
    let http = workspace().join("crates/app/src/http");
    let mut imports: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for file in rust_files(&http) {
        let name = file.file_stem().unwrap().to_str().unwrap().to_owned();
        if name == "mod" || file.parent() != Some(http.as_path()) {
            continue;
        }
        // A module's own unit tests import it through `super::*`.
        let code = code_lines(&file).join("\n");
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        for named in sibling_imports(code) {
            let is_module = http.join(format!("{named}.rs")).exists() || http.join(&named).is_dir();
            assert!(
                named == "*" || is_module,
                "{} imports {named} from the router's module: import it from the module that owns it",
                file.display()
            );
            imports.entry(name.clone()).or_default().insert(named);
        }
    }
    assert_no_cycle(&imports, "http/");
}

/// Fails when a module of `imports` (each module and those it names) reaches itself again
/// through what it imports: it is on a cycle, which the failure names in `place`.
fn assert_no_cycle(
    imports: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    place: &str,
) {
    for start in imports.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut path = vec![(start.clone(), vec![start.clone()])];
        while let Some((module, trail)) = path.pop() {
            for next in imports.get(&module).into_iter().flatten() {
                let trail = [trail.clone(), vec![next.clone()]].concat();
                assert!(next != start, "{place}: import cycle {}", trail.join(" → "));
                if seen.insert(next.clone()) {
                    path.push((next.clone(), trail));
                }
            }
        }
    }
}
