//! Write buffers: a pool of extent-sized buffers allocated once at mount.
//!
//! A file being written holds one buffer as its window: a block-aligned range of the file
//! that the next flush writes as one extent. A flush detaches the buffer from the file and
//! hands it to whoever writes it to the device (the guest's own thread for a sync, the
//! background writer for a full buffer); the buffer comes back to the pool when its write
//! is recorded. The pool never grows: when every buffer is in flight, a writer waits for
//! one to come back (back-pressure, counted in the stats). While several tenants hold
//! buffers, each may hold an equal share of them: a tenant past its share, with some of its
//! own on their way back from the device, waits for those, so a tenant writing faster than
//! the device takes cannot leave the other tenants no buffer.

use std::sync::Arc;

/// Largest detached window that is copied out of its pool buffer (see
/// [`BufferPool::copy_out`]).
const SMALL_COPY: usize = 64 * 1024;

/// Fixed set of equally sized buffers; the ones out of the pool are owned by windows or by
/// in-flight flushes.
pub struct BufferPool {
    free: Vec<Vec<u8>>,
    /// Buffers in all, free or not.
    count: usize,
    size: usize,
    /// Bytes of small detached windows copied out of the pool and not yet written.
    copied: usize,
    /// Most bytes `copied` may reach: a quarter of the pool.
    copy_budget: usize,
}

impl BufferPool {
    pub fn new(count: usize, size: usize) -> Self {
        BufferPool {
            free: (0..count).map(|_| resident_zeros(size)).collect(),
            count,
            size,
            copied: 0,
            copy_budget: count * size / 4,
        }
    }

    /// The first `len` bytes of `buf` in memory of their own, `buf` back in the pool, when
    /// they are few and the copy budget allows; else `buf` unchanged. A page rewritten in
    /// place (a B-tree's commit, a checkpoint) is a window of one block: queued for the
    /// device in a whole pool buffer, a few dozen of them would hold every buffer and make
    /// every other file wait.
    /// Copies count until [`BufferPool::retire`].
    pub fn copy_out(&mut self, buf: Vec<u8>, len: usize) -> Result<Vec<u8>, Vec<u8>> {
        if len > SMALL_COPY || self.copied + len > self.copy_budget {
            return Err(buf);
        }
        let own = buf[..len].to_vec();
        self.copied += len;
        self.give_back(buf);
        Ok(own)
    }

    /// A detached buffer is done with (written, or its file gone): a pool buffer goes back
    /// (unless a writer still holds it), a copy leaves the copy count.
    pub fn retire(&mut self, backing: Backing, buf: Arc<Vec<u8>>) {
        match backing {
            Backing::Pool => {
                if let Ok(buf) = Arc::try_unwrap(buf) {
                    self.give_back(buf);
                }
            }
            Backing::Copy => self.copied -= buf.len(),
            Backing::Own => {}
        }
    }

    pub fn take(&mut self) -> Option<Vec<u8>> {
        self.free.pop()
    }

    pub fn give_back(&mut self, buf: Vec<u8>) {
        debug_assert_eq!(buf.len(), self.size);
        self.free.push(buf);
    }

    pub fn buffer_size(&self) -> usize {
        self.size
    }

    /// Most buffers one of `tenants` tenants that hold buffers may hold while the others
    /// do (an equal share, at least one): a tenant writing faster than the device takes
    /// cannot leave the others none.
    pub fn share(&self, tenants: usize) -> usize {
        (self.count / tenants.max(1)).max(1)
    }
}

/// `size` zero bytes whose pages are in memory already. A copy into a page never touched
/// first faults it in: a 512 KiB copy into fresh pages took up to 0.35 ms, against about
/// 15 µs into pages in memory, and small copies into a window run under the store's lock.
/// So the pool's pages are faulted in once, at mount.
fn resident_zeros(size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    const PAGE: usize = 4096;
    let start = buf.as_mut_ptr() as usize;
    let first_page = start - start % PAGE;
    // SAFETY: the range covers the pages of `buf`'s own allocation (the first page rounded
    // down to its start); MADV_POPULATE_WRITE faults pages in writable without changing
    // what they hold.
    let populated = unsafe {
        libc::madvise(
            first_page as *mut libc::c_void,
            start + size - first_page,
            libc::MADV_POPULATE_WRITE,
        )
    } == 0;
    if !populated {
        // Kernels before 5.14: write each page (with the zero it holds; volatile, since the
        // compiler knows the allocation is zeroed and would drop a plain store of zero).
        for at in (0..size).step_by(PAGE) {
            // SAFETY: `at` is inside `buf`.
            unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(at), 0) };
        }
    }
    buf
}

/// The window of a file a buffer holds: bytes `[start, start + len)` of the file, with
/// `start` block aligned. `dirty` is false after a flush that kept a partial last block
/// in the buffer (it is on the device, but the next flush must rewrite it with what follows).
pub struct Window {
    pub buf: Vec<u8>,
    pub start: u64,
    pub len: usize,
    /// Holds bytes that are not in a data zone yet.
    pub dirty: bool,
    /// File offset of the first byte written since the window's bytes were last made
    /// durable (by a flush or an inline sync); `u64::MAX` when there is none.
    pub unsynced_from: u64,
    /// Store-wide generation of this window: its inline pieces carry it (see
    /// [`super::inline`]).
    pub gen: u64,
}

impl Window {
    pub fn new(buf: Vec<u8>, start: u64, len: usize, gen: u64) -> Self {
        Window {
            buf,
            start,
            len,
            dirty: false,
            unsynced_from: u64::MAX,
            gen,
        }
    }

    pub fn end(&self) -> u64 {
        self.start + self.len as u64
    }

    /// The buffer is lent out for a copy with the store's lock released (an empty
    /// placeholder stands in; pool buffers are never empty).
    pub fn is_lent(&self) -> bool {
        self.buf.is_empty()
    }

    /// Where a write at `pos` leaves a short gap after the window that is cheaper to fill
    /// with the file's bytes than to start a new window at `pos`: returns the gap's start
    /// (the window's end). Worth it when the gap is under two blocks and a new window
    /// would cost a partial block anyway (the window ends, or `pos` starts, inside one):
    /// then the bytes written are about the same, and one extent replaces two flushes and
    /// a prefix read. SQLite's WAL rewrites a 24-byte frame header every 4,120 bytes at a
    /// commit; without this each header is a window of its own.
    pub fn gap_to_fill(&self, pos: u64, block: u64, capacity: u64) -> Option<u64> {
        let end = self.end();
        let short = pos > end && pos - end < 2 * block && pos < self.start + capacity;
        let partial = end % block != 0 || pos % block != 0;
        (short && partial).then_some(end)
    }

    /// Notes a guest write of `[offset, offset + n)` into the window.
    pub fn wrote(&mut self, offset: u64, n: usize) {
        let at = (offset - self.start) as usize;
        self.len = self.len.max(at + n);
        self.dirty = true;
        self.unsynced_from = self.unsynced_from.min(offset);
    }
}

/// A window detached for flushing: its bytes stay readable (reads overlay them on what the
/// device holds) until the write is recorded, and stay with the file if the write fails.
pub struct Detached {
    /// The buffer, shared read-only with the thread writing it. Bytes past `len` up to the
    /// block boundary are the padding the flusher filled in before detaching.
    pub buf: Arc<Vec<u8>>,
    pub start: u64,
    /// Guest bytes in the buffer (the padded length is `len` rounded up to a block).
    pub len: usize,
    /// File size when detached: the size grows to it with the extents.
    pub size: u64,
    /// Journal exactly this size with the extents (a shrink by `ftruncate`).
    pub set_size: Option<u64>,
    /// Whose memory the buffer is.
    pub backing: Backing,
    /// Being written by some thread (false: waiting, or failed and kept for a retry).
    pub writing: bool,
    /// Why the last write of this buffer failed.
    pub error: Option<String>,
    /// That failure was the device's lack of space (not an I/O error).
    pub no_space: bool,
    /// The window's generation (its inline pieces retire when this buffer is recorded).
    pub gen: u64,
    /// Holds bytes no sync made durable yet (not inlined): a sync must write it first.
    pub unsynced: bool,
}

/// Whose memory a detached buffer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A pool buffer: it goes back to the pool once written.
    Pool,
    /// A small window's copy ([`BufferPool::copy_out`]): the pool counts its length.
    Copy,
    /// Memory of its own, dropped once written.
    Own,
}

impl Detached {
    pub fn end(&self) -> u64 {
        self.start + self.len as u64
    }
}
