//! The overview page: the tier in force, SLO budgets, hosts, services and the top patterns.

use brownout_protocol::now_ms;

use super::services::service_list;
use super::slos::slo_summary;
use super::{LiveDataSource, summary};
use crate::web::model::{OverviewView, UiError};

impl LiveDataSource {
    pub(super) async fn overview_view(&self) -> Result<OverviewView, UiError> {
        let now = now_ms();
        self.sample(now);
        let hosts = self.registry().list(now);
        let idx = self.service_index(now).await?.attributed(&hosts);
        let services = service_list(&idx, &hosts, now);
        let patterns = self.patterns_now(now).await?;
        let cluster = self.cluster(now).await;
        Ok(OverviewView {
            origin: self.parts.origin,
            generated_at_ms: now,
            clusters: vec![cluster.current],
            slos: self
                .parts
                .slo
                .latest()
                .slos
                .iter()
                .map(slo_summary)
                .collect(),
            hosts: hosts.iter().map(summary).collect(),
            services,
            top_patterns: patterns.iter().take(5).map(|p| p.summary.clone()).collect(),
        })
    }
}
