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
//!
//! An HTTP/1 keep-alive connection is proven again for each request: once the server has
//! written a (final, not `1xx`) response and the client sends its first byte after it, the
//! connection is unproven again — back in the registry, as its newest member — until that next
//! head is whole ([`HeadWatch::wrote`]). So a client that sends one whole request and then
//! trickles the next head on the same connection is evicted like any other trickler. (An HTTP/1
//! connection idle after a response stays proven until hyper's header-read timeout closes it; a
//! pipelined request whose bytes arrived before the previous response was written is counted
//! with that request.) HTTP/2 connections stay proven after their first `HEADERS` frame.

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
    /// Its key in the registry while unproven (a new one each time it is unproven again).
    id: AtomicU64,
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
            id: AtomicU64::new(id),
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
            m.remove(&self.id.load(Ordering::Acquire));
        }
        if let Ok(mut w) = self.waker.lock() {
            *w = None;
        }
    }

    /// A proven connection started another request head: it is unproven again, the newest in
    /// its registry (so the last to be evicted of those waiting).
    pub(crate) fn unprove(self: &Arc<Self>) {
        if self.evicted.load(Ordering::Acquire) {
            return;
        }
        let Some(r) = self.registry.upgrade() else {
            return;
        };
        let Ok(mut m) = r.unproven.lock() else {
            return;
        };
        if self.proven.swap(false, Ordering::AcqRel) {
            let id = r.next.fetch_add(1, Ordering::Relaxed);
            self.id.store(id, Ordering::Release);
            m.insert(id, Arc::clone(self));
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
            m.remove(&self.id.load(Ordering::Acquire));
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

/// The scan of one connection, proving its slot when the head is complete (and, for HTTP/1,
/// unproving it when the client starts the next request after a response).
#[derive(Debug)]
pub(crate) struct HeadWatch {
    slot: Arc<Slot>,
    scan: HeadScan,
    /// `Some(true)` once the first bytes are not the HTTP/2 preface, `Some(false)` once they
    /// are; `None` while they could still be.
    http1: Option<bool>,
    /// How much of the preface the first bytes matched.
    preface_seen: usize,
    /// A final response was written since that head: the client's next byte starts a new one.
    responded: bool,
}

impl HeadWatch {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        HeadWatch {
            slot,
            scan: HeadScan::default(),
            http1: None,
            preface_seen: 0,
            responded: false,
        }
    }

    /// Bytes the client sent.
    pub(crate) fn feed(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        if self.responded {
            // The next request on a keep-alive connection: unproven until its head is whole.
            self.responded = false;
            self.scan = HeadScan::H1(0);
            self.slot.unprove();
        }
        if self.http1.is_none() {
            let rest = &PREFACE[self.preface_seen..];
            let n = b.len().min(rest.len());
            if b[..n] != rest[..n] {
                self.http1 = Some(true);
            } else {
                self.preface_seen += n;
                if self.preface_seen == PREFACE.len() {
                    self.http1 = Some(false);
                }
            }
        }
        if self.scan != HeadScan::Done && self.scan.feed(b) {
            self.slot.prove();
        }
    }

    /// Bytes the server wrote (the first buffer of a write). After an HTTP/1 head, a write that
    /// is not an interim `1xx` response (`100 Continue`) is the answer to it.
    pub(crate) fn wrote(&mut self, first: &[u8]) {
        if self.http1 == Some(true)
            && self.scan == HeadScan::Done
            && !first.is_empty()
            && !interim(first)
        {
            self.responded = true;
        }
    }
}

/// Whether a write starts an HTTP/1 `1xx` status line.
fn interim(b: &[u8]) -> bool {
    b.len() > 9 && b.starts_with(b"HTTP/1.") && b[9] == b'1'
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

    /// The watch of an HTTP/1 connection: proven by a whole head; a `100 Continue` leaves it
    /// proven while the body comes; after the final answer the next byte unproves it until
    /// that head is whole. HTTP/2 stays proven.
    #[test]
    fn a_keep_alive_head_after_an_answer_is_unproven_until_whole() {
        let sem = Arc::new(tokio::sync::Semaphore::new(2));
        let reg = Arc::new(Registry::default());
        let slot = reg.admit(Arc::clone(&sem).try_acquire_owned().unwrap());
        let mut w = HeadWatch::new(slot);
        assert_eq!(reg.unproven(), 1);
        w.feed(b"POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n");
        assert_eq!(reg.unproven(), 0);
        w.wrote(b"HTTP/1.1 100 Continue\r\n\r\n");
        w.feed(b"hi");
        assert_eq!(
            reg.unproven(),
            0,
            "a body after 100 Continue is the same request"
        );
        w.wrote(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        assert_eq!(reg.unproven(), 0, "idle after the answer: still proven");
        w.feed(b"GET / HT");
        assert_eq!(reg.unproven(), 1, "the next head is not whole yet");
        w.feed(b"TP/1.1\r\n\r\n");
        assert_eq!(reg.unproven(), 0);
        // The unproven-again connection is evictable, and newest of all.
        let other = reg.admit(Arc::clone(&sem).try_acquire_owned().unwrap());
        w.wrote(b"HTTP/1.1 200 OK\r\n\r\n");
        w.feed(b"G");
        assert_eq!(reg.unproven(), 2);
        assert!(reg.evict_oldest().is_some());
        assert!(
            other.evicted.load(Ordering::Acquire),
            "the older one goes first"
        );

        let h2 = reg.admit(Arc::clone(&sem).try_acquire_owned().unwrap());
        let mut w2 = HeadWatch::new(h2);
        let mut bytes = PREFACE.to_vec();
        bytes.extend_from_slice(&[0, 0, 0, HEADERS, END_HEADERS, 0, 0, 0, 1]);
        w2.feed(&bytes);
        w2.wrote(b"\0\0\0\x01\x04\0\0\0\x01");
        w2.feed(&[0, 0, 0, HEADERS, 0, 0, 0, 0, 3]);
        assert_eq!(
            reg.unproven(),
            1,
            "only the HTTP/1 one; HTTP/2 stays proven"
        );
    }
}
