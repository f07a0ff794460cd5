//! Periodic writeback: what guests wrote and never synced reaches the host within
//! [`StoreConfig::handoff`] (5 s under `valet-run`) and the device's media within
//! [`StoreConfig::writeback`] (30 s), as a native program's writes are in the page cache at
//! once and the kernel's flusher writes dirty data older than 30 s back by default.
//!
//! Without it, unsynced data lived only in the store's buffers and pending metadata until
//! a sync, a close or the unmount: a process killed by SIGKILL or the OOM killer, or a
//! power cut, lost everything a guest had written since its last sync, however long ago,
//! files created included. A program that never syncs (a cache, a log written with
//! `sync=false`) could lose hours.
//!
//! Two kinds of round, on one thread at background priority (a non-user handle, stopped
//! before the store's other threads when it closes). Each does nothing when nothing is
//! unsynced, and a failure is left for the next sync of a guest to report (one file's
//! failure for that file's; only a stopped store ends the thread).
//!
//! - **A hand-off** writes the unsynced bytes of every open zoned file not written since the
//!   last round to the device as an fsync would (small tails inline in the journal, larger
//!   ones to their zones) and the pending metadata as one journal record (the full buffers
//!   of files being written included), and flushes nothing. The host's page cache (the
//!   image) or the drive (zonefs, FDP) then holds all of it, so a killed process loses
//!   nothing older than a hand-off: the next mount replays the record. A power cut can
//!   lose any of it: each record says how many before it no flush had covered yet, and
//!   recovery checks those against their data (see the store's mount and journal). Files of
//!   the conventional area are left to the durable rounds: their bytes are in the host's
//!   page cache as they are written, but journaling their sizes before their host files'
//!   fsync could make a tail read as zeros after a power cut. Without the flush a hand-off
//!   does not make the host write out the image's dirty pages at once, which a flush every
//!   second would (the kernel's flusher does it at its own pace).
//! - **A durable round** (every `writeback`) does the same for every file, the
//!   conventional area included (an fsync of each dirty host file), then commits, in one
//!   journal write and one device flush.
//!
//! [`StoreConfig::writeback`]: super::StoreConfig::writeback

use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::commit::Asker;
use super::{Error, Ino, Result, Store};
use crate::hint::Class;

/// The writeback thread and how to stop it, kept in the store.
#[derive(Default)]
pub(super) struct Writeback {
    stop: Mutex<bool>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writeback {
    /// Starts the thread; `store` is its own handle to the store. Durable rounds every
    /// `writeback`, hand-offs every `handoff` in between.
    pub fn start(&self, store: Store, writeback: Option<Duration>, handoff: Option<Duration>) {
        let thread =
            crate::background::spawn("valet-writeback", move || run(store, writeback, handoff))
                .expect("spawning the store's writeback thread");
        *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
    }

    /// Stops the thread after its current round and waits for it.
    pub fn stop(&self) {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_one();
        crate::background::join(&self.thread);
    }

    /// Waits `time` unless the store stops meanwhile; false once it is stopping.
    fn rest(&self, time: Duration) -> bool {
        crate::background::rest(&self.stop, &self.wake, time, |stop| *stop)
    }
}

fn run(store: Store, writeback: Option<Duration>, handoff: Option<Duration>) {
    let tick = match (writeback, handoff) {
        (Some(w), Some(h)) => w.min(h),
        (w, h) => w.or(h).unwrap_or(Duration::MAX),
    };
    let mut last_durable = Instant::now();
    while store.shared.writeback.rest(tick) {
        let durable = writeback.is_some_and(|w| last_durable.elapsed() >= w);
        let round = match durable {
            true => {
                last_durable = Instant::now();
                store.write_back()
            }
            false => store.hand_off(),
        };
        // A failed commit stopped the store: the guests' next calls say so. Any other
        // failure was one file's, and stays with it (see `sync_files`).
        if let Err(Error::Stopped(_)) = round {
            return;
        }
    }
}

impl Store {
    /// One hand-off, as the writeback thread makes every [`StoreConfig::handoff`]: writes
    /// the unsynced bytes of every open zoned file not written since the last round to the
    /// device, then the pending metadata as one journal record, with no flush. Returns once
    /// they are written. A killed process keeps all of it; a power cut may not (only a sync
    /// or a commit makes it durable).
    ///
    /// [`StoreConfig::handoff`]: super::StoreConfig::handoff
    pub fn hand_off(&self) -> Result<()> {
        let dirty: Vec<Ino> = {
            let mut inner = self.lock()?;
            inner.counters.handoff_rounds += 1;
            let conventional = |ino: Ino| {
                inner
                    .state
                    .inode(ino)
                    .is_ok_and(|i| i.hint.class == Class::Conventional)
            };
            // A file written since the last round is being written now: handing its window
            // off would hold its writer up for a device write (and on a busy machine for as
            // long as this background thread waits for a core), and its full buffers reach
            // the device anyway, each journaled by the next round. Its window waits for a
            // pause, a sync or a close. One with buffers on their way to the device would
            // have to wait for them too (a file's extents are mapped in the order its bytes
            // were written).
            let since = inner.handoff_tick;
            let idle = |ino: &Ino| {
                inner
                    .open
                    .get(ino)
                    .is_some_and(|of| of.last_use <= since && of.inflight.is_empty())
            };
            let dirty: Vec<Ino> = inner
                .open
                .keys()
                .copied()
                .filter(|&ino| !inner.bytes_durable(ino) && !conventional(ino) && idle(&ino))
                .collect();
            inner.handoff_tick = inner.tick;
            if inner.pending.is_empty() && dirty.is_empty() {
                return Ok(());
            }
            dirty
        };
        let started = Instant::now();
        self.sync_files(dirty)?;
        let mut written = false;
        self.shared
            .commit
            .hand_off(|| {
                written = self.lead_hand_off().map_err(|e| e.to_string())?;
                Ok(())
            })
            .map_err(Error::Stopped)?;
        if !written {
            // The journal zone is due for a checkpoint, which a commit writes.
            self.commit_for(Asker::Store)?;
        }
        let mut inner = self.lock()?;
        inner.counters.handoffs += 1;
        inner.counters.handoff_ns += started.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// A hand-off's journal write, by the holder of the leader role: every pending
    /// operation as one transaction, and no flush. Zone resets and the conventional area's
    /// removals wait for a commit, which makes the record durable first. Returns false,
    /// writing nothing, when a checkpoint is due instead.
    fn lead_hand_off(&self) -> Result<bool> {
        let mut journal = self.shared.commit.journal();
        // Taken under the store lock and encoded without it: a second's operations can be
        // many, and the guests' writes need the lock meanwhile. Operations recorded from
        // here on are newer, and go to the next record.
        let (ops, full) = {
            let mut inner = self.lock()?;
            if inner.pending.is_empty() {
                return Ok(true);
            }
            let full = inner
                .metadata_full_bytes()
                .saturating_sub(inner.names_since_checkpoint);
            (std::mem::take(&mut inner.pending), full)
        };
        let record = journal.encode_transaction(&ops)?;
        if journal.checkpoint_due(&record, full)? {
            // Back in front of the newer ones, for the commit that checkpoints.
            let mut inner = self.lock()?;
            let newer = std::mem::replace(&mut inner.pending, ops);
            inner.pending.extend(newer);
            return Ok(false);
        }
        if let Err(e) = journal.append_record(&record) {
            journal.note_failure();
            return Err(e);
        }
        let bytes = journal.bytes_written;
        self.lock()?.meta_bytes = bytes;
        Ok(true)
    }

    /// Writes the unsynced bytes of `inos` to the device as an fsync would, without a commit.
    /// One file's failure does not hold the others up: it stays with the file (its buffers
    /// queued with their error, its host file's failed sync) for the file's own next sync
    /// to report.
    fn sync_files(&self, inos: Vec<Ino>) -> Result<()> {
        for ino in inos {
            // Other errors: closed and settled, or removed, since the list was taken; or
            // this file's own failure.
            if let Err(e @ Error::Stopped(_)) = self.work_for_file(ino, || self.sync_file(ino)) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// One round: syncs every open file holding unsynced bytes, then commits whatever is
    /// recorded and not yet durable. Returns once it is durable.
    fn write_back(&self) -> Result<()> {
        let (dirty, durable) = {
            let inner = self.lock()?;
            let dirty: Vec<Ino> = inner
                .open
                .keys()
                .copied()
                .filter(|&ino| !inner.bytes_durable(ino))
                .collect();
            (dirty, self.shared.commit.is_durable(inner.changes))
        };
        if dirty.is_empty() && durable {
            return Ok(());
        }
        let started = Instant::now();
        self.sync_files(dirty)?;
        self.commit_for(Asker::Store)?;
        let mut inner = self.lock()?;
        inner.counters.writebacks += 1;
        inner.counters.writeback_ns += started.elapsed().as_nanos() as u64;
        Ok(())
    }
}
