//! Failure-pattern mining (template miner) and clustering (linfa).
//!
//! - [`mask`]: header stripping and variable masking of one raw line (pure).
//! - [`miner`]: the online template miner: stable ids, persistence, bounded memory (pure).
//! - [`cluster`]: TF-IDF + metadata vectors, DBSCAN (linfa-clustering) into patterns (pure).
//! - [`engine`]: [`PatternEngine`]: `observe(&FailureEvent)`, `patterns(since, until)` (pure).
//! - [`feed`]: [`feed::PatternFeed`], the one task that clusters, publishing the ranked
//!   patterns on a watch channel for the UI and the controller.
//! - [`api`]: `GET /api/v1/patterns` ([`api::router`]).
//! - [`share`]: one miner for every control-plane replica: failures shared through a Redis
//!   stream and mined in one canonical order (`control.share_patterns`; the one module here
//!   with IO).
//! - [`trace`]: exception types, Python tracebacks and Java stack traces (type, frames,
//!   fingerprint), and the joining of a raw log's lines into events (pure).
//! - [`synth`]: realistic agent failure logs with ground truth.
//! - [`bench`]: grouping accuracy and speed against drain3.
//! - this file: the `brownout patterns` CLI (`synth`, `mine`, `cluster`, `bench`).

pub mod api;
pub mod bench;
pub mod cluster;
pub mod engine;
pub mod feed;
pub mod hash;
pub mod mask;
pub mod miner;
pub mod share;
pub mod synth;
pub mod trace;

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use brownout_protocol::{Category, FailureEvent};

pub use api::router;
pub use engine::{EngineConfig, Pattern, PatternEngine, PatternId, SharedEngine};
pub use miner::{MinerConfig, MinerState, MinerStateStore, TemplateId, TemplateMiner};

/// Command-line arguments of `brownout patterns`.
#[derive(Debug, clap::Args)]
pub struct PatternsArgs {
    #[command(subcommand)]
    cmd: PatternsCmd,
}

#[derive(Debug, clap::Subcommand)]
enum PatternsCmd {
    /// Generate realistic agent failure events (NDJSON) with ground truth.
    Synth {
        /// Number of events.
        #[arg(long, default_value_t = 10_000)]
        lines: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write raw log lines instead of NDJSON failure events.
        #[arg(long)]
        raw: bool,
        /// Write the ground truth here: `<true template>\t<true pattern>` per event.
        #[arg(long)]
        truth: Option<PathBuf>,
        /// Output file (default stdout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print `<template_id>\t<template>` for every input line, in order.
    ///
    /// For a file, the lines are printed once the whole file is mined, each with the final id
    /// and template of its group; for stdin (or with `--online`) each line is printed as it is
    /// read, with the template as it is at that moment.
    Mine {
        /// Log file (`-` for stdin): raw lines or NDJSON failure events.
        file: String,
        /// Load and save the miner state (template ids survive between runs).
        #[arg(long)]
        state: Option<PathBuf>,
        /// Print each line as it is read, even for a file.
        #[arg(long)]
        online: bool,
    },
    /// Print `<pattern_id>\t<label>` for every input line, in order.
    Cluster {
        /// Log file (`-` for stdin): raw lines or NDJSON failure events.
        file: String,
    },
    /// Grouping accuracy and speed on labelled corpora, beside drain3.
    Bench {
        /// Directory of NAME.log + NAME.truth files.
        #[arg(long, default_value = "testdata/logs")]
        corpus: PathBuf,
        /// The drain3 peer script; `none` skips the peer.
        #[arg(long, default_value = "bench/drain3_peer.py")]
        peer: String,
        /// Minimum CPU seconds per speed measurement.
        #[arg(long, default_value_t = 1.0)]
        min_cpu_s: f64,
    },
}

/// Runs `brownout patterns`.
///
/// # Errors
/// Unreadable input, unwritable output, a bad state file, or a failing peer.
pub async fn run(args: PatternsArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(args))
        .await
        .context("patterns task panicked")?
}

/// Runs `brownout patterns` on the calling thread (no async runtime: a short `mine` run is
/// mostly process start-up, so the CLI calls this directly).
///
/// # Errors
/// As [`run`].
pub fn run_blocking(args: PatternsArgs) -> anyhow::Result<()> {
    match args.cmd {
        PatternsCmd::Synth {
            lines,
            seed,
            raw,
            truth,
            out,
        } => cmd_synth(lines, seed, raw, truth, out),
        PatternsCmd::Mine {
            file,
            state,
            online,
        } => cmd_mine(&file, state, online || file == "-"),
        PatternsCmd::Cluster { file } => cmd_cluster(&file),
        PatternsCmd::Bench {
            corpus,
            peer,
            min_cpu_s,
        } => cmd_bench(&corpus, &peer, min_cpu_s),
    }
}

fn open_input(file: &str) -> anyhow::Result<(Box<dyn BufRead>, u64)> {
    if file == "-" {
        return Ok((Box::new(std::io::BufReader::new(std::io::stdin())), 0));
    }
    let f = std::fs::File::open(file).with_context(|| format!("opening {file}"))?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((
        Box::new(std::io::BufReader::with_capacity(1 << 20, f)),
        size,
    ))
}

/// A line as the miner sees it: a failure event's message, or the raw line.
fn message_of(line: &str) -> (std::borrow::Cow<'_, str>, Option<FailureEvent>) {
    if line.starts_with('{')
        && let Ok(ev) = FailureEvent::parse_line(line.as_bytes())
    {
        return (std::borrow::Cow::Owned(ev.message.clone()), Some(ev));
    }
    (std::borrow::Cow::Borrowed(line), None)
}

/// The miner's key and text for one input event (its physical lines): an NDJSON failure
/// event's message keyed by its error type and stack frames ([`engine::miner_input_of`]), a raw
/// line as it is, or the joined lines of a raw traceback or stack trace keyed by its type and
/// frames ([`trace::miner_input`]).
pub fn event_input(lines: &[String]) -> (String, std::borrow::Cow<'_, str>, Option<FailureEvent>) {
    use std::borrow::Cow;
    match lines {
        [] => (String::new(), Cow::Borrowed(""), None),
        [line] => match message_of(line) {
            (_, Some(ev)) => {
                let input = engine::miner_input_of(&ev);
                let (key, text) = (input.key, input.text.into_owned());
                (key, Cow::Owned(text), Some(ev))
            }
            (msg, None) => match json_line_input(line) {
                Some((key, text)) => (key, Cow::Owned(text), None),
                None => (String::new(), msg, None),
            },
        },
        _ => {
            let joined = lines.join("\n");
            let input = trace::miner_input("", &joined, None);
            (input.key, Cow::Owned(input.text.into_owned()), None)
        }
    }
}

/// Fields of a JSON log line that hold its message, and its error, in the order tried.
const JSON_MESSAGE_FIELDS: &[&str] = &["msg", "message", "event", "log"];
const JSON_ERROR_FIELDS: &[&str] = &[
    "error",
    "err",
    "exception",
    "exc_info",
    "stack_trace",
    "stacktrace",
];
const JSON_TYPE_FIELDS: &[&str] = &[
    "error_type",
    "exception_type",
    "exc_type",
    "error.type",
    "exception.type",
];

/// A raw line that is a JSON object with a message field (structured loggers: Go's slog and
/// zap, pino, python-json-logger; Docker's json-file driver's `log`): the miner's key and text
/// are its message and its error field (a traceback there keyed by its type and frames, like a
/// failure event's); the other fields (time, level, ids) are left out. `None` for any other
/// line.
fn json_line_input(line: &str) -> Option<(String, String)> {
    if !line.starts_with('{') {
        return None;
    }
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).ok()?;
    let field = |names: &[&str]| {
        names
            .iter()
            .find_map(|k| v.get(*k).and_then(|x| x.as_str()))
    };
    let msg = field(JSON_MESSAGE_FIELDS)?;
    let text = match field(JSON_ERROR_FIELDS) {
        Some(err) if !err.is_empty() => format!("{msg}\n{err}"),
        _ => msg.to_string(),
    };
    let input = trace::miner_input(field(JSON_TYPE_FIELDS).unwrap_or(""), &text, None);
    Some((input.key, input.text.into_owned()))
}

/// Calls `f` for every event of `input`: its physical lines, a traceback or stack trace in a
/// raw log being one event ([`trace::Joiner`]), every other line one event.
fn for_each_event(
    input: &mut dyn BufRead,
    file: &str,
    mut f: impl FnMut(&[String]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut joiner = trace::Joiner::new();
    let err: std::cell::RefCell<Option<anyhow::Error>> = Default::default();
    let mut emit = |ev: &[String]| {
        if err.borrow().is_none()
            && let Err(e) = f(ev)
        {
            *err.borrow_mut() = Some(e);
        }
    };
    for_each_line(input, file, |line| {
        joiner.push(line, &mut emit);
        err.borrow_mut().take().map_or(Ok(()), Err)
    })?;
    joiner.flush(&mut emit);
    err.into_inner().map_or(Ok(()), Err)
}

/// Mines `lines` (a raw log or NDJSON failure events) with a fresh miner as `patterns mine`
/// does for a file: tracebacks joined into one event, each line given its event's final id.
pub fn mine_log(lines: &[String]) -> Vec<TemplateId> {
    mine_log_with(&mut TemplateMiner::default(), lines)
}

/// [`mine_log`] with the given miner (to read its templates afterwards).
pub fn mine_log_with(m: &mut TemplateMiner, lines: &[String]) -> Vec<TemplateId> {
    let mut ids = Vec::with_capacity(lines.len());
    let mut joiner = trace::Joiner::new();
    let mut emit = |ev: &[String]| {
        let (key, text, _) = event_input(ev);
        let id = m.add_keyed(&key, &text);
        ids.extend(std::iter::repeat_n(id, ev.len()));
    };
    for l in lines {
        joiner.push(l, &mut emit);
    }
    joiner.flush(&mut emit);
    ids.into_iter().map(|id| m.resolve(id)).collect()
}

/// Progress on stderr every ~2 s for inputs over 64 MiB (or stdin).
struct Progress {
    enabled: bool,
    started: std::time::Instant,
    last: std::time::Instant,
}

impl Progress {
    fn new(size: u64, file: &str) -> Self {
        let now = std::time::Instant::now();
        Progress {
            enabled: file == "-" || size > 64 << 20,
            started: now,
            last: now,
        }
    }
    fn tick(&mut self, n: u64) {
        if self.enabled && n.is_multiple_of(65_536) && self.last.elapsed().as_secs_f64() >= 2.0 {
            self.last = std::time::Instant::now();
            let rate = n as f64 / self.started.elapsed().as_secs_f64();
            eprintln!("patterns: {n} lines ({rate:.0} lines/s)");
        }
    }
}

fn cmd_synth(
    lines: usize,
    seed: u64,
    raw: bool,
    truth: Option<PathBuf>,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let events = synth::generate(&synth::SynthConfig {
        lines,
        seed,
        ..synth::SynthConfig::default()
    });
    let mut w: Box<dyn Write> = match &out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    for e in &events {
        if raw {
            writeln!(w, "{}", synth::raw_line(&e.event))?;
        } else {
            serde_json::to_writer(&mut w, &e.event)?;
            writeln!(w)?;
        }
    }
    w.flush()?;
    if let Some(p) = truth {
        let mut t = std::io::BufWriter::new(
            std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?,
        );
        for e in &events {
            writeln!(t, "{}\t{}", e.true_template, e.true_pattern)?;
        }
        t.flush()?;
    }
    Ok(())
}

/// Bytes of a line the CLI reads; the rest of a longer line is skipped.
const MAX_READ_LINE: usize = 1 << 20;

/// Reads `input` line by line (without the line break; at most [`MAX_READ_LINE`] bytes of a
/// line; invalid UTF-8 replaced, so one bad line loses nothing else), calling `f` for each line.
fn for_each_line(
    input: &mut dyn BufRead,
    file: &str,
    mut f: impl FnMut(&str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut raw = Vec::with_capacity(4096);
    loop {
        raw.clear();
        let mut any = false;
        loop {
            let buf = input
                .fill_buf()
                .with_context(|| format!("reading {file}"))?;
            if buf.is_empty() {
                break;
            }
            any = true;
            let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(k) => (&buf[..=k], true),
                None => (buf, false),
            };
            let room = MAX_READ_LINE.saturating_sub(raw.len());
            raw.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let used = chunk.len();
            input.consume(used);
            if done {
                break;
            }
        }
        if !any {
            return Ok(());
        }
        while raw.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            raw.pop();
        }
        match std::str::from_utf8(&raw) {
            Ok(s) => f(s)?,
            Err(_) => f(&String::from_utf8_lossy(&raw))?,
        }
    }
}

/// Texts of evicted templates `mine` keeps for a file's final output.
const MAX_EVICTED_TEXTS: usize = 1 << 18;

fn cmd_mine(file: &str, state: Option<PathBuf>, online: bool) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let store = state.map(miner::JsonFileStateStore);
    let mut m = match &store {
        Some(s) => match s.load()? {
            Some(st) => TemplateMiner::from_state(st)?,
            None => TemplateMiner::default(),
        },
        None => TemplateMiner::default(),
    };
    let (mut input, size) = open_input(file)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let mut progress = Progress::new(size, file);
    let mut buf = String::new();
    let mut n = 0u64;
    // Final mode: the id of every line (8 bytes a line), merges and evicted texts on the side.
    let mut ids: Vec<TemplateId> = Vec::new();
    let mut merged: std::collections::HashMap<TemplateId, TemplateId> = Default::default();
    let mut gone: std::collections::HashMap<TemplateId, String> = Default::default();
    for_each_event(&mut *input, file, |lines| {
        let (key, msg, _) = event_input(lines);
        let id = m.add_keyed(&key, &msg);
        n += lines.len() as u64;
        progress.tick(n);
        if online {
            buf.clear();
            let _ = write!(buf, "{id}\t");
            m.write_template(id, &mut buf);
            buf.push('\n');
            for _ in lines {
                out.write_all(buf.as_bytes())?;
            }
        } else {
            ids.extend(std::iter::repeat_n(id, lines.len()));
            merged.extend(m.drain_merged());
            for (id, text) in m.drain_evicted_templates() {
                // Bounded: beyond this many evicted templates their lines print no text.
                if gone.len() < MAX_EVICTED_TEXTS {
                    gone.insert(id, text);
                }
            }
        }
        Ok(())
    })?;
    if !online {
        let resolve = |mut id: TemplateId| {
            for _ in 0..64 {
                match merged.get(&id) {
                    Some(&to) => id = to,
                    None => break,
                }
            }
            id
        };
        let mut rendered: std::collections::HashMap<TemplateId, Vec<u8>> = Default::default();
        for id in ids {
            let r = rendered.entry(id).or_insert_with(|| {
                let fin = resolve(id);
                let mut s = format!("{fin}\t");
                if !m.write_template(fin, &mut s) {
                    s.push_str(gone.get(&fin).map_or("", String::as_str));
                }
                s.push('\n');
                s.into_bytes()
            });
            out.write_all(r)?;
        }
    }
    out.flush()?;
    if let Some(s) = &store {
        s.save(&m.state())?;
    }
    Ok(())
}

fn cmd_cluster(file: &str) -> anyhow::Result<()> {
    let (mut input, size) = open_input(file)?;
    let mut progress = Progress::new(size, file);
    // Pass 1: mine, remembering per template the metadata clustering looks at.
    struct Meta {
        from_event: bool,
        first_line: usize,
        count: u64,
        category: Category,
        error_type: String,
        service: String,
        feature: String,
        model: String,
    }
    let mut m = TemplateMiner::new(MinerConfig {
        max_templates: usize::MAX / 8,
        ..MinerConfig::default()
    });
    let mut ids = Vec::new();
    let mut meta: std::collections::HashMap<TemplateId, Meta> = std::collections::HashMap::new();
    let mut i = 0usize;
    for_each_event(&mut *input, file, |lines| {
        let (key, msg, ev) = event_input(lines);
        let id = m.add_keyed(&key, &msg);
        let e = meta.entry(id).or_insert_with(|| {
            let (category, error_type, service, feature, model) = match &ev {
                Some(ev) => (
                    ev.category,
                    ev.error_type.clone(),
                    ev.service.clone(),
                    ev.feature.clone(),
                    ev.attributes.get("model").cloned().unwrap_or_default(),
                ),
                // Inferred from the final template below (a raw line's variables, such as a
                // host called gpu-3, would mislead the inference); a raw trace's type is its key's.
                None => (
                    Category::Other,
                    key.split('@').next().unwrap_or_default().to_string(),
                    String::new(),
                    String::new(),
                    String::new(),
                ),
            };
            Meta {
                from_event: ev.is_some(),
                first_line: i,
                count: 0,
                category,
                error_type,
                service,
                feature,
                model,
            }
        });
        e.count += lines.len() as u64;
        ids.extend(std::iter::repeat_n(id, lines.len()));
        i += lines.len();
        progress.tick(i as u64);
        Ok(())
    })?;
    // Templates merged later in the pass: their lines and counts go to the surviving id.
    for id in &mut ids {
        *id = m.resolve(*id);
    }
    let mut folded: std::collections::HashMap<TemplateId, Meta> = std::collections::HashMap::new();
    let mut entries: Vec<(TemplateId, Meta)> = meta.into_iter().collect();
    entries.sort_by_key(|(_, x)| x.first_line);
    for (id, x) in entries {
        match folded.entry(m.resolve(id)) {
            std::collections::hash_map::Entry::Occupied(mut o) => o.get_mut().count += x.count,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(x);
            }
        }
    }
    let mut meta = folded;
    // Pass 2: cluster the final templates.
    let mut tids: Vec<TemplateId> = meta.keys().copied().collect();
    tids.sort_by_key(|t| meta[t].first_line);
    let texts: Vec<String> = tids
        .iter()
        .map(|t| m.template(*t).unwrap_or_default())
        .collect();
    for (t, text) in tids.iter().zip(&texts) {
        let x = meta.get_mut(t).expect("every mined id has metadata");
        if !x.from_event {
            x.category = Category::infer("", text);
        }
    }
    let items: Vec<cluster::ClusterItem<'_>> = tids
        .iter()
        .zip(&texts)
        .map(|(t, text)| {
            let x = &meta[t];
            cluster::ClusterItem {
                template: text,
                category: x.category.as_str(),
                error_type: &x.error_type,
                service: &x.service,
                feature: &x.feature,
                model: &x.model,
                count: x.count,
            }
        })
        .collect();
    let labels = cluster::cluster(&items, &cluster::ClusterConfig::default());
    // Per cluster: id from the oldest template, label from the most frequent.
    let mut by_cluster: std::collections::BTreeMap<usize, Vec<usize>> =
        std::collections::BTreeMap::new();
    for (i, l) in labels.iter().enumerate() {
        by_cluster.entry(*l).or_default().push(i);
    }
    let mut tid_to_pattern: std::collections::HashMap<TemplateId, (PatternId, usize)> =
        std::collections::HashMap::new();
    for members in by_cluster.values() {
        let oldest = members[0]; // tids are sorted by first line
        let label = *members
            .iter()
            .max_by_key(|&&i| (meta[&tids[i]].count, std::cmp::Reverse(i)))
            .expect("non-empty");
        for &i in members {
            tid_to_pattern.insert(tids[i], (PatternId::from_template(tids[oldest]), label));
        }
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    for id in ids {
        let (pid, label) = &tid_to_pattern[&id];
        writeln!(out, "{pid}\t{}", texts[*label])?;
    }
    out.flush()?;
    Ok(())
}

#[derive(serde::Deserialize)]
struct PeerResult {
    file: String,
    lines: usize,
    cpu_s: f64,
    ids: Vec<u64>,
    #[serde(default)]
    content_ids: Vec<u64>,
}

fn cmd_bench(corpus: &std::path::Path, peer: &str, min_cpu_s: f64) -> anyhow::Result<()> {
    let corpora = bench::load_corpora(corpus)?;
    anyhow::ensure!(
        !corpora.is_empty(),
        "no NAME.log + NAME.truth pairs under {}",
        corpus.display()
    );
    let peer_results: std::collections::HashMap<String, PeerResult> = if peer == "none" {
        Default::default()
    } else {
        let out = std::process::Command::new("python3")
            .arg(peer)
            .args(corpora.iter().map(|c| &c.log_path))
            .output()
            .with_context(|| format!("running python3 {peer} (pip install drain3)"))?;
        anyhow::ensure!(
            out.status.success(),
            "peer {peer} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut map = std::collections::HashMap::new();
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let r: PeerResult =
                serde_json::from_str(l).with_context(|| format!("peer output line {l:.80}"))?;
            map.insert(r.file.clone(), r);
        }
        map
    };
    println!(
        "| corpus | lines | true templates | brownout templates | brownout accuracy | drain3 accuracy (raw lines) | drain3 accuracy (per-source header regex) | brownout lines/CPU-s | drain3 lines/CPU-s (raw) | speed-up |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut acc_sum, mut peer_acc_sum, mut content_acc_sum, mut n_peer) = (0.0, 0.0, 0.0, 0usize);
    let (mut all_lines, mut our_cpu, mut peer_cpu) = (0usize, 0.0, 0.0);
    let dash = || "-".to_string();
    for c in &corpora {
        let ids = bench::mine_corpus(&c.lines);
        let acc = bench::grouping_accuracy(&ids, &c.truth);
        let ntrue = c
            .truth
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len();
        let nours = ids.iter().collect::<std::collections::HashSet<_>>().len();
        let speed = bench::miner_speed(&c.lines, min_cpu_s);
        acc_sum += acc;
        all_lines += c.lines.len();
        our_cpu += c.lines.len() as f64 / speed;
        let key = c.log_path.to_string_lossy().into_owned();
        let (pacc, cacc, pspeed) = match peer_results.get(&key) {
            Some(p) if p.lines == c.lines.len() => {
                let pa = bench::grouping_accuracy(&p.ids, &c.truth);
                let ca = if p.content_ids.len() == c.lines.len() {
                    bench::grouping_accuracy(&p.content_ids, &c.truth)
                } else {
                    0.0
                };
                peer_acc_sum += pa;
                content_acc_sum += ca;
                n_peer += 1;
                peer_cpu += p.cpu_s;
                (
                    format!("{pa:.3}"),
                    format!("{ca:.3}"),
                    Some(p.lines as f64 / p.cpu_s.max(1e-9)),
                )
            }
            _ => (dash(), dash(), None),
        };
        println!(
            "| {} | {} | {ntrue} | {nours} | {acc:.3} | {pacc} | {cacc} | {speed:.0} | {} | {} |",
            c.name,
            c.lines.len(),
            pspeed.map_or_else(dash, |s| format!("{s:.0}")),
            pspeed.map_or_else(dash, |s| format!("{:.0}×", speed / s)),
        );
    }
    let n = corpora.len() as f64;
    let peer_avg = |x: f64| {
        if n_peer > 0 {
            format!("{:.3}", x / n_peer as f64)
        } else {
            dash()
        }
    };
    println!(
        "| **average / total** | {all_lines} | | | **{:.3}** | {} | {} | {:.0} | {} | {} |",
        acc_sum / n,
        peer_avg(peer_acc_sum),
        peer_avg(content_acc_sum),
        all_lines as f64 / our_cpu,
        if n_peer > 0 {
            format!("{:.0}", all_lines as f64 / peer_cpu)
        } else {
            dash()
        },
        if n_peer > 0 {
            format!("{:.0}×", peer_cpu / our_cpu)
        } else {
            dash()
        },
    );
    // Pattern grouping (clustering) where the truth has a pattern column.
    for c in &corpora {
        if let Some(tp) = &c.truth_patterns {
            let pats = cluster_lines(&c.lines);
            println!(
                "\npattern grouping accuracy on {}: {:.3} ({} true patterns, {} found)",
                c.name,
                bench::grouping_accuracy(&pats, tp),
                tp.iter().collect::<std::collections::HashSet<_>>().len(),
                pats.iter().collect::<std::collections::HashSet<_>>().len()
            );
        }
    }
    Ok(())
}

/// Pattern id per line for raw lines (the `cluster` command's logic, in memory).
pub fn cluster_lines(lines: &[String]) -> Vec<PatternId> {
    let mut m = TemplateMiner::default();
    let ids: Vec<TemplateId> = lines
        .iter()
        .map(|l| {
            let (key, msg, _) = event_input(std::slice::from_ref(l));
            m.add_keyed(&key, &msg)
        })
        .collect();
    let ids: Vec<TemplateId> = ids.into_iter().map(|id| m.resolve(id)).collect();
    let mut first: Vec<TemplateId> = Vec::new();
    let mut counts: std::collections::HashMap<TemplateId, u64> = std::collections::HashMap::new();
    for id in &ids {
        let c = counts.entry(*id).or_default();
        if *c == 0 {
            first.push(*id);
        }
        *c += 1;
    }
    let texts: Vec<String> = first
        .iter()
        .map(|t| m.template(*t).unwrap_or_default())
        .collect();
    let cats: Vec<Category> = texts.iter().map(|t| Category::infer("", t)).collect();
    let items: Vec<cluster::ClusterItem<'_>> = first
        .iter()
        .zip(&texts)
        .zip(&cats)
        .map(|((t, text), cat)| cluster::ClusterItem {
            template: text,
            category: cat.as_str(),
            count: counts[t],
            ..Default::default()
        })
        .collect();
    let labels = cluster::cluster(&items, &cluster::ClusterConfig::default());
    let mut pid_of_label = std::collections::HashMap::new();
    let mut tid_to_pid = std::collections::HashMap::new();
    for (i, l) in labels.iter().enumerate() {
        let pid = pid_of_label
            .entry(*l)
            .or_insert_with(|| PatternId::from_template(first[i]))
            .clone();
        tid_to_pid.insert(first[i], pid);
    }
    ids.iter().map(|t| tid_to_pid[t].clone()).collect()
}
