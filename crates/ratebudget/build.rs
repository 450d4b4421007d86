//! Builds `ratebudget::MIGRATOR` from `migrations/`: each file as sqlx's `migrate!` reads it,
//! with every `--! include <file>` line replaced by that file of `sql/` (a function's current
//! definition, which lives in one file), and the checksum sqlx records computed from the
//! result. A file without include lines is used byte for byte, so its checksum is the one an
//! earlier build recorded.
use std::fmt::Write as _;
use std::path::Path;

use sha2::{Digest as _, Sha384};

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=sql");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let mut files: Vec<_> = std::fs::read_dir("migrations")
        .expect("crates/ratebudget/migrations")
        .map(|entry| entry.expect("a readable entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .collect();
    files.sort();
    let mut list = String::from("&[\n");
    let mut versions = Vec::new();
    for path in files {
        let file = path.file_name().and_then(|name| name.to_str()).expect("a UTF-8 file name");
        let (version, description) = file
            .trim_end_matches(".sql")
            .split_once('_')
            .unwrap_or_else(|| panic!("{file}: a migration is named <version>_<description>.sql"));
        let version: i64 = version.parse().unwrap_or_else(|_| panic!("{file}: the version is not a number"));
        assert!(!versions.contains(&version), "{file}: version {version} is used twice");
        versions.push(version);
        let sql = expand(&path);
        let expanded = Path::new(&out).join(file);
        std::fs::write(&expanded, &sql).expect("OUT_DIR is writable");
        let checksum: Vec<String> =
            Sha384::digest(sql.as_bytes()).iter().map(|byte| byte.to_string()).collect();
        let no_tx = sql.starts_with("-- no-transaction");
        writeln!(
            list,
            "    ::sqlx::migrate::Migration {{ version: {version}, description: ::std::borrow::Cow::Borrowed({description:?}), \
             migration_type: ::sqlx::migrate::MigrationType::Simple, sql: ::std::borrow::Cow::Borrowed(include_str!({expanded:?})), \
             checksum: ::std::borrow::Cow::Borrowed(&[{}]), no_tx: {no_tx} }},",
            checksum.join(", "),
            description = description.replace('_', " "),
        )
        .expect("writing to a string");
    }
    list.push(']');
    std::fs::write(Path::new(&out).join("migrations.rs"), list).expect("OUT_DIR is writable");
}

/// `path`'s text with each `--! include <file>` line replaced by `sql/<file>`'s text.
fn expand(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    if !text.contains("--! include ") {
        return text;
    }
    let mut expanded = String::with_capacity(text.len() * 4);
    for line in text.split_inclusive('\n') {
        match line.trim_end().strip_prefix("--! include ") {
            Some(included) => {
                let included = Path::new("sql").join(included.trim());
                let body = std::fs::read_to_string(&included).unwrap_or_else(|error| {
                    panic!("{}: includes {}: {error}", path.display(), included.display())
                });
                expanded.push_str(&body);
            }
            None => expanded.push_str(line),
        }
    }
    expanded
}
