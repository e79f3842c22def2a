//! UI grey-out: `GET /v1/features`, `GET /v1/features/stream` (SSE, one event per change) and a
//! small demo page at `/` whose buttons grey out live.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::{Json, Router};
use brownout_protocol::{Criticality, FeatureState, FeatureStatus, TOOL_FEATURE_PREFIX, Tier};
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio_stream::wrappers::WatchStream;

use super::{Applied, ControlHandle};

/// The features a front end knows about, with their criticality.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureCatalog {
    features: Vec<(String, Criticality)>,
}

impl FeatureCatalog {
    pub fn new(features: Vec<(String, Criticality)>) -> FeatureCatalog {
        FeatureCatalog { features }
    }

    /// The features of docs/REQUIREMENTS.md R3.1: PDF analysis, image generation, multilingual
    /// e-mail (P2), web search, simple tasks (P1), basic Q&A and login (P0).
    pub fn seed_default() -> FeatureCatalog {
        let f = |n: &str, c| (n.to_string(), c);
        FeatureCatalog::new(vec![
            f("pdf_analysis", Criticality::Sheddable),
            f("image_generation", Criticality::Sheddable),
            f("multilingual_email", Criticality::Sheddable),
            f("web_search", Criticality::Default),
            f("simple_tasks", Criticality::Default),
            f("basic_qa", Criticality::Critical),
            f("login", Criticality::Critical),
        ])
    }

    pub fn features(&self) -> &[(String, Criticality)] {
        &self.features
    }
}

/// `GET /v1/features` and each SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FeaturesView {
    pub cluster: String,
    pub tier: Tier,
    pub epoch: u64,
    pub version: u64,
    pub features: Vec<FeatureStatus>,
}

impl FeaturesView {
    /// What the front end acts on (not the version): an event is sent only when this changes.
    fn effect(&self) -> (Tier, Vec<(String, FeatureState)>) {
        (
            self.tier,
            self.features
                .iter()
                .map(|f| (f.name.clone(), f.state.clone()))
                .collect(),
        )
    }
}

/// The feature view of the state in force: the catalog, plus any feature the command names.
pub fn features_view(catalog: &FeatureCatalog, applied: &Applied) -> FeaturesView {
    let c = &applied.command;
    let mut names: BTreeMap<&str, Criticality> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for (n, crit) in &catalog.features {
        if names.insert(n.as_str(), *crit).is_none() {
            order.push(n.as_str());
        }
    }
    for n in c.features.keys() {
        if !names.contains_key(n.as_str()) {
            names.insert(n.as_str(), Criticality::Default);
            order.push(n.as_str());
        }
    }
    let features = order
        .into_iter()
        .map(|n| {
            let state = c.feature_state(n);
            let why = if c.reason.detail.is_empty() {
                c.reason.trigger.clone()
            } else {
                format!("{}: {}", c.reason.trigger, c.reason.detail)
            };
            let tool = n.starts_with(TOOL_FEATURE_PREFIX);
            let reason = match &state {
                FeatureState::Disabled if tool => {
                    format!("tool breaker open at {} ({why})", c.tier)
                }
                FeatureState::Disabled => format!("disabled at {} ({why})", c.tier),
                FeatureState::Probe => format!(
                    "{} at {}: {:.0}% of calls pass ({why})",
                    if tool {
                        "tool breaker half-open"
                    } else {
                        "probing"
                    },
                    c.tier,
                    c.probe_ratio() * 100.0
                ),
                FeatureState::Enabled | FeatureState::Unknown(_) if c.tier == Tier::T0 => {
                    "normal operation".into()
                }
                FeatureState::Enabled | FeatureState::Unknown(_) => {
                    format!("enabled at {}", c.tier)
                }
            };
            FeatureStatus {
                name: n.to_string(),
                state,
                criticality: names[n],
                tier: c.tier,
                reason,
            }
        })
        .collect();
    FeaturesView {
        cluster: c.cluster.clone(),
        tier: c.tier,
        epoch: c.epoch,
        version: c.version,
        features,
    }
}

#[derive(Clone)]
struct AppState {
    handle: ControlHandle,
    catalog: Arc<FeatureCatalog>,
}

async fn get_features(State(s): State<AppState>) -> Json<FeaturesView> {
    Json(features_view(&s.catalog, &s.handle.current()))
}

/// The SSE stream: the current view first, then one event per change of tier or feature states.
pub fn feature_events(
    handle: ControlHandle,
    catalog: Arc<FeatureCatalog>,
) -> impl Stream<Item = FeaturesView> + Send + 'static {
    let mut last: Option<(Tier, Vec<(String, FeatureState)>)> = None;
    WatchStream::new(handle.subscribe()).filter_map(move |applied| {
        let view = features_view(&catalog, &applied);
        let eff = view.effect();
        let out = if last.as_ref() == Some(&eff) {
            None
        } else {
            last = Some(eff);
            Some(view)
        };
        futures::future::ready(out)
    })
}

async fn get_stream(
    State(s): State<AppState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let events = feature_events(s.handle.clone(), s.catalog.clone()).map(|v| {
        let data = serde_json::to_string(&v).unwrap_or_else(|_| "{}".into());
        Ok(Event::default()
            .event("features")
            .id(format!("{}:{}", v.epoch, v.version))
            .data(data))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

pub use brownout_protocol::html::escape as escape_html;

const PAGE_HEAD: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>brownout: features</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font-family:system-ui,sans-serif;margin:2rem;max-width:44rem}
 #tier{font-weight:bold}
 .features{display:flex;flex-wrap:wrap;gap:.5rem;margin:1rem 0}
 button{padding:.6rem 1rem;border-radius:.4rem;border:1px solid #456;background:#def;cursor:pointer}
 button:disabled{background:#ddd;color:#888;border-color:#bbb;cursor:not-allowed}
 .p0{font-weight:bold}
 #why{color:#555;font-size:.9rem}
</style></head><body>
<h1>brownout demo front end</h1>
<p>Degradation tier in force: <span id="tier">"#;

const PAGE_SCRIPT: &str = r#"
<script>
"use strict";
(function () {
  // Optional same-origin path that receives every change (used by the headless browser test).
  var report = new URLSearchParams(location.search).get("report");
  if (!report || report.charAt(0) !== "/" || report.charAt(1) === "/") { report = null; }
  var list = document.getElementById("features");
  var tierEl = document.getElementById("tier");
  var why = document.getElementById("why");
  window.brownoutLog = [];
  function send(obj) {
    window.brownoutLog.push(obj);
    if (report) {
      fetch(report, {method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify(obj)});
    }
  }
  function button(name) {
    var bs = list.querySelectorAll("button");
    for (var i = 0; i < bs.length; i++) { if (bs[i].dataset.feature === name) { return bs[i]; } }
    var b = document.createElement("button");
    b.dataset.feature = name;
    b.textContent = name;
    list.appendChild(b);
    return b;
  }
  var first = true;
  function render(view) {
    tierEl.textContent = "T" + view.tier;
    var disabled = [];
    view.features.forEach(function (f) {
      var b = button(f.name);
      var off = f.state === "disabled";
      b.title = f.reason;
      if (off) { disabled.push(f.name); }
      if (b.disabled !== off) {
        b.disabled = off;
        if (!first) { send({event: "change", feature: f.name, disabled: off, tier: view.tier, version: view.version, at_ms: Date.now()}); }
      }
    });
    why.textContent = disabled.length ? ("Greyed out: " + disabled.join(", ")) : "All features available.";
    if (first) { first = false; send({event: "ready", tier: view.tier, version: view.version, at_ms: Date.now()}); }
  }
  var es = new EventSource("/v1/features/stream");
  es.addEventListener("features", function (e) { render(JSON.parse(e.data)); });
})();
</script>
</body></html>
"#;

/// The demo page for the state in force (server-rendered, then kept live by SSE).
pub fn demo_page(catalog: &FeatureCatalog, applied: &Applied) -> String {
    let view = features_view(catalog, applied);
    let mut html = String::from(PAGE_HEAD);
    html.push_str(&format!(
        "T{}</span></p>\n<div id=\"features\" class=\"features\">\n",
        view.tier.as_u8()
    ));
    for f in &view.features {
        let name = escape_html(&f.name);
        let class = if f.criticality == Criticality::Critical {
            " class=\"p0\""
        } else {
            ""
        };
        let disabled = if f.state == FeatureState::Disabled {
            " disabled"
        } else {
            ""
        };
        html.push_str(&format!(
            "  <button data-feature=\"{name}\" title=\"{}\"{class}{disabled}>{name}</button>\n",
            escape_html(&f.reason)
        ));
    }
    html.push_str("</div>\n<p id=\"why\"></p>\n");
    html.push_str(PAGE_SCRIPT);
    html
}

async fn get_page(State(s): State<AppState>) -> impl IntoResponse {
    Html(demo_page(&s.catalog, &s.handle.current()))
}

/// `GET /`, `GET /v1/features`, `GET /v1/features/stream`. The engine merges it into its API.
pub fn router(handle: ControlHandle, features: FeatureCatalog) -> Router {
    Router::new()
        .route("/", get(get_page))
        .route("/v1/features", get(get_features))
        .route("/v1/features/stream", get(get_stream))
        .with_state(AppState {
            handle,
            catalog: Arc::new(features),
        })
}
