//! Periodic writeback: what guests wrote and never synced reaches the device within
//! [`StoreConfig::writeback`] (30 s under `valet-run`), as the kernel's flusher (dirty data
//! older than 30 s by default) bounds what a native program loses when the host crashes.
//!
//! Without it, unsynced data lived only in the store's buffers and pending metadata until
//! a sync, a close or the unmount: a process killed by SIGKILL or the OOM killer, or a
//! power cut, lost everything a guest had written since its last sync, however long ago,
//! files created included. A program that never syncs (a cache, a log written with
//! `sync=false`) could lose hours. With it, such a crash loses at most the last interval
//! or so, like a crash of the host under Linux.
//!
//! Each round, the thread takes every open file with bytes no sync covered and syncs it
//! as an fsync would (small tails go inline in the journal, larger ones to their zones),
//! then commits everything recorded, in one journal write and one device flush. It does
//! nothing when nothing is unsynced. It is a store thread like the reclaimer (background
//! priority, a non-user handle), stopped before the others when the store closes; a
//! failure is left for the next sync of a guest to report (the commit marks the store).
//!
//! [`StoreConfig::writeback`]: super::StoreConfig::writeback

use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::commit::Asker;
use super::{Error, Ino, Result, Store};

/// The writeback thread and how to stop it, kept in the store.
#[derive(Default)]
pub(super) struct Writeback {
    stop: Mutex<bool>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writeback {
    /// Starts the thread; `store` is its own handle to the store.
    pub fn start(&self, store: Store, interval: Duration) {
        let thread = crate::background::spawn("valet-writeback", move || run(store, interval))
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

fn run(store: Store, interval: Duration) {
    while store.shared.writeback.rest(interval) {
        // A failure stopped the store or failed a commit: the guests' next calls say so.
        if store.write_back().is_err() {
            return;
        }
    }
}

impl Store {
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
        for ino in dirty {
            match self.sync_file(ino) {
                // Closed and settled, or removed, since the list was taken.
                Err(Error::NotFound | Error::BadHandle) => {}
                other => other?,
            }
        }
        self.commit_for(Asker::Store)?;
        let mut inner = self.lock()?;
        inner.counters.writebacks += 1;
        inner.counters.writeback_ns += started.elapsed().as_nanos() as u64;
        Ok(())
    }
}
