//! Wire types shared by the three brownout processes.
//!
//! This crate owns every byte that crosses a process boundary:
//!
//! - [`command`]: the degradation command the control plane publishes (docs/ARCHITECTURE.md §3),
//!   its tiers, criticalities, feature states and shed parameters;
//! - [`command_keys`]: Ed25519 command signatures (the control plane's private key, engines'
//!   public keys by key id) and per-engine ack keys;
//! - [`signing`]: HMAC-SHA256 (the compatibility mode) over a command's exact JSON bytes, verified in constant time, and
//!   domain-separated seals for the other values kept in Redis (acks, the operator override);
//! - [`keys`]: the Redis key names of one cluster (all share the hash tag `{cluster}`) and the
//!   ack format written to the acks hash;
//! - [`error_body`]: the JSON error body of the control plane's and the gpu-agent's HTTP APIs;
//! - [`failure`]: the failure event (NDJSON ingest and OTLP-derived) and category inference;
//! - [`snapshot`]: the gpu-agent snapshot (GPUs and engines, KV fragmentation ratios);
//! - [`html`]: HTML/XML escaping for the pages and charts each process renders;
//! - [`wire`]: names both sides spell the same: span attributes, HTTP headers, metric names.
//!
//! It has no IO and no async: everything here is a value, a parser or a pure function. The
//! optional `redis` feature adds [`redis_conn`], which builds a Redis client from a URL and the
//! TLS files named in the environment (it reads those files, nothing else), and [`redis_ha`],
//! which resolves a `redis+sentinel://` URL's master through Sentinel and follows failovers (async IO).

pub mod command;
pub mod command_keys;
pub mod error_body;
pub mod failure;
pub mod html;
pub mod keys;
pub mod signing;
pub mod snapshot;
pub mod wire;

#[cfg(feature = "redis")]
pub mod redis_conn;
#[cfg(feature = "redis")]
pub mod redis_ha;
#[cfg(feature = "redis")]
pub use redis_conn::{RedisTls, redis_client, redis_client_with};
#[cfg(feature = "redis")]
pub use redis_ha::{BoundedConnectError, HaConnection, RedisTarget, SentinelSpec};

pub use command::{
    ALL_INSTANCES, AbortEntry, AbortKind, Command, Criticality, DEFAULT_PROBE_RATIO, EntryApplied,
    FeatureState, FeatureStatus, InstanceEntry, Limits, MAX_ABORT_ENTRIES, MAX_ABORT_ID_BYTES,
    Reason, ResolvedInstance, Shed, TOOL_FEATURE_PREFIX, Tier, TierParseError,
};
pub use command_keys::{
    AckKeys, CommandPublicKey, CommandSigner, CommandSigningKey, CommandVerifier, EngineKeys,
    KeyError, PlaneKeys,
};
pub use error_body::{ErrorBody, ErrorDetail};
pub use failure::{Category, FailureEvent, FailureParseError};
pub use keys::{
    Ack, AckParseError, AckVerifyError, CLUSTER_ENV, ClusterNameError, DEFAULT_CLUSTER, RedisKeys,
    cluster_from_env, notify_payload, parse_notify,
};
pub use signing::{SignedCommand, UnsealError, VerifyError, seal, sign, unseal, verify};
pub use snapshot::{AgentSnapshot, EngineStats, GpuStats, KvStats};

/// Milliseconds since the Unix epoch, the time unit of every wire type.
pub fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}
