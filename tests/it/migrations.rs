//! Released migrations are immutable: a database migrated by one build must start under every
//! later build, and sqlx refuses a database whose recorded checksum of a migration differs
//! from the build's (0003 and 0004 were once edited after release, which is what this stops).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// A `checksums.sha384` file, as (version → (checksum hex, description)).
fn recorded(file: &str) -> BTreeMap<i64, (String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
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
    let mut problems = Vec::new();
    for (migrator, file) in [
        (&ratebudget::MIGRATOR, "crates/ratebudget/migrations/checksums.sha384"),
        (&app::migrations::OWN, "migrations/checksums.sha384"),
    ] {
        let recorded = recorded(file);
        for migration in migrator.iter() {
            let checksum = hex(&migration.checksum);
            match recorded.get(&migration.version) {
                Some((expected, _)) if *expected == checksum => {}
                Some(_) => problems.push(format!(
                    "migration {:04} ({}) changed after release: add a new migration instead of editing it \
                     (a function it includes changed? freeze its text into it: crates/ratebudget/sql/README.md)",
                    migration.version, migration.description
                )),
                None => problems.push(format!(
                    "migration {:04} is not recorded; once it is final, add this line to {file}:\n{:04} {checksum} {}",
                    migration.version, migration.version, migration.description
                )),
            }
        }
        for version in recorded.keys() {
            if !migrator.iter().any(|migration| migration.version == *version) {
                problems.push(format!(
                    "released migration {version:04} is gone: a database that ran it would not start"
                ));
            }
        }
    }
    // One database, one history: no version is used by both owners.
    let ours: Vec<i64> = ratebudget::MIGRATOR.iter().map(|migration| migration.version).collect();
    for migration in app::migrations::OWN.iter().filter(|migration| ours.contains(&migration.version)) {
        problems.push(format!("version {} is used by ratebudget and by the contexts", migration.version));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_coalesced_take_functions_keep_planning_once_per_session(pool: sqlx::PgPool) {
    // 0013 set plan_cache_mode on decide_rate_budget_batch; a later CREATE OR REPLACE without
    // the clause would drop it silently (and a call would plan six statements again). The
    // distinct buckets' function also prices out the joins that would read a whole index
    // (its text says why; tests/it/plans.rs fails without them).
    let generic = "plan_cache_mode=force_generic_plan";
    for (function, expected) in [
        ("decide_rate_budget_batch", &[generic][..]),
        ("decide_rate_budget_batch_of_one_bucket", &[generic][..]),
        (
            "decide_rate_budget_batch_of_distinct_buckets",
            &[generic, "enable_hashjoin=off", "enable_mergejoin=off"][..],
        ),
    ] {
        let config: Option<Vec<String>> = sqlx::query_scalar(
            "SELECT proconfig FROM pg_proc WHERE proname = $1 AND pronamespace = 'plexsphere'::regnamespace",
        )
        .bind(function)
        .fetch_one(&pool)
        .await
        .unwrap();
        let expected: Vec<String> = expected.iter().map(|setting| (*setting).to_owned()).collect();
        assert_eq!(config, Some(expected), "{function}");
    }
}

/// The versions written before migrations had to grow: the only ones allowed out of order.
const WRITTEN_OUT_OF_ORDER: std::ops::RangeInclusive<i64> = 1..=57;

#[test]
fn every_migration_since_the_last_written_out_of_order_has_a_timestamp_version_above_them() {
    // Issue 20, item 6. sqlx applies a missing version below the highest applied one, so a
    // migration whose version sorts below one already released runs in another order on an
    // upgraded database than on a fresh one. Versions are timestamps now (`sqlx migrate add`),
    // each above every earlier one; the repository's before-stop hook checks that the newest
    // file sorts last, and `serve` refuses a database that lacks one below one it has.
    for migration in app::migrations::MIGRATOR.iter() {
        if WRITTEN_OUT_OF_ORDER.contains(&migration.version) {
            continue;
        }
        assert!(
            (20_261_201_000_000..100_000_000_000_000).contains(&migration.version),
            "migration {} ({}) must have a timestamp version (YYYYMMDDHHMMSS) above every earlier one",
            migration.version,
            migration.description
        );
    }
}

#[sqlx::test(migrations = false)]
async fn a_database_lacking_a_migration_below_one_it_has_is_refused_before_anything_is_applied(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let pool = options.connect_with(connect.clone()).await.unwrap();
    // Issue 20, item 6: a database migrated by a build that had 0057 but not 0056, as a build
    // written out of order would leave it. (Since the split, order is each owner's own:
    // ratebudget's 0014 below the contexts' 0057 depends on nothing of theirs.)
    let without_0056 = sqlx::migrate::Migrator {
        migrations: app::migrations::MIGRATOR
            .iter()
            .filter(|migration| migration.version <= 57 && migration.version != 56)
            .cloned()
            .collect(),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    without_0056.run(&pool).await.unwrap();
    let applied = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM _sqlx_migrations").fetch_one(&pool).await.unwrap()
    };
    let before = applied().await;

    let refused = app::migrations::apply(&pool, false).await.unwrap_err();
    let app::migrations::MigrateError::OutOfOrder(out_of_order) = &refused else { panic!("{refused:?}") };
    assert_eq!(out_of_order.highest_applied, 57);
    assert_eq!(out_of_order.missing.iter().map(|gap| gap.version).collect::<Vec<_>>(), [56]);
    assert_eq!(applied().await, before, "nothing was applied");

    // `serve` refuses to start on it, saying what is missing and what to do.
    let config = crate::support::replicas::config(&connect, &[]);
    let message = format!("{:#}", app::cli::serve(config, true).await.unwrap_err());
    assert!(
        message.contains("lacks 56 (move issuance policies") && message.contains("--allow-out-of-order"),
        "{message}"
    );
    assert_eq!(applied().await, before);

    // Told so, having checked, the operator fills the gap and applies the rest.
    app::migrations::apply(&pool, true).await.unwrap();
    assert_eq!(applied().await, app::migrations::MIGRATOR.iter().count() as i64);
    assert!(app::migrations::gaps(&pool).await.unwrap().is_none());
}

#[test]
fn domains_that_shared_a_name_keep_it_for_the_oldest_and_the_others_tell_themselves_apart() {
    // Issue 21: names are unique from migration 20261201140000 on; Domains created before it
    // may share one.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (database, pool) =
            crate::support::helpers::FreshDatabase::create_before(20_261_201_140_000).await;
        let (oldest, later) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        for (id, created_at) in [(later, "2026-11-02T00:00:00Z"), (oldest, "2026-11-01T00:00:00Z")] {
            sqlx::query(
                "INSERT INTO plexsphere.domains (id, name, created_at) VALUES ($1, 'acme', $2::timestamptz)",
            )
            .bind(id)
            .bind(created_at)
            .execute(&pool)
            .await
            .unwrap();
        }
        app::migrations::MIGRATOR.run(&pool).await.unwrap();
        let name = |id: uuid::Uuid| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, String>("SELECT name FROM plexsphere.domains WHERE id = $1")
                    .bind(id)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(name(oldest).await, "acme");
        assert_eq!(name(later).await, format!("acme ({})", &later.to_string()[..8]));
        database.drop_database(pool).await;
    });
}

/// `crates/ratebudget/sql/functions/`: each function's current definition, by name.
fn function_files() -> BTreeMap<String, String> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/ratebudget/sql/functions");
    fs::read_dir(&directory)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
            (name, fs::read_to_string(&path).unwrap())
        })
        .collect()
}

/// PostgreSQL's own rendering of `schema.name`, with the schema's name written as `plexsphere`.
async fn functiondef(connection: &mut sqlx::PgConnection, schema: &str, name: &str) -> String {
    let definition: String = sqlx::query_scalar(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = $1 AND p.proname = $2",
    )
    .bind(schema)
    .bind(name)
    .fetch_one(&mut *connection)
    .await
    .unwrap_or_else(|error| panic!("{schema}.{name}: {error}"));
    definition.replace(&format!("{schema}."), "plexsphere.")
}

#[sqlx::test(migrator = "ratebudget::MIGRATOR")]
async fn the_database_holds_exactly_each_function_file_of_ratebudget(pool: sqlx::PgPool) {
    // Issue 22: each SQL function's current definition lives in one file, which the migration
    // that changes it includes whole; the database must hold exactly that, SET clauses and all.
    let files = function_files();
    let mut connection = pool.acquire().await.unwrap();
    let in_database: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'plexsphere' ORDER BY 1",
    )
    .fetch_all(&mut *connection)
    .await
    .unwrap();
    assert_eq!(
        in_database,
        files.keys().cloned().collect::<Vec<_>>(),
        "every function has its file, and only those"
    );
    for (name, file) in &files {
        sqlx::query("BEGIN").execute(&mut *connection).await.unwrap();
        sqlx::query("CREATE SCHEMA scratch").execute(&mut *connection).await.unwrap();
        sqlx::raw_sql(&file.replace("plexsphere.", "scratch.")).execute(&mut *connection).await.unwrap();
        let expected = functiondef(&mut connection, "scratch", name).await;
        let held = functiondef(&mut connection, "plexsphere", name).await;
        sqlx::query("ROLLBACK").execute(&mut *connection).await.unwrap();
        assert_eq!(held, expected, "plexsphere.{name} is not what functions/{name}.sql defines");
    }
}
