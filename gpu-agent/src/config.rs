//! The agent's configuration: typed values, validated once ([`AgentConfig::validate`]).

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::Url;

use crate::engine::EngineTarget;
use crate::probe::simulated::SimulatedGpuSpec;

/// Everything `gpu-agent` (or `brownout-demo`, in-process) needs to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `Hostname` label and [`brownout_protocol::AgentSnapshot::host`].
    pub host: String,
    /// Where the exporter listens when no listener is handed to [`crate::run`]; `None` runs no
    /// exporter (an in-process agent read through [`crate::AgentHandle`]).
    pub listen: Option<SocketAddr>,
    pub engines: Vec<EngineTarget>,
    /// Base URL of the control plane; snapshots go to `<base>/v1/agents/snapshot`. `None`: no push.
    pub control_plane: Option<Url>,
    /// Bearer token for the push (`BROWNOUT_INGEST_TOKEN`).
    pub ingest_token: Option<String>,
    /// `Some(spec)`: the simulated probe; `None`: NVML.
    pub simulate: Option<SimulatedGpuSpec>,
    /// One cycle (scrape, probe, snapshot) every `interval`.
    pub interval: Duration,
    /// Per-request timeout of engine scrapes (keep it under `interval`).
    pub scrape_timeout: Duration,
    /// Per-request timeout of snapshot pushes.
    pub push_timeout: Duration,
    /// Snapshots kept while the control plane is unreachable (the latest N).
    pub queue_capacity: usize,
    /// Retry backoff of the push: first delay and cap (jittered).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// TTFT quantiles look back over this many scrapes.
    pub ttft_window_scrapes: usize,
    /// The GPU-memory watermark (used over total; docs/REQUIREMENTS.md R2.2).
    pub vram_watermark_ratio: f64,
    /// How often to try NVML again after it failed to start.
    pub nvml_retry: Duration,
}

impl AgentConfig {
    /// Defaults for `host`: 1 s cycle, :9400, 60 snapshots kept, NVML probe, no engines.
    pub fn new(host: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            listen: Some(SocketAddr::from(([0, 0, 0, 0], 9400))),
            engines: Vec::new(),
            control_plane: None,
            ingest_token: None,
            simulate: None,
            interval: Duration::from_secs(1),
            scrape_timeout: Duration::from_millis(800),
            push_timeout: Duration::from_secs(2),
            queue_capacity: 60,
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(10),
            ttft_window_scrapes: 30,
            vram_watermark_ratio: 0.75,
            nvml_retry: Duration::from_secs(60),
        }
    }

    /// Uses `n` simulated H100-like GPUs instead of NVML.
    #[must_use]
    pub fn with_simulated_gpus(mut self, n: u32) -> Self {
        self.simulate = Some(SimulatedGpuSpec::h100(n, &self.host));
        self
    }

    /// Checks the combination; every message names the field.
    ///
    /// # Errors
    /// [`ConfigError`] naming the bad field and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| Err(ConfigError { field, reason });
        if self.host.is_empty() {
            return bad("host", "must not be empty".into());
        }
        if self.interval < Duration::from_millis(10) {
            return bad(
                "interval",
                format!("{:?} is below the 10 ms minimum", self.interval),
            );
        }
        if self.queue_capacity == 0 {
            return bad("queue_capacity", "must be at least 1".into());
        }
        if self.backoff_min.is_zero() || self.backoff_max < self.backoff_min {
            return bad(
                "backoff",
                format!(
                    "need 0 < min ({:?}) ≤ max ({:?})",
                    self.backoff_min, self.backoff_max
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.vram_watermark_ratio) {
            return bad(
                "vram_watermark_ratio",
                format!("{} is not within 0..=1", self.vram_watermark_ratio),
            );
        }
        if let Some(s) = &self.simulate
            && !(1..=64).contains(&s.num_gpus)
        {
            return bad(
                "simulate_gpus",
                format!("{} is not within 1..=64", s.num_gpus),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for e in &self.engines {
            if !seen.insert(e.id.as_str()) {
                return bad("engine", format!("engine id {:?} is used twice", e.id));
            }
        }
        if let Some(cp) = &self.control_plane
            && !matches!(cp.scheme(), "http" | "https")
        {
            return bad("control_plane", format!("{cp} is not an http(s) URL"));
        }
        Ok(())
    }
}

/// A bad configuration value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

/// Parses one `--engine` value: `URL` or `ID=URL`; `index` names it `engine-<index>` when no id
/// is given. A trailing `/metrics` is dropped (people paste the scrape URL).
///
/// # Errors
/// [`ConfigError`] for a bad id or URL.
pub fn parse_engine(spec: &str, index: usize) -> Result<EngineTarget, ConfigError> {
    let bad = |reason: String| ConfigError {
        field: "engine",
        reason,
    };
    let (id, url) = match spec.split_once('=') {
        Some((id, url)) if !id.contains("://") => (id.to_string(), url),
        _ => (format!("engine-{index}"), spec),
    };
    if id.is_empty()
        || id.len() > 64
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(bad(format!(
            "{id:?} is not a valid engine id (1–64 of A-Z a-z 0-9 - _ .)"
        )));
    }
    let mut url = Url::parse(url).map_err(|e| bad(format!("{url:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(format!("{url} is not an http(s) URL")));
    }
    let path = url
        .path()
        .trim_end_matches('/')
        .trim_end_matches("/metrics")
        .to_string();
    url.set_path(&path);
    Ok(EngineTarget { id, url })
}

/// The control-plane base URL.
///
/// # Errors
/// [`ConfigError`] for a URL that does not parse or is not http(s).
pub fn parse_control_plane(s: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(s).map_err(|e| ConfigError {
        field: "control_plane",
        reason: format!("{s:?} is not a URL: {e}"),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError {
            field: "control_plane",
            reason: format!("{url} is not an http(s) URL"),
        });
    }
    Ok(url)
}

/// This machine's host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `localhost`).
pub fn default_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_specs_parse_or_say_what_is_wrong() {
        let ok = [
            (
                "http://127.0.0.1:8000",
                0,
                "engine-0",
                "http://127.0.0.1:8000/",
            ),
            (
                "http://127.0.0.1:8000/",
                1,
                "engine-1",
                "http://127.0.0.1:8000/",
            ),
            (
                "http://127.0.0.1:8000/metrics",
                2,
                "engine-2",
                "http://127.0.0.1:8000/",
            ),
            (
                "vllm-a=http://10.0.0.2:8000",
                3,
                "vllm-a",
                "http://10.0.0.2:8000/",
            ),
            ("x=http://h:1/prefix/metrics", 0, "x", "http://h:1/prefix"),
            ("http://h:1/?a=b=c", 5, "engine-5", "http://h:1/?a=b=c"),
        ];
        for (spec, i, id, url) in ok {
            let t = parse_engine(spec, i).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!((t.id.as_str(), t.url.as_str()), (id, url), "{spec}");
        }
        for spec in [
            "",
            "not a url",
            "ftp://h/",
            "bad id=http://h:1",
            "=http://h:1",
        ] {
            let e = parse_engine(spec, 0).unwrap_err();
            assert_eq!(e.field, "engine", "{spec}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let base = AgentConfig::new("h");
        base.validate().unwrap();
        let cases: Vec<(AgentConfig, &str)> = vec![
            (
                AgentConfig {
                    host: String::new(),
                    ..base.clone()
                },
                "host",
            ),
            (
                AgentConfig {
                    interval: Duration::ZERO,
                    ..base.clone()
                },
                "interval",
            ),
            (
                AgentConfig {
                    queue_capacity: 0,
                    ..base.clone()
                },
                "queue_capacity",
            ),
            (
                AgentConfig {
                    backoff_max: Duration::from_millis(1),
                    ..base.clone()
                },
                "backoff",
            ),
            (
                AgentConfig {
                    vram_watermark_ratio: 1.5,
                    ..base.clone()
                },
                "vram_watermark_ratio",
            ),
            (base.clone().with_simulated_gpus(0), "simulate_gpus"),
            (base.clone().with_simulated_gpus(65), "simulate_gpus"),
            (
                AgentConfig {
                    engines: vec![
                        parse_engine("a=http://h:1", 0).unwrap(),
                        parse_engine("a=http://h:2", 1).unwrap(),
                    ],
                    ..base.clone()
                },
                "engine",
            ),
        ];
        for (cfg, field) in cases {
            assert_eq!(cfg.validate().unwrap_err().field, field);
        }
    }
}
