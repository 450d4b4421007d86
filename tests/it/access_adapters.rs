//! The access context's adapters against a real PostgreSQL.
