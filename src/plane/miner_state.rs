//! The template miner's state in the store, so template (and so pattern) ids survive restarts:
//! loaded at start, saved every minute and at shutdown.

use std::sync::Arc;
use std::time::Duration;

use crate::patterns::api::SharedEngine;
use crate::patterns::engine::{EngineConfig, PatternEngine};
use crate::store::Store;

/// Where the template miner's state lives in the store (`(kind, key)` of a doc).
const MINER_DOC: (&str, &str) = ("patterns", "miner_state");

/// The engine with the stored miner state, or a fresh one (saying why) when there is none or
/// it is unusable.
pub async fn load_pattern_engine(store: &dyn Store) -> PatternEngine {
    let fresh = || PatternEngine::new(EngineConfig::default());
    match store.get_doc(MINER_DOC.0, MINER_DOC.1).await {
        Ok(Some(doc)) => match serde_json::from_value::<crate::patterns::MinerState>(doc.value)
            .map_err(|e| e.to_string())
            .and_then(|st| {
                PatternEngine::with_miner_state(EngineConfig::default(), st)
                    .map_err(|e| e.to_string())
            }) {
            Ok(e) => {
                tracing::info!(
                    templates = e.miner().templates().len(),
                    "template miner state restored"
                );
                e
            }
            Err(e) => {
                tracing::warn!(error = %e, "stored template miner state is unusable; starting fresh");
                fresh()
            }
        },
        Ok(None) => fresh(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the template miner state; starting fresh");
            fresh()
        }
    }
}

/// Saves the miner's state now (a failure is logged; the next save retries).
pub async fn save_miner_state(store: &dyn Store, patterns: &SharedEngine) {
    let st = patterns
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .miner_state();
    match serde_json::to_value(&st) {
        Ok(v) => {
            if let Err(e) = store.put_doc(MINER_DOC.0, MINER_DOC.1, &v).await {
                tracing::warn!(error = %e, "cannot save the template miner state");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot serialise the template miner state"),
    }
}

/// Saves the miner's state every minute until `shutdown` resolves.
pub async fn save_periodically(
    store: Arc<dyn Store>,
    patterns: SharedEngine,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.tick().await;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => save_miner_state(store.as_ref(), &patterns).await,
        }
    }
}
