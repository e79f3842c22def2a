//! The in-process subscriber of `brownout-demo`: the control plane's `InProcBus` hands signed
//! commands over a `watch` channel; they are verified and applied exactly as from Redis, and
//! acked into a bounded channel.

use std::time::Duration;

use brownout_protocol::{Ack, SignedCommand, now_ms};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::{ControlHandle, Receipt, receive};

/// Starts a task that applies every command sent on `commands` and acks on `acks`. It ends when
/// the sending side is dropped. It checks the command lease every `lease_check`.
pub fn spawn_inproc_subscriber(
    handle: ControlHandle,
    instance_id: String,
    keys: impl Into<brownout_protocol::EngineKeys>,
    mut commands: watch::Receiver<Option<SignedCommand>>,
    acks: mpsc::Sender<(String, Ack)>,
    lease_check: Duration,
) -> JoinHandle<()> {
    let keys: brownout_protocol::EngineKeys = keys.into();
    handle.bind_instance(&instance_id);
    tokio::spawn(async move {
        let mut lease = tokio::time::interval(lease_check);
        lease.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        commands.mark_changed();
        loop {
            tokio::select! {
                changed = commands.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let Some(signed) = commands.borrow_and_update().clone() else { continue };
                    let ack = match receive(&handle, &keys.verifier, &signed, now_ms()) {
                        Receipt::Unchanged => continue,
                        Receipt::Applied { epoch, version, applied_at_ms, entry } => Ack::Applied { epoch, version, applied_at_ms, entry },
                        Receipt::Refused { reason, epoch, version, .. } => {
                            Ack::Refused { epoch, version, at_ms: now_ms(), reason: reason.into() }
                        }
                    };
                    // Acks are last-value-wins: a full channel drops one, the next replaces it.
                    let _ = acks.try_send((instance_id.clone(), ack));
                }
                _ = lease.tick() => { handle.step_down_if_expired(now_ms()); }
            }
        }
    })
}
