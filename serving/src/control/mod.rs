//! control (placeholder).
