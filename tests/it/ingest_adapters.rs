//! The ingest context's adapters against a real PostgreSQL.
