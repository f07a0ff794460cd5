//! Defragmentation: rewriting a fragmented file's windows as whole extents, so that the
//! metadata stays within what a checkpoint can hold.
//!
//! Small random overwrites with a sync after each (a B-tree's pages, SQLite's database
//! file) leave a file with one extent per block, each with its own checksum unit, and a
//! checkpoint holds every one of them ([`EXTENT_BYTES`] each). A checkpoint must fit half a
//! metadata zone: before, a large enough randomly written file (about 13 GiB of one on the
//! default device, 150 MiB on zones of 256 KiB) stopped the store for every tenant. Names
//! are refused past [`super::METADATA_FULL`]; extents cannot be, as refusing a write to a
//! file that exists would fail an application on a device with room. They are made fewer
//! instead:
//!
//! - Past a quarter of a metadata zone (`StoreConfig::defrag_start_bytes`), by the size
//!   [`Inner::metadata_estimate`] puts on the next checkpoint, the reclaimer thread
//!   rewrites the most fragmented windows of the most fragmented file, a pass at a time,
//!   throttled as GC is, until the estimate is under three quarters of that line.
//! - Past one and a half times that line, where new names are refused
//!   ([`super::METADATA_FULL`]) (the reclaimer behind), a sync of a fragmented file also
//!   rewrites a few of that file's windows itself, after its own data is durable: the file
//!   that fragments the metadata pays, as an allocation on a full device runs GC. (Not when
//!   no zone outside GC's reserve is left: the copy would wait for GC.)
//! - Past [`METADATA_HARD`] (7/16 of a zone), whatever the space, a flush about to add
//!   extents first rewrites windows on its own call (its file's, then the most fragmented
//!   file's), running GC there if the copies need it, until the estimate is under that
//!   line again; where nothing is worth rewriting, the flush fails with ENOSPC (its data
//!   stays dirty, and the next sync reports it). This is the backstop: a file written at
//!   random with few syncs, or on a nearly full device where the syncs skip their rewrite
//!   and GC keeps the reclaimer busy, outran the two above and stopped the store. Flushes
//!   also wake the reclaimer for defragmentation (before, only commits did).
//!
//! A window is [`MAX_EXTENT_BLOCKS`] blocks of a file, aligned, and is worth rewriting when
//! that makes at least [`MIN_GAIN`] of its extents fewer. A window is copied like a GC move
//! ([`super::gc`]): planned under the lock, read pinned with no lock held and checked against
//! its checksums, written as new extents of the file's own stream (where the application's
//! writes of it go), and each new extent mapped only if the file still maps exactly the
//! pieces that were read. A window overwritten meanwhile keeps its new data, and the copy
//! is dead. The bytes written count as device bytes of the stream (in its WAF) and in
//! `defrag_bytes_moved`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::extent_map::{Extent, MAX_EXTENT_BLOCKS};
use super::gc::maps;
use super::state::{FileKind, Ino, MetaOp};
use super::work::WorkStart;
use super::zone_map::StreamKey;
use super::{Inner, Store};
use crate::device::ZoneId;
use crate::hint::Class;
use crate::{Error, Result};

/// What one extent (with its checksum unit) adds to a checkpoint, about: postcard's
/// variable-length integers for the file block, zone, block and length, and the unit's
/// block, length and crc.
const EXTENT_BYTES: u64 = 16;

/// A window must lose this many extents to be worth its copy (at most 16 blocks copied
/// for each extent fewer).
const MIN_GAIN: usize = MAX_EXTENT_BLOCKS as usize / 16;

/// Past this share of a metadata zone's capacity a flush makes room for its extents before
/// it adds them (see the module docs): far enough under the half a checkpoint may take for
/// the flushes running at once to add theirs (a few extents each).
const METADATA_HARD: (u64, u64) = (7, 16);

/// Rounds of rewriting a flush past [`METADATA_HARD`] runs before it gives up with ENOSPC.
const HARD_ROUNDS: usize = 8;

/// Windows one pass of the reclaimer rewrites (4 MiB of 4 KiB blocks at most), and one
/// sync past the line.
const PASS_WINDOWS: usize = 8;
const SYNC_WINDOWS: usize = 2;

/// Where a file (or the store) that had `extents` and nothing worth rewriting is looked at
/// again: once it has an eighth more (and at least [`MIN_GAIN`] more), so that the scans
/// cost a few steps per extent made, however large the file.
fn rescan_at(extents: usize) -> usize {
    extents + (extents / 8).max(MIN_GAIN)
}

/// Where defragmentation stands on one file.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Cursor {
    /// The window to look at first.
    next_window: u64,
    /// Nothing to rewrite until the file has this many extents.
    quiet_below: usize,
}

/// The mapped pieces of one window, in file order, grouped into runs of consecutive file
/// blocks (a hole ends a run): each run becomes one new extent.
type Runs = Vec<Vec<(u64, Extent)>>;

impl Inner {
    /// What the next checkpoint will hold, about: the newest checkpoint's size, the names
    /// made since (as [`Inner::metadata_room`] counts them) and [`EXTENT_BYTES`] for each
    /// extent more (or fewer) than it held.
    pub(super) fn metadata_estimate(&self) -> u64 {
        let now = self.state.extents as u64 * EXTENT_BYTES;
        let then = self.extents_at_checkpoint as u64 * EXTENT_BYTES;
        (self.checkpoint_len + self.names_since_checkpoint + now).saturating_sub(then)
    }

    /// Where the reclaimer starts rewriting windows (see the module docs).
    fn defrag_start(&self) -> u64 {
        let quarter = self.state.geometry.zone_capacity / 4;
        self.config.defrag_start_bytes.unwrap_or(quarter)
    }

    /// Whether the reclaimer should rewrite windows (`running`: it already is, and goes on
    /// down to three quarters of the start).
    pub(super) fn defrag_wanted(&self, running: bool) -> bool {
        let start = self.defrag_start();
        let line = if running { start / 4 * 3 } else { start };
        self.state.extents >= self.defrag_quiet_below && self.metadata_estimate() > line
    }

    /// Whether a sync should rewrite some of its own file's windows.
    pub(super) fn defrag_needed(&self) -> bool {
        self.metadata_estimate() > self.defrag_start() / 2 * 3
    }

    /// Whether the metadata is past [`METADATA_HARD`].
    fn metadata_over_hard_line(&self) -> bool {
        let (num, den) = METADATA_HARD;
        self.metadata_estimate() > self.state.geometry.zone_capacity / den * num
    }

    /// Whether no zone outside GC's reserve is free or on its way: a copy would then have
    /// to wait for GC, which a sync should not do for work it did not ask for. (Free zones
    /// below the low watermark are not enough to skip: a store written over keeps them
    /// near it, and its metadata would outgrow a checkpoint meanwhile.)
    fn space_exhausted(&self) -> bool {
        self.free_soon() <= self.config.gc_reserve_zones as usize
    }

    /// The zoned file with the most extents beyond the fewest its size needs, of those
    /// that may have windows worth rewriting.
    fn most_fragmented(&self) -> Option<Ino> {
        let bs = self.state.block_size();
        let per = MAX_EXTENT_BLOCKS as u64;
        let quiet = |ino: &Ino, extents: usize| {
            self.defrag_cursor
                .get(ino)
                .is_some_and(|c| extents < c.quiet_below)
        };
        self.state
            .inodes
            .iter()
            .filter(|(_, n)| n.kind == FileKind::File && n.hint.class != Class::Conventional)
            .filter(|(ino, n)| !quiet(ino, n.extents.len()))
            .map(|(&ino, n)| {
                let fewest = n.size.div_ceil(bs).div_ceil(per) as usize;
                (ino, n.extents.len().saturating_sub(fewest))
            })
            .filter(|&(_, excess)| excess >= MIN_GAIN)
            .max_by_key(|&(_, excess)| excess)
            .map(|(ino, _)| ino)
    }

    /// Up to `count` windows of `ino` worth rewriting, looking from where the last pass
    /// over it stopped and around once; remembers where this one stopped, or that the
    /// file had none.
    fn windows_to_rewrite(&mut self, ino: Ino, count: usize) -> Vec<u64> {
        let Some(inode) = self.state.inodes.get(&ino) else {
            return Vec::new();
        };
        let per = MAX_EXTENT_BLOCKS as u64;
        let cursor = self.defrag_cursor.get(&ino).copied().unwrap_or_default();
        if inode.extents.len() < cursor.quiet_below {
            return Vec::new();
        }
        let from = cursor.next_window;
        let mut found = Vec::new();
        // Extents per window, counted where each extent starts.
        let count_from = |start: u64, end: u64, found: &mut Vec<u64>| {
            let mut window = u64::MAX;
            let mut extents = 0usize;
            let mut windows = inode
                .extents
                .iter_from(start * per)
                .take_while(|(fb, _)| fb / per < end);
            while found.len() < count {
                let next = windows.next();
                let w = next.map(|(fb, _)| fb / per);
                if w != Some(window) {
                    if extents > MIN_GAIN {
                        found.push(window);
                    }
                    extents = 0;
                    window = match w {
                        Some(w) => w,
                        None => break,
                    };
                }
                extents += 1;
            }
        };
        count_from(from, u64::MAX, &mut found);
        if found.len() < count && from > 0 {
            count_from(0, from, &mut found);
        }
        let cursor = match found.last() {
            Some(&last) => Cursor {
                next_window: last + 1,
                quiet_below: 0,
            },
            None => Cursor {
                next_window: 0,
                quiet_below: rescan_at(inode.extents.len()),
            },
        };
        self.defrag_cursor.insert(ino, cursor);
        found
    }

    /// The window's mapped pieces as runs, if rewriting them makes the file's extents
    /// fewer by [`MIN_GAIN`] (and none lies in a zone found damaged: left as it is, as GC
    /// leaves it).
    fn window_runs(&self, ino: Ino, window: u64) -> Option<Runs> {
        let inode = self.state.inodes.get(&ino)?;
        let per = MAX_EXTENT_BLOCKS as u64;
        let mut runs: Runs = Vec::new();
        let mut end = u64::MAX;
        for (fb, ext, _) in inode.extents.pieces(window * per, (window + 1) * per) {
            let Some(ext) = ext else {
                end = u64::MAX;
                continue;
            };
            if self.damaged.contains(&ext.zone) {
                return None;
            }
            match runs.last_mut() {
                Some(run) if fb == end => run.push((fb, ext)),
                _ => runs.push(vec![(fb, ext)]),
            }
            end = fb + ext.len as u64;
        }
        let pieces: usize = runs.iter().map(Vec::len).sum();
        (pieces >= runs.len() + MIN_GAIN).then_some(runs)
    }
}

impl Store {
    /// One pass of the reclaimer: rewrites windows of the most fragmented file. Returns
    /// whether it rewrote any (and should be called again).
    pub(super) fn defrag_pass(&self) -> Result<bool> {
        let start = WorkStart::now();
        let (ino, tenant, windows) = {
            let mut inner = self.lock()?;
            let Inner {
                defrag_cursor,
                state,
                ..
            } = &mut *inner;
            defrag_cursor.retain(|ino, _| state.inodes.contains_key(ino));
            let Some(ino) = inner.most_fragmented() else {
                inner.defrag_quiet_below = rescan_at(inner.state.extents);
                return Ok(false);
            };
            let tenant = inner.state.inode(ino)?.tenant;
            (ino, tenant, inner.windows_to_rewrite(ino, PASS_WINDOWS))
        };
        let mut rewritten = false;
        let done: Result<()> = windows.into_iter().try_for_each(|window| {
            rewritten |= self.rewrite_window(ino, window)?;
            Ok(())
        });
        // The pass is the file's tenant's work (on the reclaimer's thread).
        self.charge_work(tenant, start);
        done?;
        let mut inner = self.lock()?;
        match rewritten {
            true => inner.counters.defrag_passes += 1,
            // Scanning every file again at each commit would hold the lock for nothing.
            false => inner.defrag_quiet_below = rescan_at(inner.state.extents),
        }
        Ok(rewritten)
    }

    /// After a sync of `ino` past the line ([`Inner::defrag_needed`]), rewrites a few of
    /// its windows (see the module docs). A failure here is not the sync's (its data is
    /// durable by then): a full device only leaves the windows as they are, and a failing
    /// one fails the next write.
    pub(super) fn defrag_on_sync(&self, ino: Ino) {
        if let Err(e) = self.try_defrag_on_sync(ino) {
            if let Ok(mut inner) = self.lock() {
                let why = format!("inode {ino}, after its sync: {e}");
                inner.counters.last_defrag_failure = Some(why);
            }
        }
    }

    fn try_defrag_on_sync(&self, ino: Ino) -> Result<()> {
        let windows = {
            let mut inner = self.lock()?;
            if inner.space_exhausted() {
                return Ok(());
            }
            inner.windows_to_rewrite(ino, SYNC_WINDOWS)
        };
        let mut rewritten = false;
        for window in windows {
            rewritten |= self.rewrite_window(ino, window)?;
        }
        if rewritten {
            self.lock()?.counters.defrag_sync_passes += 1;
        }
        Ok(())
    }

    /// The stream a flush of `ino` writes to ([`Inner::stream_of`]), once the metadata has
    /// room for the flush's extents: wakes the reclaimer if the metadata is past its line,
    /// and past [`METADATA_HARD`] first rewrites windows on this call (see the module
    /// docs). One lock in the common case, as a flush took before.
    pub(super) fn flush_stream(&self, ino: Ino) -> Result<(StreamKey, crate::Hint, u64)> {
        let (stream, wanted, hard) = {
            let inner = self.lock()?;
            let stream = inner.stream_of(ino)?;
            (
                stream,
                inner.defrag_wanted(false),
                inner.metadata_over_hard_line(),
            )
        };
        if wanted {
            self.shared.reclaimer.wake_for_defrag();
        }
        if !hard {
            return Ok(stream);
        }
        self.room_for_extents(ino)?;
        self.stream_of(ino)
    }

    /// Past [`METADATA_HARD`], rewrites windows (of `ino`'s file first) until the metadata
    /// is under it. ENOSPC when nothing is worth rewriting: the metadata is then full of
    /// names and extents that only removals can make fewer.
    fn room_for_extents(&self, ino: Ino) -> Result<()> {
        let mut own = Some(ino);
        for _ in 0..HARD_ROUNDS {
            let (ino, windows) = {
                let mut inner = self.lock()?;
                if !inner.metadata_over_hard_line() {
                    return Ok(());
                }
                let Some(ino) = own.take().or_else(|| inner.most_fragmented()) else {
                    break;
                };
                (ino, inner.windows_to_rewrite(ino, PASS_WINDOWS))
            };
            let mut rewritten = false;
            for window in windows {
                rewritten |= self.rewrite_window(ino, window)?;
            }
            if rewritten {
                self.lock()?.counters.defrag_flush_passes += 1;
            }
        }
        let inner = self.lock()?;
        if !inner.metadata_over_hard_line() {
            return Ok(());
        }
        Err(Error::NoSpace(format!(
            "the store's metadata is full ({} bytes of a checkpoint that may take {}): \
             remove files to make room",
            inner.metadata_estimate(),
            inner.state.geometry.zone_capacity / 2
        )))
    }

    /// Copies one window's runs into new extents of the file's stream. Returns whether
    /// any was copied.
    fn rewrite_window(&self, ino: Ino, window: u64) -> Result<bool> {
        let bs = self.shared.device.geometry().block_size as u64;
        let (runs, reads, resets) = {
            let inner = self.lock()?;
            let Some(runs) = inner.window_runs(ino, window) else {
                return Ok(false);
            };
            // Pin every piece's zone (not reset under the reader) with its units.
            let reads: Vec<_> = runs
                .iter()
                .flatten()
                .map(|&(_, ext)| {
                    self.shared.pins[ext.zone as usize].fetch_add(1, Ordering::AcqRel);
                    inner.state.units.covering(ext.zone, ext.block, ext.len)
                })
                .collect();
            // The resets of the zones read so far, to tell them apart from the same zones
            // reset and written again by the time the copy is mapped.
            let resets: HashMap<ZoneId, u64> = runs
                .iter()
                .flatten()
                .map(|&(_, ext)| (ext.zone, inner.zone_resets[ext.zone as usize]))
                .collect();
            (runs, reads, resets)
        };
        let pieces: Vec<Extent> = runs.iter().flatten().map(|&(_, ext)| ext).collect();
        let mut data = Vec::with_capacity(pieces.len());
        let mut failed = None;
        for (ext, (units, complete)) in pieces.iter().zip(&reads) {
            if failed.is_none() {
                match self.read_verified(ext.zone, ext.block, ext.len, units, *complete) {
                    Ok(Ok((bytes, _))) => data.push(bytes),
                    Ok(Err(mismatch)) => failed = Some(Ok(mismatch)),
                    Err(e) => failed = Some(Err(e)),
                }
            }
            self.unpin(ext.zone);
        }
        match failed {
            None => {}
            Some(Err(e)) => return Err(e),
            // Left where it is, as GC leaves it: the zone is damaged, and fsck says so.
            Some(Ok(mismatch)) => {
                self.lock()?.note_damage(&mismatch);
                return Ok(false);
            }
        }
        // The stream and lifetime group the file's own flushes write to now.
        let (key, hint) = match self.stream_of(ino) {
            Ok((key, hint, _)) => (key, hint),
            Err(Error::NotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
        let mut data = data.into_iter();
        for run in &runs {
            let bytes: Vec<u8> = run.iter().flat_map(|_| data.next().unwrap()).collect();
            let first = run[0].0;
            let mut done = 0u64;
            while done * bs < bytes.len() as u64 {
                let want = (bytes.len() as u64 / bs - done) as u32;
                let r = self.allocate(key, &hint, want, false)?;
                let copy = &bytes[(done * bs) as usize..((done + r.blocks as u64) * bs) as usize];
                let crc = self.write_copy(r, copy)?;
                let mut inner = self.lock()?;
                let c = inner.counters.streams.entry(key).or_default();
                c.device += copy.len() as u64;
                inner.counters.defrag_bytes += copy.len() as u64;
                // Mapped only over blocks the file still maps where they were read from, in
                // zones not reset since (the pins were let go after the reads: a zone reset
                // and written again could map the same blocks with other data).
                let (lo, hi) = (first + done, first + done + r.blocks as u64);
                let current = run.iter().all(|&(fb, ext)| {
                    let (from, to) = (fb.max(lo), (fb + ext.len as u64).min(hi));
                    let skip = (from - fb) as u32;
                    from >= to
                        || (inner.zone_resets[ext.zone as usize] == resets[&ext.zone]
                            && maps(&inner, ino, from, ext.slice(skip, (to - from) as u32)))
                });
                if current {
                    inner.record(MetaOp::MapExtent {
                        ino,
                        file_block: lo,
                        extent: r.extent(),
                        crc,
                    })?;
                }
                drop(inner);
                self.unpin(r.zone);
                done += r.blocks as u64;
            }
        }
        Ok(true)
    }
}
