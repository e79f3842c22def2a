//! api (placeholder).
