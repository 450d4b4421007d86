//! The test harness: what feature modules share, kept apart from the tests themselves.

pub(crate) mod cluster;
pub(crate) mod grpc;
pub(crate) mod helpers;
pub(crate) mod logs;
pub(crate) mod netns;
pub(crate) mod pgbouncer;
pub(crate) mod process;
pub(crate) mod proxy;
pub(crate) mod replicas;
