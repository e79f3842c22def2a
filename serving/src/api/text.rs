//! Text hygiene and incremental detokenisation with stop strings.

use unicode_normalization::UnicodeNormalization;

/// NFC-normalises `s` and strips C0 control characters except `\n` and `\t`
/// (docs/REQUIREMENTS.md R6.3): a NUL or an escape sequence in a prompt never reaches the model or
/// the logs.
pub fn sanitize(s: &str) -> String {
    s.nfc()
        .filter(|&c| !(c < '\u{20}' && c != '\n' && c != '\t'))
        .collect()
}

/// Turns a growing token list into text deltas, holding back anything that could be the start
/// of a stop string or an incomplete UTF-8 sequence, and cutting at the first stop string.
pub struct TextAssembler<F: Fn(&[u32]) -> String> {
    decode: F,
    tokens: Vec<u32>,
    /// Bytes of the decoded text already handed out.
    emitted: usize,
    stop: Vec<String>,
    /// The final text, once a stop string was found.
    stopped: Option<String>,
}

impl<F: Fn(&[u32]) -> String> TextAssembler<F> {
    pub fn new(decode: F, stop: Vec<String>) -> Self {
        let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
        TextAssembler {
            decode,
            tokens: Vec::new(),
            emitted: 0,
            stop,
            stopped: None,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// Adds a token; returns the text that is now safe to emit.
    pub fn push(&mut self, tok: u32) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        self.tokens.push(tok);
        let text = (self.decode)(&self.tokens);
        // Search only where a new match can start.
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.emitted.saturating_sub(longest);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stop
            .iter()
            .filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(at) = hit {
            let delta = text[self.emitted.min(at)..at].to_string();
            self.emitted = at;
            self.stopped = Some(text[..at].to_string());
            return delta;
        }
        // Hold back an incomplete character and any suffix that starts a stop string.
        let mut safe = text.len();
        if text.ends_with('\u{FFFD}') {
            safe -= '\u{FFFD}'.len_utf8();
        }
        let end = safe;
        for s in &self.stop {
            let t = &text[..end];
            if let Some(k) = (1..s.len())
                .rev()
                .find(|&k| s.is_char_boundary(k) && t.ends_with(&s[..k]))
            {
                safe = safe.min(end - k);
            }
        }
        if safe <= self.emitted {
            return String::new();
        }
        let delta = text[self.emitted..safe].to_string();
        self.emitted = safe;
        delta
    }

    /// The rest of the text at the end of generation.
    pub fn finish(&mut self) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        let text = (self.decode)(&self.tokens);
        let delta = text.get(self.emitted..).unwrap_or_default().to_string();
        self.emitted = text.len();
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_normalises_and_strips_controls() {
        let cases = [
            ("plain", "plain"),
            ("a\u{0}b\u{1b}[31mc", "ab[31mc"),
            ("keep\nnew\tlines\r", "keep\nnew\tlines"),
            ("e\u{301}", "\u{e9}"),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize(input), want, "input {input:?}");
        }
    }

    fn bytes_decode(ids: &[u32]) -> String {
        String::from_utf8_lossy(&ids.iter().map(|&t| t as u8).collect::<Vec<_>>()).into_owned()
    }

    fn run(text: &str, stop: &[&str]) -> (Vec<String>, String, bool) {
        let mut a = TextAssembler::new(bytes_decode, stop.iter().map(|s| s.to_string()).collect());
        let mut deltas = Vec::new();
        for b in text.bytes() {
            let d = a.push(u32::from(b));
            if !d.is_empty() {
                deltas.push(d);
            }
            if a.is_stopped() {
                break;
            }
        }
        let stopped = a.is_stopped();
        let tail = a.finish();
        if !tail.is_empty() {
            deltas.push(tail);
        }
        let full = deltas.concat();
        (deltas, full, stopped)
    }

    #[test]
    fn stop_strings_cut_output_and_are_never_half_emitted() {
        let cases: &[(&str, &[&str], &str, bool)] = &[
            ("hello world", &[], "hello world", false),
            ("hello world", &["wor"], "hello ", true),
            ("hello world", &["xyz", "lo"], "hel", true),
            ("abcabd", &["abd"], "abc", true),
            ("ab", &["abc"], "ab", false),
            ("héllo", &["l"], "hé", true),
        ];
        for (text, stop, want, stopped) in cases {
            let (deltas, full, was) = run(text, stop);
            assert_eq!(
                (full.as_str(), was),
                (*want, *stopped),
                "text {text:?} stop {stop:?}"
            );
            for d in deltas {
                assert!(!d.contains('\u{FFFD}'), "no half characters: {d:?}");
            }
        }
    }
}
