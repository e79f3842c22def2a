//! scheduler (placeholder).
