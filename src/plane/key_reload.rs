//! Command key reload without a restart (docs/SECURITY.md "Rotating the command keys"): on
//! SIGHUP, or when a key file changes (polled), the control plane reads its keys again
//! ([`super::plane_keys`]: `BROWNOUT_COMMAND_SIGNING_KEY_FILE`, `BROWNOUT_ACK_MASTER_KEY_FILE`,
//! the extra public keys, or the data directory's files) and hands them to the running
//! controller ([`DegradeHandle::replace_keys`]). Commands are signed with the new key from the
//! next round; what the old keys sealed (the operator override, instance actions) and the acks
//! engines made under the old ack master stay accepted for `BROWNOUT_COMMAND_PUBKEY_OVERLAP_S`
//! (default 300 s), and stored commands signed with the old key keep verifying. A reload that
//! fails (an unreadable or malformed file) is logged and changes nothing.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use brownout_protocol::PlaneKeys;
use brownout_protocol::command_keys as ck;

use crate::config::Config;
use crate::degrade::DegradeHandle;

/// The key files a reload watches.
fn watched(config: &Config) -> Vec<PathBuf> {
    let var = |n: &str| {
        std::env::var_os(n)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    [
        var(ck::SIGNING_KEY_FILE_ENV).unwrap_or_else(|| config.data_dir.join(ck::SIGNING_KEY_FILE)),
        var(ck::ACK_MASTER_FILE_ENV).unwrap_or_else(|| config.data_dir.join(ck::ACK_MASTER_FILE)),
    ]
    .into_iter()
    .chain(var(ck::PUBKEY_FILE_ENV))
    .collect()
}

fn stamp(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    files
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// What tells two key sets apart without printing either: the signature of a fixed probe
/// and an ack key derived for a probe instance.
fn fingerprint(k: &PlaneKeys) -> (String, Vec<u8>, Vec<String>) {
    (
        k.signer.sign_bytes(b"brownout-key-probe"),
        k.acks.key_for("\0brownout-key-probe"),
        k.verifier.key_ids(),
    )
}

/// How long replaced keys stay accepted: `BROWNOUT_COMMAND_PUBKEY_OVERLAP_S` or 300 s.
pub fn overlap_from_env() -> anyhow::Result<Duration> {
    match std::env::var(ck::PUBKEY_OVERLAP_ENV) {
        Err(_) => Ok(ck::DEFAULT_PUBKEY_OVERLAP),
        Ok(v) if v.trim().is_empty() => Ok(ck::DEFAULT_PUBKEY_OVERLAP),
        Ok(v) => Ok(Duration::from_secs(v.trim().parse().map_err(|_| {
            anyhow::anyhow!("{}: not a number of seconds: {v:?}", ck::PUBKEY_OVERLAP_ENV)
        })?)),
    }
}

/// Reads the keys again; when they differ from `current`, hands them to the controller and
/// keeps them as `current`. Returns whether they changed.
///
/// # Errors
/// A key file that cannot be read or parsed (nothing is changed).
pub fn reload_once(
    handle: &DegradeHandle,
    config: &Config,
    current: &mut PlaneKeys,
    overlap: Duration,
) -> anyhow::Result<bool> {
    let keys = super::plane_keys(config)?;
    if fingerprint(&keys) == fingerprint(current) {
        return Ok(false);
    }
    handle.replace_keys(keys.clone(), overlap);
    *current = keys;
    Ok(true)
}

/// Starts the reload task: SIGHUP (Unix) or a watched key file's change seen by a poll every
/// `poll`.
pub fn spawn(
    handle: DegradeHandle,
    config: Config,
    overlap: Duration,
    poll: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let files = watched(&config);
        let mut last = stamp(&files);
        let mut current = handle.config().keys.clone();
        let mut wake = crate::auth::reload::HupOrTick::new(poll);
        loop {
            let signalled = wake.next().await;
            let now = stamp(&files);
            if !signalled && now == last {
                continue;
            }
            last = now;
            match reload_once(&handle, &config, &mut current, overlap) {
                Ok(true) => tracing::info!(
                    overlap_s = overlap.as_secs(),
                    "command keys reloaded; the replaced ones are accepted for the overlap"
                ),
                Ok(false) => tracing::debug!("command key reload: no key changed"),
                Err(e) => {
                    tracing::error!(error = %e, "command key reload failed; the running keys are kept");
                }
            }
        }
    })
}
