//! The in-process transport of `brownout-demo`: no Redis, same signed commands and acks.
//!
//! The controller sends each signed command into a `watch` channel; every serving tier in the
//! process reads it with `brownout_serving::control::inproc::spawn_inproc_subscriber`, verifies
//! the signature exactly as the Redis subscriber does, applies and acks into a bounded channel.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use brownout_protocol::{Ack, SignedCommand};
use tokio::sync::{mpsc, watch};

/// Ack channel capacity; acks are last-value-wins per instance, so a full channel only delays.
const ACK_CAPACITY: usize = 1024;

/// A command bus inside one process.
#[derive(Debug, Clone)]
pub struct InProcBus {
    tx: Arc<watch::Sender<Option<SignedCommand>>>,
    ack_tx: mpsc::Sender<(String, Ack)>,
    ack_rx: Arc<Mutex<mpsc::Receiver<(String, Ack)>>>,
    acks: Arc<Mutex<BTreeMap<String, Ack>>>,
}

impl Default for InProcBus {
    fn default() -> Self {
        InProcBus::new()
    }
}

impl InProcBus {
    pub fn new() -> InProcBus {
        let (tx, _) = watch::channel(None);
        let (ack_tx, ack_rx) = mpsc::channel(ACK_CAPACITY);
        InProcBus {
            tx: Arc::new(tx),
            ack_tx,
            ack_rx: Arc::new(Mutex::new(ack_rx)),
            acks: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// The receiver a serving tier reads commands from.
    pub fn commands(&self) -> watch::Receiver<Option<SignedCommand>> {
        self.tx.subscribe()
    }

    /// Where a serving tier writes its acks.
    pub fn ack_sender(&self) -> mpsc::Sender<(String, Ack)> {
        self.ack_tx.clone()
    }

    /// Publishes a signed command to every subscriber.
    pub fn publish(&self, signed: SignedCommand) {
        self.tx.send_replace(Some(signed));
    }

    /// The latest ack of every instance.
    pub fn acks(&self) -> BTreeMap<String, Ack> {
        let mut acks = self
            .acks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut rx = self
            .ack_rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Ok((inst, ack)) = rx.try_recv() {
            acks.insert(inst, ack);
        }
        acks.clone()
    }
}
