//! The reclaimer: GC in the background, against free-zone watermarks, and
//! defragmentation when the metadata nears what a checkpoint can hold ([`super::defrag`]).
//!
//! When an allocation leaves fewer than [`StoreConfig::gc_low_zones`] zones free, it wakes
//! the reclaimer's thread and goes on. The reclaimer makes durable what lets emptied zones
//! be reset (a commit), then collects victims worth it (ones that free an eighth of a zone
//! or more) until [`StoreConfig::gc_high_zones`] zones are free or nothing is worth moving.
//!
//! It is throttled: after each pass it rests in proportion to the time the pass took, so
//! that it takes at most [`StoreConfig::gc_share_percent`] of the device's time while the
//! device is not short. Only when no zone outside the reserve is left (the device really
//! full, or the reclaimer behind) does an allocation collect on its own call, as before
//! (`gc_foreground_passes` counts those).
//!
//! One GC pass runs at a time (`Inner::collecting` names its victim): passes at once would
//! each take GC's reserve of free zones for their copies. An allocation that needs space
//! while the reclaimer's pass runs waits for it, rather than start another or report ENOSPC.
//!
//! The thread holds a non-user handle of the store; dropping the last user handle stops it
//! (see [`Reclaimer::stop`]), as it does the background writer.
//!
//! [`StoreConfig::gc_low_zones`]: super::StoreConfig::gc_low_zones
//! [`StoreConfig::gc_high_zones`]: super::StoreConfig::gc_high_zones
//! [`StoreConfig::gc_share_percent`]: super::StoreConfig::gc_share_percent

use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Store;

/// What the allocations and commits tell the reclaimer.
#[derive(Default)]
struct Signal {
    /// Free zones fell below the low watermark: reset and collect up to the high one.
    wanted: bool,
    /// A guest's commit made zones' death durable: reset them (and collect nothing).
    resets: bool,
    /// A commit found the metadata past the line where fragmented files are rewritten.
    defrag: bool,
    stop: bool,
}

/// What a wake-up asks of the reclaimer's round.
#[derive(Clone, Copy)]
struct Round {
    collect: bool,
    defrag: bool,
}

/// The reclaimer's signal and thread, kept in the store.
#[derive(Default)]
pub(super) struct Reclaimer {
    signal: Mutex<Signal>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Reclaimer {
    /// Starts the thread; `store` is its own handle to the store.
    pub fn start(&self, store: Store) {
        let thread = crate::background::spawn("valet-reclaim", move || run(store))
            .expect("spawning the store's reclaimer thread");
        *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
    }

    /// Asks for a round of reclaiming (free zones fell below the low watermark).
    pub fn wake(&self) {
        let mut signal = self.signal.lock().unwrap_or_else(|p| p.into_inner());
        if !signal.wanted {
            signal.wanted = true;
            self.wake.notify_one();
        }
    }

    /// Asks for the zones waiting for a reset to be reset (a guest's sync left them).
    pub fn wake_for_resets(&self) {
        let mut signal = self.signal.lock().unwrap_or_else(|p| p.into_inner());
        if !signal.resets && !signal.wanted {
            signal.resets = true;
            self.wake.notify_one();
        }
    }

    /// Asks for fragmented files to be rewritten (see [`super::defrag`]).
    pub fn wake_for_defrag(&self) {
        let mut signal = self.signal.lock().unwrap_or_else(|p| p.into_inner());
        if !signal.defrag {
            signal.defrag = true;
            self.wake.notify_one();
        }
    }

    /// Stops the thread after its current pass and waits for it.
    pub fn stop(&self) {
        self.signal.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.wake.notify_one();
        crate::background::join(&self.thread);
    }

    /// Waits for a wake-up: what it asks for (resets are always done), or None once the
    /// store is stopping.
    fn wait_for_work(&self) -> Option<Round> {
        let mut signal = self.signal.lock().unwrap_or_else(|p| p.into_inner());
        while !signal.wanted && !signal.resets && !signal.defrag && !signal.stop {
            signal = self.wake.wait(signal).unwrap_or_else(|p| p.into_inner());
        }
        let round = Round {
            collect: signal.wanted,
            defrag: signal.defrag,
        };
        signal.wanted = false;
        signal.resets = false;
        signal.defrag = false;
        (!signal.stop).then_some(round)
    }

    /// Rests for `time` unless the store stops meanwhile; false once it is stopping.
    fn rest(&self, time: Duration) -> bool {
        crate::background::rest(&self.signal, &self.wake, time, |s| s.stop)
    }
}

fn run(store: Store) {
    let reclaimer = &store.shared.reclaimer;
    // The configuration never changes after mount.
    let share = match store.lock() {
        Ok(inner) => inner.config.gc_share_percent.clamp(1, 100) as u32,
        Err(_) => return,
    };
    while let Some(mut round) = reclaimer.wait_for_work() {
        loop {
            let started = Instant::now();
            // A failure here (a device error, a stopped store) is met again, and reported,
            // by the allocation that needs the space; the reclaimer only waits for the next
            // wake-up.
            let Ok(progress) = store.reclaim_pass(&mut round) else {
                break;
            };
            if !progress {
                break;
            }
            let rest = started.elapsed() * (100 - share) / share;
            if !reclaimer.rest(rest) {
                return;
            }
        }
    }
}

impl Store {
    /// One step of the reclaimer: a commit when emptied zones wait for one, else (in a
    /// round that may `collect`) one GC pass while fewer than the high watermark of zones
    /// are free, else (in a round that may `defrag`) one defragmentation pass while the
    /// metadata is past its line. Returns whether it did anything (and should be called
    /// again).
    fn reclaim_pass(&self, round: &mut Round) -> crate::Result<bool> {
        let (commit, collect, free) = {
            let inner = self.lock()?;
            // Zones waiting for their reset are free space on its way: collecting while
            // they count toward the watermark would move data for nothing.
            let below_high = (inner.free_soon() as u32) < inner.config.gc_high_zones;
            let commit = inner.resettable_now();
            round.defrag = round.defrag && inner.defrag_wanted(true);
            let collect = round.collect && below_high && !commit;
            (commit, collect, inner.free.len())
        };
        if commit {
            self.commit_for_resets()?;
            // A commit with nothing new to make durable resets nothing: no progress then
            // (the next commit of anyone's sync does it).
            return Ok(self.lock()?.free.len() > free);
        }
        if collect {
            let moved = self.collect(super::gc::Pick::Ahead)?;
            if moved {
                self.lock()?.counters.gc_background_passes += 1;
                return Ok(true);
            }
        }
        if round.defrag {
            round.defrag = self.defrag_pass()?;
        }
        Ok(round.defrag)
    }
}
