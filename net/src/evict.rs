//! Who goes first when a listener is full: the connections that have not yet delivered a whole
//! request head, oldest first.
//!
//! Every admitted connection starts *unproven* and sits in its listener's [`Registry`], in
//! accept order. It becomes *proven* when the bytes it sent hold one whole request head: for
//! HTTP/1 the blank line that ends the head (`\r\n\r\n`), for HTTP/2 (gRPC) the connection
//! preface and then a `HEADERS` (or `CONTINUATION`) frame carrying `END_HEADERS`, payload
//! included ([`HeadScan`]). Proven connections leave the registry and are never evicted.
//!
//! When a new connection finds no free slot, the listener takes the slot of the oldest
//! unproven connection ([`Registry::evict_oldest`]): the slot passes to the new connection at
//! once (the count of slots never exceeds the cap), and the evicted one is woken and fails its
//! next read or write, so its server task ends and its socket closes within a scheduler turn.
//! So a client that sends a whole request promptly is admitted as long as any slot is held by
//! a connection that has not — a slowloris cannot hold a full listener against it.
//!
//! Behind TLS the bytes on the socket are ciphertext: the scan runs above the TLS layer
//! ([`crate::Watched`]), and the TLS handshake itself counts as "not yet a request head".

use super::*;

/// The unproven connections of one listener, by accept order.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next: AtomicU64,
    unproven: Mutex<BTreeMap<u64, Arc<Slot>>>,
}

/// One admitted connection's place in its listener.
#[derive(Debug)]
pub struct Slot {
    id: u64,
    registry: Weak<Registry>,
    /// The listener slot; taken by the connection that evicts this one.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    evicted: AtomicBool,
    proven: AtomicBool,
    /// Woken on eviction (registered while unproven, the only time it can happen).
    waker: Mutex<Option<Waker>>,
}

impl Registry {
    /// Registers a newly admitted connection holding `permit`.
    pub(crate) fn admit(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Arc<Slot> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            id,
            registry: Arc::downgrade(self),
            permit: Mutex::new(Some(permit)),
            evicted: AtomicBool::new(false),
            proven: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        if let Ok(mut m) = self.unproven.lock() {
            m.insert(id, Arc::clone(&slot));
        }
        slot
    }

    /// Evicts the oldest connection that has not completed a request head and hands over its
    /// listener slot; `None` when every open connection has.
    pub(crate) fn evict_oldest(&self) -> Option<OwnedSemaphorePermit> {
        let mut m = self.unproven.lock().ok()?;
        while let Some((_, slot)) = m.pop_first() {
            let permit = slot.permit.lock().ok().and_then(|mut p| p.take());
            if let Some(p) = permit {
                slot.evicted.store(true, Ordering::Release);
                if let Some(w) = slot.waker.lock().ok().and_then(|mut w| w.take()) {
                    w.wake();
                }
                return Some(p);
            }
        }
        None
    }

    /// Open connections that have not completed a request head.
    pub(crate) fn unproven(&self) -> usize {
        self.unproven.lock().map(|m| m.len()).unwrap_or(0)
    }
}

impl Slot {
    /// This connection delivered a whole request head: it is never evicted.
    pub(crate) fn prove(&self) {
        if !self.proven.swap(true, Ordering::AcqRel)
            && let Some(r) = self.registry.upgrade()
            && let Ok(mut m) = r.unproven.lock()
        {
            m.remove(&self.id);
        }
        if let Ok(mut w) = self.waker.lock() {
            *w = None;
        }
    }

    /// Whether this connection was evicted; registers `cx` to be woken if it is later.
    pub(crate) fn evicted(&self, cx: &mut Context<'_>) -> bool {
        if self.evicted.load(Ordering::Acquire) {
            return true;
        }
        if !self.proven.load(Ordering::Acquire)
            && let Ok(mut w) = self.waker.lock()
        {
            match &*w {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
        // Evicted between the first check and the registration.
        self.evicted.load(Ordering::Acquire)
    }

    /// The connection closed: it leaves the registry.
    pub(crate) fn release(&self) {
        if !self.proven.load(Ordering::Acquire)
            && let Some(r) = self.registry.upgrade()
            && let Ok(mut m) = r.unproven.lock()
        {
            m.remove(&self.id);
        }
    }
}

/// The HTTP/2 connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// HTTP/2 frame types that carry a header block, and the flag that ends it.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// Finds the end of the first request head in the bytes a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeadScan {
    /// Matching the HTTP/2 preface; `0..n` of it matched so far.
    Preface(usize),
    /// HTTP/1: how much of `\r\n\r\n` the last bytes matched.
    H1(u8),
    /// HTTP/2 frames: collecting a 9-byte frame header.
    FrameHead([u8; 9], usize),
    /// HTTP/2 frames: skipping a payload; `true` if the head ends with it.
    Payload(u32, bool),
    /// A whole head was seen.
    Done,
}

impl Default for HeadScan {
    fn default() -> Self {
        HeadScan::Preface(0)
    }
}

impl HeadScan {
    /// Feeds the next bytes; `true` once a whole request head has been seen.
    pub(crate) fn feed(&mut self, mut b: &[u8]) -> bool {
        while !b.is_empty() {
            match self {
                HeadScan::Done => return true,
                HeadScan::Preface(n) => {
                    let rest = &PREFACE[*n..];
                    let k = b.len().min(rest.len());
                    if b[..k] == rest[..k] {
                        *n += k;
                        b = &b[k..];
                        if *n == PREFACE.len() {
                            *self = HeadScan::FrameHead([0; 9], 0);
                        }
                    } else {
                        // Not HTTP/2: rescan what matched as HTTP/1, then the rest.
                        let matched = *n;
                        *self = HeadScan::H1(0);
                        self.feed(&PREFACE[..matched]);
                    }
                }
                HeadScan::H1(m) => {
                    const END: &[u8] = b"\r\n\r\n";
                    let mut i = 0;
                    while i < b.len() {
                        let c = b[i];
                        i += 1;
                        *m = if c == END[*m as usize] {
                            *m + 1
                        } else if c == b'\r' {
                            1
                        } else {
                            0
                        };
                        if *m as usize == END.len() {
                            *self = HeadScan::Done;
                            return true;
                        }
                    }
                    b = &[];
                }
                HeadScan::FrameHead(h, n) => {
                    let k = b.len().min(9 - *n);
                    h[*n..*n + k].copy_from_slice(&b[..k]);
                    *n += k;
                    b = &b[k..];
                    if *n == 9 {
                        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                        let ends =
                            matches!(h[3], HEADERS | CONTINUATION) && h[4] & END_HEADERS != 0;
                        if len == 0 && ends {
                            *self = HeadScan::Done;
                            return true;
                        }
                        *self = if len == 0 {
                            HeadScan::FrameHead([0; 9], 0)
                        } else {
                            HeadScan::Payload(len, ends)
                        };
                    }
                }
                HeadScan::Payload(left, ends) => {
                    let k = (b.len() as u64).min(u64::from(*left)) as usize;
                    *left -= k as u32;
                    b = &b[k..];
                    if *left == 0 {
                        if *ends {
                            *self = HeadScan::Done;
                            return true;
                        }
                        *self = HeadScan::FrameHead([0; 9], 0);
                    }
                }
            }
        }
        *self == HeadScan::Done
    }
}

/// The scan of one connection, proving its slot when the head is complete.
#[derive(Debug)]
pub(crate) struct HeadWatch {
    slot: Arc<Slot>,
    scan: HeadScan,
}

impl HeadWatch {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        HeadWatch {
            slot,
            scan: HeadScan::default(),
        }
    }

    pub(crate) fn feed(&mut self, b: &[u8]) {
        if self.scan != HeadScan::Done && self.scan.feed(b) {
            self.slot.prove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> bool {
        let mut s = HeadScan::default();
        s.feed(bytes)
    }

    fn byte_by_byte(bytes: &[u8]) -> bool {
        let mut s = HeadScan::default();
        let mut done = false;
        for b in bytes {
            done = s.feed(std::slice::from_ref(b));
        }
        done
    }

    #[test]
    fn an_http1_head_ends_at_its_blank_line() {
        let head = b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}";
        assert!(whole(head));
        assert!(byte_by_byte(head));
        let cut = &head[..head.len() - 5];
        assert!(!whole(cut), "no blank line yet");
        assert!(!byte_by_byte(cut));
        assert!(
            !whole(b"GET / HTTP/1.1\r\nx: \r\r\n"),
            "\\r\\r\\n is no blank line"
        );
        assert!(whole(b"GET / HTTP/1.1\r\nx: \r\r\n\r\n"));
    }

    #[test]
    fn an_http2_head_is_the_preface_then_a_whole_headers_frame() {
        let mut b = PREFACE.to_vec();
        // SETTINGS (type 4), 6 bytes of payload: not a head.
        b.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]);
        assert!(!whole(&b), "the preface and settings are no request");
        assert!(!byte_by_byte(&b));
        // HEADERS without END_HEADERS, then CONTINUATION with it.
        b.extend_from_slice(&[0, 0, 3, HEADERS, 0x1, 0, 0, 0, 1, 0x82, 0x86, 0x84]);
        assert!(!whole(&b), "the header block is not finished");
        let mut cont = b.clone();
        cont.extend_from_slice(&[0, 0, 2, CONTINUATION, END_HEADERS, 0, 0, 0, 1, 0x41, 0x00]);
        assert!(whole(&cont));
        assert!(byte_by_byte(&cont));
        assert!(!whole(&cont[..cont.len() - 1]), "payload still trickling");
    }

    #[test]
    fn a_preface_lookalike_is_read_as_http1() {
        assert!(!whole(b"PRI * HTTP/1.1\r\nhost: x\r\n"));
        assert!(whole(b"PRI * HTTP/1.1\r\nhost: x\r\n\r\n"));
        assert!(
            whole(b"PRI * HTTP/2.0\r\n\r\nXX"),
            "an HTTP/1 head that ended early"
        );
    }
}
