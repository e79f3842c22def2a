//! Exception types and stack traces: what an error *is* (its type) and *where* it was raised
//! (its top frames), the way Sentry groups errors. Pure (no IO).
//!
//! - [`is_exception_type`]: a token that names an exception or error type (`RuntimeError`,
//!   `torch.OutOfMemoryError`, `java.net.SocketTimeoutException`, `grpc._channel._InactiveRpcError`,
//!   `StatusCode.UNAVAILABLE`). The masker keeps such a token as it is and the miner never
//!   merges two templates that differ in one.
//! - [`parse`]: a Python traceback or a Java stack trace (with `Caused by:` chains) in one
//!   multi-line message: the exception type, its message line, and the frames.
//! - [`Trace::fingerprint`]: a stable hash of the top in-app frames (file or class and function,
//!   line numbers left out), part of a pattern's key.
//! - [`Joiner`]: joins the physical lines of a raw log into events, a traceback or stack trace
//!   (and its `Caused by:` / `During handling …` chain) being one event.

use super::hash::stable_hash;

/// Name endings that exception and error types use across languages (Python, Java, .NET, Go,
/// JavaScript): `ValueError`, `IOException`, `SystemExit`, `KeyboardInterrupt`,
/// `DeprecationWarning`, `ConnectTimeout`, `SegmentationFault`, `DeadlineExceeded`.
const TYPE_SUFFIXES: &[&str] = &[
    "Error",
    "Exception",
    "Exit",
    "Interrupt",
    "Warning",
    "Timeout",
    "Fault",
    "Failure",
    "Exceeded",
    "Iteration",
    "Panic",
    "Cancelled",
    "Canceled",
    "Throwable",
];

/// `RateLimitError`, `_InactiveRpcError`, `OutOfMemoryError`: one CamelCase name part (an
/// optional leading `_`, a capital, at least one lower-case letter) ending in a type suffix.
fn is_type_name(p: &str) -> bool {
    let p = p.trim_start_matches('_');
    let b = p.as_bytes();
    b.first().is_some_and(u8::is_ascii_uppercase)
        && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'_')
        && b.iter().any(u8::is_ascii_lowercase)
        && TYPE_SUFFIXES
            .iter()
            .any(|s| p.len() > s.len() && p.ends_with(s))
}

/// `StatusCode`, `HTTPStatus`, `Code`: the CamelCase name of an enumeration whose member names
/// an error (`StatusCode.UNAVAILABLE`, `HTTPStatus.NOT_FOUND`, `Errno.ECONNREFUSED`).
fn is_enum_name(p: &str) -> bool {
    let b = p.as_bytes();
    b.first().is_some_and(u8::is_ascii_uppercase)
        && b.iter().any(u8::is_ascii_lowercase)
        && b.iter().all(u8::is_ascii_alphanumeric)
        && ["Code", "Status", "Errno", "Reason", "Kind"]
            .iter()
            .any(|s| p.ends_with(s))
}

fn is_upper_const(p: &str) -> bool {
    let b = p.as_bytes();
    b.len() >= 2
        && b[0].is_ascii_uppercase()
        && b.iter()
            .all(|x| x.is_ascii_uppercase() || x.is_ascii_digit() || *x == b'_')
}

/// Whether `tok` (punctuation around it set aside: quotes, brackets, a trailing `:` or `,`)
/// names an exception or error type: a CamelCase name ending in a type suffix (`Error`,
/// `Exception`, `Timeout`, … see `TYPE_SUFFIXES`), bare or as the last part of a dotted module
/// or package path (`requests.exceptions.ConnectTimeout`, `java.net.SocketTimeoutException`,
/// `grpc._channel._InactiveRpcError`, `Outer$InnerException`), or a member of an error-code
/// enumeration (`StatusCode.UNAVAILABLE`).
pub fn is_exception_type(tok: &str) -> bool {
    let t = core(tok);
    if t.is_empty() || t.len() > 200 {
        return false;
    }
    let mut parts = t.rsplit('.');
    let last = parts.next().unwrap_or("");
    let prefix_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|x| x.is_ascii_alphanumeric() || matches!(x, b'_' | b'.' | b'$'))
            && p.split('.').all(|s| {
                s.as_bytes()
                    .first()
                    .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
            })
    };
    let before = &t[..t.len() - last.len()];
    let before = before.strip_suffix('.').unwrap_or(before);
    if before.is_empty() {
        return last.split('$').any(is_type_name);
    }
    if !prefix_ok(before) {
        return false;
    }
    if last.split('$').any(is_type_name) {
        return true;
    }
    // `StatusCode.UNAVAILABLE`, `grpc.StatusCode.DEADLINE_EXCEEDED`.
    is_upper_const(last) && before.rsplit('.').next().is_some_and(is_enum_name)
}

/// The exception types named inside one token (`"error":"httpx.ReadTimeout:",` names
/// `httpx.ReadTimeout`): its runs of name characters that [`is_exception_type`].
fn types_in(tok: &str) -> impl Iterator<Item = &str> {
    tok.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | ':')))
        .map(core)
        .filter(|c| is_exception_type(c))
}

/// Whether two tokens name different exception types (one naming one and the other none, or
/// two different ones): such tokens are never one template.
pub fn exception_types_differ(a: &str, b: &str) -> bool {
    let first = |t: &str| t.bytes().any(|x| x.is_ascii_uppercase());
    if !first(a) && !first(b) {
        return false; // no capital, no type (a fast way out for most tokens)
    }
    !types_in(a).eq(types_in(b))
}

/// A token with its surrounding punctuation set aside: `'httpx.ReadTimeout'>` ->
/// `httpx.ReadTimeout`, `RuntimeError:` -> `RuntimeError`.
fn core(tok: &str) -> &str {
    tok.trim_start_matches(['(', '[', '{', '"', '\'', '<', '`'])
        .trim_end_matches([')', ']', '}', '"', '\'', '>', ':', ',', ';', '.', '`', '!'])
}

/// One frame of a stack trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The file (Python) or class (Java), as written.
    pub file: String,
    pub function: String,
    pub line: Option<u32>,
    /// Application code rather than a library or the runtime (see [`Trace::fingerprint`]).
    pub in_app: bool,
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(n) => write!(f, "{} ({}:{n})", self.function, self.file),
            None => write!(f, "{} ({})", self.function, self.file),
        }
    }
}

/// A parsed traceback or stack trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The exception that was raised last (Python: the last block; Java: the first line).
    pub error_type: String,
    /// Its line: `RuntimeError: CUDA error: out of memory`.
    pub headline: String,
    /// Text before the trace (`Engine loop failed` of a logged exception), one line.
    pub lead: String,
    /// Its frames, innermost (where it was raised) first.
    pub frames: Vec<Frame>,
    /// The types of the exceptions chained to it (causes, then contexts), in the order written.
    pub causes: Vec<String>,
}

/// Frames that make up a fingerprint.
pub const FINGERPRINT_FRAMES: usize = 3;

impl Trace {
    /// A stable hash of the top [`FINGERPRINT_FRAMES`] in-app frames nearest to where the
    /// exception was raised (all frames when none is in-app): each frame's file base name (or
    /// class) and function, never its line number, so an edit elsewhere in the file keeps the
    /// group. `None` when the trace has no frames.
    pub fn fingerprint(&self) -> Option<u64> {
        let app: Vec<&Frame> = self.frames.iter().filter(|f| f.in_app).collect();
        let use_frames: Vec<&Frame> = if app.is_empty() {
            self.frames.iter().collect()
        } else {
            app
        };
        if use_frames.is_empty() {
            return None;
        }
        let mut parts: Vec<&[u8]> = Vec::new();
        for f in use_frames.iter().take(FINGERPRINT_FRAMES) {
            parts.push(base_name(&f.file).as_bytes());
            parts.push(f.function.as_bytes());
        }
        Some(stable_hash(&parts))
    }

    /// The text the template miner mines for this event: the lead (a logged message) and the
    /// exception's line.
    pub fn text(&self) -> String {
        if self.lead.is_empty() {
            self.headline.clone()
        } else {
            format!("{} {}", self.lead, self.headline)
        }
    }
}

/// `/app/server.py` -> `server.py`; `C:\x\y.py` -> `y.py`; a Java class stays.
fn base_name(f: &str) -> &str {
    f.rsplit(['/', '\\']).next().unwrap_or(f)
}

/// Python frames of the standard library or of installed packages are not the application's.
fn python_in_app(path: &str) -> bool {
    !(path.contains("site-packages")
        || path.contains("dist-packages")
        || path.starts_with('<')
        || path.contains("/lib/python")
        || path.contains("\\Lib\\"))
}

/// Java frames of the runtime and of the JVM languages' libraries are not the application's.
fn java_in_app(class: &str) -> bool {
    const LIB: &[&str] = &[
        "java.",
        "javax.",
        "jdk.",
        "sun.",
        "com.sun.",
        "kotlin.",
        "kotlinx.",
        "scala.",
        "akka.",
        "io.netty.",
        "org.springframework.",
        "org.apache.",
        "com.google.",
        "okhttp3.",
        "reactor.",
    ];
    !LIB.iter().any(|p| class.starts_with(p))
}

/// `  File "/app/x.py", line 12, in handle` -> a frame.
fn python_frame(line: &str) -> Option<Frame> {
    let t = line.trim_start();
    let rest = t.strip_prefix("File \"")?;
    let q = rest.find('"')?;
    let file = &rest[..q];
    let after = &rest[q + 1..];
    let mut num = None;
    let mut function = String::new();
    for part in after.split(',') {
        let p = part.trim();
        if let Some(n) = p.strip_prefix("line ") {
            num = n.trim().parse().ok();
        } else if let Some(f) = p.strip_prefix("in ") {
            function = f.trim().to_string();
        }
    }
    Some(Frame {
        file: file.to_string(),
        function,
        line: num,
        in_app: python_in_app(file),
    })
}

/// `\tat com.x.Client.call(Client.java:42)` -> a frame (class `com.x.Client`, function `call`).
/// The JDK 9+ module prefix (`java.base/`) is dropped.
fn java_frame(line: &str) -> Option<Frame> {
    if !line.starts_with([' ', '\t']) {
        return None;
    }
    let t = line.trim_start().strip_prefix("at ")?;
    let open = t.find('(');
    let (name, loc) = match open {
        Some(k) => (&t[..k], t[k + 1..].trim_end().trim_end_matches(')')),
        None => (t.trim_end(), ""),
    };
    let name = name.rsplit('/').next().unwrap_or(name);
    let (class, function) = name.rsplit_once('.').unwrap_or(("", name));
    let num = loc.rsplit_once(':').and_then(|(_, n)| n.parse().ok());
    Some(Frame {
        file: class.to_string(),
        function: function.to_string(),
        line: num,
        in_app: java_in_app(class),
    })
}

/// `vllm.engine.AsyncEngineDeadError: Background loop …`: a line that starts with an
/// exception type (followed by `:` or the end of the line); returns the type.
fn exception_line(line: &str) -> Option<&str> {
    let t = line.trim();
    let t = t
        .strip_prefix("Caused by:")
        .or_else(|| t.strip_prefix("Suppressed:"))
        .map_or(t, str::trim_start);
    let end = t
        .find(|c: char| c == ':' || c.is_whitespace())
        .unwrap_or(t.len());
    let ty = &t[..end];
    (is_exception_type(ty) && (end == t.len() || t[end..].starts_with(':'))).then_some(ty)
}

const PY_START: &str = "Traceback (most recent call last):";
const PY_CHAIN: &[&str] = &[
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
];

/// Parses a Python traceback or a Java stack trace out of a multi-line text (a failure event's
/// message or `exception.stacktrace`, or the joined lines of a raw log event). `None` when the
/// text holds neither.
pub fn parse(text: &str) -> Option<Trace> {
    if text.contains(PY_START) {
        return parse_python(text);
    }
    parse_java(text)
}

fn parse_python(text: &str) -> Option<Trace> {
    let mut lead = String::new();
    let mut blocks: Vec<(Vec<Frame>, Option<(String, String)>)> = Vec::new();
    let mut in_tb = false;
    for line in text.lines() {
        if line.trim() == PY_START {
            blocks.push((Vec::new(), None));
            in_tb = true;
            continue;
        }
        if blocks.is_empty() {
            if !line.trim().is_empty() && lead.is_empty() {
                line.trim().clone_into(&mut lead);
            }
            continue;
        }
        if PY_CHAIN.contains(&line.trim()) {
            in_tb = false;
            continue;
        }
        if !in_tb {
            continue;
        }
        if let Some(f) = python_frame(line) {
            if let Some(b) = blocks.last_mut() {
                b.0.push(f);
            }
            continue;
        }
        if line.starts_with([' ', '\t']) || line.trim().is_empty() {
            continue; // a source line, a `^^^^` marker
        }
        // The unindented line that ends a traceback is its exception's line.
        let t = line.trim();
        let ty = exception_line(t).unwrap_or_else(|| t.split(':').next().unwrap_or(t));
        if let Some(b) = blocks.last_mut() {
            b.1 = Some((ty.to_string(), t.to_string()));
        }
        in_tb = false;
    }
    // The last block with an exception line is the one that was raised.
    let last = blocks.iter().rposition(|b| b.1.is_some())?;
    let causes = blocks[..last]
        .iter()
        .filter_map(|b| b.1.as_ref().map(|x| x.0.clone()))
        .collect();
    let (mut frames, head) = blocks.swap_remove(last);
    frames.reverse(); // Python prints the innermost frame last.
    Some(trace_of(head?, lead, frames, causes))
}

/// A [`Trace`] from its exception's (type, line) and the rest.
fn trace_of(
    (error_type, headline): (String, String),
    lead: String,
    frames: Vec<Frame>,
    causes: Vec<String>,
) -> Trace {
    Trace {
        error_type,
        headline,
        lead,
        frames,
        causes,
    }
}

fn parse_java(text: &str) -> Option<Trace> {
    let mut lead = String::new();
    let mut head: Option<(String, String)> = None;
    let mut frames = Vec::new();
    let mut causes = Vec::new();
    let mut in_top = false;
    for line in text.lines() {
        if let Some(f) = java_frame(line) {
            if head.is_none() {
                return None; // frames before any exception line
            }
            if in_top {
                frames.push(f);
            }
            continue;
        }
        if let Some(ty) = exception_line(line) {
            let t = line.trim_start();
            if t.starts_with("Caused by:") || t.starts_with("Suppressed:") {
                if head.is_some() {
                    causes.push(ty.to_string());
                    in_top = false;
                }
                continue;
            }
            if head.is_none() {
                head = Some((ty.to_string(), line.trim().to_string()));
                in_top = true;
                continue;
            }
        }
        if head.is_none() && lead.is_empty() && !line.trim().is_empty() {
            line.trim().clone_into(&mut lead);
        }
    }
    let head = head?;
    if frames.is_empty() && causes.is_empty() {
        return None; // a single line naming an exception is not a stack trace
    }
    Some(trace_of(head, lead, frames, causes))
}

/// Bytes of a key at most (an exception type longer than this is cut).
const MAX_KEY_BYTES: usize = 256;

/// What the template miner mines for one failure: its key and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinerInput<'a> {
    /// The exception type (the event's `error_type`, else the type its trace names), and
    /// `@` + the trace's [`Trace::fingerprint`] when it has frames.
    pub key: String,
    /// The exception type alone (empty when none is known).
    pub error_type: String,
    /// The message, or the lead and exception line of a trace in it.
    pub text: std::borrow::Cow<'a, str>,
}

/// The miner's input for a failure with this `error_type` and `message` and, when given, its
/// `exception.stacktrace`: a multi-line message that holds a traceback is mined as its lead
/// and exception line, keyed by the type and the fingerprint of its top frames (a stack trace
/// given apart keys the message the same way). Distinct exception types are distinct keys.
pub fn miner_input<'a>(
    error_type: &str,
    message: &'a str,
    stacktrace: Option<&str>,
) -> MinerInput<'a> {
    let in_message = message.contains('\n').then(|| parse(message)).flatten();
    let from_message = in_message.is_some();
    let trace = in_message.or_else(|| stacktrace.and_then(parse));
    let ty = if error_type.is_empty() {
        trace.as_ref().map_or("", |t| t.error_type.as_str())
    } else {
        error_type
    };
    let mut end = ty.len().min(MAX_KEY_BYTES);
    while !ty.is_char_boundary(end) {
        end -= 1;
    }
    let mut key = ty[..end].to_string();
    if let Some(fp) = trace.as_ref().and_then(Trace::fingerprint) {
        key.push_str(&format!("@{fp:016x}"));
    }
    let text = match &trace {
        Some(t) if from_message => std::borrow::Cow::Owned(t.text()),
        _ => std::borrow::Cow::Borrowed(message),
    };
    MinerInput {
        key,
        error_type: ty[..end].to_string(),
        text,
    }
}

/// Frames the UI shows of an example.
pub const SHOWN_FRAMES: usize = 12;

/// The frames of a failure to show (its trace's, innermost first, at most [`SHOWN_FRAMES`]),
/// each as `function (file:line)` with `[app]` in front of an in-app frame; empty when the
/// message (or `exception.stacktrace`) holds no trace.
pub fn shown_frames(message: &str, stacktrace: Option<&str>) -> Vec<String> {
    let trace = message
        .contains('\n')
        .then(|| parse(message))
        .flatten()
        .or_else(|| stacktrace.and_then(parse));
    trace.map_or_else(Vec::new, |t| {
        t.frames
            .iter()
            .take(SHOWN_FRAMES)
            .map(|f| {
                if f.in_app {
                    format!("[app] {f}")
                } else {
                    f.to_string()
                }
            })
            .collect()
    })
}

/// Lines of one joined event at most; a longer trace is cut into events of this many lines.
pub const MAX_EVENT_LINES: usize = 512;
/// Bytes of one joined event at most.
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// Joins the physical lines of a raw log into events: a line continues the current event when
/// it is a stack frame (`\tat …`, `  File "…", line …`), a frame's source line, `... 12 more`,
/// `Caused by:` / `Suppressed:`, a traceback's first line (`Traceback (most recent call
/// last):`, so a logged exception joins the log line before it), a chain sentence (`During
/// handling of the above exception …`), the exception line that ends a Python traceback, or a
/// blank line inside a traceback that another traceback follows. A line that starts with an
/// exception type joins the event before it only when a frame follows it (a Java logger writes
/// the message, then the exception line, then the frames). Any other line starts an event, so a
/// log without traces is one event per line.
#[derive(Debug, Default)]
pub struct Joiner {
    cur: Vec<String>,
    /// Line buffers of earlier events, reused (no allocation per line once warm).
    spare: Vec<String>,
    bytes: usize,
    /// Lines from this index are held back: they join only if a continuation follows.
    held: Option<usize>,
    /// Inside a Python traceback, before its exception line.
    in_py: bool,
    /// Right after a Python traceback's exception line (a chain may follow).
    after_py: bool,
}

impl Joiner {
    pub fn new() -> Self {
        Joiner::default()
    }

    /// Takes one physical line; `emit` gets each completed event (its lines).
    pub fn push(&mut self, line: &str, emit: &mut impl FnMut(&[String])) {
        let trimmed = line.trim();
        let indented = line.starts_with([' ', '\t']) && !trimmed.is_empty();
        let frame = java_frame(line).is_some()
            || python_frame(line).is_some()
            || (indented && trimmed.starts_with("... ") && trimmed.ends_with("more"));
        let chain = trimmed == PY_START
            || PY_CHAIN.contains(&trimmed)
            || trimmed.starts_with("Caused by:")
            || trimmed.starts_with("Suppressed:");
        let py_end = self.in_py && !indented && !trimmed.is_empty() && !chain;
        let cont = !self.cur.is_empty() && (frame || chain || (self.in_py && indented) || py_end);
        if cont {
            self.held = None;
            if trimmed == PY_START {
                self.in_py = true;
                self.after_py = false;
            } else if py_end {
                self.in_py = false;
                self.after_py = true;
            }
            self.add(line, emit);
            return;
        }
        // A blank line after a Python traceback, or an exception line after a log line: held
        // until the next line tells.
        if !self.cur.is_empty()
            && ((trimmed.is_empty() && (self.after_py || self.held.is_some()))
                || (self.held.is_none()
                    && exception_line(line).is_some()
                    && !line.starts_with([' ', '\t'])))
        {
            self.held.get_or_insert(self.cur.len());
            self.add(line, emit);
            return;
        }
        // A new event.
        self.flush(emit);
        self.in_py = trimmed == PY_START;
        self.add(line, emit);
    }

    fn add(&mut self, line: &str, emit: &mut impl FnMut(&[String])) {
        if self.cur.len() >= MAX_EVENT_LINES || self.bytes + line.len() > MAX_EVENT_BYTES {
            self.flush(emit);
        }
        self.bytes += line.len() + 1;
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.push_str(line);
        self.cur.push(buf);
    }

    /// Emits the current event (the lines held back as events of their own).
    pub fn flush(&mut self, emit: &mut impl FnMut(&[String])) {
        if let Some(h) = self.held.take() {
            let rest = self.cur.split_off(h.min(self.cur.len()));
            if !self.cur.is_empty() {
                emit(&self.cur);
            }
            for l in rest {
                emit(std::slice::from_ref(&l));
                self.spare.push(l);
            }
        } else if !self.cur.is_empty() {
            emit(&self.cur);
        }
        self.spare.extend(self.cur.drain(..));
        self.spare.truncate(MAX_EVENT_LINES);
        self.bytes = 0;
        self.in_py = false;
        self.after_py = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_naming_different_types_differ() {
        assert!(exception_types_differ(
            "failed\",\"error\":\"httpx.ReadTimeout:",
            "failed\",\"error\":\"httpx.ConnectTimeout:"
        ));
        assert!(exception_types_differ("RuntimeError:", "<*>"));
        assert!(!exception_types_differ("(RuntimeError)", "RuntimeError,"));
        assert!(!exception_types_differ("host=a.b", "host=c.d"));
        assert!(!exception_types_differ("Alpha", "Bravo"));
    }

    #[test]
    fn exception_types_are_recognised_and_words_are_not() {
        for t in [
            "RuntimeError",
            "RuntimeError:",
            "torch.OutOfMemoryError:",
            "torch.cuda.OutOfMemoryError",
            "java.net.SocketTimeoutException:",
            "grpc._channel._InactiveRpcError",
            "grpc.StatusCode.UNAVAILABLE",
            "StatusCode.DEADLINE_EXCEEDED",
            "httpx.ConnectTimeout",
            "requests.exceptions.ConnectionError:",
            "vllm.engine.async_llm_engine.AsyncEngineDeadError:",
            "'httpx.ReadTimeout'>",
            "asyncio.exceptions.CancelledError",
            "KeyboardInterrupt",
            "SystemExit",
            "StopIteration",
            "Outer$InnerException",
            "openai.RateLimitError:",
            "DeadlineExceeded",
        ] {
            assert!(is_exception_type(t), "{t} is an exception type");
        }
        for t in [
            "Error",
            "ERROR",
            "error:",
            "Timeout",
            "timeout",
            "com.android.systemui",
            "chrome.exe",
            "dfs.DataNode$PacketResponder:",
            "nova.compute.manager",
            "PowerManagerService.WakeLocks",
            "StatusCode.ok",
            "1.2.3.Error",
            "connectionError",
            "",
        ] {
            assert!(!is_exception_type(t), "{t} is not an exception type");
        }
    }

    const PY: &str = "Engine loop failed
Traceback (most recent call last):
  File \"/app/server.py\", line 88, in handle
    out = await self.engine.generate(req)
  File \"/usr/lib/python3.11/site-packages/vllm/engine/async_llm_engine.py\", line 621, in generate
    raise AsyncEngineDeadError(\"x\")
vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.";

    #[test]
    fn python_traceback_gives_type_headline_and_frames_innermost_first() {
        let t = parse(PY).expect("a traceback");
        assert_eq!(
            t.error_type,
            "vllm.engine.async_llm_engine.AsyncEngineDeadError"
        );
        assert_eq!(t.lead, "Engine loop failed");
        assert!(t.headline.ends_with("Background loop has errored already."));
        assert_eq!(t.frames.len(), 2);
        assert_eq!(t.frames[0].function, "generate");
        assert!(!t.frames[0].in_app);
        assert_eq!(t.frames[1].to_string(), "handle (/app/server.py:88)");
        assert!(t.frames[1].in_app);
        // Line numbers are not part of the fingerprint; functions are.
        let moved = PY.replace("line 88", "line 91");
        assert_eq!(
            parse(&moved).unwrap().fingerprint(),
            t.fingerprint(),
            "a moved line keeps the group"
        );
        let other = PY.replace("in handle", "in stream");
        assert_ne!(parse(&other).unwrap().fingerprint(), t.fingerprint());
    }

    #[test]
    fn python_chains_key_on_the_last_exception() {
        let text = "Traceback (most recent call last):
  File \"/app/a.py\", line 3, in f
    g()
KeyError: 'model'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File \"/app/a.py\", line 5, in f
    raise RuntimeError('no model')
RuntimeError: no model";
        let t = parse(text).unwrap();
        assert_eq!(t.error_type, "RuntimeError");
        assert_eq!(t.causes, vec!["KeyError".to_string()]);
        assert_eq!(t.frames.len(), 1);
    }

    const JAVA: &str = "Request failed
java.lang.IllegalStateException: connection pool shut down
\tat org.apache.http.impl.conn.PoolingHttpClientConnectionManager.requestConnection(PoolingHttpClientConnectionManager.java:269)
\tat com.example.llm.Client.complete(Client.java:42)
\tat com.example.llm.Agent.step(Agent.java:7)
Caused by: java.net.SocketTimeoutException: Read timed out
\tat java.base/java.net.SocketInputStream.socketRead0(Native Method)
\t... 12 more";

    #[test]
    fn miner_input_keys_on_type_and_frames() {
        let a = miner_input("", PY, None);
        assert!(
            a.key
                .starts_with("vllm.engine.async_llm_engine.AsyncEngineDeadError@")
        );
        assert_eq!(
            a.error_type,
            "vllm.engine.async_llm_engine.AsyncEngineDeadError"
        );
        assert!(
            a.text.starts_with("Engine loop failed vllm.engine"),
            "{}",
            a.text
        );
        // The event's own type wins; a one-line message is mined as it is.
        let b = miner_input("EngineDead", "background loop died", Some(PY));
        assert!(b.key.starts_with("EngineDead@"));
        assert_eq!(b.text, "background loop died");
        assert_eq!(b.key[10..], a.key[a.key.len() - 17..]);
        let c = miner_input("", "plain failure", None);
        assert_eq!((c.key.as_str(), c.text.as_ref()), ("", "plain failure"));
        let long = "E".repeat(1000) + "rror";
        assert!(miner_input(&long, "x", None).key.len() <= MAX_KEY_BYTES);
    }

    #[test]
    fn java_trace_gives_top_exception_causes_and_frames() {
        let t = parse(JAVA).unwrap();
        assert_eq!(t.error_type, "java.lang.IllegalStateException");
        assert_eq!(t.lead, "Request failed");
        assert_eq!(
            t.causes,
            vec!["java.net.SocketTimeoutException".to_string()]
        );
        assert_eq!(t.frames.len(), 3);
        assert_eq!(t.frames[1].function, "complete");
        assert_eq!(t.frames[1].line, Some(42));
        assert!(!t.frames[0].in_app && t.frames[1].in_app);
        assert!(parse("java.lang.IllegalStateException: x").is_none());
        assert!(parse("just a line\nand another").is_none());
    }

    fn join(text: &str) -> Vec<Vec<String>> {
        let mut j = Joiner::new();
        let mut out = Vec::new();
        for l in text.lines() {
            j.push(l, &mut |e: &[String]| out.push(e.to_vec()));
        }
        j.flush(&mut |e: &[String]| out.push(e.to_vec()));
        out
    }

    #[test]
    fn joiner_makes_one_event_of_a_trace_and_leaves_other_lines_alone() {
        let log = format!(
            "2024-05-01 12:00:00,001 INFO started\n2024-05-01 12:00:01,002 ERROR {PY}\n2024-05-01 12:00:02,003 INFO next\n{JAVA}\nplain line\n    indented but no trace\nRuntimeError: alone\nlast"
        );
        let ev = join(&log);
        let sizes: Vec<usize> = ev.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 7, 1, 8, 1, 1, 1, 1], "{ev:#?}");
        assert!(ev[3][0].starts_with("Request failed"));
        assert!(ev[3][7].contains("12 more"));
        let chained = "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    g()\nKeyError: 'x'\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 2, in f\n    h()\nRuntimeError: y\n\nnext event";
        let ev = join(chained);
        assert_eq!(ev.len(), 3, "{ev:#?}");
        assert_eq!(ev[0].len(), 11);
        assert_eq!(ev[1], vec![String::new()]);
        // Bounded: a trace longer than MAX_EVENT_LINES is cut.
        let long = format!(
            "x failed\njava.io.IOException: y\n{}",
            "\tat a.B.c(B.java:1)\n".repeat(MAX_EVENT_LINES + 10)
        );
        let ev = join(&long);
        assert!(ev.iter().all(|e| e.len() <= MAX_EVENT_LINES));
        assert_eq!(ev.iter().map(Vec::len).sum::<usize>(), MAX_EVENT_LINES + 12);
    }
}
