//! The secrets context's adapters against a real PostgreSQL.
