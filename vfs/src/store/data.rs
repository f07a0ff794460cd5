//! The file data path: writes into a file's window, flushes as extents, reads.
//!
//! A zoned file being written holds one buffer from the pool as its window: a block-aligned
//! range of the file. Writes that continue the window are copied into it under the store's
//! lock and return (the fast path). A full window is detached and handed to the background
//! writer; the guest's write returns without waiting for the device. A write elsewhere in
//! the file detaches the window and opens a new one at the write's block, holding the
//! file's bytes between the block start and the write (read with no lock held).
//! When every buffer is taken, a write waits for one to come back; meanwhile it writes one
//! of its tenant's queued buffers itself if the writer has not taken it yet (back-pressure
//! then costs a buffer's write, not the writer's wait for a core).
//!
//! A flush pads the last block with what the file holds after the window (or zeros past
//! its end), reserves blocks in the stream's zone (allocate-on-flush), writes them with no
//! lock held, and then records the extents over whatever the file had there: in-place
//! writes become out-of-place ones. Until that record, reads see the detached bytes; if the
//! device write fails, the bytes stay with the file and the next sync tries again. When it
//! failed for want of space, they move out of the pool into memory of their own and the file
//! takes no new bytes until they are written (ENOSPC, as a full disk's write(2)): a tenant
//! whose data does not fit never holds the buffers the others write through.
//!
//! After a flush the last partial block stays in a new window (when a buffer is free), so
//! the next flush rewrites it together with what follows.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use super::alloc::Reserved;
use super::buffer::{Backing, Detached, Window};
use super::events::Event;
use super::inline;
use super::state::{Ino, MetaOp, TenantId};
use super::zone_map::StreamKey;
use super::{now_ns, Inner, Store};
use crate::hint::Class;
use crate::{Error, Result};

/// Largest file: keeps file block numbers and offsets far from overflow.
pub(super) const MAX_FILE_SIZE: u64 = 1 << 46;

/// Writes of at least this many bytes into a window are copied with the store's lock
/// released (see the module docs): a 512 KiB copy held it for 12–18 µs at the median and
/// up to 0.1 ms, while another thread's small write waited. Smaller copies take less than
/// taking the lock again would.
const LENT_COPY: usize = 64 * 1024;

/// Room left in a journal block for the record header and the transaction's other
/// operations when a sync's tail goes inline.
const INLINE_HEADROOM: usize = 1024;

/// Inline bytes the whole store may hold, as a fraction of a zone: bounds what a checkpoint
/// carries along and what a recovery writes back.
const INLINE_BUDGET_DIVISOR: u64 = 8;

/// A device read planned under the lock: bytes `[dst, dst + len)` of the caller's buffer
/// come from `zone` at byte `at`.
struct DeviceRead {
    zone: u32,
    at: u64,
    dst: usize,
    len: usize,
}

impl Store {
    /// Writes all of `data` at `offset` (at the end of file for an append handle); returns
    /// the offset written at.
    pub(super) fn write_data(&self, id: u64, ino: Ino, data: &[u8], offset: u64) -> Result<u64> {
        self.check_running()?;
        let mut inner = self.lock()?;
        let h = inner.handle(id)?;
        if !h.write {
            return Err(Error::NotPermitted("writing"));
        }
        let append = h.append;
        // An append's offset is the end of every write before it.
        inner = self.wait_for_writes(inner, ino)?;
        let at = if append {
            inner.state.inode(ino)?.size
        } else {
            offset
        };
        let end = at.checked_add(data.len() as u64).ok_or(Error::TooLarge)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::TooLarge);
        }
        if data.is_empty() {
            return Ok(at);
        }
        let inode = inner.state.inode(ino)?;
        let (tenant, class, stream) = (inode.tenant, inode.hint.class, inode.hint.stream);
        *inner.counters.tenant_host.entry(tenant).or_default() += data.len() as u64;
        if class == Class::Conventional {
            self.write_conventional(inner, ino, data, at)?;
            return Ok(at);
        }
        let key = StreamKey::user(tenant, stream);
        inner.counters.streams.entry(key).or_default().host += data.len() as u64;
        if data.len() < LENT_COPY && inner.copy_into_window(ino, data, at)? {
            return Ok(at);
        }
        inner.open.get_mut(&ino).ok_or(Error::BadHandle)?.writing = true;
        drop(inner);
        let written = self.write_slow(ino, data, at);
        self.end_writing(ino);
        written.map(|()| at)
    }

    /// Copies `bytes` into `ino`'s window at `at` with the lock released: the window's
    /// buffer is lent out of it meanwhile and the file is busy (see the module docs).
    fn copy_lent<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        ino: Ino,
        at: usize,
        bytes: &[u8],
    ) -> Result<MutexGuard<'a, Inner>> {
        let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        let w = of.window.as_mut().ok_or(Error::BadHandle)?;
        let mut buf = std::mem::take(&mut w.buf);
        of.busy = true;
        drop(inner);
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        let mut inner = self.lock()?;
        let of = inner.open.get_mut(&ino).expect("a busy file stays open");
        let w = of.window.as_mut().expect("a busy file keeps its window");
        w.buf = buf;
        self.set_busy(&mut inner, ino, false);
        Ok(inner)
    }

    /// Waits until no write or size change of `ino` is under way (see the module docs).
    pub(super) fn wait_for_writes<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        ino: Ino,
    ) -> Result<MutexGuard<'a, Inner>> {
        while inner.open.get(&ino).is_some_and(|o| o.writing) {
            inner = self.wait(inner)?;
        }
        Ok(inner)
    }

    /// Ends the write or size change of `ino` that set its `writing` flag.
    pub(super) fn end_writing(&self, ino: Ino) {
        if let Ok(mut inner) = self.lock() {
            if let Some(of) = inner.open.get_mut(&ino) {
                of.writing = false;
            }
        }
        self.notify();
    }

    /// The write path when the window does not simply take the bytes: windows are
    /// detached and started as needed.
    fn write_slow(&self, ino: Ino, data: &[u8], offset: u64) -> Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let mut inner = self.lock_idle(ino)?;
            let buf_size = inner.pool.buffer_size() as u64;
            let bs = inner.state.block_size();
            let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
            let waits_for_room = of.waits_for_room();
            if let Some(from) = of
                .window
                .as_ref()
                .and_then(|w| w.gap_to_fill(pos, bs, buf_size))
            {
                self.fill_gap(inner, ino, from, pos)?;
                continue;
            }
            match &mut of.window {
                Some(w) if w.start <= pos && pos <= w.end() && pos < w.start + buf_size => {
                    let at = (pos - w.start) as usize;
                    let n = (data.len() - done).min(buf_size as usize - at);
                    if n < LENT_COPY {
                        w.buf[at..at + n].copy_from_slice(&data[done..done + n]);
                    } else {
                        inner = self.copy_lent(inner, ino, at, &data[done..done + n])?;
                    }
                    let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
                    let w = of.window.as_mut().ok_or(Error::BadHandle)?;
                    w.wrote(pos, n);
                    let full = w.len == buf_size as usize;
                    of.unreported += n as u64;
                    inner.state.grow_unrecorded(ino, pos + n as u64)?.mtime_ns = now_ns();
                    done += n;
                    if full {
                        // A full window ends on a block boundary: nothing to pad.
                        inner.detach(ino, Vec::new())?;
                        inner.counters.background_flushes += 1;
                        drop(inner);
                        self.shared.writer.push(ino);
                    }
                }
                Some(w) if w.dirty => {
                    inner.counters.background_flushes += 1;
                    drop(inner);
                    self.flush_window(ino)?;
                    self.shared.writer.push(ino);
                }
                Some(_) => {
                    let w = of.window.take().expect("matched");
                    inner.pool.give_back(w.buf);
                }
                None if waits_for_room => {
                    // As a full disk at write(2): new bytes are refused until the queued
                    // ones find room (retried here, as a sync would).
                    drop(inner);
                    self.write_queued(ino)?;
                }
                None => {
                    drop(inner);
                    self.start_window(ino, pos)?;
                }
            }
        }
        Ok(())
    }

    /// Extends `ino`'s window from its end `from` to `pos` with the file's bytes there
    /// (zeros past the end of file), read with the file busy and no lock held.
    fn fill_gap<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        ino: Ino,
        from: u64,
        pos: u64,
    ) -> Result<()> {
        let size = inner.state.inode(ino)?.size;
        let mut gap = vec![0u8; (pos - from) as usize];
        let known = size.clamp(from, pos) - from;
        if known > 0 {
            let read;
            (inner, read) = self.read_busy(inner, ino, &mut gap[..known as usize], from)?;
            read?;
        }
        let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        // The window cannot have changed while the file was busy; check all the same.
        if let Some(w) = of.window.as_mut().filter(|w| w.end() == from) {
            let at = w.len;
            w.buf[at..at + gap.len()].copy_from_slice(&gap);
            w.len += gap.len();
            w.dirty = true;
        }
        Ok(())
    }

    /// Locks the store once `ino` is not busy (see the module docs).
    fn lock_idle(&self, ino: Ino) -> Result<MutexGuard<'_, Inner>> {
        let mut inner = self.lock()?;
        while inner.open.get(&ino).is_some_and(|o| o.busy) {
            inner = self.wait(inner)?;
        }
        Ok(inner)
    }

    /// Reads `buf` at `offset` of `ino` with the file busy and the lock released (see the
    /// module docs), then takes the lock again: returns it, and how the read went.
    fn read_busy<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        ino: Ino,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<(MutexGuard<'a, Inner>, Result<()>)> {
        self.set_busy(&mut inner, ino, true);
        let read = self.read_range(inner, ino, buf, offset);
        let mut inner = self.lock()?;
        self.set_busy(&mut inner, ino, false);
        Ok((inner, read))
    }

    /// Sets or clears a file's busy flag.
    fn set_busy(&self, inner: &mut Inner, ino: Ino, busy: bool) {
        if let Some(of) = inner.open.get_mut(&ino) {
            of.busy = busy;
        }
        if !busy {
            self.notify();
        }
    }

    /// Opens a window at `pos`'s block holding the file's bytes before `pos` in that block.
    fn start_window(&self, ino: Ino, pos: u64) -> Result<()> {
        let inner = self.lock_idle(ino)?;
        let (mut inner, buf) = self.take_buffer(inner, ino)?;
        let bs = inner.state.block_size();
        let start = pos / bs * bs;
        let size = inner.state.inode(ino)?.size;
        // Bytes past the end of file read as zeros, whatever an old block still holds.
        let prefix = (pos.min(size).max(start) - start) as usize;
        let gen = inner.next_window_gen();
        let mut window = Window::new(buf, start, (pos - start) as usize, gen);
        window.buf[..window.len].fill(0);
        if prefix > 0 {
            let mut bytes = vec![0u8; prefix];
            let read;
            (inner, read) = self.read_busy(inner, ino, &mut bytes, start)?;
            if let Err(e) = read {
                inner.pool.give_back(window.buf);
                return Err(e);
            }
            window.buf[..prefix].copy_from_slice(&bytes);
        }
        let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        match &of.window {
            None => of.window = Some(window),
            // Another thread opened one meanwhile: use it.
            Some(_) => inner.pool.give_back(window.buf),
        }
        Ok(())
    }

    /// A free buffer for `ino`'s new window. When the pool is empty, takes the buffer of the
    /// least recently used clean window, or hands dirty ones to the writer and waits for a
    /// buffer to come back (back-pressure, counted in the stats). Before each wait it writes
    /// one of its tenant's queued buffers itself, if one is waiting for the writer: the
    /// thread would only sleep meanwhile, and the writer, at nice 10 beside busy guests,
    /// may wait milliseconds for a core.
    fn take_buffer<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        ino: Ino,
    ) -> Result<(MutexGuard<'a, Inner>, Vec<u8>)> {
        let tenant = inner.state.inode(ino)?.tenant;
        let mut waited: Option<Instant> = None;
        loop {
            if inner.past_pool_share(ino) {
                // Its own buffers come back as the device takes them; the other tenants'
                // writes meanwhile find the rest of the pool.
                waited.get_or_insert_with(Instant::now);
                inner = self.help_or_wait(inner, tenant)?;
                continue;
            }
            if let Some(buf) = inner.pool.take() {
                if let Some(since) = waited {
                    inner.counters.buffer_waits += 1;
                    inner.counters.buffer_wait_ns += since.elapsed().as_nanos() as u64;
                }
                return Ok((inner, buf));
            }
            // The least recently used other window gives its buffer up: at once if clean,
            // once written if dirty.
            let victim = inner
                .open
                .iter()
                .filter(|(&i, o)| i != ino && !o.busy)
                .filter_map(|(&i, o)| Some((o.last_use, i, o.window.as_ref()?.dirty)))
                .min();
            match victim {
                Some((_, victim, false)) => {
                    let w = inner.open.get_mut(&victim).and_then(|o| o.window.take());
                    return Ok((inner, w.expect("victim has a window").buf));
                }
                Some((_, victim, true)) => {
                    let tail = match inner.tail_to_read(victim)? {
                        None => Vec::new(),
                        Some((at, len)) => {
                            let mut tail = vec![0u8; len];
                            let read;
                            (inner, read) = self.read_busy(inner, victim, &mut tail, at)?;
                            read?;
                            tail
                        }
                    };
                    inner.detach(victim, tail)?;
                    inner.counters.background_flushes += 1;
                    self.shared.writer.push(victim);
                }
                None => {
                    // Buffers come back from writes in progress or queued; ones whose
                    // write failed wait for a sync to retry them.
                    // (A file's queue is written in order: behind a failed front, nothing
                    // moves until a sync retries it.)
                    let coming = inner.open.values().any(|o| {
                        o.inflight
                            .front()
                            .is_some_and(|d| d.writing || d.error.is_none())
                    });
                    if !coming && !inner.any_busy() {
                        let failed = inner
                            .open
                            .values()
                            .flat_map(|o| o.inflight.iter())
                            .find_map(|d| d.error.clone());
                        return Err(match failed {
                            Some(why) => Error::NoSpace(format!(
                                "every write buffer holds data whose write failed: {why}"
                            )),
                            None => Error::NoSpace("no write buffer available".into()),
                        });
                    }
                }
            }
            waited.get_or_insert_with(Instant::now);
            inner = self.help_or_wait(inner, tenant)?;
        }
    }

    /// For a write waiting for a buffer: writes the front of one of `tenant`'s queues that
    /// waits for the writer, or else waits for a change.
    fn help_or_wait<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner>,
        tenant: TenantId,
    ) -> Result<MutexGuard<'a, Inner>> {
        let Some((queued, claim)) = inner.claim_queued(tenant) else {
            return self.wait(inner);
        };
        inner.counters.flushes_while_waiting += 1;
        drop(inner);
        // A failure stays with that file for its next sync to report, as when the writer's
        // write fails.
        let _ = self.write_claimed(queued, claim);
        self.lock()
    }

    /// Detaches `ino`'s dirty window (padding its last block with what the file holds
    /// after it) so that it can be written; a no-op for a clean window.
    fn flush_window(&self, ino: Ino) -> Result<()> {
        let mut inner = self.lock_idle(ino)?;
        let Some(w) = inner.open.get(&ino).and_then(|o| o.window.as_ref()) else {
            return Ok(());
        };
        if !w.dirty {
            return Ok(());
        }
        let mut tail = Vec::new();
        if let Some((at, len)) = inner.tail_to_read(ino)? {
            tail = vec![0u8; len];
            let read;
            (inner, read) = self.read_busy(inner, ino, &mut tail, at)?;
            read?;
        }
        inner.detach(ino, tail)?;
        drop(inner);
        self.notify();
        Ok(())
    }

    /// Writes the file's buffered bytes to the device and records them: detaches the
    /// window, then writes every detached buffer of the file, oldest first, on this thread.
    pub(super) fn flush_file(&self, ino: Ino) -> Result<()> {
        self.flush_window(ino)?;
        self.write_queued(ino)
    }

    /// Writes the file's detached buffers, oldest first, waiting for any another thread is
    /// writing. Returns the error of a write that failed (its bytes stay queued).
    ///
    /// Only the buffers queued when it starts: another thread that keeps filling the file
    /// keeps detaching more, and a sync or close that went on with them might never return
    /// (Linux tags the pages a data-integrity writeback must write before it starts). The
    /// newest one is watched through a weak reference: it keeps its address from being
    /// taken by a later buffer without keeping the buffer from the pool.
    pub(super) fn write_queued(&self, ino: Ino) -> Result<()> {
        let newest = {
            let inner = self.lock()?;
            let of = inner.open.get(&ino);
            match of.and_then(|of| of.inflight.back()) {
                Some(d) => Arc::downgrade(&d.buf),
                None => return Ok(()),
            }
        };
        loop {
            let mut inner = self.lock()?;
            let Some(of) = inner.open.get_mut(&ino) else {
                return Ok(());
            };
            if !of
                .inflight
                .iter()
                .any(|d| std::ptr::eq(Arc::as_ptr(&d.buf), newest.as_ptr()))
            {
                return Ok(());
            }
            match of.inflight.front() {
                None => return Ok(()),
                Some(front) if front.writing => {
                    drop(self.wait(inner)?);
                    continue;
                }
                Some(_) => {}
            }
            let claim = claim_front(&mut of.inflight);
            drop(inner);
            self.write_claimed(ino, claim)?;
        }
    }

    /// Writes what this thread claimed from the front of `ino`'s queue; a failure stays
    /// with the file (its buffers wait for a retry) and is returned.
    fn write_claimed(&self, ino: Ino, claim: Claim) -> Result<()> {
        let written = match claim {
            Claim::Front { buf, start, len } => self.write_front(ino, buf, start, len),
            Claim::Batch(batch) => self.write_small_batch(ino, &batch),
        };
        if let Err(e) = written {
            let mut inner = self.lock()?;
            if let Some(of) = inner.open.get_mut(&ino) {
                // The buffers marked `writing` are this thread's: they wait for a retry.
                for d in of.inflight.iter_mut().filter(|d| d.writing) {
                    d.writing = false;
                }
                if let Some(front) = of.inflight.front_mut() {
                    front.error = Some(e.to_string());
                    front.no_space = matches!(e, Error::NoSpace(_));
                }
            }
            inner.unpool_unplaceable(ino);
            let _ = inner.settle_closed(ino);
            drop(inner);
            self.notify();
            return Err(e);
        }
        Ok(())
    }

    /// Writes the front detached buffer of `ino` (owned by this thread: `writing` is set)
    /// and records its extents.
    fn write_front(&self, ino: Ino, buf: Arc<Vec<u8>>, start: u64, len: usize) -> Result<()> {
        let (key, hint, bs) = self.flush_stream(ino)?;
        let total = (len as u64).div_ceil(bs) * bs;
        self.write_pieces(ino, key, &hint, &buf, start, total)?;
        drop(buf);
        self.finish_front(ino, key, total)
    }

    /// Writes a batch of small queued buffers of `ino` (the front and the ones after it,
    /// marked `writing`; see [`small_batch`]) as one device write per piece of allocation,
    /// and records each buffer's extents and retires it in queue order, as
    /// [`Store::write_front`] does for one.
    fn write_small_batch(&self, ino: Ino, batch: &[SmallQueued]) -> Result<()> {
        let (key, hint, bs) = self.flush_stream(ino)?;
        let mut data = Vec::with_capacity(batch.iter().map(|q| q.bytes.len()).sum());
        for q in batch {
            data.extend_from_slice(&q.bytes);
        }
        let total = data.len() as u64;
        let (mut written, mut next, mut next_at) = (0u64, 0usize, 0u64);
        while written < total {
            let want = ((total - written) / bs) as u32;
            let r = self.allocate(key, &hint, want, false)?;
            let piece_end = written + r.blocks as u64 * bs;
            let recorded = self
                .write_blocks(r, &data[written as usize..piece_end as usize])
                .and_then(|crc| {
                    // Each buffer's part of the piece is an extent of its own.
                    let mut at = written;
                    while at < piece_end {
                        let q = &batch[next];
                        let q_end = next_at + q.bytes.len() as u64;
                        let to = piece_end.min(q_end);
                        let whole = at == written && to == piece_end;
                        let part = Reserved {
                            zone: r.zone,
                            block: r.block + ((at - written) / bs) as u32,
                            blocks: ((to - at) / bs) as u32,
                        };
                        let crc = match whole {
                            true => crc,
                            false => crc32c::crc32c(&data[at as usize..to as usize]),
                        };
                        let file_block = (q.start + (at - next_at)) / bs;
                        self.record_piece(ino, part, crc, file_block, at == next_at, to == q_end)?;
                        if to == q_end {
                            self.finish_front(ino, key, q.bytes.len() as u64)?;
                            next += 1;
                            next_at = q_end;
                        }
                        at = to;
                    }
                    Ok(())
                });
            self.unpin(r.zone);
            recorded?;
            written = piece_end;
        }
        Ok(())
    }

    /// See [`Inner::stream_of`].
    pub(super) fn stream_of(&self, ino: Ino) -> Result<(StreamKey, crate::Hint, u64)> {
        self.lock()?.stream_of(ino)
    }

    /// Reserves and writes `total` bytes of `buf` (file offset `start`) as extents of
    /// stream `key`, recording each as soon as it is written (the first with the file's
    /// size), so that no zone this flush wrote waits for the rest of the flush to be reset
    /// or reused. A flush cut short by a crash leaves some pieces new and the rest old, as
    /// any unsynced write may.
    fn write_pieces(
        &self,
        ino: Ino,
        key: StreamKey,
        hint: &crate::Hint,
        buf: &[u8],
        start: u64,
        total: u64,
    ) -> Result<()> {
        let bs = self.shared.device.geometry().block_size as u64;
        let mut written = 0u64;
        while written < total {
            let want = ((total - written) / bs) as u32;
            let r = self.allocate(key, hint, want, false)?;
            let bytes = &buf[written as usize..(written + r.blocks as u64 * bs) as usize];
            let last = written + r.blocks as u64 * bs == total;
            let recorded = self.write_blocks(r, bytes).and_then(|crc| {
                let file_block = (start + written) / bs;
                self.record_piece(ino, r, crc, file_block, written == 0, last)
            });
            self.unpin(r.zone);
            recorded?;
            written += r.blocks as u64 * bs;
        }
        Ok(())
    }

    /// Records one written piece of the front buffer of `ino`, after the file's size when
    /// it is the first. With the last piece, the inline pieces of this buffer's window and
    /// older ones retire: its extents (and the ones recorded before) hold their bytes.
    fn record_piece(
        &self,
        ino: Ino,
        r: Reserved,
        crc: u32,
        file_block: u64,
        first: bool,
        last: bool,
    ) -> Result<()> {
        let mut inner = self.lock()?;
        let gen = inner
            .open
            .get(&ino)
            .and_then(|o| o.inflight.front())
            .map(|d| d.gen)
            .ok_or(Error::BadHandle)?;
        if first {
            let front = inner.open.get(&ino).and_then(|o| o.inflight.front());
            let (size, set_size) = front
                .map(|d| (d.size, d.set_size))
                .ok_or(Error::BadHandle)?;
            let inode = inner.state.inode(ino)?;
            let op = match set_size {
                // A shrink by `set_len`: the zeroed block and the new size together.
                Some(size) => {
                    let now = now_ns();
                    MetaOp::SetAttr {
                        ino,
                        size,
                        atime_ns: inode.atime_ns,
                        mtime_ns: now,
                        ctime_ns: now,
                    }
                }
                None => MetaOp::Extend {
                    ino,
                    size,
                    mtime_ns: inode.mtime_ns,
                },
            };
            inner.record(op)?;
        }
        inner.record(MetaOp::MapExtent {
            ino,
            file_block,
            extent: r.extent(),
            crc,
        })?;
        if last && inner.state.inline.has_up_to(ino, gen) {
            inner.record(MetaOp::InlineDone { ino, gen })?;
        }
        Ok(())
    }

    /// Retires the front buffer of `ino` once all of it is recorded.
    fn finish_front(&self, ino: Ino, key: StreamKey, total: u64) -> Result<()> {
        let mut inner = self.lock()?;
        let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        let done = of.inflight.pop_front().expect("the front is ours");
        let unreported = std::mem::take(&mut of.unreported);
        inner.counters.streams.entry(key).or_default().device += total;
        inner.pool.retire(done.backing, done.buf);
        if unreported > 0 {
            let tenant = key.tenant;
            let path = inner.state.any_path(ino);
            inner.events.push(Event::Written {
                tenant,
                path,
                bytes: unreported,
            });
        }
        inner.settle_closed(ino)?;
        self.release(inner)?;
        self.notify();
        Ok(())
    }

    /// Writes `data` to the reserved blocks, in the zone's reservation order; returns the
    /// data's crc32c. The zone stays pinned (so it is not reset before the caller records
    /// the extent); the caller unpins it with [`Store::unpin`]. A failed write faults the
    /// zone: nothing more is written there.
    pub(super) fn write_blocks(&self, r: Reserved, data: &[u8]) -> Result<u32> {
        self.write_blocks_pinned(r, data)
    }

    /// [`Store::write_blocks`] for a copy (GC's, defragmentation's): a copy that fails is
    /// never recorded, so its zone is unpinned here.
    pub(super) fn write_copy(&self, r: Reserved, data: &[u8]) -> Result<u32> {
        self.write_blocks(r, data)
            .inspect_err(|_| self.unpin(r.zone))
    }

    /// Drops a pin taken by allocation or by a read plan.
    pub(super) fn unpin(&self, zone: u32) {
        self.shared.pins[zone as usize].fetch_sub(1, Ordering::AcqRel);
    }

    fn write_blocks_pinned(&self, r: Reserved, data: &[u8]) -> Result<u32> {
        let z = r.zone as usize;
        let bs = self.shared.device.geometry().block_size as u64;
        {
            let mut inner = self.lock()?;
            while inner.written[z] != r.block as u64 {
                if inner.fault[z] {
                    return Err(Error::Device(crate::device::DeviceError::InvalidState {
                        zone: r.zone,
                        state: crate::device::ZoneState::ReadOnly,
                        op: "write after a failed write",
                    }));
                }
                inner = self.wait(inner)?;
            }
        }
        let mut crc = 0;
        let wrote =
            self.shared
                .device
                .write_overlapped(r.zone, r.block as u64 * bs, data, &mut || {
                    crc = crc32c::crc32c(data)
                });
        let mut inner = self.lock()?;
        let result = match wrote {
            Ok(()) => inner.wrote(r.zone, r.block, r.blocks).map(|()| crc),
            Err(e) => {
                // Later reservations of the zone give up; the zone is sealed as it stands.
                inner.fault[z] = true;
                inner.written[z] = inner.wp[z];
                let _ = inner.seal(r.zone);
                Err(e.into())
            }
        };
        drop(inner);
        self.notify();
        result
    }

    /// Reads at `offset` (a handle's read, or a prefetch when `id` is None), seeing
    /// buffered data; short only at end of file.
    pub(super) fn read_data(
        &self,
        id: Option<u64>,
        ino: Ino,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<usize> {
        let mut inner = self.lock()?;
        if let Some(id) = id {
            if !inner.handle(id)?.read {
                return Err(Error::NotPermitted("reading"));
            }
        }
        // A window lent out for a copy gets its buffer back within microseconds.
        while inner
            .open
            .get(&ino)
            .and_then(|o| o.window.as_ref())
            .is_some_and(Window::is_lent)
        {
            inner = self.wait(inner)?;
        }
        let inode = inner.state.inode(ino)?;
        let size = inode.size;
        if offset >= size {
            return Ok(0);
        }
        let n = ((size - offset) as usize).min(buf.len());
        let buf = &mut buf[..n];
        if inode.hint.class == Class::Conventional {
            return self.read_conventional(inner, ino, buf, offset);
        }
        // Served from the window alone.
        if let Some(w) = inner.open.get(&ino).and_then(|o| o.window.as_ref()) {
            if w.start <= offset && offset + n as u64 <= w.end() {
                let from = (offset - w.start) as usize;
                buf.copy_from_slice(&w.buf[from..from + n]);
                return Ok(n);
            }
        }
        self.read_range(inner, ino, buf, offset)?;
        Ok(n)
    }

    /// Fills `buf` with the file's bytes at `offset` as they stand: what the device holds
    /// (holes as zeros), overlaid with detached buffers and then the window. The device is
    /// read after the lock is released, with the zones pinned. The caller keeps the range
    /// within the file.
    fn read_range(
        &self,
        inner: MutexGuard<'_, Inner>,
        ino: Ino,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<()> {
        let bs = inner.state.block_size();
        let end = offset + buf.len() as u64;
        let inode = inner.state.inode(ino)?;
        let mut reads: Vec<DeviceRead> = Vec::new();
        for (file_block, ext, nblocks) in inode.extents.pieces(offset / bs, end.div_ceil(bs)) {
            let piece_start = (file_block * bs).max(offset);
            let piece_end = ((file_block + nblocks) * bs).min(end);
            let dst = (piece_start - offset) as usize;
            let len = (piece_end - piece_start) as usize;
            match ext {
                None => buf[dst..dst + len].fill(0),
                Some(e) => reads.push(DeviceRead {
                    zone: e.zone,
                    at: e.block as u64 * bs + (piece_start - file_block * bs),
                    dst,
                    len,
                }),
            }
        }
        // Buffered bytes, oldest first, copied now: they may be gone once the lock is. A
        // read-only store has no buffers, and the synced bytes that only the journal holds
        // (written back into their files by a writable mount) are read from there.
        let journaled: &[inline::Piece] = match inner.config.read_only {
            true => inner.state.inline.of(ino),
            false => &[],
        };
        let journaled = journaled
            .iter()
            .map(|p| (p.offset, p.offset + p.data.len() as u64, &p.data[..]));
        let of = inner.open.get(&ino);
        let detached = of.into_iter().flat_map(|of| of.inflight.iter());
        let detached = detached.map(|d| (d.start, d.end(), &d.buf[..]));
        let window = of.and_then(|of| of.window.as_ref());
        let window = window.map(|w| (w.start, w.end(), &w.buf[..]));
        let mut overlays: Vec<(usize, Vec<u8>)> = Vec::new();
        for (start, stop, bytes) in journaled.chain(detached).chain(window) {
            let from = start.max(offset);
            let to = stop.min(end);
            if from < to {
                let src = &bytes[(from - start) as usize..(to - start) as usize];
                overlays.push(((from - offset) as usize, src.to_vec()));
            }
        }
        for r in &reads {
            self.shared.pins[r.zone as usize].fetch_add(1, Ordering::AcqRel);
        }
        drop(inner);
        let mut result = Ok(());
        for r in &reads {
            if result.is_ok() {
                let out = &mut buf[r.dst..r.dst + r.len];
                result = self.shared.device.read(r.zone, r.at, out);
            }
            self.shared.pins[r.zone as usize].fetch_sub(1, Ordering::AcqRel);
        }
        result?;
        for (dst, bytes) in overlays {
            buf[dst..dst + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }

    /// `ftruncate`. Shrinking drops the extents past the new end; a partial new last block
    /// is first rewritten with zeros after the new end, in the same transaction as the new
    /// size: were the size durable with the old bytes still in that block, a crash would let
    /// them reappear when the file grows.
    pub(super) fn set_len(&self, id: u64, ino: Ino, size: u64) -> Result<()> {
        self.change_len(id, ino, size, false)
    }

    /// `posix_fallocate`: grows the file to `size` unless it already holds that much,
    /// decided with the file's writes held off (a size read before would let it cut an
    /// append that landed meanwhile).
    pub(super) fn grow_to(&self, id: u64, ino: Ino, size: u64) -> Result<()> {
        self.change_len(id, ino, size, true)
    }

    /// [`Store::set_len`] and [`Store::grow_to`].
    fn change_len(&self, id: u64, ino: Ino, size: u64, grow_only: bool) -> Result<()> {
        self.check_running()?;
        if size > MAX_FILE_SIZE {
            return Err(Error::TooLarge);
        }
        let conventional = {
            let inner = self.lock()?;
            if !inner.handle(id)?.write {
                // POSIX: EINVAL when the descriptor is not open for writing.
                return Err(Error::Invalid("file not open for writing"));
            }
            inner.state.inode(ino)?.hint.class == Class::Conventional
        };
        // The file's writes wait meanwhile, as Linux's inode lock makes them: else a
        // writer that never pauses keeps the flush of a file in the zones from ending, and
        // a write that took its offset before the new size lands past it.
        let mut inner = self.wait_for_writes(self.lock()?, ino)?;
        if grow_only && inner.state.inode(ino)?.size >= size {
            return Ok(());
        }
        inner.open.get_mut(&ino).ok_or(Error::BadHandle)?.writing = true;
        drop(inner);
        let changed = match conventional {
            true => self.change_len_conventional(ino, size),
            false => self.change_len_zoned(ino, size),
        };
        self.end_writing(ino);
        changed
    }

    /// [`Store::set_len`] of a file in the zones, with the file's `writing` flag set.
    fn change_len_zoned(&self, ino: Ino, size: u64) -> Result<()> {
        // Everything buffered goes to the device first.
        let mut inner = loop {
            self.flush_file(ino)?;
            let inner = self.lock_idle(ino)?;
            let of = inner.open.get(&ino).ok_or(Error::BadHandle)?;
            if !of.has_unwritten() {
                break inner;
            }
        };
        if let Some(w) = inner.open.get_mut(&ino).and_then(|o| o.window.take()) {
            inner.pool.give_back(w.buf);
        }
        let bs = inner.state.block_size();
        let old = inner.state.inode(ino)?.size;
        let block_start = size / bs * bs;
        let partial_tail = size < old
            && size % bs != 0
            && inner
                .state
                .inode(ino)?
                .extents
                .pieces(size / bs, size / bs + 1)
                .first()
                .is_some_and(|(_, e, _)| e.is_some());
        let now = now_ns();
        if !partial_tail {
            let inode = inner.state.set_size(ino, size)?;
            inode.mtime_ns = now;
            inode.ctime_ns = now;
            inner.record_attr(ino)?;
            return self.release(inner);
        }
        // The new last block: its bytes up to the new end, zeros after.
        let mut block = vec![0u8; bs as usize];
        self.set_busy(&mut inner, ino, true);
        let head = &mut block[..(size - block_start) as usize];
        let read = self.read_range(inner, ino, head, block_start);
        let mut inner = self.lock()?;
        if let Err(e) = read {
            self.set_busy(&mut inner, ino, false);
            return Err(e);
        }
        // The size changes when the block's write is recorded, with it (`SetAttr` in
        // `record_piece`): changed here, a checkpoint taken meanwhile by another thread's
        // commit would hold the new size with the old extents past it.
        let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        let block = Arc::new(block);
        of.inflight.push_back(Detached {
            buf: block.clone(),
            start: block_start,
            len: bs as usize,
            size,
            set_size: Some(size),
            backing: Backing::Own,
            writing: false,
            error: None,
            no_space: false,
            gen: 0,
            unsynced: true,
        });
        self.set_busy(&mut inner, ino, false);
        drop(inner);
        let written = self.write_queued(ino);
        if written.is_err() {
            // A truncation that failed is not applied later, by the next flush of the file,
            // after writes made since (it was the only buffer queued, and the file's
            // `writing` flag kept any other from joining it): the file stays as it was.
            let mut inner = self.lock()?;
            let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
            if of
                .inflight
                .back()
                .is_some_and(|d| Arc::ptr_eq(&d.buf, &block) && !d.writing)
            {
                of.inflight.pop_back();
            }
        }
        written
    }

    /// fsync / fdatasync of one file, up to the commit: as [`Store::flush_or_sync_conventional`],
    /// except that a small unsynced tail of the window goes into the journal record instead
    /// of a data block (one page per small sync: a log record, a commit). The window keeps
    /// the bytes and reaches a data zone when it fills, is evicted or the file is closed.
    pub(super) fn sync_file(&self, ino: Ino) -> Result<()> {
        let conventional = {
            let inner = self.lock()?;
            inner.state.inode(ino)?.hint.class == Class::Conventional
        };
        if conventional {
            return self.sync_conventional(ino);
        }
        // Queued buffers a sync has not covered yet go first (in order); ones whose bytes
        // went inline are written by the background writer without making the sync wait.
        let queued = {
            let inner = self.lock()?;
            let of = inner.open.get(&ino).ok_or(Error::BadHandle)?;
            of.inflight.iter().any(|d| d.unsynced)
        };
        if queued {
            self.write_queued(ino)?;
        }
        if self.sync_inline(ino)? {
            return Ok(());
        }
        self.flush_file(ino)
    }

    /// Records the window's unsynced tail as an inline journal operation if it is small and
    /// the store's inline budget allows. Returns whether nothing is left to flush.
    fn sync_inline(&self, ino: Ino) -> Result<bool> {
        let mut inner = self.lock_idle(ino)?;
        let block = inner.state.block_size() as usize;
        // A checkpoint carries every inline byte: keep them a small part of a zone.
        let budget = inner.state.geometry.zone_capacity / INLINE_BUDGET_DIVISOR;
        let held = inner.state.inline.bytes();
        let of = inner.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        if of.inflight.iter().any(|d| d.unsynced) {
            return Ok(false);
        }
        let Some(w) = of.window.as_mut() else {
            return Ok(true);
        };
        if !w.dirty || w.unsynced_from == u64::MAX {
            return Ok(true);
        }
        let from = (w.unsynced_from - w.start) as usize;
        let n = w.len - from;
        // Past this, a data block costs no more than the journal bytes would.
        if n > block - INLINE_HEADROOM || held + n as u64 > budget {
            return Ok(false);
        }
        let data = w.buf[from..w.len].to_vec();
        let offset = w.unsynced_from;
        let gen = w.gen;
        w.unsynced_from = u64::MAX;
        let inode = inner.state.inode(ino)?;
        let op = MetaOp::Inline {
            ino,
            gen,
            offset,
            data,
            size: inode.size,
            mtime_ns: inode.mtime_ns,
        };
        inner.record(op)?;
        inner.counters.inline_syncs += 1;
        Ok(true)
    }

    /// fsync / fdatasync / close of one file, up to the commit: zoned data written and
    /// recorded, conventional bytes synced on the host.
    pub(super) fn flush_or_sync_conventional(&self, ino: Ino) -> Result<()> {
        let conventional = {
            let inner = self.lock()?;
            inner.state.inode(ino)?.hint.class == Class::Conventional
        };
        if conventional {
            return self.sync_conventional(ino);
        }
        self.flush_file(ino)
    }
}

/// Most buffers one device write of small ones carries.
const MAX_SMALL_BATCH: usize = 256;

/// A small queued buffer taken into a batch: its padded bytes and file offset.
struct SmallQueued {
    bytes: Arc<Vec<u8>>,
    start: u64,
}

/// Queued buffers of one file that a thread took on to write (`writing` set on each).
enum Claim {
    /// The front buffer alone.
    Front {
        buf: Arc<Vec<u8>>,
        start: u64,
        len: usize,
    },
    /// A run of small buffers from the front ([`small_batch`]).
    Batch(Vec<SmallQueued>),
}

/// Claims the front of a queue whose front no thread is writing.
fn claim_front(queue: &mut std::collections::VecDeque<Detached>) -> Claim {
    let batch = small_batch(queue);
    if !batch.is_empty() {
        return Claim::Batch(batch);
    }
    let front = queue.front_mut().expect("a queue with a front");
    front.writing = true;
    Claim::Front {
        buf: front.buf.clone(),
        start: front.start,
        len: front.len,
    }
}

/// Marks `writing` and returns the run of small buffers at the front of a file's queue
/// (copies of one-page windows: [`BufferPool::copy_out`](super::buffer::BufferPool::copy_out))
/// when there are two or more, so that a checkpoint's scattered pages go to the device in one
/// write instead of one each; empty otherwise. Buffers that failed before, or that carry
/// a truncation, go alone.
fn small_batch(queue: &mut std::collections::VecDeque<Detached>) -> Vec<SmallQueued> {
    let run = queue
        .iter()
        .take(MAX_SMALL_BATCH)
        .take_while(|d| {
            d.backing == Backing::Copy && !d.writing && d.error.is_none() && d.set_size.is_none()
        })
        .count();
    if run < 2 {
        return Vec::new();
    }
    queue
        .iter_mut()
        .take(run)
        .map(|d| {
            d.writing = true;
            SmallQueued {
                bytes: d.buf.clone(),
                start: d.start,
            }
        })
        .collect()
}

impl Inner {
    /// The stream a flush of `ino` writes to, its hint (with the lifetime group of the
    /// stream's bytes so far) and the block size.
    pub(super) fn stream_of(&self, ino: Ino) -> Result<(StreamKey, crate::Hint, u64)> {
        let inode = self.state.inode(ino)?;
        let key = StreamKey::user(inode.tenant, inode.hint.stream);
        let mut hint = inode.hint;
        let stream_bytes = self.counters.streams.get(&key).map_or(0, |c| c.host);
        hint.group = hint.group_at(stream_bytes, now_ns() / 1_000_000_000);
        Ok((key, hint, self.state.block_size()))
    }

    /// The fast path: copies `data` into the window if it continues or overwrites it and
    /// leaves it not full. Returns false when the slow path must run.
    fn copy_into_window(&mut self, ino: Ino, data: &[u8], offset: u64) -> Result<bool> {
        let buf_size = self.pool.buffer_size() as u64;
        self.tick += 1;
        let tick = self.tick;
        let of = self.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        of.last_use = tick;
        if of.busy {
            return Ok(false);
        }
        let Some(w) = of.window.as_mut() else {
            return Ok(false);
        };
        let end = offset + data.len() as u64;
        if !(w.start <= offset && offset <= w.end() && end < w.start + buf_size) {
            return Ok(false);
        }
        let at = (offset - w.start) as usize;
        w.buf[at..at + data.len()].copy_from_slice(data);
        w.wrote(offset, data.len());
        of.unreported += data.len() as u64;
        self.state.grow_unrecorded(ino, end)?.mtime_ns = now_ns();
        Ok(true)
    }

    /// The file bytes a dirty window's last block needs from past the window, as
    /// `(offset, length)`: none when the window ends on a block boundary or at the end of
    /// file.
    fn tail_to_read(&self, ino: Ino) -> Result<Option<(u64, usize)>> {
        let bs = self.state.block_size();
        let size = self.state.inode(ino)?.size;
        let Some(w) = self.open.get(&ino).and_then(|o| o.window.as_ref()) else {
            return Ok(None);
        };
        let end = w.end();
        let padded_end = end.div_ceil(bs) * bs;
        Ok((size > end && padded_end > end).then(|| (end, (size.min(padded_end) - end) as usize)))
    }

    /// Claims for the caller the front of the queue of one of `tenant`'s files whose front
    /// waits for a thread to write it (not being written, no failed write to retry).
    fn claim_queued(&mut self, tenant: TenantId) -> Option<(Ino, Claim)> {
        let Inner { open, state, .. } = self;
        let (&ino, of) = open.iter_mut().find(|(i, o)| {
            o.inflight
                .front()
                .is_some_and(|d| !d.writing && d.error.is_none())
                && state.inodes.get(i).is_some_and(|n| n.tenant == tenant)
        })?;
        Some((ino, claim_front(&mut of.inflight)))
    }

    fn any_busy(&self) -> bool {
        self.open.values().any(|o| o.busy)
    }

    /// Whether `ino`'s tenant holds its share of the write buffers or more while other
    /// tenants hold some too, with some of its own on their way back from the device (so
    /// waiting for them cannot wait forever). Pool buffers are held by windows and by
    /// queued writes.
    fn past_pool_share(&self, ino: Ino) -> bool {
        let tenant_of = |i: &Ino| self.state.inodes.get(i).map(|n| n.tenant);
        let Some(tenant) = tenant_of(&ino) else {
            return false;
        };
        // Other tenants holding buffers (allocates only when there are some).
        let mut others: Vec<TenantId> = Vec::new();
        let (mut held, mut coming) = (0, false);
        for (i, o) in &self.open {
            let queued = o.inflight.iter().filter(|d| d.backing == Backing::Pool);
            let holds = usize::from(o.window.is_some()) + queued.count();
            if holds == 0 {
                continue;
            }
            let Some(t) = tenant_of(i) else { continue };
            if t == tenant {
                held += holds;
                // A file's queue is written in order: behind a failed front nothing moves.
                coming |= o
                    .inflight
                    .front()
                    .is_some_and(|d| d.writing || d.error.is_none());
            } else if !others.contains(&t) {
                others.push(t);
            }
        }
        coming && !others.is_empty() && held >= self.pool.share(others.len() + 1)
    }

    /// Detaches `ino`'s dirty window for flushing, its last block padded with `tail` (the
    /// file's bytes after the window) and zeros; keeps the partial last block in a new
    /// window when a buffer is free.
    fn detach(&mut self, ino: Ino, tail: Vec<u8>) -> Result<()> {
        let bs = self.state.block_size();
        let size = self.state.inode(ino)?.size;
        let of = self.open.get_mut(&ino).ok_or(Error::BadHandle)?;
        let Some(mut w) = of.window.take() else {
            return Ok(());
        };
        let end = w.end();
        let padded = (end.div_ceil(bs) * bs - w.start) as usize;
        w.buf[w.len..w.len + tail.len()].copy_from_slice(&tail);
        w.buf[w.len + tail.len()..padded].fill(0);
        let (bytes, backing) = match self.pool.copy_out(w.buf, padded) {
            Ok(own) => (own, Backing::Copy),
            Err(pooled) => (pooled, Backing::Pool),
        };
        let keep_from = end / bs * bs;
        let keep = (end - keep_from) as usize;
        let skip = (keep_from - w.start) as usize;
        let next = match keep {
            0 => None,
            _ => self.pool.take().map(|mut buf| {
                buf[..keep].copy_from_slice(&bytes[skip..skip + keep]);
                Window::new(buf, keep_from, keep, 0)
            }),
        };
        let next = next.map(|w| Window {
            gen: self.next_window_gen(),
            ..w
        });
        let of = self.open.get_mut(&ino).expect("checked above");
        of.inflight.push_back(Detached {
            buf: Arc::new(bytes),
            start: w.start,
            len: w.len,
            size,
            set_size: None,
            backing,
            writing: false,
            error: None,
            no_space: false,
            gen: w.gen,
            unsynced: w.unsynced_from != u64::MAX,
        });
        of.window = next;
        self.unpool_unplaceable(ino);
        Ok(())
    }

    /// Behind a write that found no room, a file's queued bytes wait in memory of their own
    /// and give their pool buffers back: a file (or a tenant, or a pod long gone) whose data
    /// does not fit must not take the buffers every other file writes through. What this
    /// holds is bounded: such a file gets no new window (see [`Store::write_slow`]). (After
    /// an I/O error the bytes keep their buffers, as before: the pool bounds them.)
    fn unpool_unplaceable(&mut self, ino: Ino) {
        let bs = self.state.block_size() as usize;
        let Some(of) = self.open.get_mut(&ino).filter(|of| of.waits_for_room()) else {
            return;
        };
        let mut freed = Vec::new();
        for d in of
            .inflight
            .iter_mut()
            .filter(|d| d.backing == Backing::Pool && !d.writing)
        {
            let own = Arc::new(d.buf[..d.len.div_ceil(bs) * bs].to_vec());
            let pooled = std::mem::replace(&mut d.buf, own);
            match Arc::try_unwrap(pooled) {
                Ok(buf) => {
                    d.backing = Backing::Own;
                    freed.push(buf);
                }
                // Someone still reads it: it stays pooled, and goes back when written.
                Err(shared) => d.buf = shared,
            }
        }
        for buf in freed {
            self.pool.give_back(buf);
        }
    }

    /// Journals a file's size and times as they are now.
    pub(super) fn record_attr(&mut self, ino: Ino) -> Result<()> {
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
}
