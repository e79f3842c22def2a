//! Progress on stderr: a bar redrawn in place on a terminal, a plain line every 10 s otherwise
//! (a pipe or a CI log gets no control codes).

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

/// Seconds between plain lines when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// One progress display.
#[derive(Debug)]
pub struct Progress {
    tty: bool,
    label: String,
    total: Duration,
    last_plain: Option<Duration>,
}

impl Progress {
    /// `total`: the planned length (the bar is full there; the drain after it shows as 100%).
    pub fn new(label: &str, total: Duration) -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            label: label.to_string(),
            total,
            last_plain: None,
        }
    }

    /// Shows `elapsed` and a status text; on a pipe, at most one line per 10 s.
    pub fn tick(&mut self, elapsed: Duration, status: &str) {
        let line = render(&self.label, elapsed, self.total, status, self.tty);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        } else if self.last_plain.is_none_or(|t| elapsed >= t + PLAIN_EVERY) {
            self.last_plain = Some(elapsed);
            let _ = writeln!(err, "{line}");
        }
    }

    /// Ends the bar's line on a terminal (a no-op on a pipe).
    pub fn finish_line() {
        if std::io::stderr().is_terminal() {
            eprintln!();
        }
    }
}

/// The text of one update: `[label ####------  40%  48/120s] status` (a terminal line is cut
/// to 160 characters so it redraws in place).
pub fn render(label: &str, elapsed: Duration, total: Duration, status: &str, tty: bool) -> String {
    const WIDTH: usize = 24;
    let frac = if total.is_zero() {
        1.0
    } else {
        (elapsed.as_secs_f64() / total.as_secs_f64()).clamp(0.0, 1.0)
    };
    let full = (frac * WIDTH as f64).round() as usize;
    let line = format!(
        "[{label} {}{} {:>3.0}% {:>4}/{}s] {status}",
        "#".repeat(full),
        "-".repeat(WIDTH - full),
        frac * 100.0,
        elapsed.as_secs(),
        total.as_secs()
    );
    if tty {
        line.chars().take(160).collect()
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_time_and_clamps() {
        let t = Duration::from_secs(100);
        let half = render("x", Duration::from_secs(50), t, "s", false);
        assert!(
            half.starts_with("[x ############------------  50%   50/100s] s"),
            "{half}"
        );
        let over = render("x", Duration::from_secs(130), t, "", false);
        assert!(
            over.contains(&"#".repeat(24)) && over.contains("100%"),
            "{over}"
        );
        let long = render("x", Duration::ZERO, t, &"y".repeat(500), true);
        assert_eq!(long.chars().count(), 160);
        assert!(!half.contains('\x1b'));
    }
}
