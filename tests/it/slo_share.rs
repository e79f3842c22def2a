//! N control-plane replicas, correct SLO counters (`control.share_slo_counters`,
//! `brownout::slo::share`): two replicas each ingest half of a known stream and share their
//! counts through the real Redis (`REDIS_TEST_URL`, a unique cluster name); the burn rates,
//! budgets and alert states of either — the leader's — equal those of one replica fed the whole
//! stream. Also: a replayed entry is applied once, and a replica started later catches up from
//! the stream.

use brownout::slo::eval::{EventKind, Observation};
use brownout::slo::share::SloShare;
use brownout::slo::spec::{self, SloSpec};
use brownout::slo::{Evaluator, SloHandle, SloStatus};
use brownout_protocol::Criticality;
use brownout_test_support::{redis_url, require_redis, unique};
use std::time::Duration;

const SEC: u64 = 1_000;
const MIN: u64 = 60 * SEC;

fn specs() -> Vec<SloSpec> {
    let text = [
        "version: brownout/v1",
        "slos:",
        "  - name: chat-availability",
        "    service: chat",
        "    objective_percent: 99",
        "    period: 28d",
        "    sli: {kind: availability}",
        "    min_events: 10",
        "  - name: chat-latency",
        "    service: chat",
        "    objective_percent: 95",
        "    period: 7d",
        "    sli: {kind: latency, latency_metric: e2e, threshold_ms: 500}",
        "  - name: chat-slices",
        "    service: chat",
        "    objective_percent: 99",
        "    period: 28d",
        "    sli: {kind: availability}",
        "    budgeting: timeslices",
        "    timeslice: {slice: 1m, good_ratio: 0.9}",
    ]
    .join("\n");
    spec::parse_str(&text, "share.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn handle() -> SloHandle {
    SloHandle::new(Evaluator::new(specs()))
}

/// A known stream: one request every 250 ms over 20 minutes ending `end_ms`; an outage
/// (every other request failing, slow) in minutes 12–15; every 17th refused on purpose.
fn stream(end_ms: u64) -> Vec<Observation<'static>> {
    let from = end_ms - 20 * MIN;
    (0..(20 * MIN / 250))
        .map(|i| {
            let ts_ms = from + i * 250;
            let outage = (12 * MIN..15 * MIN).contains(&(ts_ms - from));
            Observation {
                ts_ms,
                kind: EventKind::Request,
                service: "chat",
                feature: "basic_qa",
                criticality: Criticality::Default,
                ok: !(outage && i % 2 == 0),
                deliberate: i % 17 == 0,
                latency_ms: Some(if outage {
                    900.0
                } else {
                    120.0 + (i % 7) as f64
                }),
                ttft_ms: None,
            }
        })
        .collect()
}

fn burn(s: &SloStatus) -> Vec<(u64, f64, u64)> {
    s.burn_rates
        .iter()
        .map(|w| (w.window_secs, w.burn_rate, w.events))
        .collect()
}

async fn share(cluster: &str, name: &str) -> SloShare {
    SloShare::connect(&redis_url(), cluster, name, Duration::from_secs(2))
        .await
        .expect("connect to the test Redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_through_redis_burn_as_one_fed_the_whole_stream() {
    require_redis(&redis_url());
    let cluster = unique("slo-share-");
    // Just before now: the handles refuse events dated ahead of the wall clock.
    let now = brownout_protocol::now_ms() / 1000 * 1000;
    let events = stream(now);

    let whole = handle();
    let (a, b) = (handle(), handle());
    a.enable_sharing();
    b.enable_sharing();
    let (mut sa, mut sb) = (share(&cluster, "cp-a").await, share(&cluster, "cp-b").await);
    // The load balancer: alternating runs of 3 and 5 events, so neither half is a sample
    // of the other.
    for (i, o) in events.iter().enumerate() {
        whole.record(o);
        let replica = if (i / 3) % 3 == 0 { &a } else { &b };
        replica.record(o);
        if i % 4 == 3 {
            // A round per second of stream time, as in production (each replica publishes
            // and reads), well within the 5 s a time slice waits for late counts.
            sa.round(&a).await.unwrap();
            sb.round(&b).await.unwrap();
        }
    }
    // Last rounds: a publishes, b publishes and reads it, a reads b's.
    sa.round(&a).await.unwrap();
    sb.round(&b).await.unwrap();
    sa.round(&a).await.unwrap();

    let at = now + 2 * SEC;
    let want = whole.evaluate(at);
    for (who, h) in [("cp-a", &a), ("cp-b", &b)] {
        let got = h.evaluate(at);
        for (w, g) in want.slos.iter().zip(&got.slos) {
            assert_eq!(burn(g), burn(w), "{who} {}: burn rates", w.name);
            assert_eq!(g.period_events, w.period_events, "{who} {}", w.name);
            assert_eq!(g.refused, w.refused, "{who} {}: refusals", w.name);
            assert_eq!(
                g.budget_remaining_ratio, w.budget_remaining_ratio,
                "{who} {}: budget",
                w.name
            );
            assert_eq!(g.history_secs, w.history_secs, "{who} {}", w.name);
            assert_eq!(g.alerts, w.alerts, "{who} {}: alert states", w.name);
        }
    }
    // The outage burns: the comparison is not between empty reports.
    let avail = want.get("chat-availability").unwrap();
    assert!(avail.burn_rate(3_600).unwrap() > 1.0, "{avail:?}");

    // Without sharing a replica sees only its part.
    let alone = handle();
    for (i, o) in events.iter().enumerate() {
        if (i / 3) % 3 == 0 {
            alone.record(o);
        }
    }
    let part = alone.evaluate(at);
    assert_ne!(
        part.get("chat-availability").unwrap().period_events,
        avail.period_events
    );

    // A replica started now reads the stream from its start and catches up with both.
    let c = handle();
    c.enable_sharing();
    let mut sc = share(&cluster, "cp-c").await;
    let got = sc.round(&c).await.unwrap();
    assert!(got.applied_entries >= 2, "{got:?}");
    let late = c.evaluate(at);
    for (w, g) in want.slos.iter().zip(&late.slos) {
        assert_eq!(burn(g), burn(w), "late replica {}: burn rates", w.name);
        assert_eq!(g.period_events, w.period_events, "late replica {}", w.name);
    }
    // Nothing is applied twice: another round changes nothing.
    let again = sc.round(&c).await.unwrap();
    assert_eq!(again.applied_entries, 0);
    assert_eq!(
        c.evaluate(at + SEC)
            .get("chat-availability")
            .unwrap()
            .period_events,
        a.evaluate(at + SEC)
            .get("chat-availability")
            .unwrap()
            .period_events
    );

    cleanup(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_written_twice_is_applied_once() {
    require_redis(&redis_url());
    let cluster = unique("slo-share-dup-");
    let now = brownout_protocol::now_ms();
    let a = handle();
    a.enable_sharing();
    for o in stream(now).iter().take(100) {
        a.record(o);
    }
    let deltas = a.take_shared();
    assert!(!deltas.is_empty());
    // The same entry twice (an XADD whose answer was lost, sent again with the same s).
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("brownout:{{{cluster}}}:slo-deltas");
    let wire: Vec<(String, u64, u64, u64, u64, u64)> = deltas
        .iter()
        .map(|d| (d.slo.clone(), d.sec, d.good, d.total, d.refused, d.first_ms))
        .collect();
    let json = serde_json::to_string(&wire).unwrap();
    for _ in 0..2 {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("o")
            .arg("cp-x/1")
            .arg("s")
            .arg(1)
            .arg("d")
            .arg(&json)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let b = handle();
    b.enable_sharing();
    let got = share(&cluster, "cp-b").await.round(&b).await.unwrap();
    assert_eq!(got.applied_entries, 1, "{got:?}");
    let total: u64 = deltas
        .iter()
        .filter(|d| d.slo == "chat-availability")
        .map(|d| d.total)
        .sum();
    let at = now + SEC;
    assert_eq!(
        b.evaluate(at)
            .get("chat-availability")
            .unwrap()
            .period_events
            .total,
        total
    );
    // Applied deltas are not shared again (b sends nothing of its own).
    assert!(b.take_shared().is_empty());
    cleanup(&cluster).await;
}

async fn cleanup(cluster: &str) {
    let client = redis::Client::open(redis_url()).unwrap();
    if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
        let _: Result<(), _> = redis::cmd("DEL")
            .arg(format!("brownout:{{{cluster}}}:slo-deltas"))
            .query_async(&mut conn)
            .await;
    }
}
