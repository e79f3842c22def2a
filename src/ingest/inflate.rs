//! Un-gzipping request bodies inside the in-flight memory budget.
//!
//! A gzip body of a few KiB can inflate to `ingest.max_body_bytes` (16 MiB by default). Both
//! receivers inflate it here, chunk by chunk: the memory for each piece of output is taken from
//! the in-flight budget ([`Pipeline::reserve`]) *before* it is allocated, and inflation stops
//! with [`InflateError::TooLarge`] as soon as the output would pass the size limit. So no
//! inflated byte is ever outside the budget, and a request that cannot get the memory waits for
//! it (then 503 / `UNAVAILABLE`) like any other.
//!
//! - OTLP/HTTP, NDJSON and snapshots need the body in one piece: [`gunzip_contiguous`] grows
//!   one buffer, reserving each growth of its capacity (the first from the gzip trailer's
//!   size, so a truthful trailer means one allocation).
//! - gRPC hands tonic the inflated message as separate chunks ([`gunzip_chunks`]), each
//!   reserved before it is filled; tonic copies them into its own buffer one by one, so the
//!   chunks are freed as it goes.

use std::collections::VecDeque;
use std::io::Read;

use bytes::{Buf, Bytes};

use super::SubmitError;
use super::pipeline::Pipeline;
use super::write::Reservation;

/// Output is produced (and reserved) at least this much at a time.
pub const CHUNK: usize = 256 << 10;

/// Why a gzip body was not inflated.
#[derive(Debug)]
pub enum InflateError {
    /// The output would pass this many bytes.
    TooLarge(usize),
    /// Truncated or corrupt gzip.
    Bad(String),
    /// No memory in the budget for the output (or the pipeline is closed).
    Budget(SubmitError),
}

/// Takes `n` more bytes from the budget into `held`.
async fn take(
    pipeline: &Pipeline,
    held: &mut Option<Reservation>,
    n: usize,
) -> Result<(), InflateError> {
    if n == 0 {
        return Ok(());
    }
    let r = pipeline.reserve(n).await.map_err(InflateError::Budget)?;
    match held {
        Some(h) => h.merge(r),
        None => *held = Some(r),
    }
    Ok(())
}

/// The uncompressed size a gzip stream claims in its trailer (ISIZE, mod 2³²), if it is
/// long enough to have one. Only a hint: a lying trailer costs a reallocation, nothing more.
fn isize_hint(gz: &VecDeque<Bytes>) -> Option<usize> {
    let len: usize = gz.iter().map(Bytes::len).sum();
    if len < 18 {
        return None;
    }
    let mut t = [0u8; 4];
    let mut need = 4;
    for piece in gz.iter().rev() {
        let n = need.min(piece.len());
        t[need - n..need].copy_from_slice(&piece[piece.len() - n..]);
        need -= n;
        if need == 0 {
            break;
        }
    }
    Some(u32::from_le_bytes(t) as usize)
}

fn bad(e: &std::io::Error) -> InflateError {
    InflateError::Bad(e.to_string())
}

/// Inflates `gz` into one buffer of at most `max` bytes. Every growth of the buffer's
/// capacity is first taken from the budget into `held` (which the caller keeps until the
/// decoded rows are written).
///
/// # Errors
/// [`InflateError`]: past `max`, corrupt input, or no memory within the backpressure wait.
pub async fn gunzip_contiguous(
    gz: VecDeque<Bytes>,
    max: usize,
    pipeline: &Pipeline,
    held: &mut Option<Reservation>,
) -> Result<Vec<u8>, InflateError> {
    let limit = max.saturating_add(1); // one byte past `max` tells "too large" from "exactly max"
    let hint = isize_hint(&gz);
    let mut dec = flate2::bufread::GzDecoder::new(Pieces::new(gz).reader());
    let mut out: Vec<u8> = Vec::new();
    let mut filled = 0usize;
    let mut reserved = 0usize;
    loop {
        if filled == out.len() {
            if filled >= limit {
                return Err(InflateError::TooLarge(max));
            }
            let want = if reserved == 0 {
                hint.map_or(CHUNK, |h| h.saturating_add(1).max(4096))
            } else {
                reserved.saturating_mul(2)
            }
            .clamp(1, limit);
            take(pipeline, held, want - reserved).await?;
            reserved = want;
            out.reserve_exact(want - out.len());
            out.resize(want, 0);
        }
        let n = dec.read(&mut out[filled..]).map_err(|e| bad(&e))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    out.truncate(filled);
    Ok(out)
}

/// Inflates `gz` (the pieces of one compressed message) into chunks of at most [`CHUNK`]
/// bytes, `max` bytes in all; each chunk is taken from the budget into `held` before it is
/// filled. Returns the chunks and their total length.
///
/// # Errors
/// [`InflateError`]: past `max`, corrupt input, or no memory within the backpressure wait.
pub async fn gunzip_chunks(
    gz: VecDeque<Bytes>,
    max: usize,
    pipeline: &Pipeline,
    held: &mut Option<Reservation>,
) -> Result<(Vec<Bytes>, usize), InflateError> {
    let limit = max.saturating_add(1);
    let mut dec = flate2::bufread::GzDecoder::new(Pieces::new(gz).reader());
    let mut chunks = Vec::new();
    let mut total = 0usize;
    loop {
        let room = (limit - total).min(CHUNK);
        if room == 0 {
            return Err(InflateError::TooLarge(max));
        }
        take(pipeline, held, room).await?;
        let mut buf = vec![0u8; room];
        let mut filled = 0;
        let mut end = false;
        while filled < room {
            let n = dec.read(&mut buf[filled..]).map_err(|e| bad(&e))?;
            if n == 0 {
                end = true;
                break;
            }
            filled += n;
        }
        buf.truncate(filled);
        total += filled;
        if filled > 0 {
            chunks.push(Bytes::from(buf));
        }
        if total > max {
            return Err(InflateError::TooLarge(max));
        }
        if end {
            return Ok((chunks, total));
        }
    }
}

/// Received pieces of a message, read in order without joining them.
struct Pieces(VecDeque<Bytes>, usize);

impl Pieces {
    fn new(p: VecDeque<Bytes>) -> Pieces {
        let len = p.iter().map(Bytes::len).sum();
        Pieces(p, len)
    }
}

impl Buf for Pieces {
    fn remaining(&self) -> usize {
        self.1
    }

    fn chunk(&self) -> &[u8] {
        self.0.front().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let Some(front) = self.0.front_mut() else {
                return;
            };
            let n = cnt.min(front.len());
            front.advance(n);
            cnt -= n;
            self.1 -= n;
            if front.is_empty() {
                self.0.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;
    use crate::ingest::pipeline::test_pipeline;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    }

    /// Split into pieces the way frames arrive.
    fn pieces(b: &[u8], n: usize) -> VecDeque<Bytes> {
        b.chunks(n).map(Bytes::copy_from_slice).collect()
    }

    fn text(n: usize) -> Vec<u8> {
        (0..n).map(|i| b"spans and logs "[i % 15]).collect()
    }

    #[tokio::test]
    async fn contiguous_output_is_reserved_before_it_is_allocated() {
        let (p, _task, _stop, _dir) = test_pipeline(64 << 20, Duration::from_millis(100));
        let data = text(3 << 20);
        let gz = gzip(&data);
        assert!(gz.len() < 100 << 10, "compresses well: {}", gz.len());
        let mut held = None;
        let out = gunzip_contiguous(pieces(&gz, 16 << 10), 4 << 20, &p, &mut held)
            .await
            .unwrap();
        assert_eq!(out, data);
        let held = held.expect("reserved");
        assert!(
            held.bytes() >= out.capacity(),
            "{} reserved for a buffer of {}",
            held.bytes(),
            out.capacity()
        );
        assert_eq!(p.taken(), held.bytes());
        drop(held);
        assert_eq!(p.taken(), 0);
    }

    #[tokio::test]
    async fn a_lying_trailer_costs_a_reallocation_not_the_budget() {
        let (p, _task, _stop, _dir) = test_pipeline(64 << 20, Duration::from_millis(100));
        let data = text(1 << 20);
        let mut gz = gzip(&data);
        let n = gz.len();
        gz[n - 4..].copy_from_slice(&10u32.to_le_bytes()); // claims 10 bytes
        let mut held = None;
        // flate2 checks ISIZE at the end: a lying trailer is a corrupt stream…
        let r = gunzip_contiguous(pieces(&gz, 4096), 4 << 20, &p, &mut held).await;
        assert!(matches!(r, Err(InflateError::Bad(_))), "{r:?}");
        // …and up to that point the output grew within its reservation.
        assert!(held.is_some_and(|h| h.bytes() >= 1 << 20));
        assert_eq!(p.taken(), 0);
    }

    #[tokio::test]
    async fn inflating_past_the_budget_waits_then_is_refused() {
        // A 4 MiB budget (= the size limit), 3 MiB of it held by other requests: a body of a few
        // KiB that inflates to 2 MiB cannot get the memory for its output, waits, and is refused;
        // once the others are done it inflates.
        let (p, _task, _stop, _dir) = test_pipeline(4 << 20, Duration::from_millis(50));
        let gz = gzip(&text(2 << 20));
        assert!(gz.len() < 64 << 10);
        let others = p.reserve(3 << 20).await.unwrap();
        for contiguous in [true, false] {
            let mut held = None;
            let r = if contiguous {
                gunzip_contiguous(pieces(&gz, 16 << 10), 4 << 20, &p, &mut held)
                    .await
                    .map(|_| ())
            } else {
                gunzip_chunks(pieces(&gz, 16 << 10), 4 << 20, &p, &mut held)
                    .await
                    .map(|_| ())
            };
            assert!(
                matches!(r, Err(InflateError::Budget(SubmitError::Overloaded { .. }))),
                "contiguous={contiguous}: {r:?}"
            );
            assert!(held.as_ref().is_none_or(|h| h.bytes() <= 1 << 20));
            drop(held);
            assert_eq!(p.taken(), 3 << 20);
        }
        drop(others);
        let mut held = None;
        let out = gunzip_contiguous(pieces(&gz, 16 << 10), 4 << 20, &p, &mut held)
            .await
            .unwrap();
        assert_eq!(out.len(), 2 << 20);
        assert!(held.is_some_and(|h| h.bytes() >= 2 << 20));
    }

    #[tokio::test]
    async fn a_gzip_bomb_stops_at_the_limit() {
        let (p, _task, _stop, _dir) = test_pipeline(64 << 20, Duration::from_millis(100));
        let gz = gzip(&vec![0u8; 8 << 20]);
        let mut held = None;
        let r = gunzip_contiguous(pieces(&gz, 1 << 20), 1 << 20, &p, &mut held).await;
        assert!(matches!(r, Err(InflateError::TooLarge(m)) if m == 1 << 20));
        assert!(held.is_some_and(|h| h.bytes() <= (1 << 20) + 1));
        let mut held = None;
        let r = gunzip_chunks(pieces(&gz, 1 << 20), 1 << 20, &p, &mut held).await;
        assert!(matches!(r, Err(InflateError::TooLarge(m)) if m == 1 << 20));
        assert!(held.is_some_and(|h| h.bytes() <= (1 << 20) + 1));
        // Exactly at the limit is fine.
        let exact = text(1 << 20);
        let mut held = None;
        let out = gunzip_contiguous(pieces(&gzip(&exact), 7), 1 << 20, &p, &mut held)
            .await
            .unwrap();
        assert_eq!(out, exact);
    }

    #[tokio::test]
    async fn chunks_are_each_reserved_and_join_to_the_message() {
        let (p, _task, _stop, _dir) = test_pipeline(64 << 20, Duration::from_millis(100));
        let data = text((2 << 20) + 12345);
        let gz = gzip(&data);
        let mut held = None;
        let (chunks, total) = gunzip_chunks(pieces(&gz, 1000), 4 << 20, &p, &mut held)
            .await
            .unwrap();
        assert_eq!(total, data.len());
        assert!(chunks.iter().all(|c| c.len() <= CHUNK));
        assert_eq!(chunks.concat(), data);
        let held = held.unwrap();
        assert!(held.bytes() >= total && held.bytes() <= total + CHUNK);
        // Corrupt input is Bad, not a panic or a hang.
        let mut held = None;
        let r = gunzip_chunks(pieces(&gz[..gz.len() / 2], 1000), 4 << 20, &p, &mut held).await;
        assert!(matches!(r, Err(InflateError::Bad(_))), "{r:?}");
    }
}
