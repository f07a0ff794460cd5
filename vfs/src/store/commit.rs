//! Group commit: concurrent syncs share one journal write and one device flush.
//!
//! Every change to the store's metadata and every device write bumps a change counter
//! (`Inner::changes`). A sync asks for its counter value to become durable. The first
//! syncer to find no commit running becomes the leader: it takes every pending operation
//! (under the store lock, briefly), writes them as one journal transaction and flushes the
//! device, all without the store lock, then publishes the counter value it made durable.
//! Syncers that arrived meanwhile wait; when the leader is done, those covered return at
//! once and the rest elect the next leader, whose commit covers all of them. So N
//! concurrent syncers cost at most two flushes, not N.
//!
//! A sync returns only after a flush that began after its data and its journal record were
//! written completed: the leader takes the operations after the syncer recorded them, and
//! flushes after writing them.
//!
//! A failed device flush is sticky: the host may have dropped the dirty pages, so nothing
//! written before it can be promised any more. Every later commit reports the failure
//! (PostgreSQL's "fsyncgate" lesson) and the store refuses writes.

use std::sync::{Condvar, Mutex, MutexGuard};

use super::journal::Journal;

/// The leader role, the durable point, and the journal the leader writes.
pub(super) struct GroupCommit {
    state: Mutex<CommitState>,
    done: Condvar,
    /// Taken only by the leader (and by mount, before anyone else runs).
    journal: Mutex<Journal>,
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
}

/// What a leader reports after one commit.
pub(super) enum Led {
    /// Changes up to this value are durable.
    Durable(u64),
    /// The commit failed; changes up to this value are not durable.
    Failed(u64, String),
}

impl GroupCommit {
    pub fn new(journal: Journal) -> Self {
        GroupCommit {
            state: Mutex::new(CommitState::default()),
            done: Condvar::new(),
            journal: Mutex::new(journal),
        }
    }

    fn state(&self) -> MutexGuard<'_, CommitState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        mut lead: impl FnMut() -> Led,
    ) -> std::result::Result<(), String> {
        let mut st = self.state();
        let mut waited = false;
        loop {
            if let Some((upto, why)) = &st.failed {
                if *upto >= target || st.durable < target {
                    return Err(why.clone());
                }
            }
            if st.durable >= target {
                if waited {
                    st.joined += 1;
                }
                return Ok(());
            }
            if !st.leading {
                st.leading = true;
                drop(st);
                let led = lead();
                st = self.state();
                st.leading = false;
                st.commits += 1;
                match led {
                    Led::Durable(upto) => st.durable = st.durable.max(upto),
                    Led::Failed(upto, why) => st.failed = Some((upto.max(target), why)),
                }
                self.done.notify_all();
                continue;
            }
            waited = true;
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether a commit failed (the store then refuses writes).
    pub fn failure(&self) -> Option<String> {
        self.state().failed.as_ref().map(|(_, why)| why.clone())
    }

    /// (commits led, syncs that joined another's commit).
    pub fn counts(&self) -> (u64, u64) {
        let st = self.state();
        (st.commits, st.joined)
    }
}
