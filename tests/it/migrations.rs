//! Released migrations are immutable: a database migrated by one build must start under every
//! later build, and sqlx refuses a database whose recorded checksum of a migration differs
//! from the build's (0003 and 0004 were once edited after release, which is what this stops).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// `migrations/checksums.sha384`, as (version → (checksum hex, description)).
fn recorded() -> BTreeMap<i64, (String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/checksums.sha384");
    let text = fs::read_to_string(&path).unwrap();
    let mut recorded = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')) {
        let mut fields = line.splitn(3, ' ');
        let (Some(version), Some(checksum), Some(description)) =
            (fields.next(), fields.next(), fields.next())
        else {
            panic!("malformed line in {}: {line:?}", path.display());
        };
        let version: i64 = version.parse().unwrap();
        let previous = recorded.insert(version, (checksum.to_owned(), description.to_owned()));
        assert!(previous.is_none(), "migration {version} is recorded twice");
    }
    recorded
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[test]
fn every_migration_is_recorded_and_no_released_one_has_changed() {
    let recorded = recorded();
    let mut problems = Vec::new();
    for migration in app::MIGRATOR.iter() {
        let checksum = hex(&migration.checksum);
        match recorded.get(&migration.version) {
            Some((expected, _)) if *expected == checksum => {}
            Some(_) => problems.push(format!(
                "migration {:04} ({}) changed after release: add a new migration instead of editing it",
                migration.version, migration.description
            )),
            None => problems.push(format!(
                "migration {:04} is not recorded; once it is final, add this line to \
                 migrations/checksums.sha384:\n{:04} {checksum} {}",
                migration.version, migration.version, migration.description
            )),
        }
    }
    for version in recorded.keys() {
        if !app::MIGRATOR.iter().any(|migration| migration.version == *version) {
            problems.push(format!(
                "released migration {version:04} is gone: a database that ran it would not start"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn the_coalesced_take_functions_keep_planning_once_per_session(pool: sqlx::PgPool) {
    // 0013 set plan_cache_mode on decide_rate_budget_batch; a later CREATE OR REPLACE without
    // the clause would drop it silently (and a call would plan six statements again).
    for function in [
        "decide_rate_budget_batch",
        "decide_rate_budget_batch_of_one_bucket",
        "decide_rate_budget_batch_of_distinct_buckets",
    ] {
        let config: Option<Vec<String>> = sqlx::query_scalar(
            "SELECT proconfig FROM pg_proc WHERE proname = $1 AND pronamespace = 'plexsphere'::regnamespace",
        )
        .bind(function)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(config, Some(vec!["plan_cache_mode=force_generic_plan".to_owned()]), "{function}");
    }
}
