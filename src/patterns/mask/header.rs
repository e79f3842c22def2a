//! Stripping a raw line's header: the timestamp that starts it (after a few fields), then the
//! pids, hosts, level, thread and logger (`tag:`) that follow it in the common formats
//! (syslog, RFC 5424, Log4j, glog/klog, Python `logging`, uvicorn, HDFS, BGL, …).

use super::datetime::{
    all_digits, datetime_run, is_clock, is_date, is_datetime_token, is_month, is_weekday,
    strip_punct,
};
use crate::patterns::trace::is_exception_type;

const LEVELS: &[&str] = &[
    "TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "WARNING", "ERROR", "ERR", "FATAL", "CRITICAL",
    "CRIT", "SEVERE", "ALERT", "EMERG", "Trace", "Debug", "Info", "Notice", "Warn", "Warning",
    "Error", "Fatal", "Critical", "trace", "debug", "info", "notice", "warn", "warning", "error",
    "fatal", "crit", "alert", "emerg", "V", "D", "I", "W", "E", "F",
];

fn is_level(t: &str) -> bool {
    LEVELS.contains(
        &strip_punct(t)
            .trim_matches(['<', '>'])
            .trim_end_matches(':'),
    )
}

/// `sshd[24200]:`, `kernel:`, `dfs.DataNode$PacketResponder:`, `crond(pam_unix)[2915]:`: the
/// name of what logged the line, ending in a colon.
fn is_tag(t: &str) -> bool {
    let Some(name) = t.strip_suffix(':') else {
        return false;
    };
    !name.is_empty()
        && !name.ends_with(':')
        && name.as_bytes()[0].is_ascii_alphabetic()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'_' | b'.' | b'$' | b'-' | b'[' | b']' | b'(' | b')' | b'/' | b'@'
                )
        })
}

/// `1117838570`: unix seconds (2001-2033) or milliseconds.
fn is_epoch(t: &str) -> bool {
    let t = strip_punct(t);
    all_digits(t) && (t.len() == 10 || t.len() == 13) && t.starts_with('1')
}

/// `unix.hw`, `state_change.unavailable`: a field of a header before its timestamp.
fn is_field(t: &str) -> bool {
    !t.ends_with(':')
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && t.bytes().any(|b| matches!(b, b'.' | b'_'))
}

/// `nova.compute.manager`, `org.apache.Foo`: a logger name (dotted, no colon).
fn is_logger(t: &str) -> bool {
    let parts = t.split('.').count();
    parts >= 2
        && t.split('.').all(|p| {
            p.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'-'))
        })
}

/// `dn228`, `R02-M1-N0-C:J12-U11`, `calvisitor-10-105-160-95`: a host or node id in a header.
fn is_host_field(t: &str) -> bool {
    t.bytes().any(|b| b.is_ascii_digit())
        && !t.ends_with(':')
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'/' | b':' | b'_'))
}

/// `RAS`, `KERNEL`, `UNKNOWN_LOCATION`: an upper-case field name.
fn is_upper_field(t: &str) -> bool {
    t.len() >= 2
        && t.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && t.as_bytes()[0].is_ascii_uppercase()
}

/// `[main]`, `[pool-1-thread-3]`: one bracketed token.
fn is_bracketed(t: &str) -> bool {
    t.len() > 2 && t.starts_with('[') && t.ends_with(']')
}

/// `INFO`, `WARNING`, `[ERROR]`: a level written in capitals (four letters or more).
fn is_upper_level(t: &str) -> bool {
    let c = strip_punct(t);
    c.len() >= 4 && c.bytes().all(|b| b.is_ascii_uppercase()) && LEVELS.contains(&c)
}

/// `<13>1`, `<3>`: a syslog priority (and RFC 5424 version) opening a line.
fn is_syslog_pri(t: &str) -> bool {
    let Some(r) = t.strip_prefix('<') else {
        return false;
    };
    let Some((pri, ver)) = r.split_once('>') else {
        return false;
    };
    all_digits(pri) && pri.len() <= 3 && (ver.is_empty() || (all_digits(ver) && ver.len() <= 2))
}

/// `metrics.py:345]`: a file name with an extension, a colon, a line number and `]`.
fn is_source_location(t: &str) -> bool {
    let Some(loc) = t.strip_suffix(']') else {
        return false;
    };
    let Some((file, line)) = loc.rsplit_once(':') else {
        return false;
    };
    all_digits(line)
        && file.contains('.')
        && file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/'))
}

/// `ERROR:root:msg` -> `msg`, `WARNING:  msg` -> `msg`, `SEVERE: msg` -> `msg`: an upper-case
/// level glued to a colon at the very start of a line, with the logger name and its colon
/// that Python's default format puts after it.
fn level_prefix(rest: &str) -> Option<&str> {
    let colon = rest.as_bytes().iter().take(9).position(|&b| b == b':')?;
    let level = &rest[..colon];
    if !(LEVELS.contains(&level)
        && level.len() >= 3
        && level.bytes().all(|b| b.is_ascii_uppercase()))
    {
        return None;
    }
    let after = &rest[colon + 1..];
    if after.starts_with([' ', '\t']) {
        return Some(after.trim_start());
    }
    // `root:`, `vllm.engine.async_llm_engine:`: a logger name and a colon.
    let name = after
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        .count();
    (name > 0 && after.as_bytes().get(name) == Some(&b':')).then(|| after[name + 1..].trim_start())
}

/// Strips a raw line's header: a timestamp in one of the common shapes (possibly after a few
/// fields: `- 1117838570 2005.06.03 …`, `134681 node-246 unix.hw … 1077804742`), then what
/// follows it in headers: more dates and clocks, numbers (pids, thread ids), digit-bearing ids
/// (hosts such as `dn228`), fields before an upper-case level (`RAS KERNEL INFO`, `[main] INFO`), `-`, a level
/// (`INFO`, `[error]`, `D`), a `[thread name]` after the level, and the logger (`tag:`, or a
/// dotted name and one `[context]` after it; after a host word when there is no level:
/// `combo sshd[19939]:`).
///
/// Nothing is stripped unless a timestamp starts the header, so message text is kept (a line
/// that starts `121 floating point …` or `Info about …` stays whole). `a|b|c|message` headers
/// whose first field is a timestamp lose their fields.
pub fn strip_header(line: &str) -> &str {
    let rest = line.trim_start();
    // `20171223-22:15:29:606|Step_LSC|30002312|message`
    if let Some(first) = rest.split_ascii_whitespace().next()
        && let Some(bar) = first.find('|')
        && (is_datetime_token(&first[..bar]) || is_clock(&first[..bar]))
    {
        let mut s = rest;
        while let Some(k) = s.find('|') {
            if s[..k].bytes().any(|b| b.is_ascii_whitespace()) {
                break;
            }
            s = &s[k + 1..];
        }
        return s.trim_start();
    }
    // `ERROR:root:message` (Python `logging`'s default format), `INFO:     127.0.0.1:…`
    // (uvicorn), `SEVERE: message` (java.util.logging): an upper-case level and a colon, then
    // a logger name and a colon.
    if let Some(body) = level_prefix(rest) {
        return body;
    }
    // Most messages start with a word: no header.
    let first = rest.split_ascii_whitespace().next().unwrap_or("");
    if !(first == "-"
        || first.bytes().any(|b| b.is_ascii_digit())
        || is_month(first)
        || is_weekday(first)
        || is_field(first)
        || is_level(first))
    {
        return rest;
    }
    let base = rest.as_ptr() as usize;
    let mut buf: [(usize, &str); 20] = [(0, ""); 20];
    let mut count = 0;
    for t in rest.split_ascii_whitespace().take(20) {
        buf[count] = (t.as_ptr() as usize - base, t);
        count += 1;
    }
    let toks = &buf[..count];
    let tok = |i: usize| toks.get(i).map(|x| x.1);
    let run_at = |i: usize| match tok(i) {
        Some(t) => datetime_run(t, toks[i + 1..].iter().map(|x| x.1)),
        None => 0,
    };
    // Phase 1: a timestamp within the first few fields, those before it bearing digits or
    // shaped like fields; or unix seconds after a line number and a few words (`2286759 full
    // partition status 1061219795 -1 running`).
    let mut i = 0;
    let mut found = false;
    let mut fields = true;
    while i < toks.len().min(7) {
        let t = toks[i].1;
        let ts = run_at(i);
        let stamp = ts > 1 || is_clock(t) || is_datetime_token(t) || is_date(t, false);
        if (stamp && fields) || (i >= 1 && is_epoch(t) && (fields || all_digits(toks[0].1))) {
            i += ts.max(1);
            found = true;
            break;
        }
        // A level may come first (`INFO 11-27 20:15:00 …`: glog's family, vLLM).
        fields &= t == "-" || t.bytes().any(|b| b.is_ascii_digit()) || is_field(t) || is_level(t);
        if !fields && !all_digits(toks[0].1) {
            break;
        }
        i += 1;
    }
    if !found {
        return rest;
    }
    // RFC 5424 syslog: `<PRI>VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD MSG`, `-`
    // for a field left out.
    if is_syslog_pri(toks[0].1) && i == 2 && toks.len() > i + 4 {
        let mut k = i + 4;
        if toks[k].1 == "-" {
            k += 1;
        } else if toks[k].1.starts_with('[') {
            k = (k..toks.len().min(k + 16))
                .find(|&j| toks[j].1.ends_with(']'))
                .map_or(k, |j| j + 1);
        }
        return rest[toks.get(k).map_or(rest.len(), |&(at, _)| at)..].trim_start();
    }
    // Skips a `[…]` group that may span tokens (`[RMCommunicator Allocator]`).
    let bracket = |i: usize| -> usize {
        match tok(i) {
            Some(t) if t.starts_with('[') => (i..toks.len().min(i + 8))
                .find(|&k| toks[k].1.ends_with(']'))
                .map_or(i, |k| k + 1),
            _ => i,
        }
    };
    // Phase 2: what follows a timestamp in headers.
    let mut level = false;
    while i < toks.len() {
        let t = toks[i].1;
        let ts = run_at(i);
        if ts > 1 {
            i += ts;
            continue;
        }
        if is_level(t) && i + 1 < toks.len() {
            i = bracket(i + 1);
            if tok(i) == Some("-") {
                i += 1;
            }
            level = true;
            match tok(i) {
                Some(n) if is_exception_type(n) => {}
                Some(n) if is_tag(n) => i += 1,
                Some(n) if is_logger(n) => {
                    i = bracket(i + 1);
                    // `%c - %m` (Log4j), `%(name)s - %(message)s` (Python).
                    if tok(i) == Some("-") && i + 1 < toks.len() {
                        i += 1;
                    }
                }
                _ => {}
            }
            break;
        }
        // `metrics.py:345]`, `pod_workers.go:1298]`: the source location that closes a glog,
        // klog or vLLM header.
        if is_source_location(t) {
            i += 1;
            break;
        }
        if t == "-"
            || t == "|"
            || is_clock(t)
            || is_datetime_token(t)
            || is_date(t, true)
            || all_digits(strip_punct(t))
            || is_host_field(t)
        {
            i += 1;
            continue;
        }
        // Fields between the timestamp and an upper-case level are header fields: a
        // component or facility (`RAS KERNEL INFO`), a thread (`[main] INFO`, Log4j's
        // `%d [%t] %-5p %c - %m`).
        if (is_upper_field(t) || is_bracketed(t))
            && (i + 1..toks.len().min(i + 6))
                .take_while(|&k| {
                    let n = toks[k].1;
                    is_upper_field(n)
                        || is_bracketed(n)
                        || n.bytes().any(|b| b.is_ascii_digit())
                        || is_upper_level(n)
                })
                .any(|k| is_upper_level(toks[k].1))
        {
            i += 1;
            continue;
        }
        let tag = |t: &str| is_tag(t) && !is_exception_type(t);
        if tag(t) {
            i += 1;
        } else if tok(i + 1).is_some_and(tag) && !is_exception_type(t) {
            i += 2;
        }
        break;
    }
    let _ = level;
    rest[toks.get(i).map_or(rest.len(), |&(at, _)| at)..].trim_start()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_common_headers() {
        let table = [
            (
                "081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 terminating",
                "PacketResponder 1 terminating",
            ),
            (
                "17/06/09 20:10:40 INFO executor.CoarseGrainedExecutorBackend: Registered",
                "Registered",
            ),
            (
                "Dec 10 06:55:46 LabSZ sshd[24200]: Invalid user webmaster",
                "Invalid user webmaster",
            ),
            (
                "03-17 16:13:38.811  1702  2395 D WindowManager: freeze",
                "freeze",
            ),
            (
                "2016-09-28 04:30:30, Info                  CBS    Loaded",
                "CBS    Loaded",
            ),
            ("2026-11-27T20:15:00.123Z ERROR muse-agent: boom", "boom"),
            (
                "[Sun Dec 04 04:47:44 2005] [error] mod_jk child",
                "mod_jk child",
            ),
            (
                "2015-10-18 18:01:47,978 INFO [main] org.apache.hadoop.MRAppMaster: Created x",
                "Created x",
            ),
            (
                "2015-07-29 17:41:44,747 - INFO  [QuorumPeer[myid=1]/0:0:0:0:0:0:0:0:2181:FastLeaderElection@774] - Have smaller server",
                "Have smaller server",
            ),
            (
                "- 1131566461 2005.11.09 dn228 Nov 9 12:01:01 dn228/dn228 crond(pam_unix)[2915]: session closed",
                "session closed",
            ),
            (
                "Jul  1 09:00:55 calvisitor-10-105-160-95 kernel[0]: ARPT: 620651.021206: wl0: x",
                "ARPT: 620651.021206: wl0: x",
            ),
            (
                "20171223-22:15:29:606|Step_LSC|30002312|onStandStepChanged 3579",
                "onStandStepChanged 3579",
            ),
            (
                "[10.30 16:49:06] chrome.exe - proxy.cse.cuhk.edu.hk:5070 open",
                "chrome.exe - proxy.cse.cuhk.edu.hk:5070 open",
            ),
            ("Info about the message", "Info about the message"),
            // Exception types are never taken for a logger or a tag.
            (
                "2026-11-27 20:15:00,123 ERROR torch.OutOfMemoryError: CUDA out of memory.",
                "torch.OutOfMemoryError: CUDA out of memory.",
            ),
            (
                "2026-11-27T20:15:00.123Z ERROR RuntimeError: CUDA error",
                "RuntimeError: CUDA error",
            ),
            (
                "2026-11-27 20:15:00,123 ERROR agent.worker: openai.RateLimitError: Error code: 429",
                "openai.RateLimitError: Error code: 429",
            ),
            (
                "Nov 27 20:15:00 gpu-node-3 python3[2211]: KeyError: 'choices'",
                "KeyError: 'choices'",
            ),
            // A level glued to a colon: Python logging's default format, uvicorn,
            // java.util.logging.
            ("ERROR:root:RuntimeError: boom", "RuntimeError: boom"),
            ("WARNING:agent.memory:context full", "context full"),
            (
                "INFO:     127.0.0.1:5000 - \"GET / HTTP/1.1\" 200 OK",
                "127.0.0.1:5000 - \"GET / HTTP/1.1\" 200 OK",
            ),
            ("SEVERE: Servlet failed", "Servlet failed"),
            ("ERRORS: none", "ERRORS: none"),
            // RFC 5424 syslog, gunicorn's error log, vLLM's own lines.
            (
                "<3>1 2026-11-27T20:15:00.123Z gpu-node-3 kernel - - - Out of memory: Killed process 4242",
                "Out of memory: Killed process 4242",
            ),
            (
                "[2026-11-27 20:15:00 +0000] [7] [CRITICAL] WORKER TIMEOUT (pid:4242)",
                "WORKER TIMEOUT (pid:4242)",
            ),
            (
                "INFO 11-27 20:15:00 metrics.py:345] Avg prompt throughput: 12.5 tokens/s",
                "Avg prompt throughput: 12.5 tokens/s",
            ),
            (
                "E1127 20:15:00.123456    2211 pod_workers.go:1298] \"Error syncing pod, skipping\"",
                "\"Error syncing pod, skipping\"",
            ),
            (
                "<11>1 2026-11-27T20:15:00.1Z app-3 agent 4242 ID47 [ex@32473 iut=\"3\" a=\"b\"] tool failed",
                "tool failed",
            ),
            ("May the force be with you", "May the force be with you"),
            (
                "121 floating point alignment exceptions",
                "121 floating point alignment exceptions",
            ),
            (
                "00000008 CSI Store 4991456 initialized",
                "00000008 CSI Store 4991456 initialized",
            ),
            (
                "10.11.10.1 \"GET /v2/x HTTP/1.1\" status: 200",
                "10.11.10.1 \"GET /v2/x HTTP/1.1\" status: 200",
            ),
            ("ERROR something broke", "ERROR something broke"),
            (
                "2015-10-18 18:43:57,463 INFO [RMCommunicator Allocator] org.apache.hadoop.X: Recalculating schedule",
                "Recalculating schedule",
            ),
            (
                "nova-api.log.1.2017-05-16_13:53:08 2017-05-16 00:00:00.008 25746 INFO nova.osapi_compute.wsgi.server [req-3 1 5 - - -] 10.11.10.1 \"GET /v2\"",
                "10.11.10.1 \"GET /v2\"",
            ),
            (
                "nova-compute.log.1 2017-05-16 00:00:04.500 2931 INFO nova.compute.manager [-] [instance: b9] VM Started",
                "[instance: b9] VM Started",
            ),
            (
                "134681 node-246 unix.hw state_change.unavailable 1077804742 1 Component State Change: x",
                "Component State Change: x",
            ),
            (
                "- 1117838570 2005.06.03 R02-M1-N0-C:J12-U11 2005-06-03-15.42.50.675872 R02-M1-N0-C:J12-U11 RAS KERNEL INFO instruction cache parity error corrected",
                "instruction cache parity error corrected",
            ),
            (
                "- 1117869872 2005.06.04 UNKNOWN_LOCATION 2005-06-04-00.24.32.432192 UNKNOWN_LOCATION NULL DISCOVERY WARNING Node card is not fully functional",
                "Node card is not fully functional",
            ),
            (
                "2026-11-27 20:15:00,123 [main] INFO com.example.App - Started",
                "Started",
            ),
            (
                "2026-11-27 20:15:00,123 [main] Error connecting",
                "[main] Error connecting",
            ),
            ("Took 19.05 seconds to spawn", "Took 19.05 seconds to spawn"),
            (
                "1365301360 double-hummer alignment exceptions",
                "1365301360 double-hummer alignment exceptions",
            ),
            (
                "2286759 full partition status 1061219795 -1 running",
                "running",
            ),
            (
                "462 node-130 unix.hw temp 1074119817 1 ambient=30",
                "ambient=30",
            ),
            ("462 node-130 unix.hw temp 1074119817 1 warning", "warning"),
            (
                "attempt_1445_0020_m_0 TaskAttempt Transitioned",
                "attempt_1445_0020_m_0 TaskAttempt Transitioned",
            ),
        ];
        let bad: Vec<String> = table
            .iter()
            .filter(|(input, want)| strip_header(input) != *want)
            .map(|(input, want)| {
                format!(
                    "{input:?}\n  got  {:?}\n  want {want:?}",
                    strip_header(input)
                )
            })
            .collect();
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
