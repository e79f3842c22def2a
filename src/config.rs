//! The control plane's configuration: a TOML file (see `examples/brownout.toml`, documented in
//! docs/CONFIG.md) plus environment overrides.
//!
//! Two layers, as STYLE.md asks: [`RawConfig`] mirrors the file (`deny_unknown_fields`, units in
//! field names) and [`Config`] holds validated, typed values. Every error names the file, the
//! field and the reason.
//!
//! Environment overrides (applied after the file, before validation):
//! `BROWNOUT_DATA_DIR`, `CLICKHOUSE_URL`, `CLICKHOUSE_CLUSTER`, `REDIS_URL`,
//! `BROWNOUT_SHARE_SLO_COUNTERS`, `BROWNOUT_SHARE_PATTERNS`, `BROWNOUT_CLICKHOUSE_ACK`, and the secrets `BROWNOUT_INGEST_TOKEN`,
//! `BROWNOUT_READ_TOKEN`, `BROWNOUT_ADMIN_TOKEN`, `BROWNOUT_COMMAND_KEY` — each secret also as
//! `<NAME>_FILE` naming a file that holds it (trailing whitespace trimmed).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod tls;
pub use tls::ListenerTls;
use tls::{clickhouse_tls, listener_tls};

/// Why a configuration was refused. The message always says where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {reason}")]
    Parse { file: String, reason: String },
    #[error("{file}: field `{field}`: {reason}")]
    Field {
        file: String,
        field: String,
        reason: String,
    },
    #[error("{0}")]
    MissingSecrets(String),
}

/// The file, exactly as written. Every section and field is optional; defaults are documented in
/// docs/CONFIG.md and in `examples/brownout.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub storage: RawStorage,
    #[serde(default)]
    pub ingest: RawIngest,
    #[serde(default)]
    pub spool: RawSpool,
    #[serde(default)]
    pub hosts: RawHosts,
    #[serde(default)]
    pub auth: RawAuth,
    #[serde(default)]
    pub control: RawControl,
    #[serde(default)]
    pub web: RawWeb,
}

// ---- web (docs/DASHBOARDS.md "Trace waterfall") -----------------------------------------------

/// `[web]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeb {
    /// An external trace viewer's link with `{trace_id}` in it (Jaeger, Tempo, SigNoz…).
    pub trace_url: Option<String>,
}

/// `web.trace_url` (env `BROWNOUT_TRACE_URL`): `None` when unset or empty; else it must be an
/// `http(s)://` URL of at most 500 bytes holding `{trace_id}`, without spaces or control characters.
pub fn check_trace_url(v: Option<String>) -> Result<Option<String>, String> {
    let Some(v) = v.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let lower = v.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(format!("{v:?} must start with http:// or https://"));
    }
    if !v.contains("{trace_id}") {
        return Err(format!("{v:?} must hold {{trace_id}}"));
    }
    if v.len() > 500 || v.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("{v:?} must be at most 500 bytes, without spaces"));
    }
    Ok(Some(v))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub http_addr: Option<String>,
    pub otlp_http_addr: Option<String>,
    pub otlp_grpc_addr: Option<String>,
    pub shutdown_grace_ms: Option<u64>,
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
    pub header_read_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    // TLS on the listeners (issue 39): PEM files, reloaded when they change.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStorage {
    pub data_dir: Option<PathBuf>,
    pub clickhouse_url: Option<String>,
    pub clickhouse_database: Option<String>,
    pub clickhouse_user: Option<String>,
    pub clickhouse_password: Option<String>,
    pub clickhouse_cluster: Option<String>,
    /// `https://` ClickHouse: PEM CA bundle to verify it with (a private CA), and a client
    /// certificate and key for mutual TLS.
    pub clickhouse_ca_file: Option<PathBuf>,
    pub clickhouse_client_cert_file: Option<PathBuf>,
    pub clickhouse_client_key_file: Option<PathBuf>,
    pub table_prefix: Option<String>,
    pub retention_days: Option<u32>,
    pub write_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIngest {
    pub max_body_bytes: Option<usize>,
    pub max_ndjson_line_bytes: Option<usize>,
    pub batch_max_rows: Option<usize>,
    pub batch_max_delay_ms: Option<u64>,
    pub max_inflight_bytes: Option<usize>,
    pub backpressure_wait_ms: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub tenant_items_per_sec: Option<u32>,
    pub tenant_burst_items: Option<u32>,
    /// `spool` (default) or `insert`: see [`ClickHouseAck`].
    pub clickhouse_ack: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpool {
    pub max_bytes: Option<u64>,
    pub segment_bytes: Option<u64>,
    pub retry_after_secs: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHosts {
    pub stale_after_ms: Option<u64>,
    pub down_after_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub ingest_token: Option<String>,
    pub read_token: Option<String>,
    pub admin_token: Option<String>,
    pub command_key: Option<String>,
    /// How long a token replaced by a reload stays accepted (seconds; 0: not at all).
    pub token_overlap_s: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawControl {
    pub cluster: Option<String>,
    pub redis_url: Option<String>,
    pub slo_file: Option<PathBuf>,
    pub policy_file: Option<PathBuf>,
    pub share_slo_counters: Option<bool>,
    pub share_patterns: Option<bool>,
}

/// A secret that never prints itself.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub http_addr: SocketAddr,
    pub otlp_http_addr: SocketAddr,
    pub otlp_grpc_addr: SocketAddr,
    pub shutdown_grace: Duration,
    /// Open client connections each listener holds at most; past it a new connection gets
    /// `503` (HTTP) or is closed (gRPC) at once.
    pub max_connections: usize,
    /// Open connections one client address holds at most on each listener (same answer past
    /// it), so one source cannot take every slot.
    pub max_connections_per_ip: usize,
    /// An HTTP/1 request head (request line and headers) must arrive within this long after
    /// the connection waits for it — also an idle keep-alive connection; closed after it.
    pub header_read_timeout: Duration,
    /// A connection that moves no byte either way for this long is closed (HTTP/2, gRPC).
    pub idle_timeout: Duration,
    /// TLS on the three listeners (`server.tls_*`); `None`: plaintext.
    pub tls: Option<ListenerTls>,
    pub data_dir: PathBuf,
    pub clickhouse: Option<ClickHouseConfig>,
    pub retention_days: u32,
    pub store_write_timeout: Duration,
    pub ingest: IngestConfig,
    pub spool: SpoolConfig,
    pub hosts: HostsConfig,
    pub ingest_token: Option<Secret>,
    pub read_token: Option<Secret>,
    pub admin_token: Option<Secret>,
    pub command_key: Option<Secret>,
    /// How long a token replaced by a reload (SIGHUP or a changed file) stays accepted
    /// (`auth.token_overlap_s`, `BROWNOUT_TOKEN_OVERLAP_S`; default 300 s).
    pub token_overlap: Duration,
    pub cluster: String,
    pub redis_url: Option<String>,
    pub slo_file: Option<PathBuf>,
    pub policy_file: Option<PathBuf>,
    /// Every replica of the cluster adds the others' SLO counts to its own through Redis
    /// (`slo::share`): on when several replicas ingest behind a load balancer.
    pub share_slo_counters: bool,
    /// Every replica of the cluster mines every replica's failures, in one order, through
    /// Redis (`patterns::share`): pattern ids and the pattern feed agree across replicas.
    pub share_patterns: bool,
    /// `web.trace_url` ([`check_trace_url`]): the external trace viewer's link template.
    pub trace_url: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    pub url: String,
    pub database: String,
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// Prepended to every table name (tests use a unique one each).
    pub table_prefix: String,
    /// A cluster name from the servers' `remote_servers`: tables are then `ReplicatedMergeTree`
    /// local tables created `ON CLUSTER` plus `Distributed` tables that every read and write
    /// goes through (docs/SCALING.md "ClickHouse cluster"). `None`: one node, `MergeTree`.
    pub cluster: Option<String>,
    /// The client TLS configuration for an `https://` URL with `storage.clickhouse_ca_file` or a
    /// client certificate; `None`: the clickhouse crate's own (Mozilla roots, no client cert).
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Largest accepted request body after decompression (413 above).
    pub max_body_bytes: usize,
    /// Longest accepted NDJSON line.
    pub max_ndjson_line_bytes: usize,
    /// A store write holds at most this many rows…
    pub batch_max_rows: NonZeroUsize,
    /// …and waits at most this long for more (0: commits as soon as nothing more is queued).
    /// Requests are acknowledged after their group's commit, so this adds to ingest latency.
    pub batch_max_delay: Duration,
    /// Accepted but not yet written bytes held in memory; past it, requests wait, then get 503.
    pub max_inflight_bytes: usize,
    /// How long a request waits for memory before 503.
    pub backpressure_wait: Duration,
    /// An ingest request's body must arrive within this long: 408 after it (gRPC:
    /// `CANCELLED` by tonic's timeout).
    pub request_timeout: Duration,
    /// Items (spans, log records, failure events, snapshots) per second one tenant may send
    /// (`X-Brownout-Tenant` header, `default` without one); `None` is unlimited. 429 past it.
    pub tenant_items_per_sec: Option<std::num::NonZeroU32>,
    /// How many items a tenant may send at once above its rate (also the largest request).
    pub tenant_burst_items: std::num::NonZeroU32,
    /// When a request is acknowledged with a ClickHouse store (SQLite always commits first).
    pub clickhouse_ack: ClickHouseAck,
}

/// When ingest acknowledges a request whose rows go to ClickHouse (`ingest.clickhouse_ack`,
/// env `BROWNOUT_CLICKHOUSE_ACK`; docs/INGEST.md "Write path").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClickHouseAck {
    /// Once the rows are appended to the fsync'ed spool (group commit, one fsync per group); a
    /// shipper drains the spool into ClickHouse behind the acknowledgement, merging records
    /// into one INSERT per table, exactly once.
    #[default]
    Spool,
    /// Once ClickHouse answered the group's INSERT (the spool only while it is down or slow).
    Insert,
}

impl ClickHouseAck {
    fn parse(s: &str) -> Option<ClickHouseAck> {
        match s {
            "spool" => Some(ClickHouseAck::Spool),
            "insert" => Some(ClickHouseAck::Insert),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SpoolConfig {
    pub max_bytes: u64,
    pub segment_bytes: u64,
    pub retry_after_secs: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct HostsConfig {
    pub stale_after: Duration,
    pub down_after: Duration,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            max_body_bytes: 16 << 20,
            max_ndjson_line_bytes: 64 << 10,
            batch_max_rows: NonZeroUsize::new(20_000).expect("non-zero"),
            batch_max_delay: Duration::ZERO,
            max_inflight_bytes: 128 << 20,
            backpressure_wait: Duration::from_secs(2),
            request_timeout: Duration::from_secs(30),
            tenant_items_per_sec: std::num::NonZeroU32::new(250_000),
            tenant_burst_items: std::num::NonZeroU32::new(500_000).expect("non-zero"),
            clickhouse_ack: ClickHouseAck::Spool,
        }
    }
}

impl Default for SpoolConfig {
    fn default() -> Self {
        SpoolConfig {
            max_bytes: 1 << 30,
            segment_bytes: 64 << 20,
            retry_after_secs: 5,
        }
    }
}

impl Default for HostsConfig {
    fn default() -> Self {
        HostsConfig {
            stale_after: Duration::from_secs(5),
            down_after: Duration::from_secs(30),
        }
    }
}

/// The environment, abstracted so tests need not mutate the process's.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned().filter(|v| !v.is_empty())
    }
}

impl Config {
    /// Loads `path` (or defaults when `None`), applies the process environment and validates.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, the field and the reason.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::load_with_env(path, &ProcessEnv)
    }

    /// Like [`Config::load`] with an explicit environment.
    ///
    /// # Errors
    /// See [`Config::load`].
    pub fn load_with_env(path: Option<&Path>, env: &dyn Env) -> Result<Config, ConfigError> {
        let (file, text) = match path {
            Some(p) => {
                let file = p.display().to_string();
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    file: file.clone(),
                    source,
                })?;
                (file, text)
            }
            None => ("<defaults>".to_string(), String::new()),
        };
        Config::from_toml_str(&file, &text, env)
    }

    /// Parses and validates TOML text; `file` is only used in messages.
    ///
    /// # Errors
    /// See [`Config::load`].
    pub fn from_toml_str(file: &str, text: &str, env: &dyn Env) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_string(),
            reason: e.to_string().trim_end().replace('\n', " "),
        })?;
        raw.validate(file, env)
    }

    /// Defaults, with no file and no environment: for tests and `demo`.
    pub fn defaults() -> Config {
        Config::from_toml_str("<defaults>", "", &BTreeMap::new()).expect("defaults are valid")
    }

    /// `serve` needs all three tokens; says which are missing.
    ///
    /// # Errors
    /// [`ConfigError::MissingSecrets`] listing each missing token and how to set it.
    pub fn require_tokens(&self) -> Result<(), ConfigError> {
        let mut missing = Vec::new();
        for (name, v) in [
            ("ingest", &self.ingest_token),
            ("read", &self.read_token),
            ("admin", &self.admin_token),
        ] {
            if v.is_none() {
                let upper = name.to_ascii_uppercase();
                missing.push(format!(
                    "{name} token (set BROWNOUT_{upper}_TOKEN, BROWNOUT_{upper}_TOKEN_FILE or [auth] {name}_token)"
                ));
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::MissingSecrets(format!(
                "refusing to start without: {}",
                missing.join("; ")
            )))
        }
    }

    /// Where the SQLite database lives.
    pub fn sqlite_path(&self) -> PathBuf {
        self.data_dir.join("brownout.sqlite")
    }

    /// Where the ingest spool lives.
    pub fn spool_dir(&self) -> PathBuf {
        self.data_dir.join("spool")
    }
}

fn secret_from_env(
    file: &str,
    env: &dyn Env,
    name: &str,
    from_file: Option<String>,
) -> Result<Option<Secret>, ConfigError> {
    if let Some(v) = env.var(name) {
        return Ok(Some(Secret(v)));
    }
    let file_var = format!("{name}_FILE");
    if let Some(p) = env.var(&file_var) {
        let text = std::fs::read_to_string(&p).map_err(|e| ConfigError::Field {
            file: file.to_string(),
            field: file_var.clone(),
            reason: format!("cannot read {p}: {e}"),
        })?;
        let t = text.trim_end().to_string();
        if t.is_empty() {
            return Err(ConfigError::Field {
                file: file.to_string(),
                field: file_var,
                reason: format!("{p} is empty"),
            });
        }
        return Ok(Some(Secret(t)));
    }
    Ok(from_file.filter(|s| !s.is_empty()).map(Secret))
}

impl RawConfig {
    fn validate(self, file: &str, env: &dyn Env) -> Result<Config, ConfigError> {
        let field_err = |field: &str, reason: String| ConfigError::Field {
            file: file.to_string(),
            field: field.to_string(),
            reason,
        };
        let addr =
            |field: &str, v: Option<String>, default: &str| -> Result<SocketAddr, ConfigError> {
                let s = v.unwrap_or_else(|| default.to_string());
                s.parse()
                    .map_err(|e| field_err(field, format!("{s:?} is not host:port ({e})")))
            };
        let positive = |field: &str, v: Option<u64>, default: u64| -> Result<u64, ConfigError> {
            match v.unwrap_or(default) {
                0 => Err(field_err(field, "must be greater than 0".into())),
                n => Ok(n),
            }
        };

        let http_addr = addr("server.http_addr", self.server.http_addr, "0.0.0.0:8080")?;
        let otlp_http_addr = addr(
            "server.otlp_http_addr",
            self.server.otlp_http_addr,
            "0.0.0.0:4318",
        )?;
        let otlp_grpc_addr = addr(
            "server.otlp_grpc_addr",
            self.server.otlp_grpc_addr,
            "0.0.0.0:4317",
        )?;
        let shutdown_grace = Duration::from_millis(positive(
            "server.shutdown_grace_ms",
            self.server.shutdown_grace_ms,
            10_000,
        )?);
        let max_connections = self
            .server
            .max_connections
            .unwrap_or(brownout_net::DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err(field_err(
                "server.max_connections",
                "must be at least 1".into(),
            ));
        }
        let max_connections_per_ip = self
            .server
            .max_connections_per_ip
            .unwrap_or(256)
            .min(max_connections);
        if max_connections_per_ip == 0 {
            return Err(field_err(
                "server.max_connections_per_ip",
                "must be at least 1".into(),
            ));
        }
        let tls = listener_tls(
            self.server.tls_cert_file,
            self.server.tls_key_file,
            self.server.tls_client_ca_file,
            &field_err,
        )?;
        let header_read_timeout = Duration::from_millis(positive(
            "server.header_read_timeout_ms",
            self.server.header_read_timeout_ms,
            10_000,
        )?);
        let idle_timeout = Duration::from_millis(positive(
            "server.idle_timeout_ms",
            self.server.idle_timeout_ms,
            60_000,
        )?);

        let data_dir = env
            .var("BROWNOUT_DATA_DIR")
            .map(PathBuf::from)
            .or(self.storage.data_dir)
            .unwrap_or_else(|| PathBuf::from("./data"));
        if data_dir.as_os_str().is_empty() {
            return Err(field_err("storage.data_dir", "must not be empty".into()));
        }
        let ch_url = env
            .var("CLICKHOUSE_URL")
            .or(self.storage.clickhouse_url)
            .filter(|s| !s.is_empty());
        let table_prefix = self
            .storage
            .table_prefix
            .unwrap_or_else(|| "brownout_".into());
        if !table_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(field_err(
                "storage.table_prefix",
                format!("{table_prefix:?}: only ASCII letters, digits and _"),
            ));
        }
        let clickhouse = match ch_url {
            None => None,
            Some(url) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(field_err(
                        "storage.clickhouse_url",
                        format!(
                            "{url:?} must start with http:// or https:// (the HTTP interface, port 8123)"
                        ),
                    ));
                }
                let database = self
                    .storage
                    .clickhouse_database
                    .unwrap_or_else(|| "default".into());
                if database.is_empty()
                    || !database
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(field_err(
                        "storage.clickhouse_database",
                        format!("{database:?}: only ASCII letters, digits and _"),
                    ));
                }
                let cluster = env
                    .var("CLICKHOUSE_CLUSTER")
                    .or(self.storage.clickhouse_cluster)
                    .filter(|s| !s.is_empty());
                if let Some(c) = &cluster
                    && !c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
                {
                    return Err(field_err(
                        "storage.clickhouse_cluster",
                        format!(
                            "{c:?}: only ASCII letters, digits and _ (a cluster name from the servers' remote_servers)"
                        ),
                    ));
                }
                let tls = clickhouse_tls(
                    &url,
                    env.var("CLICKHOUSE_CA_FILE")
                        .map(PathBuf::from)
                        .or(self.storage.clickhouse_ca_file),
                    env.var("CLICKHOUSE_CLIENT_CERT_FILE")
                        .map(PathBuf::from)
                        .or(self.storage.clickhouse_client_cert_file),
                    env.var("CLICKHOUSE_CLIENT_KEY_FILE")
                        .map(PathBuf::from)
                        .or(self.storage.clickhouse_client_key_file),
                    &field_err,
                )?;
                Some(ClickHouseConfig {
                    tls,
                    url,
                    database,
                    user: self.storage.clickhouse_user,
                    password: self.storage.clickhouse_password.map(Secret),
                    table_prefix: table_prefix.clone(),
                    cluster,
                })
            }
        };
        let retention_days = self.storage.retention_days.unwrap_or(14);
        if retention_days == 0 {
            return Err(field_err(
                "storage.retention_days",
                "must be at least 1".into(),
            ));
        }
        let store_write_timeout = Duration::from_millis(positive(
            "storage.write_timeout_ms",
            self.storage.write_timeout_ms,
            10_000,
        )?);

        let d = IngestConfig::default();
        let max_body_bytes = self.ingest.max_body_bytes.unwrap_or(d.max_body_bytes);
        if max_body_bytes < 1024 {
            return Err(field_err(
                "ingest.max_body_bytes",
                "must be at least 1024".into(),
            ));
        }
        let max_ndjson_line_bytes = self
            .ingest
            .max_ndjson_line_bytes
            .unwrap_or(d.max_ndjson_line_bytes);
        if max_ndjson_line_bytes < 256 || max_ndjson_line_bytes > max_body_bytes {
            return Err(field_err(
                "ingest.max_ndjson_line_bytes",
                "must be between 256 and ingest.max_body_bytes".into(),
            ));
        }
        let batch_max_rows =
            NonZeroUsize::new(self.ingest.batch_max_rows.unwrap_or(d.batch_max_rows.get()))
                .ok_or_else(|| {
                    field_err("ingest.batch_max_rows", "must be greater than 0".into())
                })?;
        // 0 is allowed (the default): commit a group as soon as the queue is empty.
        let batch_max_delay = Duration::from_millis(
            self.ingest
                .batch_max_delay_ms
                .unwrap_or(d.batch_max_delay.as_millis() as u64)
                .min(10_000),
        );
        let max_inflight_bytes = self
            .ingest
            .max_inflight_bytes
            .unwrap_or(d.max_inflight_bytes);
        if max_inflight_bytes < max_body_bytes {
            return Err(field_err(
                "ingest.max_inflight_bytes",
                format!(
                    "{max_inflight_bytes} is below ingest.max_body_bytes ({max_body_bytes}): one request could never fit"
                ),
            ));
        }
        let backpressure_wait = Duration::from_millis(
            self.ingest
                .backpressure_wait_ms
                .unwrap_or(d.backpressure_wait.as_millis() as u64),
        );
        let request_timeout = Duration::from_millis(positive(
            "ingest.request_timeout_ms",
            self.ingest.request_timeout_ms,
            d.request_timeout.as_millis() as u64,
        )?);
        // 0 turns the per-tenant limit off.
        let tenant_items_per_sec = match self.ingest.tenant_items_per_sec {
            Some(n) => std::num::NonZeroU32::new(n),
            None => d.tenant_items_per_sec,
        };
        let tenant_burst_items = match self.ingest.tenant_burst_items {
            None => tenant_items_per_sec
                .and_then(|r| r.checked_mul(std::num::NonZeroU32::new(2).expect("non-zero")))
                .unwrap_or(d.tenant_burst_items),
            Some(b) => std::num::NonZeroU32::new(b).ok_or_else(|| {
                field_err("ingest.tenant_burst_items", "must be greater than 0".into())
            })?,
        };
        let clickhouse_ack = match env
            .var("BROWNOUT_CLICKHOUSE_ACK")
            .filter(|s| !s.is_empty())
            .map(|v| ("BROWNOUT_CLICKHOUSE_ACK", v))
            .or_else(|| {
                self.ingest
                    .clickhouse_ack
                    .clone()
                    .map(|v| ("ingest.clickhouse_ack", v))
            }) {
            None => d.clickhouse_ack,
            Some((field, v)) => ClickHouseAck::parse(&v)
                .ok_or_else(|| field_err(field, format!("{v:?}: \"spool\" or \"insert\"")))?,
        };

        let ds = SpoolConfig::default();
        let spool_max = self.spool.max_bytes.unwrap_or(ds.max_bytes);
        let segment_bytes = self.spool.segment_bytes.unwrap_or(ds.segment_bytes);
        if segment_bytes < 4096 {
            return Err(field_err(
                "spool.segment_bytes",
                "must be at least 4096".into(),
            ));
        }
        if spool_max < segment_bytes {
            return Err(field_err(
                "spool.max_bytes",
                format!("{spool_max} is below spool.segment_bytes ({segment_bytes})"),
            ));
        }
        let retry_after_secs = self
            .spool
            .retry_after_secs
            .unwrap_or(ds.retry_after_secs)
            .max(1);

        let stale_after = Duration::from_millis(positive(
            "hosts.stale_after_ms",
            self.hosts.stale_after_ms,
            5_000,
        )?);
        let down_after = Duration::from_millis(positive(
            "hosts.down_after_ms",
            self.hosts.down_after_ms,
            30_000,
        )?);
        if down_after <= stale_after {
            return Err(field_err(
                "hosts.down_after_ms",
                "must be greater than hosts.stale_after_ms".into(),
            ));
        }

        let ingest_token =
            secret_from_env(file, env, "BROWNOUT_INGEST_TOKEN", self.auth.ingest_token)?;
        let read_token = secret_from_env(file, env, "BROWNOUT_READ_TOKEN", self.auth.read_token)?;
        let admin_token =
            secret_from_env(file, env, "BROWNOUT_ADMIN_TOKEN", self.auth.admin_token)?;
        let command_key =
            secret_from_env(file, env, "BROWNOUT_COMMAND_KEY", self.auth.command_key)?;
        let token_overlap = match env.var("BROWNOUT_TOKEN_OVERLAP_S") {
            Some(v) => v.trim().parse::<u64>().map_err(|e| {
                field_err(
                    "BROWNOUT_TOKEN_OVERLAP_S",
                    format!("{v:?} is not a number of seconds ({e})"),
                )
            })?,
            None => self.auth.token_overlap_s.unwrap_or(300),
        };
        let token_overlap = Duration::from_secs(token_overlap.min(7 * 86_400));
        for (field, t) in [
            ("auth.ingest_token", &ingest_token),
            ("auth.read_token", &read_token),
            ("auth.admin_token", &admin_token),
        ] {
            if let Some(t) = t {
                if t.0.len() < 16 {
                    return Err(field_err(
                        field,
                        "a token must be at least 16 characters".into(),
                    ));
                }
                if t.0.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(field_err(
                        field,
                        "a token must not contain whitespace or control characters".into(),
                    ));
                }
            }
        }

        // One default and one variable for every binary (brownout-protocol's
        // DEFAULT_CLUSTER / BROWNOUT_CLUSTER): the environment wins over the file.
        let cluster = env
            .var(brownout_protocol::CLUSTER_ENV)
            .or(self.control.cluster)
            .unwrap_or_else(|| brownout_protocol::DEFAULT_CLUSTER.into());
        if cluster.is_empty()
            || !cluster
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(field_err(
                "control.cluster",
                format!("{cluster:?}: only ASCII letters, digits, - and _"),
            ));
        }
        let redis_url = env
            .var("REDIS_URL")
            .or(self.control.redis_url)
            .filter(|s| !s.is_empty());
        if let Some(u) = &redis_url {
            if u.starts_with(brownout_protocol::redis_ha::SENTINEL_SCHEME) {
                brownout_protocol::SentinelSpec::parse(u)
                    .map_err(|e| field_err("control.redis_url", e.to_string()))?;
            } else if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                return Err(field_err(
                    "control.redis_url",
                    format!("{u:?} must start with redis://, rediss:// or redis+sentinel://"),
                ));
            }
        }

        let share_slo_counters = env
            .var("BROWNOUT_SHARE_SLO_COUNTERS")
            .map(|v| match v.as_str() {
                "1" | "true" => Ok(true),
                "0" | "false" | "" => Ok(false),
                other => Err(field_err(
                    "BROWNOUT_SHARE_SLO_COUNTERS",
                    format!("{other:?}: true, false, 1 or 0"),
                )),
            })
            .transpose()?
            .or(self.control.share_slo_counters)
            .unwrap_or(false);
        if share_slo_counters && redis_url.is_none() {
            return Err(field_err(
                "control.share_slo_counters",
                "needs control.redis_url (the replicas share their counts through Redis)".into(),
            ));
        }
        let trace_url = check_trace_url(env.var("BROWNOUT_TRACE_URL").or(self.web.trace_url))
            .map_err(|m| field_err("web.trace_url", m))?;
        let share_patterns = env
            .var("BROWNOUT_SHARE_PATTERNS")
            .map(|v| match v.as_str() {
                "1" | "true" => Ok(true),
                "0" | "false" | "" => Ok(false),
                other => Err(field_err(
                    "BROWNOUT_SHARE_PATTERNS",
                    format!("{other:?}: true, false, 1 or 0"),
                )),
            })
            .transpose()?
            .or(self.control.share_patterns)
            .unwrap_or(false);
        if share_patterns && redis_url.is_none() {
            return Err(field_err(
                "control.share_patterns",
                "needs control.redis_url (the replicas share their failures through Redis)".into(),
            ));
        }

        Ok(Config {
            http_addr,
            otlp_http_addr,
            otlp_grpc_addr,
            shutdown_grace,
            max_connections,
            max_connections_per_ip,
            header_read_timeout,
            idle_timeout,
            tls,
            data_dir,
            clickhouse,
            retention_days,
            store_write_timeout,
            ingest: IngestConfig {
                max_body_bytes,
                max_ndjson_line_bytes,
                batch_max_rows,
                batch_max_delay,
                max_inflight_bytes,
                backpressure_wait,
                request_timeout,
                tenant_items_per_sec,
                tenant_burst_items,
                clickhouse_ack,
            },
            spool: SpoolConfig {
                max_bytes: spool_max,
                segment_bytes,
                retry_after_secs,
            },
            hosts: HostsConfig {
                stale_after,
                down_after,
            },
            ingest_token,
            read_token,
            admin_token,
            command_key,
            token_overlap,
            cluster,
            redis_url,
            slo_file: self.control.slo_file,
            policy_file: self.control.policy_file,
            share_slo_counters,
            share_patterns,
            trace_url,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid_and_have_no_tokens() {
        let c = Config::defaults();
        assert_eq!(c.http_addr.port(), 8080);
        assert_eq!(c.otlp_http_addr.port(), 4318);
        assert_eq!(c.otlp_grpc_addr.port(), 4317);
        assert!(c.clickhouse.is_none());
        let err = c.require_tokens().unwrap_err().to_string();
        for want in [
            "ingest token",
            "read token",
            "admin token",
            "BROWNOUT_READ_TOKEN",
        ] {
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn env_overrides_the_file() {
        let text = "[storage]\ndata_dir = \"/from/file\"\n[auth]\nread_token = \"file-token-0123456789\"\n";
        let e = env(&[
            ("BROWNOUT_DATA_DIR", "/from/env"),
            ("CLICKHOUSE_URL", "http://127.0.0.1:8123"),
            ("BROWNOUT_READ_TOKEN", "env-token-0123456789"),
            ("BROWNOUT_INGEST_TOKEN", "ingest-token-0123456789"),
            ("BROWNOUT_ADMIN_TOKEN", "admin-token-0123456789"),
            ("REDIS_URL", "redis://127.0.0.1:6379"),
        ]);
        let c = Config::from_toml_str("x.toml", text, &e).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/from/env"));
        let ch = c.clickhouse.unwrap();
        assert_eq!(ch.url, "http://127.0.0.1:8123");
        assert_eq!(ch.cluster, None);
        assert_eq!(c.read_token.unwrap().expose(), "env-token-0123456789");
        assert_eq!(c.redis_url.as_deref(), Some("redis://127.0.0.1:6379"));
    }

    #[test]
    fn clickhouse_cluster_from_the_file_or_the_environment() {
        let text =
            "[storage]\nclickhouse_url = \"http://127.0.0.1:8123\"\nclickhouse_cluster = \"bt2\"\n";
        let c = Config::from_toml_str("x.toml", text, &BTreeMap::new()).unwrap();
        assert_eq!(c.clickhouse.unwrap().cluster.as_deref(), Some("bt2"));
        let e = env(&[("CLICKHOUSE_CLUSTER", "prod_3x2")]);
        let c = Config::from_toml_str("x.toml", text, &e).unwrap();
        assert_eq!(c.clickhouse.unwrap().cluster.as_deref(), Some("prod_3x2"));
    }

    #[test]
    fn token_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "secret-from-a-file-123\n").unwrap();
        let e = env(&[("BROWNOUT_ADMIN_TOKEN_FILE", p.to_str().unwrap())]);
        let c = Config::from_toml_str("x.toml", "", &e).unwrap();
        assert_eq!(c.admin_token.unwrap().expose(), "secret-from-a-file-123");
        let e = env(&[("BROWNOUT_ADMIN_TOKEN_FILE", "/nonexistent/t")]);
        let err = Config::from_toml_str("x.toml", "", &e)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BROWNOUT_ADMIN_TOKEN_FILE") && err.contains("/nonexistent/t"),
            "{err}"
        );
    }

    #[test]
    fn bad_configs_name_file_field_and_reason() {
        let cases = [
            ("[server]\nhttp_addr = \"nope\"\n", "server.http_addr"),
            ("[server]\nport = 1\n", "unknown field `port`"),
            ("[colour]\n", "unknown field `colour`"),
            ("[ingest]\nbatch_max_rows = 0\n", "ingest.batch_max_rows"),
            ("[ingest]\nmax_body_bytes = 10\n", "ingest.max_body_bytes"),
            (
                "[spool]\nmax_bytes = 5000\nsegment_bytes = 8192\n",
                "spool.max_bytes",
            ),
            (
                "[hosts]\nstale_after_ms = 5000\ndown_after_ms = 1000\n",
                "hosts.down_after_ms",
            ),
            (
                "[storage]\nclickhouse_url = \"tcp://x:9000\"\n",
                "storage.clickhouse_url",
            ),
            (
                "[storage]\ntable_prefix = \"a;drop\"\n",
                "storage.table_prefix",
            ),
            (
                "[storage]\nclickhouse_url = \"http://x:8123\"\nclickhouse_cluster = \"a b\"\n",
                "storage.clickhouse_cluster",
            ),
            (
                "[control]\nredis_url = \"redis+sentinel://s1:26379/\"\n",
                "control.redis_url",
            ),
            (
                "[control]\nredis_url = \"sentinel://s1/m\"\n",
                "control.redis_url",
            ),
            ("[auth]\nread_token = \"short\"\n", "auth.read_token"),
            (
                "[control]\nshare_slo_counters = true\n",
                "control.share_slo_counters",
            ),
            (
                "[control]\nshare_patterns = true\n",
                "control.share_patterns",
            ),
            ("[storage]\nretention_days = \"ten\"\n", "retention_days"),
            (
                "[ingest]\nclickhouse_ack = \"later\"\n",
                "ingest.clickhouse_ack",
            ),
        ];
        for (text, want) in cases {
            let err = Config::from_toml_str("bad.toml", text, &BTreeMap::new())
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("bad.toml"), "{err}");
            assert!(err.contains(want), "{text:?}: got {err:?}, want {want:?}");
        }
    }

    #[test]
    fn clickhouse_ack_defaults_to_spool_and_the_env_wins() {
        let c = Config::from_toml_str("x.toml", "", &BTreeMap::new()).unwrap();
        assert_eq!(c.ingest.clickhouse_ack, ClickHouseAck::Spool);
        let text = "[ingest]\nclickhouse_ack = \"insert\"\n";
        let c = Config::from_toml_str("x.toml", text, &BTreeMap::new()).unwrap();
        assert_eq!(c.ingest.clickhouse_ack, ClickHouseAck::Insert);
        let e = env(&[("BROWNOUT_CLICKHOUSE_ACK", "spool")]);
        let c = Config::from_toml_str("x.toml", text, &e).unwrap();
        assert_eq!(c.ingest.clickhouse_ack, ClickHouseAck::Spool);
        let e = env(&[("BROWNOUT_CLICKHOUSE_ACK", "both")]);
        let err = Config::from_toml_str("x.toml", "", &e)
            .unwrap_err()
            .to_string();
        assert!(err.contains("BROWNOUT_CLICKHOUSE_ACK"), "{err}");
    }

    #[test]
    fn sentinel_redis_url_is_accepted() {
        let url = "redis+sentinel://app:pw@s1:26379,s2/mymaster/1";
        let text = format!("[control]\nredis_url = \"{url}\"\n");
        let c = Config::from_toml_str("x.toml", &text, &BTreeMap::new()).unwrap();
        assert_eq!(c.redis_url.as_deref(), Some(url));
    }

    #[test]
    fn secrets_do_not_print() {
        assert_eq!(format!("{:?}", Secret::new("abc")), "Secret(***)");
    }

    #[test]
    fn trace_url_templates_are_http_with_the_placeholder() {
        assert_eq!(check_trace_url(None), Ok(None));
        assert_eq!(check_trace_url(Some(" ".into())), Ok(None));
        let ok = "https://jaeger:16686/trace/{trace_id}".to_string();
        assert_eq!(check_trace_url(Some(ok.clone())), Ok(Some(ok)));
        for bad in [
            "javascript:alert(1)//{trace_id}",
            "http://jaeger/trace/",
            "http://jaeger/trace/{trace_id} x",
        ] {
            assert!(check_trace_url(Some(bad.into())).is_err(), "{bad}");
        }
        let c = Config::from_toml_str(
            "t.toml",
            "[web]\ntrace_url = \"ftp://x/{trace_id}\"\n",
            &BTreeMap::<String, String>::new(),
        );
        assert!(format!("{:?}", c.unwrap_err()).contains("web.trace_url"));
    }
}
