//! Server-sent events from an upstream, split as they arrive (the bytes of each event are passed
//! to the client unchanged, one event at a time), and read just enough to measure tokens: a
//! token is an event whose first choice carries text (`text`, `delta.content`,
//! `delta.reasoning_content`) or tool calls.

use bytes::{Bytes, BytesMut};
use serde::Deserialize;

/// Splits a byte stream into events (blank-line separated; `\n` or `\r\n` line ends), each at
/// most `max_event_bytes`.
#[derive(Debug)]
pub struct Splitter {
    buf: BytesMut,
    /// Where to resume the search for a separator.
    scanned: usize,
    max_event_bytes: usize,
}

/// An event larger than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

impl Splitter {
    pub fn new(max_event_bytes: usize) -> Splitter {
        Splitter {
            buf: BytesMut::new(),
            scanned: 0,
            max_event_bytes,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole event (its bytes without the separating blank line).
    ///
    /// # Errors
    /// [`TooLarge`] when the buffered, unfinished event is past the bound.
    pub fn next_event(&mut self) -> Result<Option<Bytes>, TooLarge> {
        let b = &self.buf[..];
        let mut i = self.scanned;
        while i < b.len() {
            if b[i] == b'\n' {
                // "\n\n" or "\n\r\n": the line that ends here is followed by an empty one.
                let end = if b.get(i + 1) == Some(&b'\n') {
                    Some(i + 2)
                } else if b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') {
                    Some(i + 3)
                } else if i + 1 >= b.len() || (b.get(i + 1) == Some(&b'\r') && i + 2 >= b.len()) {
                    // Not decidable yet: wait for more bytes.
                    self.scanned = i;
                    return self.check();
                } else {
                    None
                };
                if let Some(end) = end {
                    let mut ev = self.buf.split_to(end);
                    let mut body_len = i;
                    if body_len > 0 && ev[body_len - 1] == b'\r' {
                        body_len -= 1;
                    }
                    ev.truncate(body_len);
                    self.scanned = 0;
                    return Ok(Some(ev.freeze()));
                }
            }
            i += 1;
        }
        self.scanned = b.len();
        self.check()
    }

    fn check(&self) -> Result<Option<Bytes>, TooLarge> {
        if self.buf.len() > self.max_event_bytes {
            Err(TooLarge)
        } else {
            Ok(None)
        }
    }

    /// Bytes of an unfinished event left at the end of the stream.
    pub fn rest(&self) -> &[u8] {
        &self.buf
    }
}

/// The `data` of an event (its `data:` lines joined by `\n`); `None` for a comment-only event.
pub fn data_of(event: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for line in event.split(|&c| c == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            match &mut out {
                None => out = Some(rest.to_vec()),
                Some(v) => {
                    v.push(b'\n');
                    v.extend_from_slice(rest);
                }
            }
        }
    }
    out
}

#[derive(Debug, Default, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
struct Choice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

/// Token counts an upstream reports (`usage`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

/// What one event says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EventInfo {
    /// `data: [DONE]`.
    pub done: bool,
    /// It carries a token (text or a tool call).
    pub token: bool,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// An `error` object in the stream.
    pub error: bool,
}

/// Reads an event's data (the bytes are passed on as they are, whatever this finds).
pub fn inspect(data: &[u8]) -> EventInfo {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return EventInfo {
            done: true,
            ..EventInfo::default()
        };
    }
    let Ok(c) = serde_json::from_slice::<Chunk>(trimmed) else {
        return EventInfo::default();
    };
    let mut info = EventInfo {
        usage: c.usage,
        error: c.error.is_some(),
        ..EventInfo::default()
    };
    if let Some(ch) = c.choices.into_iter().next() {
        let nonempty = |s: &Option<String>| s.as_deref().is_some_and(|t| !t.is_empty());
        info.token = nonempty(&ch.text)
            || ch.delta.as_ref().is_some_and(|d| {
                nonempty(&d.content) || nonempty(&d.reasoning_content) || d.tool_calls.is_some()
            });
        info.finish_reason = ch.finish_reason;
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(s: &mut Splitter) -> Vec<String> {
        let mut v = Vec::new();
        while let Some(e) = s.next_event().unwrap() {
            v.push(String::from_utf8(e.to_vec()).unwrap());
        }
        v
    }

    #[test]
    fn events_split_across_chunks_and_line_endings() {
        let mut s = Splitter::new(1024);
        s.push(b"data: {\"a\":1}\n");
        assert!(
            all(&mut s).is_empty(),
            "one newline is not the end of an event"
        );
        s.push(b"\ndata: x\r\n");
        assert_eq!(all(&mut s), vec!["data: {\"a\":1}"]);
        s.push(b"\r");
        assert!(all(&mut s).is_empty());
        s.push(b"\n: ping\n\ndata: [DONE]\n\n");
        assert_eq!(all(&mut s), vec!["data: x", ": ping", "data: [DONE]"]);
        assert!(s.rest().is_empty());
        // Byte by byte gives the same events.
        let text = b"data: a\n\ndata: b\r\n\r\nevent: e\ndata: c\ndata: d\n\n";
        let mut s = Splitter::new(1024);
        let mut got = Vec::new();
        for b in text {
            s.push(&[*b]);
            got.extend(all(&mut s));
        }
        assert_eq!(
            got,
            vec!["data: a", "data: b", "event: e\ndata: c\ndata: d"]
        );
        assert_eq!(data_of(got[2].as_bytes()).unwrap(), b"c\nd");
        assert_eq!(data_of(b": comment"), None);
        assert_eq!(data_of(b"data:x").unwrap(), b"x");
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut s = Splitter::new(16);
        s.push(b"data: 0123456789");
        assert_eq!(s.next_event(), Ok(None));
        s.push(b"0123456789");
        assert_eq!(s.next_event(), Err(TooLarge));
    }

    #[test]
    fn tokens_usage_and_done_are_recognised() {
        let role = br#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert!(!inspect(role).token, "the role chunk is not a token");
        let tok = br#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
        assert!(inspect(tok).token);
        let text = br#"{"object":"text_completion","choices":[{"index":0,"text":" there","finish_reason":null}]}"#;
        assert!(inspect(text).token);
        let tool = br#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#;
        assert!(inspect(tool).token);
        let fin = br#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#;
        let i = inspect(fin);
        assert_eq!(
            (i.token, i.finish_reason.as_deref()),
            (false, Some("length"))
        );
        let usage = br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        assert_eq!(
            inspect(usage).usage,
            Some(Usage {
                prompt_tokens: Some(5),
                completion_tokens: Some(7)
            })
        );
        assert!(inspect(b" [DONE] ").done);
        assert!(inspect(br#"{"error":{"message":"x"}}"#).error);
        assert_eq!(inspect(b"not json"), EventInfo::default());
    }
}
