//! Write buffers: a pool of extent-sized buffers allocated once at mount.
//!
//! A file that is written takes one buffer; it covers a block-aligned window of the file
//! that the next flush writes as one extent. No buffer is allocated on the write path:
//! when the pool is empty, the store flushes the least recently used file and takes its
//! buffer.

/// Index of a buffer in the pool.
pub type BufId = usize;

/// Fixed set of equally sized buffers.
pub struct BufferPool {
    buffers: Vec<Box<[u8]>>,
    free: Vec<BufId>,
}

impl BufferPool {
    pub fn new(count: usize, size: usize) -> Self {
        BufferPool {
            buffers: (0..count)
                .map(|_| vec![0u8; size].into_boxed_slice())
                .collect(),
            free: (0..count).rev().collect(),
        }
    }

    pub fn take(&mut self) -> Option<BufId> {
        self.free.pop()
    }

    pub fn give_back(&mut self, id: BufId) {
        debug_assert!(!self.free.contains(&id));
        self.free.push(id);
    }

    pub fn get(&self, id: BufId) -> &[u8] {
        &self.buffers[id]
    }

    pub fn get_mut(&mut self, id: BufId) -> &mut [u8] {
        &mut self.buffers[id]
    }

    pub fn buffer_size(&self) -> usize {
        self.buffers.first().map_or(0, |b| b.len())
    }
}

/// The window of a file a buffer holds: bytes `[start, start + len)` of the file, with
/// `start` block aligned. `dirty` is false after a flush that kept a partial last block
/// in the buffer (it is on the device, but the next flush must rewrite it with what follows).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub buf: BufId,
    pub start: u64,
    pub len: usize,
    pub dirty: bool,
}

impl Window {
    pub fn end(&self) -> u64 {
        self.start + self.len as u64
    }
}
