//! Group commit: concurrent syncs share one journal write and one device flush.
//!
//! Every change to the store's metadata and every device write bumps a change counter
//! (`Inner::changes`). A sync asks for a counter value to become durable: a guest's fsync,
//! fdatasync or close the value of its own file's newest change (`Inner::undurable`), so a
//! file whose changes a commit already covered costs nothing; the store's own commits the
//! current value. The journal is one sequence, so a commit also covers every change made
//! before the ones asked for (a file's create before its data, a zone before its
//! extents). The first
//! syncer to find no commit running becomes the leader: it takes every pending operation
//! (under the store lock, briefly), writes them as one journal transaction and flushes the
//! device, all without the store lock, then publishes the counter value it made durable.
//! Syncers that arrived meanwhile wait; when the leader is done, those covered return at
//! once and the rest elect the next leader, whose commit covers all of them. So N
//! concurrent syncers cost at most two flushes, not N.
//!
//! **Batching.** Syncers in closed loops (a log per tenant, a thread per file, each
//! appending a record and syncing it) would split into two halves that take turns: the
//! one that returns first leads alone while the others are still finishing their records,
//! and every flush carries half of them. So a leader first waits briefly for the syncers
//! that took part in the last two commits and are not here yet (as ext4's jbd2 waits for
//! other sync writers before a commit), for at most half a recent commit's time and never
//! more than [`MAX_BATCH_WAIT`]. A syncer that does not come in that time is forgotten
//! until it syncs again, so a thread that stopped syncing costs one wait, and a lone
//! syncer never waits. The wait costs a flush's latency at most half a flush, and it lets
//! every flush carry every syncer. The last expected syncer to arrive leads the commit in
//! the waiting leader's place without waking it (the leader sleeps on until that commit
//! ends, like any other syncer), so no thread is woken between the last record and the
//! journal write; the ones before it do not wake the leader either (it could do nothing
//! but sleep again, and on a machine with more busy threads than cores each such wake-up
//! costs a syncer its core).
//!
//! A sync returns only after a flush that began after its data and its journal record were
//! written completed: the leader takes the operations after the syncer recorded them, and
//! flushes after writing them.
//!
//! A failed device flush is sticky: the host may have dropped the dirty pages, so nothing
//! written before it can be promised any more. Every later commit reports the failure
//! (PostgreSQL's "fsyncgate" lesson) and the store refuses writes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use super::journal::Journal;

/// The longest a leader waits for expected syncers before it commits without them.
pub(super) const MAX_BATCH_WAIT: Duration = Duration::from_millis(1);

/// Who asks for a commit: a guest's fsync, fdatasync or close (which a leader waits for
/// when it is expected), or the store itself (allocation, reclaim, metadata pressure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Asker {
    Sync,
    Store,
}

/// The leader role, the durable point, and the journal the leader writes.
pub(super) struct GroupCommit {
    state: Mutex<CommitState>,
    /// Signalled when a commit ends; a leader waiting for expected syncers waits on it too.
    done: Condvar,
    /// Taken only by the leader (and by mount, before anyone else runs).
    journal: Mutex<Journal>,
    /// Set once `CommitState::failed` is: every write asks, and the answer is almost always
    /// no, which needs no lock that a commit holds.
    any_failed: AtomicBool,
}

#[derive(Default)]
struct CommitState {
    leading: bool,
    /// Every change up to this counter value is durable.
    durable: u64,
    /// The last failed commit: the counter value it tried to make durable, and why.
    failed: Option<(u64, String)>,
    /// Commits run by a leader (each one journal write and one device flush at most).
    commits: u64,
    /// Syncs that found their changes already made durable by another's commit.
    joined: u64,
    /// Threads waiting for a commit to end.
    sleepers: usize,
    /// Guest syncs inside [`GroupCommit::make_durable`], with their targets (a covered one
    /// stays listed until it runs again to return).
    waiting: Vec<(ThreadId, u64)>,
    /// Guest syncers of recent commits, with the number of the commit each last took part
    /// in: those the next leader waits for.
    recent: Vec<(ThreadId, u64)>,
    /// The batch a leader is waiting in now (see [`GroupCommit::batch`]); a syncer that
    /// takes the leader role over clears it.
    batching: Option<u64>,
    next_batch: u64,
    /// Moving average of a commit's duration, in nanoseconds.
    commit_ns: u64,
    /// Commits whose leader waited for expected syncers, and the time those waits took.
    batch_waits: u64,
    batch_wait_ns: u64,
}

/// What a leader reports after one commit.
pub(super) enum Led {
    /// Changes up to this value are durable.
    Durable(u64),
    /// The commit failed; changes up to this value are not durable.
    Failed(u64, String),
}

/// What [`GroupCommit::counts`] reports.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CommitCounts {
    pub commits: u64,
    pub joined: u64,
    pub batch_waits: u64,
    pub batch_wait_ns: u64,
}

/// Whether `thread` is among `waiting` for a change past `durable`.
fn uncovered(waiting: &[(ThreadId, u64)], durable: u64, thread: ThreadId) -> bool {
    waiting
        .iter()
        .any(|&(t, target)| t == thread && target > durable)
}

impl CommitState {
    /// Syncers the leader should wait for: part of the last two commits and not here.
    fn expected(&mut self) -> usize {
        let recent_from = self.commits.saturating_sub(2);
        self.recent.retain(|&(_, commit)| commit >= recent_from);
        let (waiting, durable) = (&self.waiting, self.durable);
        self.recent
            .iter()
            .filter(|&&(t, _)| !uncovered(waiting, durable, t))
            .count()
    }

    /// The commit about to run covers every syncer waiting for it now.
    fn note_participants(&mut self) {
        let commit = self.commits;
        let (waiting, recent) = (&self.waiting, &mut self.recent);
        let durable = self.durable;
        for &(t, _) in waiting.iter().filter(|&&(_, target)| target > durable) {
            match recent.iter_mut().find(|(r, _)| *r == t) {
                Some(entry) => entry.1 = commit,
                None => recent.push((t, commit)),
            }
        }
    }

    /// Forgets expected syncers that did not come in time.
    fn forget_absent(&mut self) {
        let (waiting, durable) = (&self.waiting, self.durable);
        self.recent.retain(|&(t, _)| uncovered(waiting, durable, t));
    }
}

impl GroupCommit {
    pub fn new(journal: Journal) -> Self {
        GroupCommit {
            state: Mutex::new(CommitState::default()),
            done: Condvar::new(),
            journal: Mutex::new(journal),
            any_failed: AtomicBool::new(false),
        }
    }

    fn state(&self) -> MutexGuard<'_, CommitState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the end of a commit or hand-off, counted among the sleepers it wakes.
    fn sleep<'a>(&'a self, mut st: MutexGuard<'a, CommitState>) -> MutexGuard<'a, CommitState> {
        st.sleepers += 1;
        let mut st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        st.sleepers -= 1;
        st
    }

    /// Gives the leader role back and wakes whoever waits (after the caller has recorded
    /// what its commit or hand-off did).
    fn end_lead(&self, st: &mut CommitState) {
        st.leading = false;
        // A notify is a system call even with no one waiting: a lone syncer skips it.
        if st.sleepers > 0 {
            self.done.notify_all();
        }
    }

    /// The journal, for the leader (and mount).
    pub fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until changes up to `target` are durable, leading commits with `lead` when no
    /// one else is. Returns the failure of a commit that should have covered `target`.
    pub fn make_durable(
        &self,
        target: u64,
        asker: Asker,
        mut lead: impl FnMut() -> Led,
    ) -> std::result::Result<(), String> {
        let mut st = self.state();
        let me = thread::current().id();
        let counted = asker == Asker::Sync && st.durable < target;
        if counted {
            st.waiting.push((me, target));
        }
        let mut waited = false;
        let result = loop {
            if let Some((upto, why)) = &st.failed {
                if *upto >= target || st.durable < target {
                    break Err(why.clone());
                }
            }
            if st.durable >= target {
                if waited {
                    st.joined += 1;
                }
                break Ok(());
            }
            if !st.leading {
                st.leading = true;
                if asker == Asker::Sync {
                    let handed_over;
                    (st, handed_over) = self.batch(st);
                    if handed_over {
                        // The last expected syncer leads this commit in our place.
                        waited = true;
                        continue;
                    }
                }
                st = self.lead_one(st, target, &mut lead);
                continue;
            }
            if counted && st.batching.is_some() && st.expected() == 0 {
                // The leader waits only for syncers that are all here now: lead in its
                // place rather than wake it. It sleeps on until this commit ends, as the
                // others do, so no wake-up stands between the last record and the flush.
                st.batching = None;
                st = self.lead_one(st, target, &mut lead);
                continue;
            }
            waited = true;
            st = self.sleep(st);
        };
        if counted {
            if let Some(i) = st.waiting.iter().position(|&(t, _)| t == me) {
                st.waiting.swap_remove(i);
            }
        }
        result
    }

    /// One commit by the caller, who holds the leader role: runs `lead` with no lock held.
    fn lead_one<'a>(
        &'a self,
        mut st: MutexGuard<'a, CommitState>,
        target: u64,
        lead: &mut impl FnMut() -> Led,
    ) -> MutexGuard<'a, CommitState> {
        st.note_participants();
        drop(st);
        let started = Instant::now();
        let led = lead();
        let took = started.elapsed().as_nanos() as u64;
        let mut st = self.state();
        st.commits += 1;
        st.commit_ns = match st.commit_ns {
            0 => took,
            avg => avg - avg / 8 + took / 8,
        };
        match led {
            Led::Durable(upto) => st.durable = st.durable.max(upto),
            Led::Failed(upto, why) => {
                st.failed = Some((upto.max(target), why));
                self.any_failed.store(true, Ordering::Release);
            }
        }
        self.end_lead(&mut st);
        st
    }

    /// The leader's wait for the syncers expected to join its commit (see the module docs).
    /// Returns whether the last of them took the leader role over (the caller then only
    /// waits for the commit).
    fn batch<'a>(
        &'a self,
        mut st: MutexGuard<'a, CommitState>,
    ) -> (MutexGuard<'a, CommitState>, bool) {
        // Until one commit is timed there is nothing to size the wait by.
        if st.commit_ns == 0 || st.expected() == 0 {
            return (st, false);
        }
        let patience = Duration::from_nanos(st.commit_ns / 2).min(MAX_BATCH_WAIT);
        let started = Instant::now();
        let deadline = started + patience;
        st.next_batch += 1;
        let id = st.next_batch;
        st.batching = Some(id);
        let handed_over = loop {
            // Only a syncer that took the role over changes it while we wait.
            if st.batching != Some(id) {
                break true;
            }
            let now = Instant::now();
            if st.expected() == 0 || now >= deadline {
                st.batching = None;
                break false;
            }
            // A commit's end wakes us (`done`): the one of a syncer that took over.
            st.sleepers += 1;
            st = match self.done.wait_timeout(st, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
            st.sleepers -= 1;
        };
        if !handed_over {
            st.forget_absent();
        }
        st.batch_waits += 1;
        st.batch_wait_ns += started.elapsed().as_nanos() as u64;
        (st, handed_over)
    }

    /// Runs `lead`, a hand-off (a journal write with no flush, see the store's writeback),
    /// holding the leader role once no commit runs. Durability does not move: a later
    /// commit's flush makes what it wrote durable. A failure is sticky, as a commit's is:
    /// the store's memory then holds operations no journal record does.
    pub fn hand_off(&self, lead: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
        let mut st = self.state();
        while st.leading {
            st = self.sleep(st);
        }
        if let Some((_, why)) = &st.failed {
            return Err(why.clone());
        }
        st.leading = true;
        drop(st);
        let result = lead();
        let mut st = self.state();
        if let Err(why) = &result {
            st.failed = Some((u64::MAX, why.clone()));
            self.any_failed.store(true, Ordering::Release);
        }
        self.end_lead(&mut st);
        result
    }

    /// Whether every change up to `target` is durable.
    pub fn is_durable(&self, target: u64) -> bool {
        self.state().durable >= target
    }

    /// Whether a commit failed (the store then refuses writes).
    pub fn failure(&self) -> Option<String> {
        if !self.any_failed.load(Ordering::Acquire) {
            return None;
        }
        self.state().failed.as_ref().map(|(_, why)| why.clone())
    }

    pub fn counts(&self) -> CommitCounts {
        let st = self.state();
        CommitCounts {
            commits: st.commits,
            joined: st.joined,
            batch_waits: st.batch_waits,
            batch_wait_ns: st.batch_wait_ns,
        }
    }
}
