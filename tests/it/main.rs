//! Integration tests against a real PostgreSQL: one binary, a module per feature.
//!
//! Each database test runs on a fresh database of its own (`#[sqlx::test]`, or
//! `support::helpers::FreshDatabase` where a test needs a runtime of its own), created from
//! `DATABASE_URL` and migrated with `app::migrations::MIGRATOR`.

mod access_adapters;
mod app_api;
mod app_auth_throttle;
mod app_hostile_input;
mod app_leaks;
mod app_outage;
mod app_replicas;
mod app_resilience;
mod app_revocation;
mod app_security;
mod architecture;
mod charges;
mod coalescing;
mod database_pgbouncer;
mod decide;
mod envoy_ratelimit;
mod faults_clock;
mod faults_database;
mod faults_failover;
mod faults_history;
mod faults_http;
mod faults_leader;
mod grafana_dashboard;
mod guard;
mod ingest_adapters;
mod leases;
mod migrations;
mod named_limits;
mod otlp_export;
mod plans;
mod quota_api;
mod quota_store;
mod ratebudget_store;
mod readme;
mod rlqs;
mod rules_api;
mod rules_enforcement;
mod rules_store;
mod secrets_adapters;
mod support;
mod tower_layer;
mod ui_api;
mod ui_chromium;
