//! Same data → same report: golden HTML, Markdown and JSON for fixed WeekData (regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p brownout --test it report_golden::`), escaping of user-controlled text, the
//! empty week, and playbook parsing.

use std::path::{Path, PathBuf};

use brownout::report::{Format, Playbook, WeekData, build, render};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/report_golden")
}

fn week() -> WeekData {
    serde_json::from_str(&std::fs::read_to_string(golden_dir().join("week.json")).unwrap()).unwrap()
}

fn check_golden(name: &str, got: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_GOLDEN=1", path.display()));
    assert!(
        got == want,
        "{name} differs from its golden file (UPDATE_GOLDEN=1 to accept):\n{got}"
    );
}

#[test]
fn fixed_week_renders_the_golden_files() {
    let report = build(&week(), &Playbook::bundled());
    for (format, name) in [
        (Format::Html, "week.html"),
        (Format::Md, "week.md"),
        (Format::Json, "week.report.json"),
    ] {
        let a = render(&report, format).unwrap();
        assert_eq!(
            a,
            render(&build(&week(), &Playbook::bundled()), format).unwrap(),
            "deterministic"
        );
        check_golden(name, &a);
    }
}

#[test]
fn top_three_by_impact_map_to_playbook_items() {
    let r = build(&week(), &Playbook::bundled());
    let ids: Vec<&str> = r.roadmap.iter().map(|i| i.playbook_id.as_str()).collect();
    assert_eq!(
        ids,
        ["kv-overflow", "tool-timeouts", "serialization-sanitize"]
    );
    assert!((r.roadmap[0].expected_budget_win_back - 0.38 * 0.8).abs() < 1e-9);
    assert_eq!(
        r.top.iter().map(|t| t.trend.as_str()).collect::<Vec<_>>(),
        ["+31%", "-6%", "new"]
    );
    assert_eq!(r.new_patterns.len(), 1);
    assert_eq!(r.episodes[0].duration, "1 h 45 min");
}

#[test]
fn per_instance_actions_are_listed_with_instance_time_reason_duration_and_ack() {
    let r = build(&week(), &Playbook::bundled());
    let rows: Vec<(&str, &str, &str, &str)> = r
        .instance_actions
        .iter()
        .map(|a| {
            (
                a.instance.as_str(),
                a.what.as_str(),
                a.duration.as_str(),
                a.ack.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "gpu-3/engine-0",
                "max_num_seqs halved",
                "1 min",
                "applied (lag 42 ms)"
            ),
            (
                "gpu-3/engine-0",
                "drained (only critical admitted)",
                "9 min",
                "applied (lag 38 ms)"
            ),
            (
                "*",
                "admission ramp 70% \u{2192} 80% \u{2192} 90%",
                "1 min",
                "pending"
            ),
            ("*", "recovery storm (retry waves)", "30 s", "-"),
            (
                "gpu-<b>4</b>|x",
                "operator action",
                "2 h 46 min",
                "unknown_instance"
            ),
        ]
    );
    assert_eq!(r.instance_actions[0].start, "Mon 2026-11-23 20:05 UTC");
    assert_eq!(r.instance_actions[4].end, "still in force");
    assert!(r.instance_actions[1].detail.contains("drained"));
    assert!(
        r.summary.contains(
            "Stop-bleed acted on single instances: 1 max_num_seqs halving, 1 drain, 1 operator action, 1 admission ramp, 1 recovery storm on 2 instances."
        ),
        "{}",
        r.summary
    );
}

#[test]
fn user_controlled_text_is_escaped() {
    let r = build(&week(), &Playbook::bundled());
    let html = render(&r, Format::Html).unwrap();
    assert!(!html.contains("<script>"), "label must be escaped in HTML");
    assert!(html.contains("&lt;script&gt;"));
    assert!(!html.contains("prod <eu>") && !html.contains("abc<def>"));
    assert!(
        !html.contains("& <ttft>"),
        "SLO names are escaped in the chart legend too"
    );
    let md = render(&r, Format::Md).unwrap();
    // Outside code spans (which Markdown shows literally) no raw `<` survives.
    for line in md.lines() {
        let outside: String = line.split('`').step_by(2).collect();
        assert!(!outside.contains('<'), "raw < outside a code span: {line}");
    }
    // Per-instance actions: instance ids and reasons are escaped too, and a `|` in them adds no
    // cell to the Markdown table.
    assert!(!html.contains("<img") && html.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(!html.contains("<b>4</b>") && html.contains("gpu-&lt;b&gt;4&lt;&#x2F;b&gt;|x"));
    for line in md
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("operator action"))
    {
        let outside: String = line.split('`').step_by(2).collect();
        assert_eq!(
            outside.matches(" | ").count() + 1,
            7,
            "a | in an instance id or reason must not add table cells: {line}"
        );
    }
    for line in md.lines().filter(|l| l.starts_with("| 3 |")) {
        assert_eq!(
            line.matches(" | ").count() + 1,
            9,
            "a | in a label must not add table cells: {line}"
        );
    }
}

#[test]
fn an_empty_week_says_so() {
    let data = WeekData {
        week: "2026-W01".into(),
        cluster: "prod".into(),
        start_ms: 1_767_571_200_000,
        slos: vec![],
        episodes: vec![],
        patterns: vec![],
        as_of_ms: None,
        refusals: vec![],
        instance_actions: vec![],
        slos_without_data: vec![],
    };
    let r = build(&data, &Playbook::bundled());
    assert!(r.empty && r.roadmap.is_empty());
    for f in [Format::Html, Format::Md] {
        let out = render(&r, f).unwrap();
        assert!(out.contains("No data was recorded for 2026-W01"), "{out}");
        assert!(
            out.contains("No failure patterns this week")
                && out.contains("No degradation this week")
        );
    }
    assert!(r.burn_chart_svg.contains("no data this week"));
}

#[test]
fn playbooks_parse_extend_and_refuse_bad_values() {
    let user = Playbook::parse(
        "mine.toml",
        "[[item]]\nid = \"kv-ours\"\ncategories = [\"kv_cache_exhausted\"]\ntitle = \"t\"\nchange = \"c\"\nverify = \"v\"\nwin_back_ratio = 0.5\n",
    )
    .unwrap();
    let pb = Playbook::bundled().extended_by(user);
    assert_eq!(
        pb.item_for("kv_cache_exhausted", "x").unwrap().id,
        "kv-ours"
    );
    assert_eq!(
        pb.item_for("other", "x").unwrap().id,
        "triage",
        "unmapped patterns get the triage item"
    );
    let err = Playbook::parse(
        "bad.toml",
        "[[item]]\nid = \"x\"\ntitle = \"t\"\nchange = \"c\"\nverify = \"v\"\nwin_back_ratio = 3.0\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("bad.toml") && err.to_string().contains("win_back_ratio"));
    let err = Playbook::parse("typo.toml", "[[item]]\nid = \"x\"\ntitel = \"t\"\n").unwrap_err();
    assert!(
        err.to_string().contains("typo.toml") && err.to_string().contains("titel"),
        "{err}"
    );
}

#[test]
fn iso_weeks_resolve_to_their_monday() {
    assert_eq!(
        brownout::report::week_start_ms("2026-W48").unwrap(),
        1_795_392_000_000
    );
    for bad in ["2026-48", "2026-W54", "x-W1"] {
        assert!(brownout::report::week_start_ms(bad).is_err(), "{bad}");
    }
}
