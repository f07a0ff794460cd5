//! The file data path: writes into a file's window, flushes as extents, reads.
//!
//! A zoned file being written owns one buffer from the pool, holding a block-aligned window
//! of the file. Writes that continue the window are copied into it; anything else first
//! flushes the window and opens a new one at the write's block (reading the existing bytes
//! of that block, so partial-block overwrites work). A flush pads the window to whole blocks
//! (with the file's existing bytes, or zeros past the end), lets the allocator choose where
//! it goes, and maps it over whatever the file had there: in-place writes become out-of-place
//! ones. After a flush the last partial block stays in the window, so the next flush rewrites
//! it together with what follows.

use super::buffer::Window;
use super::extent_map::Extent;
use super::state::{Ino, MetaOp, State};
use super::zone_map::StreamKey;
use super::{now_ns, Inner};
use crate::device::ZonedDevice;
use crate::hint::{Class, FileEvent};
use crate::{Error, Result};

/// Largest file: keeps file block numbers and offsets far from overflow.
const MAX_FILE_SIZE: u64 = 1 << 46;

impl Inner {
    fn is_conventional(&self, ino: Ino) -> Result<bool> {
        Ok(self.state.inode(ino)?.hint.class == Class::Conventional)
    }

    /// Writes all of `data` at `offset`.
    pub(super) fn write(&mut self, ino: Ino, data: &[u8], offset: u64) -> Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(Error::TooLarge)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::TooLarge);
        }
        if data.is_empty() {
            return Ok(());
        }
        let inode = self.state.inode(ino)?;
        let (tenant, class, stream) = (inode.tenant, inode.hint.class, inode.hint.stream);
        *self.counters.tenant_host.entry(tenant).or_default() += data.len() as u64;
        if class == Class::Conventional {
            return self.write_conventional(ino, data, offset);
        }
        let key = StreamKey { tenant, stream };
        self.counters.streams.entry(key).or_default().host += data.len() as u64;
        let tick = self.touch();
        let buf_size = self.pool.buffer_size() as u64;
        let of = self.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        of.last_use = tick;
        of.unreported += data.len() as u64;
        // Fast path: the write continues or overwrites the window and leaves it not full.
        if let Some(w) = of.window.as_mut() {
            let end = offset + data.len() as u64;
            if w.start <= offset && offset <= w.end() && end < w.start + buf_size {
                let at = (offset - w.start) as usize;
                self.pool.get_mut(w.buf)[at..at + data.len()].copy_from_slice(data);
                w.len = w.len.max(at + data.len());
                w.dirty = true;
                let inode = self.state.inode_mut(ino)?;
                inode.size = inode.size.max(end);
                inode.mtime_ns = now_ns();
                return Ok(());
            }
        }

        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let window = match self.open[&ino].window {
                Some(w) if w.start <= pos && pos <= w.end() && pos < w.start + buf_size => w,
                _ => self.start_window(ino, pos)?,
            };
            let at = (pos - window.start) as usize;
            let n = (data.len() - done).min(buf_size as usize - at);
            self.pool.get_mut(window.buf)[at..at + n].copy_from_slice(&data[done..done + n]);
            let w = self
                .open
                .get_mut(&ino)
                .and_then(|o| o.window.as_mut())
                .expect("window just set");
            w.len = w.len.max(at + n);
            w.dirty = true;
            let full = w.len == buf_size as usize;
            let inode = self.state.inode_mut(ino)?;
            inode.size = inode.size.max(pos + n as u64);
            done += n;
            if full {
                self.flush(ino)?;
            }
        }
        self.state.inode_mut(ino)?.mtime_ns = now_ns();
        Ok(())
    }

    /// The stream a file's zoned data goes to.
    fn stream_of(&self, ino: Ino) -> Result<StreamKey> {
        let inode = self.state.inode(ino)?;
        Ok(StreamKey {
            tenant: inode.tenant,
            stream: inode.hint.stream,
        })
    }

    /// Flushes the file's current window (if any) and opens one at `pos`'s block, holding
    /// the file's bytes between the block start and `pos`.
    fn start_window(&mut self, ino: Ino, pos: u64) -> Result<Window> {
        self.flush(ino)?;
        let bs = self.state.block_size();
        let start = pos / bs * bs;
        let buf = match self.open[&ino].window {
            Some(w) => w.buf,
            None => self.take_buffer(ino)?,
        };
        let window = Window {
            buf,
            start,
            len: (pos - start) as usize,
            dirty: false,
        };
        // Drop the old window before reading, so the prefix comes from the device.
        self.open.get_mut(&ino).expect("open").window = None;
        if window.len > 0 {
            let prefix = &mut self.pool.get_mut(buf)[..window.len];
            read_mapped(&self.state, &*self.device, ino, prefix, start)?;
        }
        self.open.get_mut(&ino).expect("open").window = Some(window);
        Ok(window)
    }

    /// A buffer from the pool, or the least recently used file's after flushing it.
    fn take_buffer(&mut self, ino: Ino) -> Result<usize> {
        if let Some(b) = self.pool.take() {
            return Ok(b);
        }
        let victim = self
            .open
            .iter()
            .filter(|(&i, o)| i != ino && o.window.is_some())
            .min_by_key(|(_, o)| o.last_use)
            .map(|(&i, _)| i)
            .ok_or_else(|| Error::NoSpace("no write buffer available".into()))?;
        self.flush(victim)?;
        let w = self
            .open
            .get_mut(&victim)
            .and_then(|o| o.window.take())
            .expect("victim has a window");
        Ok(w.buf)
    }

    /// Writes the file's dirty window to the device as extents, then commits if enough
    /// metadata is pending.
    pub(super) fn flush(&mut self, ino: Ino) -> Result<()> {
        self.flush_window(ino)?;
        self.commit_if_due()
    }

    /// Writes the file's dirty window to the device as extents.
    fn flush_window(&mut self, ino: Ino) -> Result<()> {
        let Some(window) = self.open.get(&ino).and_then(|o| o.window) else {
            return Ok(());
        };
        if !window.dirty {
            return Ok(());
        }
        let bs = self.state.block_size();
        let size = self.state.inode(ino)?.size;
        let end = window.end();
        let padded_end = end.div_ceil(bs) * bs;
        // Pad the last block with what the file holds after the window, or zeros.
        if padded_end > end {
            let tail = &mut self.pool.get_mut(window.buf)
                [window.len..(padded_end - window.start) as usize];
            let upto = (size.max(end).min(padded_end) - end) as usize;
            read_mapped(&self.state, &*self.device, ino, &mut tail[..upto], end)?;
            tail[upto..].fill(0);
        }
        let key = self.stream_of(ino)?;
        let mut hint = self.state.inode(ino)?.hint;
        let stream_bytes = self.counters.streams.get(&key).map_or(0, |c| c.host);
        hint.group = hint.group_at(stream_bytes, now_ns() / 1_000_000_000);
        // Size first: a commit between the records (allocation may commit) must never make
        // extents durable past the durable size.
        self.record_attr(ino)?;
        let total = (padded_end - window.start) as usize;
        let mut written = 0usize;
        while written < total {
            let (zone, block, nblocks) =
                self.allocate(key, &hint, ((total - written) as u64 / bs) as u32, false)?;
            let len = nblocks as usize * bs as usize;
            let data = &self.pool.get(window.buf)[written..written + len];
            let mut crc = 0;
            self.device
                .write_overlapped(zone, block as u64 * bs, data, &mut || {
                    crc = crc32c::crc32c(data)
                })?;
            self.advance(zone, nblocks);
            self.counters.streams.entry(key).or_default().device += len as u64;
            self.record(MetaOp::MapExtent {
                ino,
                file_block: (window.start + written as u64) / bs,
                extent: Extent {
                    zone,
                    block,
                    len: nblocks,
                },
                crc,
            })?;
            written += len;
        }
        // Keep the last partial block: the next flush rewrites it with what follows.
        let keep_from = end / bs * bs;
        let keep = (end - keep_from) as usize;
        let skip = (keep_from - window.start) as usize;
        self.pool
            .get_mut(window.buf)
            .copy_within(skip..skip + keep, 0);
        let of = self.open.get_mut(&ino).expect("open");
        of.window = Some(Window {
            buf: window.buf,
            start: keep_from,
            len: keep,
            dirty: false,
        });
        let unreported = std::mem::take(&mut of.unreported);
        if unreported > 0 {
            self.report_written(ino, unreported);
        }
        Ok(())
    }

    fn report_written(&self, ino: Ino, bytes: u64) {
        let Ok(inode) = self.state.inode(ino) else {
            return;
        };
        let path = self.state.any_path(ino);
        self.placements
            .get(inode.tenant)
            .event(&FileEvent::Written {
                tenant: inode.tenant,
                path: &path,
                bytes,
            });
    }

    /// Journals a file's size and times as they are now.
    fn record_attr(&mut self, ino: Ino) -> Result<()> {
        let inode = self.state.inode(ino)?;
        let op = MetaOp::SetAttr {
            ino,
            size: inode.size,
            atime_ns: inode.atime_ns,
            mtime_ns: inode.mtime_ns,
            ctime_ns: inode.mtime_ns.max(inode.ctime_ns),
        };
        self.record(op)
    }

    /// Reads at `offset`, seeing buffered data; short only at end of file.
    pub(super) fn read(&mut self, ino: Ino, buf: &mut [u8], offset: u64) -> Result<usize> {
        let size = self.state.inode(ino)?.size;
        if offset >= size {
            return Ok(0);
        }
        let n = ((size - offset) as usize).min(buf.len());
        let buf = &mut buf[..n];
        if self.is_conventional(ino)? {
            return self.read_conventional(ino, buf, offset);
        }
        read_mapped(&self.state, &*self.device, ino, buf, offset)?;
        if let Some(w) = self.open.get(&ino).and_then(|o| o.window) {
            let from = w.start.max(offset);
            let to = w.end().min(offset + n as u64);
            if from < to {
                let src = &self.pool.get(w.buf)[(from - w.start) as usize..(to - w.start) as usize];
                buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
            }
        }
        Ok(n)
    }

    /// `ftruncate`: shrinking drops extents past the end and rewrites a partial last block
    /// with zeros after the new end, so growing again reads zeros.
    pub(super) fn set_len(&mut self, ino: Ino, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::TooLarge);
        }
        if self.is_conventional(ino)? {
            return self.set_len_conventional(ino, size);
        }
        self.flush(ino)?;
        if let Some(w) = self.open.get_mut(&ino).and_then(|o| o.window.take()) {
            self.pool.give_back(w.buf);
        }
        let old = self.state.inode(ino)?.size;
        let bs = self.state.block_size();
        let mapped_tail = self
            .state
            .inode(ino)?
            .extents
            .pieces(size / bs, size / bs + 1)
            .first()
            .is_some_and(|(_, e, _)| e.is_some());
        if size < old && size % bs != 0 && mapped_tail {
            // Zero the new last block past the new end before the size is journaled, with
            // no commit between the two records: were the size durable with the old bytes
            // still in that block, a crash would let them reappear when the file grows.
            let w = self.start_window(ino, size)?;
            self.pool.get_mut(w.buf)[w.len..bs as usize].fill(0);
            let w = self
                .open
                .get_mut(&ino)
                .and_then(|o| o.window.as_mut())
                .expect("window just started");
            w.len = bs as usize;
            w.dirty = true;
            self.flush_window(ino)?;
        }
        let now = now_ns();
        let inode = self.state.inode_mut(ino)?;
        inode.size = size;
        inode.mtime_ns = now;
        inode.ctime_ns = now;
        self.record_attr(ino)?;
        self.commit_if_due()
    }

    /// fsync / fdatasync / close: the file's data and the metadata that finds it are durable
    /// on return, with one device sync (nothing at all when nothing changed).
    pub(super) fn sync_file(&mut self, ino: Ino) -> Result<()> {
        if self.is_conventional(ino)? {
            self.sync_conventional(ino)?;
        } else {
            self.flush(ino)?;
        }
        self.commit()
    }

    /// Flushes every open file's window.
    pub(super) fn flush_all(&mut self) -> Result<()> {
        let inos: Vec<Ino> = self.open.keys().copied().collect();
        for ino in inos {
            if self.is_conventional(ino)? {
                self.sync_conventional(ino)?;
            } else {
                self.flush(ino)?;
            }
        }
        Ok(())
    }
}

/// Reads what the device holds for `buf.len()` bytes of a file at `offset` (holes read as
/// zeros), ignoring the file's window and size. A free function so that it can fill a pool
/// buffer while the store's other fields are borrowed.
fn read_mapped(
    state: &State,
    device: &dyn ZonedDevice,
    ino: Ino,
    buf: &mut [u8],
    offset: u64,
) -> Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let bs = state.block_size();
    let end = offset + buf.len() as u64;
    let inode = state.inode(ino)?;
    for (file_block, ext, nblocks) in inode.extents.pieces(offset / bs, end.div_ceil(bs)) {
        let piece_start = (file_block * bs).max(offset);
        let piece_end = ((file_block + nblocks) * bs).min(end);
        let out = &mut buf[(piece_start - offset) as usize..(piece_end - offset) as usize];
        match ext {
            None => out.fill(0),
            Some(e) => {
                let at = e.block as u64 * bs + (piece_start - file_block * bs);
                device.read(e.zone, at, out)?;
            }
        }
    }
    Ok(())
}
