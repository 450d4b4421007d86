//! Architecture checks for the context as a whole.

/// The domain modules, as compiled; `persistence.rs` is the one module allowed the database.
const DOMAIN_MODULES: [(&str, &str); 5] = [
    ("lib.rs", include_str!("lib.rs")),
    ("model.rs", include_str!("model.rs")),
    ("ports.rs", include_str!("ports.rs")),
    ("error.rs", include_str!("error.rs")),
    ("service.rs", include_str!("service.rs")),
];

#[test]
fn only_the_persistence_module_names_the_database_crates() {
    for (file, source) in DOMAIN_MODULES {
        for line in source.lines().filter(|line| !line.trim_start().starts_with("//")) {
            for crate_name in ["sqlx", "ratebudget"] {
                assert!(!line.contains(crate_name), "{file} names {crate_name}: {line}");
            }
        }
    }
}
