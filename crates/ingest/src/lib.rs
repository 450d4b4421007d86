//! The ingest context: telemetry batches from Nodes.
