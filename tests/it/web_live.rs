//! The overview's live updates in headless Chromium: the page is served with cluster tier T0, the
//! source then moves to T3 with a new reason and a host goes down; after the script's 5 s poll
//! (virtual time) the DOM shows the new tier, class, reason and host state — and the reason, which
//! contains markup, arrives as text.
//!
//! Needs `/usr/bin/chromium` (`apt-get install chromium`; scripts/test.sh installs it).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use brownout::web::{self, UiDataSource, UiError};
use brownout_protocol::Tier;
use brownout_test_support::ui::SampleDataSource;
use futures::future::{BoxFuture, FutureExt};

const NOW_MS: u64 = 1_764_460_800_000;

/// The demo source, except that the first overview says T0 and every later one says T3.
struct Escalating {
    demo: SampleDataSource,
    calls: AtomicUsize,
}

impl UiDataSource for Escalating {
    fn overview(&self) -> BoxFuture<'_, Result<web::OverviewView, UiError>> {
        async move {
            let mut v = self.demo.overview().await?;
            let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
            let c = &mut v.clusters[0];
            if first {
                c.tier = Tier::T0;
                c.reason.trigger = "recovered".into();
            } else {
                c.tier = Tier::T3;
                c.reason.trigger = "gpu_util".into();
                c.reason.slo = None;
                c.reason.window = None;
                c.reason.burn_rate = None;
                c.reason.detail = "<b>util 99.7%</b> for 30s".into();
                v.hosts[0].state = web::HostState::Down;
            }
            Ok(v)
        }
        .boxed()
    }
    fn hosts(&self) -> BoxFuture<'_, Result<web::HostsView, UiError>> {
        self.demo.hosts()
    }
    fn host<'a>(&'a self, h: &'a str) -> BoxFuture<'a, Result<web::HostDetailView, UiError>> {
        self.demo.host(h)
    }
    fn service<'a>(&'a self, s: &'a str) -> BoxFuture<'a, Result<web::ServiceView, UiError>> {
        self.demo.service(s)
    }
    fn instance<'a>(
        &'a self,
        s: &'a str,
        i: &'a str,
    ) -> BoxFuture<'a, Result<web::InstanceView, UiError>> {
        self.demo.instance(s, i)
    }
    fn patterns(&self) -> BoxFuture<'_, Result<web::PatternsView, UiError>> {
        self.demo.patterns()
    }
    fn slos(&self) -> BoxFuture<'_, Result<web::SloView, UiError>> {
        self.demo.slos()
    }
    fn degradation(&self) -> BoxFuture<'_, Result<web::DegradationView, UiError>> {
        self.demo.degradation()
    }
    fn resource(&self) -> BoxFuture<'_, Result<web::ResourceView, UiError>> {
        self.demo.resource()
    }
}

fn dump_dom(url: &str, budget_ms: u32) -> String {
    let profile = tempfile::tempdir().expect("temp profile");
    let out = Command::new("timeout")
        .arg("60")
        .arg("/usr/bin/chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("/usr/bin/chromium is needed for this test: apt-get install chromium (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 DOM")
}

fn tier_card(dom: &str) -> &str {
    let start = dom.find("class=\"card tier-card").expect("a tier card");
    &dom[start..start + dom[start..].find("</div>\n  </div>").unwrap_or(600)]
}

#[test]
fn overview_tier_badges_update_from_the_json_endpoint() {
    let source = Arc::new(Escalating {
        demo: SampleDataSource::new(NOW_MS),
        calls: AtomicUsize::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let app = web::router(source.clone());
    rt.spawn(async move { axum::serve(listener, app).await });

    let dom = dump_dom(&format!("http://{addr}/"), 7_000);
    assert!(
        source.calls.load(Ordering::SeqCst) >= 2,
        "the script polled /ui/api/overview"
    );
    let card = tier_card(&dom);
    assert!(card.contains("tier-card t3"), "class updated: {card}");
    assert!(card.contains(">T3<"), "badge updated: {card}");
    assert!(
        card.contains("gpu_util — &lt;b&gt;util 99.7%&lt;/b&gt; for 30s"),
        "reason updated as text: {card}"
    );
    assert!(!dom.contains("<b>util"), "markup in the reason stayed text");
    let row_start = dom
        .find("<tr data-host=\"gpu-a100-01\">")
        .expect("first host row");
    let row = &dom[row_start..row_start + dom[row_start..].find("</tr>").expect("row end")];
    assert!(
        row.contains("<span class=\"state down\">down</span>"),
        "host state updated: {row}"
    );
}
