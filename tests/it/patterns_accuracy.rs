//! Grouping accuracy of the template miner on the committed labelled corpora (testdata/logs),
//! and pattern grouping of the clustering on the agent corpus. Accuracy, not speed: speed is
//! measured by `brownout patterns bench` (docs/BENCHMARKS.md).

use std::path::Path;

use brownout::patterns::bench::{grouping_accuracy, load_corpora, mine_corpus};
use brownout::patterns::cluster_lines;

fn corpora() -> Vec<brownout::patterns::bench::Corpus> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/logs");
    let c = load_corpora(&dir).expect("corpora load");
    let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
    for want in [
        "agent", "android", "hdfs", "openssh", "spark", "syslog", "windows",
    ] {
        assert!(
            names.contains(&want),
            "corpus {want} missing from {}",
            dir.display()
        );
    }
    c
}

#[test]
fn one_configuration_groups_every_log_style_accurately() {
    let corpora = corpora();
    let mut sum = 0.0;
    for c in &corpora {
        let acc = grouping_accuracy(&mine_corpus(&c.lines), &c.truth);
        assert!(acc >= 0.90, "{}: grouping accuracy {acc:.3} < 0.90", c.name);
        sum += acc;
    }
    let avg = sum / corpora.len() as f64;
    assert!(avg >= 0.95, "average grouping accuracy {avg:.3} < 0.95");
}

#[test]
fn held_out_styles_are_grouped_accurately_too() {
    // Apache and ZooKeeper styles were written after the miner was tuned (bench/gen_corpora.py).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/logs/heldout");
    let corpora = load_corpora(&dir).expect("held-out corpora load");
    assert_eq!(corpora.len(), 2);
    for c in &corpora {
        let acc = grouping_accuracy(&mine_corpus(&c.lines), &c.truth);
        assert!(acc >= 0.90, "{}: grouping accuracy {acc:.3} < 0.90", c.name);
    }
}

#[test]
fn agent_failures_cluster_into_their_true_patterns() {
    let corpora = corpora();
    let agent = corpora.iter().find(|c| c.name == "agent").unwrap();
    let truth = agent
        .truth_patterns
        .as_ref()
        .expect("agent.truth has a pattern column");
    let acc = grouping_accuracy(&cluster_lines(&agent.lines), truth);
    assert!(acc >= 0.95, "pattern grouping accuracy {acc:.3} < 0.95");
}

#[test]
fn grouping_accuracy_is_the_logpai_definition() {
    // Lines 0-1 share true template A, 2 is B. Prediction merges all: nothing is right.
    assert_eq!(grouping_accuracy(&[1, 1, 1], &["A", "A", "B"]), 0.0);
    // Prediction splits A: only B's line is right.
    assert!((grouping_accuracy(&[1, 2, 3], &["A", "A", "B"]) - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(grouping_accuracy(&[7, 7, 9], &["A", "A", "B"]), 1.0);
    assert_eq!(grouping_accuracy::<u8, u8>(&[], &[]), 1.0);
}
