use chrono::TimeZone;

use super::*;

fn at(micros: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap() + chrono::TimeDelta::microseconds(micros)
}

#[track_caller]
fn rejects(per_second: f64, burst: f64, field: &str) {
    let error = Limit::new(per_second, burst).unwrap_err();
    assert_eq!(error.field, field, "{per_second}/{burst}: {error}");
}

#[test]
fn a_limit_must_refill_within_the_idle_retention_by_the_tables_comparison() {
    assert!(Limit::new(1.0, 3600.0).is_ok());
    rejects(1.0, 3600.000001, "burst");
    // Found by a user: passed the old `burst / per_second > 3600` test and tripped the CHECK.
    rejects(544.7026188767409, 1960929.4279562673, "burst");
    assert_eq!(
        Limit::new(544.7026188767409, 1960929.4279562673).is_ok(),
        1960929.4279562673 <= 544.7026188767409 * 3600.0
    );
}

#[test]
fn unusable_numbers_are_refused_naming_their_field() {
    for per_second in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e13] {
        rejects(per_second, 1.0, "per_second");
    }
    for burst in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e16] {
        rejects(1e12, burst, "burst");
    }
    let limit = Limit::new(Limit::MAX_PER_SECOND, Limit::MAX_BURST).unwrap();
    assert_eq!((limit.per_second(), limit.burst()), (1e12, 1e15));
}

#[test]
fn the_level_refills_at_the_rate_up_to_the_burst_and_never_from_a_clock_behind() {
    let limit = Limit::new(2.0, 10.0).unwrap();
    let fill = Fill { tokens: 1.0, refilled_at: at(0) };
    assert_eq!(limit.level(fill, at(500_000)), 2.0);
    assert_eq!(limit.level(fill, at(-5_000_000)), 1.0);
    assert_eq!(limit.level(fill, at(3_600_000_000)), 10.0);
    assert_eq!(limit.level(fill, at(200 * 86_400_000_000)), 10.0);
}

#[test]
fn covered_at_is_the_first_microsecond_at_which_the_level_covers_the_cost() {
    let cases = [(2.0, 10.0, 0.0, 1.0), (0.1, 5.0, 0.3, 1.0), (3.0, 9.0, 0.0, 9.0), (7.3, 20.0, 1.7, 3.3)];
    for (per_second, burst, tokens, cost) in cases {
        let limit = Limit::new(per_second, burst).unwrap();
        let fill = Fill { tokens, refilled_at: at(0) };
        let now = at(1_000);
        let covered = limit.covered_at(fill, cost, now);
        assert!(limit.level(fill, covered) >= cost, "{cases:?}");
        assert!(limit.level(fill, covered - chrono::TimeDelta::microseconds(1)) < cost, "{cases:?}");
    }
    let limit = Limit::new(2.0, 10.0).unwrap();
    let full = Fill { tokens: 10.0, refilled_at: at(0) };
    assert_eq!(limit.covered_at(full, 3.0, at(7)), at(7), "covered already: now");
    assert_eq!(
        limit.time_to_cover(Fill { tokens: 0.0, refilled_at: at(0) }, 1.0, at(0)),
        Duration::from_millis(500)
    );
}

#[test]
fn covered_at_waits_for_a_clock_running_behind_to_reach_the_refill_instant() {
    let limit = Limit::new(1.0, 5.0).unwrap();
    let ahead = Fill { tokens: 0.0, refilled_at: at(10_000_000) };
    assert_eq!(limit.covered_at(ahead, 1.0, at(0)), at(11_000_000));
}

#[test]
fn refill_time_is_the_burst_over_the_rate() {
    assert_eq!(Limit::new(10.0, 20.0).unwrap().refill_time(), Duration::from_secs(2));
}

#[test]
fn a_budget_of_any_period_refills_within_a_year_and_a_day() {
    // 1,000 a day: over the hour, so not a `Limit::new`, and within a year.
    let daily = 1000.0 / 86_400.0;
    assert_eq!(Limit::new(daily, 1000.0).unwrap_err().field, "burst");
    let limit = Limit::for_any_period(daily, 1000.0).unwrap();
    assert_eq!(limit.refill_time().as_secs(), 86_400);
    assert!(!limit.refills_within_the_idle_retention());
    assert!(Limit::new(1.0, 3600.0).unwrap().refills_within_the_idle_retention());
    // A year's quota fits; more than a year and a day does not.
    assert!(Limit::for_any_period(1000.0 / (365.0 * 86_400.0), 1000.0).is_ok());
    assert_eq!(Limit::for_any_period(1.0 / (367.0 * 86_400.0), 1.0).unwrap_err().field, "burst");
    // The other rules are Limit::new's.
    assert_eq!(Limit::for_any_period(0.0, 1.0).unwrap_err().field, "per_second");
    assert_eq!(Limit::for_any_period(1.0, 0.0).unwrap_err().field, "burst");
    assert_eq!(Limit::for_any_period(1.0, f64::NAN).unwrap_err().field, "burst");
    assert_eq!(Limit::for_any_period(1e12, 2e15).unwrap_err().field, "burst");
}
