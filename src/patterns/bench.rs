//! Grouping accuracy and speed of the miner on labelled corpora, with drain3 as the peer.
//!
//! A corpus is `NAME.log` (one raw line per line) beside `NAME.truth` (the true template of each
//! line; an optional second tab-separated column is the true failure pattern). Grouping accuracy
//! (LogPai's): a line is right when the set of lines sharing its mined template equals the set
//! sharing its true template.

use std::collections::HashMap;
use std::hash::Hash;
use std::path::{Path, PathBuf};

use super::miner::TemplateId;

/// Grouping accuracy of `pred` against `truth` (same length): the share of lines whose predicted
/// group is exactly their true group.
///
/// # Panics
/// When the two slices differ in length (a broken caller).
pub fn grouping_accuracy<P: Hash + Eq, T: Hash + Eq>(pred: &[P], truth: &[T]) -> f64 {
    assert_eq!(
        pred.len(),
        truth.len(),
        "grouping_accuracy: one label per line"
    );
    if pred.is_empty() {
        return 1.0;
    }
    // A predicted group is right when all its lines share one true label and that label has
    // no lines outside the group.
    let mut pred_groups: HashMap<&P, Vec<usize>> = HashMap::new();
    for (i, p) in pred.iter().enumerate() {
        pred_groups.entry(p).or_default().push(i);
    }
    let mut truth_sizes: HashMap<&T, usize> = HashMap::new();
    for t in truth {
        *truth_sizes.entry(t).or_default() += 1;
    }
    let mut right = 0usize;
    for lines in pred_groups.values() {
        let t0 = &truth[lines[0]];
        if lines.iter().all(|&i| truth[i] == *t0) && truth_sizes[t0] == lines.len() {
            right += lines.len();
        }
    }
    right as f64 / pred.len() as f64
}

/// One labelled corpus.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub name: String,
    pub log_path: PathBuf,
    pub lines: Vec<String>,
    pub truth: Vec<String>,
    /// Second truth column, when present.
    pub truth_patterns: Option<Vec<String>>,
}

/// Loads every `*.log` with a `*.truth` beside it, sorted by name.
///
/// # Errors
/// Unreadable files, or a truth file whose line count differs from its log.
pub fn load_corpora(dir: &Path) -> anyhow::Result<Vec<Corpus>> {
    use anyhow::Context;
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading corpus directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log") && p.with_extension("truth").exists())
        .collect();
    entries.sort();
    for log_path in entries {
        let lines: Vec<String> = std::fs::read_to_string(&log_path)
            .with_context(|| format!("reading {}", log_path.display()))?
            .lines()
            .map(str::to_string)
            .collect();
        let truth_raw = std::fs::read_to_string(log_path.with_extension("truth"))?;
        let mut truth = Vec::new();
        let mut pats = Vec::new();
        for l in truth_raw.lines() {
            let mut it = l.splitn(2, '\t');
            truth.push(it.next().unwrap_or_default().to_string());
            if let Some(p) = it.next() {
                pats.push(p.to_string());
            }
        }
        anyhow::ensure!(
            truth.len() == lines.len(),
            "{}: {} lines but {} truth lines",
            log_path.display(),
            lines.len(),
            truth.len()
        );
        let truth_patterns = (pats.len() == lines.len()).then_some(pats);
        let name = log_path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        out.push(Corpus {
            name,
            log_path,
            lines,
            truth,
            truth_patterns,
        });
    }
    Ok(out)
}

/// Mines a corpus with a fresh miner (default configuration) as `patterns mine` mines a file
/// ([`super::mine_log`]: tracebacks joined into one event, NDJSON events keyed by their type);
/// the final template id of each line (templates merged later in the pass are resolved).
pub fn mine_corpus(lines: &[String]) -> Vec<TemplateId> {
    super::mine_log(lines)
}

/// CPU time of the calling thread in seconds (Linux `/proc/thread-self/schedstat`), or `None`.
pub fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 / 1e9)
}

/// Lines per CPU-second of the miner on `lines` (repeats until ≥ `min_cpu_s` was spent).
pub fn miner_speed(lines: &[String], min_cpu_s: f64) -> f64 {
    let clock = || {
        thread_cpu_s().unwrap_or_else(|| {
            std::time::UNIX_EPOCH
                .elapsed()
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0)
        })
    };
    let t0 = clock();
    let mut n = 0usize;
    loop {
        let ids = mine_corpus(lines);
        n += ids.len();
        std::hint::black_box(ids);
        let dt = clock() - t0;
        if dt >= min_cpu_s {
            return n as f64 / dt;
        }
    }
}
