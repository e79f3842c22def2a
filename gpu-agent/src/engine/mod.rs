//! Engine scrapers: one per serving engine on the host (the bundled tier or any vLLM server).
//!
//! Each cycle an [`EngineScraper`] GETs `/metrics` (and, for the bundled tier, `/debug/kv`),
//! parses them ([`parse`]) and turns them into the protocol's [`EngineStats`] plus the extra
//! figures the exporter and the simulated probe need ([`EngineReport`]). TTFT quantiles come from
//! the `vllm:time_to_first_token_seconds` histogram over a sliding window of scrapes
//! ([`histogram`]).

pub mod histogram;
pub mod parse;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use brownout_protocol::{EngineStats, KvStats};
use reqwest::{Client, Url};

use histogram::Histogram;
use parse::{DebugKv, EngineMetrics};

/// Where one engine lives and what the agent calls it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineTarget {
    /// The `engine` label and [`EngineStats::id`].
    pub id: String,
    /// Base URL (no trailing slash), e.g. `http://127.0.0.1:8000`.
    pub url: Url,
}

/// Kinds of scrape failure, the `kind` label of `brownout_gpu_agent_engine_scrape_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeErrorKind {
    /// Connection refused, reset, DNS, timeout.
    Connect,
    /// A non-2xx status.
    HttpStatus,
    /// A body that was not the expected format.
    Parse,
}

impl ScrapeErrorKind {
    pub const ALL: [ScrapeErrorKind; 3] = [Self::Connect, Self::HttpStatus, Self::Parse];
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::HttpStatus => "http_status",
            Self::Parse => "parse",
        }
    }
}

/// What one scrape of one engine produced, beyond [`EngineStats`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineReport {
    pub stats: EngineStats,
    /// True when the engine exports brownout_kv_* / serves /debug/kv (the bundled tier).
    pub bundled: bool,
    /// Whether the TTFT quantiles in `stats` are real (there were first tokens in the window).
    pub ttft_known: bool,
    /// Whether the engine reported fragmentation ratios (plain vLLM does not; the snapshot then
    /// holds zeros and the exporter shows no ratio series for it).
    pub fragmentation_known: bool,
    /// `/debug/kv` extras, when the engine has it.
    pub bytes_per_block: Option<u64>,
    pub model_weights_bytes: Option<u64>,
    pub max_num_seqs: Option<u32>,
    /// Cumulative scrape errors by [`ScrapeErrorKind::ALL`] order.
    pub scrape_errors: [u64; 3],
    /// How long the last scrape took.
    pub scrape_duration: Duration,
}

/// Pushes `h` onto a window of cumulative histograms (cleared on a counter reset) and returns
/// the observations inside the window (everything since start until it holds two scrapes).
fn slide(window: &mut VecDeque<Histogram>, h: &Histogram, len: usize) -> Option<Histogram> {
    if let Some(last) = window.back()
        && h.since(last).is_none()
    {
        window.clear();
    }
    window.push_back(h.clone());
    while window.len() > len {
        window.pop_front();
    }
    match window.len() {
        0 | 1 => window.back().cloned(),
        _ => window.back().and_then(|b| b.since(&window[0])),
    }
}

/// Scrapes one engine and remembers what it needs between scrapes (TTFT window, error counts,
/// whether `/debug/kv` exists).
#[derive(Debug)]
pub struct EngineScraper {
    target: EngineTarget,
    metrics_url: Url,
    debug_kv_url: Url,
    /// Cumulative TTFT histograms of the last scrapes, oldest first.
    ttft_window: VecDeque<Histogram>,
    /// Cumulative queue-time histograms of the last scrapes, oldest first.
    queue_window: VecDeque<Histogram>,
    ttft_window_len: usize,
    /// `None` until tried; `Some(false)` after a 404, re-tried every `DEBUG_KV_RETRY` scrapes.
    debug_kv_supported: Option<bool>,
    scrapes_since_debug_kv_probe: u32,
    last_debug_kv: Option<DebugKv>,
    errors: [u64; 3],
    last_error_logged: Option<ScrapeErrorKind>,
}

const DEBUG_KV_RETRY: u32 = 60;

impl EngineScraper {
    /// `ttft_window_len`: how many scrapes the TTFT quantiles look back over (≥ 2).
    pub fn new(target: EngineTarget, ttft_window_len: usize) -> Self {
        let join = |p: &str| {
            let mut u = target.url.clone();
            let base = u.path().trim_end_matches('/').to_string();
            u.set_path(&format!("{base}/{p}"));
            u
        };
        Self {
            metrics_url: join("metrics"),
            debug_kv_url: join("debug/kv"),
            target,
            ttft_window: VecDeque::new(),
            queue_window: VecDeque::new(),
            ttft_window_len: ttft_window_len.max(2),
            debug_kv_supported: None,
            scrapes_since_debug_kv_probe: 0,
            last_debug_kv: None,
            errors: [0; 3],
            last_error_logged: None,
        }
    }

    pub fn target(&self) -> &EngineTarget {
        &self.target
    }

    fn count(&mut self, kind: ScrapeErrorKind, detail: &dyn std::fmt::Display) {
        self.errors[kind as usize] += 1;
        // Log a change of failure mode once, not every second.
        if self.last_error_logged != Some(kind) {
            tracing::warn!(engine = %self.target.id, url = %self.metrics_url, kind = kind.as_str(), error = %detail, "engine scrape failed");
            self.last_error_logged = Some(kind);
        }
    }

    /// One scrape. Never fails: a failed scrape is an engine with `up = false` and a counted error.
    pub async fn scrape(&mut self, client: &Client) -> EngineReport {
        let started = Instant::now();
        let metrics = match self.fetch_metrics(client).await {
            Ok(m) => {
                if self.last_error_logged.take().is_some() {
                    tracing::info!(engine = %self.target.id, "engine scrape recovered");
                }
                Some(m)
            }
            Err((kind, detail)) => {
                self.count(kind, &detail);
                None
            }
        };
        if let Some(m) = &metrics
            && m.bundled
        {
            self.maybe_fetch_debug_kv(client).await;
        }
        let mut report = self.build(metrics.as_ref());
        report.scrape_duration = started.elapsed();
        report
    }

    async fn fetch_metrics(
        &self,
        client: &Client,
    ) -> Result<EngineMetrics, (ScrapeErrorKind, String)> {
        let resp = client
            .get(self.metrics_url.clone())
            .send()
            .await
            .map_err(|e| (ScrapeErrorKind::Connect, e.to_string()))?;
        if !resp.status().is_success() {
            return Err((
                ScrapeErrorKind::HttpStatus,
                format!("status {}", resp.status()),
            ));
        }
        let body = resp
            .text()
            .await
            .map_err(|e| (ScrapeErrorKind::Connect, e.to_string()))?;
        parse::parse_metrics(&body).map_err(|e| (ScrapeErrorKind::Parse, e.to_string()))
    }

    async fn maybe_fetch_debug_kv(&mut self, client: &Client) {
        if self.debug_kv_supported == Some(false) {
            self.scrapes_since_debug_kv_probe += 1;
            if self.scrapes_since_debug_kv_probe < DEBUG_KV_RETRY {
                return;
            }
        }
        self.scrapes_since_debug_kv_probe = 0;
        let resp = match client.get(self.debug_kv_url.clone()).send().await {
            Ok(r) => r,
            Err(e) => {
                self.count(ScrapeErrorKind::Connect, &e);
                return;
            }
        };
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            if self.debug_kv_supported != Some(false) {
                tracing::info!(engine = %self.target.id, "engine has no /debug/kv; using /metrics only");
            }
            self.debug_kv_supported = Some(false);
            self.last_debug_kv = None;
            return;
        }
        if !resp.status().is_success() {
            self.count(
                ScrapeErrorKind::HttpStatus,
                &format!("/debug/kv status {}", resp.status()),
            );
            return;
        }
        match resp
            .bytes()
            .await
            .map_err(|e| e.to_string())
            .and_then(|b| parse::parse_debug_kv(&b).map_err(|e| e.to_string()))
        {
            Ok(d) => {
                self.debug_kv_supported = Some(true);
                self.last_debug_kv = Some(d);
            }
            Err(e) => self.count(ScrapeErrorKind::Parse, &format!("/debug/kv: {e}")),
        }
    }

    /// Merges the parsed figures into a report. `/metrics` wins; `/debug/kv` fills the gaps.
    fn build(&mut self, metrics: Option<&EngineMetrics>) -> EngineReport {
        let mut report = EngineReport {
            scrape_errors: self.errors,
            ..Default::default()
        };
        report.stats.id = self.target.id.clone();
        report.stats.url = self.target.url.to_string();
        let Some(m) = metrics else {
            // Down: keep the TTFT window (a blip should not reset it) and report zeros.
            report.stats.up = false;
            return report;
        };
        let d = self.last_debug_kv.clone().unwrap_or_default();
        report.bundled = m.bundled;
        report.bytes_per_block = d.bytes_per_block;
        report.model_weights_bytes = d.model_weights_bytes;
        report.max_num_seqs = d.max_num_seqs;

        let block_size = m.block_size.or(d.block_size).unwrap_or(0);
        let total = m.num_blocks_total.or(d.num_blocks_total).unwrap_or(0);
        let usage = m.kv_usage_ratio.or(d.usage_ratio).or_else(|| {
            let used = m.num_blocks_used.or(d.num_blocks_used)?;
            (total > 0).then(|| used as f64 / total as f64)
        });
        let usage = usage.unwrap_or(0.0).clamp(0.0, 1.0);
        let used = m
            .num_blocks_used
            .or(d.num_blocks_used)
            .unwrap_or_else(|| (usage * total as f64).round() as u64);
        report.fragmentation_known = [
            m.internal_fragmentation_ratio,
            m.reserved_unused_ratio,
            m.token_occupancy_ratio,
            d.internal_fragmentation_ratio,
            d.reserved_unused_ratio,
            d.token_occupancy_ratio,
        ]
        .iter()
        .any(Option::is_some);
        let internal = m
            .internal_fragmentation_ratio
            .or(d.internal_fragmentation_ratio)
            .unwrap_or(0.0);
        let reserved = m
            .reserved_unused_ratio
            .or(d.reserved_unused_ratio)
            .unwrap_or(0.0);
        let occupancy = m
            .token_occupancy_ratio
            .or(d.token_occupancy_ratio)
            .unwrap_or(if used > 0 && report.fragmentation_known {
                (1.0 - internal - reserved).max(0.0)
            } else {
                0.0
            });
        report.stats.kv = KvStats {
            block_size,
            num_blocks_total: total,
            num_blocks_used: used,
            usage_ratio: usage,
            internal_fragmentation_ratio: internal,
            reserved_unused_ratio: reserved,
            token_occupancy_ratio: occupancy,
            external_fragmentation_ratio: m
                .external_fragmentation_ratio
                .or(d.external_fragmentation_ratio)
                .unwrap_or(0.0),
        };
        report.stats.up = true;
        report.stats.model = m.model.clone().or(d.model).unwrap_or_default();
        report.stats.num_requests_running = m.num_requests_running.unwrap_or(0.0).max(0.0) as u64;
        report.stats.num_requests_waiting = m.num_requests_waiting.unwrap_or(0.0).max(0.0) as u64;
        report.stats.num_preemptions_total = m.num_preemptions_total.unwrap_or(0.0).max(0.0) as u64;
        report.stats.tier = m.tier.unwrap_or(0);
        report.stats.instance_id = d.instance_id.clone().unwrap_or_default();
        report.stats.configured_max_num_seqs = d.configured_max_num_seqs;
        report.stats.requests_completed_total = m.completed_total.unwrap_or(0.0).max(0.0) as u64;
        report.stats.requests_arrived_total = m.arrived_total.map(|v| v.max(0.0) as u64);
        report.stats.requests_first_arrived_total =
            m.first_arrived_total.map(|v| v.max(0.0) as u64);
        report.stats.requests_answered_total = m
            .answered_total
            .or(m.completed_total)
            .unwrap_or(0.0)
            .max(0.0) as u64;
        if let Some(h) = &m.queue_time
            && let Some(w) = slide(&mut self.queue_window, h, self.ttft_window_len)
            && let Some(p99) = w.quantile(0.99)
        {
            report.stats.queue_wait_p99_s = p99;
        }

        if let Some(h) = &m.ttft {
            // A reset (engine restart) invalidates the window.
            if let Some(last) = self.ttft_window.back()
                && h.since(last).is_none()
            {
                self.ttft_window.clear();
            }
            self.ttft_window.push_back(h.clone());
            while self.ttft_window.len() > self.ttft_window_len {
                self.ttft_window.pop_front();
            }
            // Until the window holds two scrapes, the quantiles cover everything since the
            // engine started.
            let window = match self.ttft_window.len() {
                0 | 1 => self.ttft_window.back().cloned(),
                _ => self
                    .ttft_window
                    .back()
                    .and_then(|b| b.since(&self.ttft_window[0])),
            };
            if let Some(w) = window
                && let (Some(p50), Some(p99)) = (w.quantile(0.5), w.quantile(0.99))
            {
                report.stats.ttft_p50_s = p50;
                report.stats.ttft_p99_s = p99;
                report.ttft_known = true;
            }
        }
        report
    }
}
