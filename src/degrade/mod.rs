//! degrade (placeholder until its issue lands).
