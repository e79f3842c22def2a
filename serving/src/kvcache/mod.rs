//! kvcache (placeholder).
