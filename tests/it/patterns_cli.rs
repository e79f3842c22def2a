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

fn brownout_bytes(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_brownout"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn mine_prints_the_final_group_of_every_line_of_a_file() {
    // The slot after `the` becomes a variable at its third word: in a file every line gets the
    // merged template; on stdin (and with --online) each line is printed as it was read.
    let lines = "calling the weather service\ncalling the hotel service\n\
                 disk full on /dev/sda1\ncalling the maps service\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.log");
    std::fs::write(&file, lines).unwrap();
    let out = brownout_bytes(&["patterns", "mine", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<(&str, &str)> = text.lines().map(|l| l.split_once('\t').unwrap()).collect();
    assert_eq!(rows.len(), 4);
    for i in [0, 1, 3] {
        assert_eq!(rows[i], (rows[0].0, "calling the <*> service"), "{text}");
    }
    assert_eq!(rows[2].1, "disk full on <*>");
    assert_ne!(rows[2].0, rows[0].0);

    let online = brownout(&["patterns", "mine", "-"], lines);
    let ids: Vec<&str> = online
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(ids.len(), 4);
    assert_ne!(ids[0], ids[1], "the second word is not yet a variable");
    assert_eq!(ids[3], rows[0].0, "the merge keeps the oldest id");
    let again = brownout_bytes(&["patterns", "mine", "--online", file.to_str().unwrap()]);
    assert_eq!(String::from_utf8(again.stdout).unwrap(), online);
}

#[test]
fn a_line_that_is_not_utf8_loses_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.log");
    let mut bytes = b"Received block blk_1 of size 10 from 10.0.0.1\r\n".to_vec();
    bytes.extend_from_slice(b"bad \xff\xfe bytes 42\n");
    bytes.extend_from_slice(b"Received block blk_2 of size 20 from 10.0.0.2");
    std::fs::write(&file, &bytes).unwrap();
    let out = brownout_bytes(&["patterns", "mine", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<(&str, &str)> = text.lines().map(|l| l.split_once('\t').unwrap()).collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert_eq!(rows[0], rows[2]);
    assert_eq!(rows[0].1, "Received block <*> of size <*> from <*>");
    assert_eq!(rows[1].1, "bad \u{fffd}\u{fffd} bytes <*>");
    let missing = brownout_bytes(&["patterns", "mine", "/nonexistent/x.log"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/x.log"));
}
