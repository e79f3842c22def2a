//! Token reload without a restart (docs/SECURITY.md "Rotating tokens"): on SIGHUP, or when the
//! config file or a `BROWNOUT_{INGEST,READ,ADMIN}_TOKEN_FILE` changes (polled), the config is
//! loaded again and its tokens replace the running ones; the replaced tokens stay accepted for
//! `auth.token_overlap_s` (`BROWNOUT_TOKEN_OVERLAP_S`, default 300 s). A reload that fails (a file
//! unreadable, a token too short or missing) is logged and changes nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::Tokens;
use crate::config::Config;

/// The files a reload watches: the config file and the token files named in the environment.
fn watched(config_path: Option<&PathBuf>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = config_path.into_iter().cloned().collect();
    for name in ["INGEST", "READ", "ADMIN"] {
        if let Some(p) = std::env::var_os(format!("BROWNOUT_{name}_TOKEN_FILE")) {
            v.push(PathBuf::from(p));
        }
    }
    v
}

/// The watched files' contents (a missing file reads as empty): compared between polls. Token
/// files and the config are small; each is read at most 1 MiB.
fn snapshot(files: &[PathBuf]) -> Vec<Vec<u8>> {
    use std::io::Read as _;
    files
        .iter()
        .map(|p| {
            let mut buf = Vec::new();
            if let Ok(f) = std::fs::File::open(p) {
                let _ = f.take(1 << 20).read_to_end(&mut buf);
            }
            buf
        })
        .collect()
}

/// Loads the config again and swaps its tokens in. Returns whether any token changed.
pub fn reload_once(
    tokens: &Tokens,
    config_path: Option<&std::path::Path>,
    overlap: Duration,
) -> bool {
    let cfg = match Config::load(config_path).and_then(|c| c.require_tokens().map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "token reload failed; the running tokens are kept");
            return false;
        }
    };
    let changed = tokens.replace(&Tokens::from_config(&cfg), overlap);
    if changed.is_empty() {
        tracing::info!("token reload: no token changed");
        false
    } else {
        let roles: Vec<&str> = changed.iter().map(|r| r.as_str()).collect();
        tracing::info!(
            ?roles,
            overlap_s = overlap.as_secs(),
            "tokens reloaded; the replaced ones are accepted for the overlap"
        );
        true
    }
}

/// What a reload task waits on: SIGHUP (Unix) or the next poll.
pub struct HupOrTick {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
    tick: tokio::time::Interval,
}

impl HupOrTick {
    /// Listens for SIGHUP (if the handler can be installed) and ticks every `poll`.
    pub fn new(poll: Duration) -> HupOrTick {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        HupOrTick {
            #[cfg(unix)]
            hup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
            tick,
        }
    }

    /// Waits for the next SIGHUP or tick; true for a SIGHUP.
    pub async fn next(&mut self) -> bool {
        #[cfg(unix)]
        let hup_fut = async {
            match self.hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hup_fut = std::future::pending::<()>();
        tokio::select! {
            () = hup_fut => true,
            _ = self.tick.tick() => false,
        }
    }
}

/// Starts the reload task: SIGHUP (Unix) or a watched file's change seen by a poll every `poll`.
pub fn spawn(
    tokens: Arc<Tokens>,
    config_path: Option<PathBuf>,
    overlap: Duration,
    poll: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let files = watched(config_path.as_ref());
        let mut last = snapshot(&files);
        let mut wake = HupOrTick::new(poll);
        loop {
            let signalled = wake.next().await;
            let now = tokio::task::spawn_blocking({
                let files = files.clone();
                move || snapshot(&files)
            })
            .await
            .unwrap_or_default();
            if signalled || now != last {
                last = now;
                let t = tokens.clone();
                let p = config_path.clone();
                let _ = tokio::task::spawn_blocking(move || reload_once(&t, p.as_deref(), overlap))
                    .await;
            }
        }
    })
}
