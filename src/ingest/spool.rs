//! The on-disk spool: where accepted batches wait while the store is down or slow.
//!
//! ```text
//! dir/
//!   00000000000000000001.seg   ┐ append-only segments, oldest first
//!   00000000000000000002.seg   ┘ record = [len: u32 LE][crc32(payload): u32 LE][payload]
//!   cursor                      "<segment> <offset>": the first record not yet replayed
//!   writer-id                   random hex, created once: names this spool's store writes
//! ```
//!
//! - [`Spool::append`] writes a record at the end of the newest segment (rotating past
//!   `segment_bytes`) and `fsync`s it; it refuses with [`SpoolError::Full`] past `max_bytes`.
//! - [`Spool::peek`] reads the record at the cursor; [`Spool::commit`] moves the cursor past
//!   it (written to a temp file and renamed, so a crash leaves the old or the new cursor) and
//!   deletes segments left behind.
//! - Opening after a crash truncates a torn record at the end of the newest segment. A record
//!   whose checksum does not match anywhere else is skipped with the rest of its segment and
//!   counted (it cannot be trusted to say where the next record starts).
//!
//! - `writer-id` ([`Spool::writer_id`]) is made once, when the spool is first opened (written
//!   to a temp file, fsync'ed, renamed, the directory fsync'ed) and read on every later open.
//!   The store tags its inserts with it (`query_id` on ClickHouse), so a restarted process can
//!   see which inserts its predecessor left running and wait for them before a replay check.
//!
//! Replay is in order. It is exactly-once together with the store: a record replayed but not
//! yet committed when the process dies is replayed again after restart, and the store's
//! [`crate::store::WriteMode::Replay`] skips what it already holds.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const HEADER: u64 = 8;
/// No record may claim to be longer than this (guards against a corrupt length).
pub const MAX_RECORD_BYTES: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool is full ({used} of {max} bytes used, record needs {need})")]
    Full { used: u64, max: u64, need: u64 },
    #[error("spool record of {0} bytes exceeds the limit")]
    TooLarge(u64),
    #[error("spool io ({path}): {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A record at the cursor, with where it ends (pass to [`Spool::commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peeked {
    pub payload: Vec<u8>,
    pub segment: u64,
    pub end: u64,
}

/// Where a record starts (or the spool ends): a segment id and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub segment: u64,
    pub offset: u64,
}

/// What [`Spool::read_at`] found at a position past the cursor.
#[derive(Debug)]
pub enum ReadAt {
    /// A whole, valid record (its `end` is where the next one starts).
    Record(Peeked),
    /// Nothing there yet: the end of the newest segment.
    End,
    /// A record that cannot be trusted: the rest of its segment is skipped, reading goes on
    /// at `next`.
    Corrupt { next: Pos },
}

/// The spool. Not thread-safe by itself: the ingest writer owns it behind a mutex.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    /// Segment ids on disk, oldest first (never empty: the newest is the write segment).
    segments: Vec<u64>,
    /// Size of the write segment.
    write_len: u64,
    writer: File,
    /// Cursor: first unreplayed record.
    read_seg: u64,
    read_off: u64,
    /// Bytes on disk not yet replayed (from the cursor to the end).
    pending_bytes: u64,
    /// Records skipped as corrupt since open.
    pub num_corrupt: u64,
    /// This spool's stable writer id (the `writer-id` file).
    writer_id: String,
}

const WRITER_ID_FILE: &str = "writer-id";

fn valid_writer_id(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Reads the spool's writer id, creating it (durably) the first time.
fn load_writer_id(dir: &Path) -> Result<String, SpoolError> {
    let path = dir.join(WRITER_ID_FILE);
    match fs::read_to_string(&path) {
        Ok(s) if valid_writer_id(s.trim()) => return Ok(s.trim().to_ascii_lowercase()),
        Ok(s) => {
            // Written by rename, so never torn; anything else was put there by hand.
            tracing::warn!(path = %path.display(), content = %s.trim(), "spool writer-id is not hex; making a new one");
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&path)(e)),
    }
    let id = format!("{:016x}", rand::random::<u64>());
    let tmp = dir.join("writer-id.tmp");
    let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
    writeln!(f, "{id}").map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(id)
}

fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

/// Scans a segment from `from`; returns the end of the last whole, valid record and whether
/// a bad record (torn or corrupt) was found after it.
fn scan_valid_end(path: &Path, from: u64) -> Result<(u64, bool), SpoolError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    let mut off = from;
    f.seek(SeekFrom::Start(off)).map_err(io_err(path))?;
    let mut r = io::BufReader::with_capacity(1 << 20, f);
    let mut buf = Vec::new();
    loop {
        if off == len {
            return Ok((off, false));
        }
        if len - off < HEADER {
            return Ok((off, true));
        }
        let mut h = [0u8; 8];
        r.read_exact(&mut h).map_err(io_err(path))?;
        let n = u64::from(u32::from_le_bytes([h[0], h[1], h[2], h[3]]));
        let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        if n > MAX_RECORD_BYTES || len - off - HEADER < n {
            return Ok((off, true));
        }
        buf.resize(n as usize, 0);
        r.read_exact(&mut buf).map_err(io_err(path))?;
        if crc32fast::hash(&buf) != crc {
            return Ok((off, true));
        }
        off += HEADER + n;
    }
}

impl Spool {
    /// Opens (creating) the spool in `dir`, repairing a torn tail.
    ///
    /// # Errors
    /// When the directory or its files cannot be read or written.
    pub fn open(dir: &Path, max_bytes: u64, segment_bytes: u64) -> Result<Spool, SpoolError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let writer_id = load_writer_id(dir)?;
        let mut segments: Vec<u64> = Vec::new();
        for e in fs::read_dir(dir).map_err(io_err(dir))? {
            let e = e.map_err(io_err(dir))?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name
                .strip_suffix(".seg")
                .and_then(|s| s.parse::<u64>().ok())
            {
                segments.push(id);
            }
        }
        segments.sort_unstable();
        let cursor_path = dir.join("cursor");
        let (mut read_seg, mut read_off) = match fs::read_to_string(&cursor_path) {
            Ok(s) => {
                let mut it = s.split_whitespace().map(str::parse::<u64>);
                match (it.next(), it.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a, b),
                    _ => (0, 0),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => (0, 0),
            Err(e) => return Err(io_err(&cursor_path)(e)),
        };
        // Segments wholly before the cursor were replayed; remove leftovers.
        segments.retain(|&id| {
            if id < read_seg {
                let _ = fs::remove_file(seg_path(dir, id));
                false
            } else {
                true
            }
        });
        if segments.is_empty() {
            let id = read_seg.max(1);
            File::create(seg_path(dir, id)).map_err(io_err(dir))?;
            segments.push(id);
        }
        if read_seg < segments[0] {
            read_seg = segments[0];
            read_off = 0;
        }
        // Repair the newest segment's tail (a crash mid-append).
        let last = *segments.last().expect("non-empty");
        let last_path = seg_path(dir, last);
        let from = if last == read_seg { read_off } else { 0 };
        let (valid_end, bad) = scan_valid_end(&last_path, from)?;
        let mut num_corrupt = 0;
        if bad {
            tracing::warn!(segment = %last_path.display(), valid_end, "spool: truncating a torn record at the end");
            num_corrupt += 1;
            let f = OpenOptions::new()
                .write(true)
                .open(&last_path)
                .map_err(io_err(&last_path))?;
            f.set_len(valid_end).map_err(io_err(&last_path))?;
            f.sync_all().map_err(io_err(&last_path))?;
        }
        let writer = OpenOptions::new()
            .append(true)
            .open(&last_path)
            .map_err(io_err(&last_path))?;
        let write_len = writer.metadata().map_err(io_err(&last_path))?.len();
        let mut pending_bytes = 0;
        for &id in &segments {
            let len = fs::metadata(seg_path(dir, id)).map_err(io_err(dir))?.len();
            pending_bytes += if id == read_seg {
                len.saturating_sub(read_off)
            } else {
                len
            };
        }
        Ok(Spool {
            dir: dir.to_path_buf(),
            max_bytes,
            segment_bytes,
            segments,
            write_len,
            writer,
            read_seg,
            read_off,
            pending_bytes,
            num_corrupt,
            writer_id,
        })
    }

    /// The id that names this spool's writes to the store across restarts (hex, made once when
    /// the spool directory was first opened).
    pub fn writer_id(&self) -> &str {
        &self.writer_id
    }

    /// Bytes waiting to be replayed.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.pending_bytes == 0
    }

    /// True when a record of `need` payload bytes would not fit.
    pub fn would_overflow(&self, need: u64) -> bool {
        self.pending_bytes + HEADER + need > self.max_bytes
    }

    /// Appends one record and makes it durable.
    ///
    /// # Errors
    /// [`SpoolError::Full`] when it would pass `max_bytes` (nothing is written), or IO.
    pub fn append(&mut self, payload: &[u8]) -> Result<(), SpoolError> {
        self.append_inner(payload, true)
    }

    /// [`Spool::append`], saying where the record starts and where it ends.
    ///
    /// # Errors
    /// As [`Spool::append`].
    pub fn append_pos(&mut self, payload: &[u8]) -> Result<(Pos, Pos), SpoolError> {
        self.append_inner(payload, true)?;
        let segment = *self.segments.last().expect("non-empty");
        let start = self.write_len - HEADER - payload.len() as u64;
        Ok((
            Pos {
                segment,
                offset: start,
            },
            Pos {
                segment,
                offset: self.write_len,
            },
        ))
    }

    /// The first record not yet replayed.
    pub fn cursor(&self) -> Pos {
        Pos {
            segment: self.read_seg,
            offset: self.read_off,
        }
    }

    /// Where the next appended record will start (or the newest segment ends).
    pub fn end(&self) -> Pos {
        Pos {
            segment: *self.segments.last().expect("non-empty"),
            offset: self.write_len,
        }
    }

    fn seg_len(&self, id: u64) -> Result<u64, SpoolError> {
        if Some(&id) == self.segments.last() {
            return Ok(self.write_len);
        }
        let path = seg_path(&self.dir, id);
        Ok(fs::metadata(&path).map_err(io_err(&path))?.len())
    }

    /// Reads the record at `at` (at or after the cursor), without moving the cursor: the
    /// shipper reads ahead of it to merge records. At the end of an older segment it goes on
    /// in the next one.
    ///
    /// # Errors
    /// IO errors reading the segment.
    pub fn read_at(&self, mut at: Pos) -> Result<ReadAt, SpoolError> {
        loop {
            let len = match self.segments.binary_search(&at.segment) {
                Ok(_) => self.seg_len(at.segment)?,
                // A segment already dropped (everything in it committed): go on at the cursor.
                Err(_) if at.segment < self.read_seg => {
                    at = self.cursor();
                    continue;
                }
                Err(_) => return Ok(ReadAt::End),
            };
            let is_last = Some(&at.segment) == self.segments.last();
            if at.offset >= len {
                if is_last {
                    return Ok(ReadAt::End);
                }
                let pos = self.segments.binary_search(&at.segment).unwrap_or_default();
                at = Pos {
                    segment: self.segments[pos + 1],
                    offset: 0,
                };
                continue;
            }
            let path = seg_path(&self.dir, at.segment);
            let skip = Pos {
                segment: at.segment,
                offset: len,
            };
            if len - at.offset < HEADER {
                return Ok(ReadAt::Corrupt { next: skip });
            }
            let mut f = File::open(&path).map_err(io_err(&path))?;
            f.seek(SeekFrom::Start(at.offset)).map_err(io_err(&path))?;
            let mut h = [0u8; 8];
            f.read_exact(&mut h).map_err(io_err(&path))?;
            let n = u64::from(u32::from_le_bytes([h[0], h[1], h[2], h[3]]));
            let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            if n > MAX_RECORD_BYTES || len - at.offset - HEADER < n {
                return Ok(ReadAt::Corrupt { next: skip });
            }
            let mut payload = vec![0u8; n as usize];
            f.read_exact(&mut payload).map_err(io_err(&path))?;
            if crc32fast::hash(&payload) != crc {
                return Ok(ReadAt::Corrupt { next: skip });
            }
            return Ok(ReadAt::Record(Peeked {
                payload,
                segment: at.segment,
                end: at.offset + HEADER + n,
            }));
        }
    }

    /// Moves the cursor forward to `to` (a record's end, or a position past skipped bytes):
    /// everything before it was shipped. One cursor write; segments left wholly behind are
    /// deleted after it. A position at or before the cursor changes nothing.
    ///
    /// # Errors
    /// IO errors writing the cursor.
    pub fn commit_to(&mut self, to: Pos) -> Result<(), SpoolError> {
        if to <= self.cursor() {
            return Ok(());
        }
        let mut gone = Vec::new();
        while self.read_seg < to.segment {
            let len = self.seg_len(self.read_seg)?;
            self.pending_bytes = self
                .pending_bytes
                .saturating_sub(len.saturating_sub(self.read_off));
            let pos = self
                .segments
                .iter()
                .position(|&s| s == self.read_seg)
                .unwrap_or(0);
            if pos + 1 >= self.segments.len() {
                break;
            }
            gone.push(self.segments.remove(pos));
            self.read_seg = self.segments[pos];
            self.read_off = 0;
        }
        if self.read_seg == to.segment && to.offset > self.read_off {
            let len = self.seg_len(self.read_seg)?;
            let to_off = to.offset.min(len);
            self.pending_bytes = self.pending_bytes.saturating_sub(to_off - self.read_off);
            self.read_off = to_off;
        }
        self.write_cursor()?;
        for id in gone {
            let _ = fs::remove_file(seg_path(&self.dir, id));
        }
        let is_last = Some(&self.read_seg) == self.segments.last();
        if !is_last && self.read_off >= self.seg_len(self.read_seg)? {
            self.advance_segment()?;
        }
        Ok(())
    }

    /// Appends even past `max_bytes`: for shutdown, when keeping what was already accepted
    /// matters more than the bound (which exists to stop accepting new data).
    ///
    /// # Errors
    /// IO errors.
    pub fn append_over_limit(&mut self, payload: &[u8]) -> Result<(), SpoolError> {
        self.append_inner(payload, false)
    }

    fn append_inner(&mut self, payload: &[u8], bounded: bool) -> Result<(), SpoolError> {
        let n = payload.len() as u64;
        if n > MAX_RECORD_BYTES {
            return Err(SpoolError::TooLarge(n));
        }
        if bounded && self.would_overflow(n) {
            return Err(SpoolError::Full {
                used: self.pending_bytes,
                max: self.max_bytes,
                need: HEADER + n,
            });
        }
        if self.write_len > 0 && self.write_len + HEADER + n > self.segment_bytes {
            self.rotate()?;
        }
        let mut rec = Vec::with_capacity(payload.len() + HEADER as usize);
        rec.extend_from_slice(&(n as u32).to_le_bytes());
        rec.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        rec.extend_from_slice(payload);
        let path = seg_path(&self.dir, *self.segments.last().expect("non-empty"));
        if let Err(e) = self
            .writer
            .write_all(&rec)
            .and_then(|()| self.writer.sync_data())
        {
            // Leave no half record behind for the next append to follow.
            let _ = self.writer.set_len(self.write_len);
            return Err(io_err(&path)(e));
        }
        self.write_len += HEADER + n;
        self.pending_bytes += HEADER + n;
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), SpoolError> {
        let id = self.segments.last().expect("non-empty") + 1;
        let path = seg_path(&self.dir, id);
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        // Make the new file's name durable before records land in it.
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        self.writer = f;
        self.write_len = 0;
        self.segments.push(id);
        Ok(())
    }

    /// The oldest unreplayed record, if any. Skips (and counts) corrupt records.
    ///
    /// # Errors
    /// IO errors reading the segment.
    pub fn peek(&mut self) -> Result<Option<Peeked>, SpoolError> {
        loop {
            let path = seg_path(&self.dir, self.read_seg);
            let is_last = Some(&self.read_seg) == self.segments.last();
            let len = if is_last {
                self.write_len
            } else {
                fs::metadata(&path).map_err(io_err(&path))?.len()
            };
            if self.read_off >= len {
                if is_last {
                    return Ok(None);
                }
                self.advance_segment()?;
                continue;
            }
            let mut f = File::open(&path).map_err(io_err(&path))?;
            f.seek(SeekFrom::Start(self.read_off))
                .map_err(io_err(&path))?;
            let corrupt = |this: &mut Spool, why: &str| -> Result<(), SpoolError> {
                tracing::error!(segment = %path.display(), offset = this.read_off, why, "spool: skipping the rest of a corrupt segment");
                this.num_corrupt += 1;
                this.pending_bytes = this.pending_bytes.saturating_sub(len - this.read_off);
                this.read_off = len;
                Ok(())
            };
            if len - self.read_off < HEADER {
                corrupt(self, "short header")?;
                continue;
            }
            let mut h = [0u8; 8];
            f.read_exact(&mut h).map_err(io_err(&path))?;
            let n = u64::from(u32::from_le_bytes([h[0], h[1], h[2], h[3]]));
            let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            if n > MAX_RECORD_BYTES || len - self.read_off - HEADER < n {
                corrupt(self, "length past the end")?;
                continue;
            }
            let mut payload = vec![0u8; n as usize];
            f.read_exact(&mut payload).map_err(io_err(&path))?;
            if crc32fast::hash(&payload) != crc {
                corrupt(self, "checksum mismatch")?;
                continue;
            }
            return Ok(Some(Peeked {
                payload,
                segment: self.read_seg,
                end: self.read_off + HEADER + n,
            }));
        }
    }

    fn advance_segment(&mut self) -> Result<(), SpoolError> {
        let old = self.read_seg;
        let pos = self.segments.iter().position(|&s| s == old).unwrap_or(0);
        let next = self.segments[pos + 1];
        self.read_seg = next;
        self.read_off = 0;
        self.write_cursor()?;
        self.segments.remove(pos);
        let _ = fs::remove_file(seg_path(&self.dir, old));
        Ok(())
    }

    /// Marks the record `p` as replayed.
    ///
    /// # Errors
    /// IO errors writing the cursor.
    ///
    /// # Panics
    /// If `p` is not the record at the cursor (a broken invariant of the caller).
    pub fn commit(&mut self, p: &Peeked) -> Result<(), SpoolError> {
        assert_eq!(
            p.segment, self.read_seg,
            "spool: commit of a record that is not at the cursor"
        );
        assert!(p.end > self.read_off, "spool: commit does not move forward");
        self.pending_bytes = self.pending_bytes.saturating_sub(p.end - self.read_off);
        self.read_off = p.end;
        self.write_cursor()?;
        let is_last = Some(&self.read_seg) == self.segments.last();
        if !is_last {
            let len = fs::metadata(seg_path(&self.dir, self.read_seg))
                .map_err(io_err(&self.dir))?
                .len();
            if self.read_off >= len {
                self.advance_segment()?;
            }
        }
        Ok(())
    }

    fn write_cursor(&self) -> Result<(), SpoolError> {
        let tmp = self.dir.join("cursor.tmp");
        let path = self.dir.join("cursor");
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        writeln!(f, "{} {}", self.read_seg, self.read_off).map_err(io_err(&tmp))?;
        f.sync_data().map_err(io_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    fn drain(s: &mut Spool) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(p) = s.peek().unwrap() {
            s.commit(&p).unwrap();
            out.push(p.payload);
        }
        out
    }

    #[test]
    fn replays_in_order_across_segments_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20, 4096).unwrap();
        let recs: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; 300]).collect();
        for r in &recs {
            s.append(r).unwrap();
        }
        assert!(
            fs::read_dir(dir.path()).unwrap().count() > 3,
            "rotated into several segments"
        );
        let p = s.peek().unwrap().unwrap();
        s.commit(&p).unwrap();
        drop(s);
        let mut s = Spool::open(dir.path(), 1 << 20, 4096).unwrap();
        assert_eq!(drain(&mut s), recs[1..].to_vec());
        assert!(s.is_empty());
        drop(s);
        let mut s = Spool::open(dir.path(), 1 << 20, 4096).unwrap();
        assert!(
            s.peek().unwrap().is_none(),
            "nothing replays twice after reopen"
        );
    }

    #[test]
    fn read_ahead_and_commit_to_across_segments_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20, 4096).unwrap();
        let recs: Vec<Vec<u8>> = (0..30u8).map(|i| vec![i; 300]).collect();
        let mut ends = Vec::new();
        for r in &recs {
            let (start, end) = s.append_pos(r).unwrap();
            match s.read_at(start).unwrap() {
                ReadAt::Record(p) => assert_eq!(&p.payload, r),
                other => panic!("{other:?}"),
            }
            ends.push(end);
        }
        // Walk ahead of the cursor, across segment ends, without moving it.
        let mut at = s.cursor();
        let mut seen = Vec::new();
        while let ReadAt::Record(p) = s.read_at(at).unwrap() {
            at = Pos {
                segment: p.segment,
                offset: p.end,
            };
            seen.push(p.payload);
        }
        assert_eq!(seen, recs);
        assert_eq!(at, s.end());
        let total = s.pending_bytes();
        s.commit_to(ends[9]).unwrap();
        assert_eq!(s.pending_bytes(), total - 10 * (300 + HEADER));
        s.commit_to(ends[3]).unwrap(); // behind the cursor: nothing moves
        assert_eq!(s.pending_bytes(), total - 10 * (300 + HEADER));
        drop(s);
        let mut s = Spool::open(dir.path(), 1 << 20, 4096).unwrap();
        assert_eq!(s.pending_bytes(), total - 10 * (300 + HEADER));
        assert_eq!(s.peek().unwrap().unwrap().payload, recs[10]);
        let end = s.end();
        s.commit_to(end).unwrap();
        assert!(s.is_empty());
        assert_eq!(
            fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| e
                    .as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "seg"))
                .count(),
            1,
            "segments behind the cursor deleted"
        );
        drop(s);
        let mut s = Spool::open(dir.path(), 1 << 20, 4096).unwrap();
        assert!(s.peek().unwrap().is_none());
        s.append(b"next").unwrap();
        assert_eq!(drain(&mut s), vec![b"next".to_vec()]);
    }

    #[test]
    fn uncommitted_record_is_replayed_again_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20, 1 << 16).unwrap();
        s.append(b"a").unwrap();
        s.append(b"b").unwrap();
        assert_eq!(s.peek().unwrap().unwrap().payload, b"a");
        drop(s); // crash before commit
        let mut s = Spool::open(dir.path(), 1 << 20, 1 << 16).unwrap();
        assert_eq!(drain(&mut s), vec![b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn full_spool_refuses_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 4096 * 2, 4096).unwrap();
        let mut n = 0;
        loop {
            match s.append(&[7u8; 1000]) {
                Ok(()) => n += 1,
                Err(SpoolError::Full { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(n, 8);
        assert_eq!(drain(&mut s).len(), 8);
        s.append(&[1u8; 1000]).unwrap();
    }

    #[test]
    fn writer_id_is_made_once_and_kept_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let a = Spool::open(dir.path(), 1 << 20, 1 << 16).unwrap();
        let id = a.writer_id().to_string();
        assert!(valid_writer_id(&id), "{id}");
        drop(a);
        let b = Spool::open(dir.path(), 1 << 20, 1 << 16).unwrap();
        assert_eq!(
            b.writer_id(),
            id,
            "the same spool directory keeps its writer id"
        );
        let other = tempfile::tempdir().unwrap();
        let c = Spool::open(other.path(), 1 << 20, 1 << 16).unwrap();
        assert_ne!(c.writer_id(), id, "another spool directory gets its own");
        assert!(!dir.path().join("writer-id.tmp").exists());
    }

    #[test]
    fn torn_tail_is_truncated_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20, 1 << 16).unwrap();
        s.append(b"good").unwrap();
        s.append(b"also good").unwrap();
        drop(s);
        let seg = seg_path(dir.path(), 1);
        let len = fs::metadata(&seg).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20, 1 << 16).unwrap();
        assert_eq!(s.num_corrupt, 1);
        s.append(b"after").unwrap();
        assert_eq!(drain(&mut s), vec![b"good".to_vec(), b"after".to_vec()]);
    }

    #[test]
    fn flipped_bit_is_detected_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20, 64).unwrap();
        s.append(&[1u8; 60]).unwrap(); // segment 1
        s.append(&[2u8; 60]).unwrap(); // segment 2
        drop(s);
        let seg = seg_path(dir.path(), 1);
        let mut bytes = fs::read(&seg).unwrap();
        bytes[20] ^= 0x40;
        fs::write(&seg, bytes).unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20, 64).unwrap();
        assert_eq!(drain(&mut s), vec![vec![2u8; 60]]);
        assert_eq!(s.num_corrupt, 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append(Vec<u8>),
        Replay,
        PeekNoCommit,
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Op::Append),
            3 => Just(Op::Replay),
            1 => Just(Op::PeekNoCommit),
            1 => Just(Op::Reopen),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The spool behaves like a bounded FIFO queue across reopens.
        #[test]
        fn spool_matches_a_fifo_model(ops in proptest::collection::vec(op(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let (max, seg) = (4000, 512);
            let mut s = Spool::open(dir.path(), max, seg).unwrap();
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            for o in ops {
                match o {
                    Op::Append(p) => {
                        let used: u64 = model.iter().map(|r| r.len() as u64 + HEADER).sum();
                        let fits = used + HEADER + p.len() as u64 <= max;
                        match s.append(&p) {
                            Ok(()) => { prop_assert!(fits); model.push_back(p) }
                            Err(SpoolError::Full { .. }) => prop_assert!(!fits),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    Op::Replay => {
                        let got = s.peek().unwrap();
                        prop_assert_eq!(got.as_ref().map(|p| p.payload.clone()), model.front().cloned());
                        if let Some(p) = got { s.commit(&p).unwrap(); model.pop_front(); }
                    }
                    Op::PeekNoCommit => {
                        let got = s.peek().unwrap().map(|p| p.payload);
                        prop_assert_eq!(got, model.front().cloned());
                    }
                    Op::Reopen => { drop(s); s = Spool::open(dir.path(), max, seg).unwrap(); }
                }
                let want: u64 = model.iter().map(|r| r.len() as u64 + HEADER).sum();
                prop_assert_eq!(s.pending_bytes(), want);
            }
        }
    }
}
