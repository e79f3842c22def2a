//! `/debug/resource`: every engine's snapshot with its queue over the last 30 minutes.

use brownout_protocol::now_ms;

use super::LiveDataSource;
use super::sampler::HostSample;
use crate::ingest::hosts::HostView;
use crate::web::model::{EngineResource, Point, ResourceView};

/// Window of the queue series.
const QUEUE_WINDOW_MS: u64 = 30 * 60_000;

/// One host's engines with their queue series from its sampled history.
fn engine_resources(h: &HostView, hist: &[HostSample], now: u64) -> Vec<EngineResource> {
    let since = now.saturating_sub(QUEUE_WINDOW_MS);
    h.snapshot
        .engines
        .iter()
        .map(|e| {
            let queue_series = hist
                .iter()
                .filter(|s| s.ts_ms >= since)
                .filter_map(|s| {
                    s.engines
                        .iter()
                        .find(|(id, _, _)| *id == e.id)
                        .map(|(_, _, q)| Point::new(s.ts_ms, *q as f64))
                })
                .collect();
            EngineResource {
                host: h.host.clone(),
                engine: e.clone(),
                // Snapshots do not carry load/warm-up times yet (see docs/DASHBOARDS.md).
                model_load_s: 0.0,
                warmup_s: 0.0,
                queue_series,
            }
        })
        .collect()
}

impl LiveDataSource {
    pub(super) fn resource_view(&self) -> ResourceView {
        let now = now_ms();
        self.sample(now);
        let hosts = self.registry().list(now);
        let engines = hosts
            .iter()
            .flat_map(|h| engine_resources(h, &self.host_history(&h.host), now))
            .collect();
        ResourceView {
            origin: self.parts.origin,
            generated_at_ms: now,
            engines,
        }
    }
}
