//! The `brownout patterns` CLI through the real binary: synth with ground truth, mine (one line
//! out per line in, ids surviving a restart through --state), cluster.

use std::io::Write;
use std::process::{Command, Stdio};

fn brownout(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_brownout"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "brownout {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn synth_mine_and_cluster_work_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.tsv");
    let events = brownout(
        &[
            "patterns",
            "synth",
            "--lines",
            "400",
            "--seed",
            "2",
            "--truth",
            truth.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(events.lines().count(), 400);
    assert_eq!(
        std::fs::read_to_string(&truth).unwrap().lines().count(),
        400
    );
    assert!(
        events
            .lines()
            .all(|l| brownout_protocol::FailureEvent::parse_line(l.as_bytes()).is_ok())
    );

    let mined = brownout(&["patterns", "mine", "-"], &events);
    assert_eq!(mined.lines().count(), 400);
    assert!(
        mined
            .lines()
            .all(|l| l.split('\t').count() == 2 && l.split('\t').next().unwrap().len() == 16),
        "{mined:.300}"
    );

    let clustered = brownout(&["patterns", "cluster", "-"], &events);
    assert_eq!(clustered.lines().count(), 400);
    let patterns: std::collections::HashSet<&str> = clustered
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert!(
        (6..=10).contains(&patterns.len()),
        "{} patterns",
        patterns.len()
    );
}

#[test]
fn template_ids_survive_a_restart_through_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("miner.json");
    let s = state.to_str().unwrap();
    let first = brownout(
        &["patterns", "mine", "--state", s, "-"],
        "user alice logged in from 10.0.0.1\ndisk full on /dev/sda1\n",
    );
    let second = brownout(
        &["patterns", "mine", "--state", s, "-"],
        "disk full on /dev/sdb9\nuser bob logged in from 10.0.0.2\n",
    );
    let ids = |out: &str| {
        out.lines()
            .map(|l| l.split('\t').next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let (a, b) = (ids(&first), ids(&second));
    assert_eq!(
        (a[0].as_str(), a[1].as_str()),
        (b[1].as_str(), b[0].as_str())
    );
    assert!(second.contains("user <*> logged in from <*>"), "{second}");
}
