//! The host list and the host detail page (VRAM, KV usage per engine and queue over the
//! sampled history, and the service instances on the host).

use std::collections::BTreeMap;

use brownout_protocol::now_ms;

use super::sampler::HostSample;
use super::services::{ServiceIndex, instances_of};
use super::{LiveDataSource, instance_id, summary};
use crate::ingest::hosts::HostView;
use crate::web::model::{
    DataOrigin, HostDetailView, HostsView, InstanceRef, Point, Series, UiError,
};

/// The service instances that run on host `name`: from the index, and the models of its
/// engines no service reported under.
fn instances_on(
    name: &str,
    h: &HostView,
    idx: &ServiceIndex,
    hosts: &[HostView],
) -> Vec<InstanceRef> {
    let mut instances = Vec::new();
    for (svc, f) in &idx.services {
        for (id, host, _) in instances_of(Some(f), svc, hosts) {
            if host == name {
                instances.push(InstanceRef {
                    service: svc.clone(),
                    instance: id,
                });
            }
        }
    }
    for e in &h.snapshot.engines {
        if !e.model.is_empty()
            && !idx.services.contains_key(&e.model)
            && !instances
                .iter()
                .any(|i| i.instance == instance_id(name, Some(&e.id)))
        {
            instances.push(InstanceRef {
                service: e.model.clone(),
                instance: instance_id(name, Some(&e.id)),
            });
        }
    }
    instances
}

/// The host page from its registry view, its sampled history and the instances on it.
fn host_detail(
    origin: DataOrigin,
    now: u64,
    h: &HostView,
    hist: &[HostSample],
    instances: Vec<InstanceRef>,
) -> HostDetailView {
    let mut kv: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for e in &h.snapshot.engines {
        kv.entry(e.id.clone()).or_default();
    }
    for s in hist {
        for (id, usage, _) in &s.engines {
            kv.entry(id.clone())
                .or_default()
                .push(Point::new(s.ts_ms, *usage));
        }
    }
    HostDetailView {
        origin,
        generated_at_ms: now,
        host: summary(h),
        vram_series: hist
            .iter()
            .map(|s| Point::new(s.ts_ms, s.max_vram))
            .collect(),
        kv_series: kv
            .into_iter()
            .map(|(name, points)| Series { name, points })
            .collect(),
        queue_series: hist
            .iter()
            .map(|s| Point::new(s.ts_ms, s.queue as f64))
            .collect(),
        instances,
    }
}

impl LiveDataSource {
    pub(super) fn hosts_view(&self) -> HostsView {
        let now = now_ms();
        self.sample(now);
        HostsView {
            origin: self.parts.origin,
            generated_at_ms: now,
            hosts: self.registry().list(now).iter().map(summary).collect(),
        }
    }

    pub(super) async fn host_view(&self, name: &str) -> Result<HostDetailView, UiError> {
        let now = now_ms();
        self.sample(now);
        let hosts = self.registry().list(now);
        let h = hosts
            .iter()
            .find(|h| h.host == name)
            .ok_or_else(|| UiError::not_found("host", name))?;
        let hist = self.host_history(name);
        let idx = self.service_index(now).await?.attributed(&hosts);
        let instances = instances_on(name, h, &idx, &hosts);
        Ok(host_detail(self.parts.origin, now, h, &hist, instances))
    }
}
