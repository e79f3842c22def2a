//! [`WeightBuf`]: huge-page-aligned memory for the packed f32 weights.

/// Zeroed floats for weights that are streamed whole every step, in their own anonymous
/// mapping that starts on a 2 MiB boundary and is untouched until written, which the kernel
/// is asked (Linux `madvise(MADV_HUGEPAGE)`) to back with transparent huge pages: one TLB
/// entry then covers 512 × more of the stream, and the page walks that stalled the weight
/// loads go away (docs/BENCHMARKS.md). A heap `Vec` could not do this: its start is not
/// aligned and its pages may already be touched. Where huge pages are off this is an ordinary
/// mapping.
pub struct WeightBuf {
    ptr: std::ptr::NonNull<f32>,
    len: usize,
    /// Bytes mapped at `ptr` (len × 4 rounded up to a page, at least one page).
    bytes: usize,
}

// SAFETY: WeightBuf owns its mapping exclusively, like a Vec<f32>.
unsafe impl Send for WeightBuf {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for WeightBuf {}

impl WeightBuf {
    /// `len` zeros.
    ///
    /// # Panics
    /// If the system cannot map the memory (as a `Vec` would abort).
    pub fn zeroed(len: usize) -> WeightBuf {
        const PAGE: usize = 4096;
        const HUGE: usize = 2 << 20;
        let bytes = (len * std::mem::size_of::<f32>())
            .max(1)
            .next_multiple_of(PAGE);
        let map_len = bytes + HUGE;
        // SAFETY: a fresh private anonymous mapping; only its own parts are unmapped below.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert!(
                p != libc::MAP_FAILED,
                "cannot map {map_len} bytes for weights: {}",
                std::io::Error::last_os_error()
            );
            let base = p as usize;
            let start = base.next_multiple_of(HUGE);
            if start > base {
                libc::munmap(p, start - base);
            }
            let end = start + bytes;
            if base + map_len > end {
                libc::munmap(end as *mut libc::c_void, base + map_len - end);
            }
            #[cfg(target_os = "linux")]
            libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
            WeightBuf {
                ptr: std::ptr::NonNull::new(start as *mut f32).expect("mmap gave a null address"),
                len,
                bytes,
            }
        }
    }
}

impl Drop for WeightBuf {
    fn drop(&mut self) {
        // SAFETY: exactly the range `zeroed` kept mapped; nothing borrows it any more.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast::<libc::c_void>(), self.bytes);
        }
    }
}

impl std::ops::Deref for WeightBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: the mapping is page-aligned, holds at least len f32s, and lives as long as
        // self; zeroed bytes are valid f32s.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for WeightBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for WeightBuf {
    fn clone(&self) -> WeightBuf {
        let mut c = WeightBuf::zeroed(self.len);
        c.copy_from_slice(self);
        c
    }
}

impl std::fmt::Debug for WeightBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBuf({} floats)", self.len)
    }
}
