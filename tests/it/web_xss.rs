//! XSS: every user-controlled string the UI shows (cluster, host, service, instance, SLO and
//! model names, pattern templates, log messages, OTLP log bodies and attributes, span names and
//! attributes, reasons, features, trace links) is replaced by a
//! hostile payload; each page is served on a real socket and loaded in headless Chromium. The
//! dumped DOM must show the payloads as literal text and contain no trace of them executing
//! (no `data-pwned` attribute set by a script, no changed title, no injected element).
//!
//! Needs `/usr/bin/chromium` (`apt-get install chromium`; scripts/test.sh installs it).

use std::process::Command;
use std::sync::Arc;

use brownout::web;
use brownout_test_support::ui::{SampleDataSource, Vocabulary};

const NOW_MS: u64 = 1_764_460_800_000;

/// Each payload, if it ran, would leave `data-pwned="<kind>"` on `<body>` or change the title.
const PAYLOADS: &[&str] = &[
    "<script>document.body.setAttribute('data-pwned','script')</script>",
    "\"><img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">",
    "</title><script>document.title='PWNED'</script>",
    "<svg onload=\"document.body.setAttribute('data-pwned','svg')\"><circle r=9 /></svg>",
    "</text></svg><script>document.body.setAttribute('data-pwned','svgtext')</script>",
    "' onmouseover='document.body.setAttribute(`data-pwned`,`attr`)' x='",
    "{{ 7*7 }} {% raw %}<iframe src=javascript:document.body.setAttribute('data-pwned','iframe')>",
];

/// Payload `i` with a suffix that keeps names unique within a list.
fn evil(i: usize) -> String {
    format!("{}/{i}?#", PAYLOADS[i % PAYLOADS.len()])
}

fn evil_list(offset: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| evil(offset + i)).collect()
}

fn hostile_vocabulary() -> Vocabulary {
    Vocabulary {
        clusters: evil_list(0, 3),
        hosts: evil_list(1, 5),
        services: evil_list(2, 4),
        models: evil_list(3, 3),
        slos: evil_list(4, 3),
        templates: evil_list(5, 6),
        messages: evil_list(6, 6),
        details: evil_list(0, 4),
        features: evil_list(3, 4),
        trace_url_prefix: "javascript:document.body.setAttribute('data-pwned','link')//".into(),
    }
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Loads `url` in headless Chromium and returns the DOM after scripts ran (`budget_ms` of
/// virtual time lets the live-update poll run too).
fn dump_dom(url: &str, budget_ms: u32) -> String {
    let profile = tempfile::tempdir().expect("temp profile");
    let out = Command::new("timeout")
        .arg("60")
        .arg("/usr/bin/chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
        ])
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

#[test]
fn hostile_strings_render_as_text_and_never_run_in_chromium() {
    let source = Arc::new(SampleDataSource::with_vocabulary(
        NOW_MS,
        hostile_vocabulary(),
    ));
    let host = source.host_names()[0].clone();
    let (service, instance) = source.instance_names()[0].clone();

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

    let pages = [
        "/".to_string(),
        "/hosts".into(),
        format!("/hosts/{}", enc(&host)),
        format!("/services/{}", enc(&service)),
        format!("/services/{}/instances/{}", enc(&service), enc(&instance)),
        "/patterns".into(),
        "/slos".into(),
        "/degradation".into(),
        "/debug/resource".into(),
        "/logs".into(),
        format!("/logs?q={}", enc(&hostile_vocabulary().messages[0][..20])),
        format!("/traces/{}", brownout_test_support::ui::SAMPLE_TRACE_ID),
    ];
    // Two Chromiums at a time: the machine is small.
    let doms: Vec<(String, String)> = pages
        .chunks(2)
        .flat_map(|chunk| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|p| {
                    let url = format!("http://{addr}{p}");
                    // The overview runs the live-update script (it polls every 5 s).
                    let budget = if p == "/" { 7_000 } else { 500 };
                    std::thread::spawn(move || dump_dom(&url, budget))
                })
                .collect();
            chunk
                .iter()
                .cloned()
                .zip(
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("chromium thread")),
                )
                .collect::<Vec<_>>()
        })
        .collect();

    for (page, dom) in &doms {
        assert!(dom.contains("<main>"), "{page}: page did not render: {dom}");
        // Nothing ran.
        assert!(
            !dom.contains("data-pwned=\""),
            "{page}: a payload executed: {dom}"
        );
        assert!(
            !dom.contains("<title>PWNED"),
            "{page}: a payload changed the title"
        );
        // Nothing was parsed as markup.
        // (Serialised attributes use double quotes; the payloads quote theirs with single quotes
        // or appear only as text, so these strings can only come from real elements.)
        for tag in [
            "<img",
            "<iframe",
            "<svg onload",
            "<circle r=\"9\"",
            " onmouseover=\"",
            "href=\"javascript:",
        ] {
            assert!(
                !dom.contains(tag),
                "{page}: payload became markup ({tag}): {dom}"
            );
        }
        assert_eq!(
            dom.matches("<script").count(),
            1,
            "{page}: only our own external script tag"
        );
        // The literal text is shown (a DOM serialiser escapes only `&`, `<`, `>` in text).
        let body = &dom[dom.find("<body").unwrap_or(0)..];
        assert!(
            PAYLOADS.iter().any(|p| body.contains(
                &p.replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;")
            )),
            "{page}: no payload is displayed literally: {dom}"
        );
    }
    assert!(
        doms.iter().any(|(_, d)| d.contains("{{ 7*7 }} {% raw %}")),
        "template syntax in data is shown, not evaluated"
    );
    // The live-update script ran on the overview and wrote the cluster reason as text.
    let overview = &doms[0].1;
    assert!(
        overview.contains("burn 16.2×"),
        "overview lost its reason after the live update: {overview}"
    );
}
