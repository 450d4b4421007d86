//! The plexsphere composition root, the `plexsphere` binary: it reads the knobs once at boot,
//! builds the pools, binds each context's ports and the `service` crate's to their adapters,
//! serves the HTTP API and Envoy's gRPC protocols, and runs the leader-elected background
//! loops. What plexsphere decides lives in the `service` crate; this crate holds no decision.
//!
//! Its modules, by layer:
//! - wiring: [`startup`] (the application, its pools and adapters), [`cli`] (the commands),
//!   [`migrations`] (the database's one set, [`migrations::MIGRATOR`]);
//! - configuration: [`config`], the knobs grouped by subsystem;
//! - transports: [`http`] (the API; handlers translate), [`grpc`] (Envoy's protocols), and
//!   [`edge`], what both share (who is calling, the failed-authentication throttle, a call's
//!   database time);
//! - runtime: [`runtime`] (the leader, the sweep, the listener and its followers, readiness);
//! - observation: [`observation`] (the guard's observer, fill history, metrics, OTLP, logs).

pub mod cli;
pub mod config;
pub mod edge;
pub mod grpc;
pub mod http;
pub mod migrations;
pub mod observation;
pub mod quota_store;
pub mod runtime;
pub mod startup;
