use super::*;

#[test]
fn debug_never_shows_the_value() {
    let token = Redacted::new("dev-operator-token-change-me".to_owned());
    assert_eq!(format!("{token:?}"), "<redacted>");
    assert_eq!(format!("{:?}", Some(&token)), "Some(<redacted>)");
    assert_eq!(token.as_str(), "dev-operator-token-change-me");
}

#[test]
fn a_database_shows_where_it_leads_and_never_its_password() {
    let options: PgConnectOptions = "postgres://app:pa55word@db.internal:5433/plexsphere".parse().unwrap();
    assert_eq!(format!("{:?}", Database::new(options)), "postgres://app@db.internal:5433/plexsphere");
}
