//! The audit context: who did what, recorded once and never changed.
//!
//! An [`Entry`] names its [`Actor`] (an operator by the name of its token, or the command
//! line), its [`Action`] and what it acted on. The composition root appends one after every
//! operator action succeeds; `GET /v1/audit` reads them back, newest first.
//!
//! Invariants:
//! - Append-only: the port has no update or delete, and the table's triggers refuse both (and
//!   TRUNCATE) to the service.
//! - An entry never holds a token or a secret value: its fields are an actor's name, an action,
//!   ids and a secret's name, each validated, and nothing else.
//!
//! It is a context of its own, not part of `app`, because it owns a table: its SQL stays in
//! its `persistence` module like every context's, and the other contexts never see it (the
//! composition root records what they did, in the operator's name).

mod model;
mod persistence;
mod ports;

pub use model::{Action, Actor, Entry, InvalidInput, NewEntry, Page, Subject};
pub use persistence::PgAuditLog;
pub use ports::{AuditLog, AuditLogError};
