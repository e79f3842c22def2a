//! ingest (placeholder until its issue lands).
