//! A tenant's space quota (`valet.io/quota`): the bytes its files may hold, counted as the
//! sum of their sizes (each inode once).
//!
//! The adapter asks before every write to a store file ([`crate::wasi::SpaceLimit`]); the
//! quota charges each written byte against a running total without looking at the store,
//! so a write costs one uncontended lock. Overwrites, truncations and deletions are not
//! seen as they happen: when a charge would pass the limit, the quota counts the tenant's
//! files again (a walk of its tree) and only refuses if the true total is over. A walk
//! that found the tenant over its limit is trusted for [`RECOUNT_AFTER`], so a pod
//! hammering a full quota does not walk its tree at every write.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use valet_vfs::{FileKind, Ino, Store};

/// How long a count that found the tenant full is trusted.
pub const RECOUNT_AFTER: Duration = Duration::from_millis(50);

pub struct Quota {
    store: Store,
    root: Ino,
    state: Mutex<State>,
}

struct State {
    limit: u64,
    /// Bytes counted at the last walk plus everything charged since.
    charged: u64,
    /// When the last walk found the tenant over its limit.
    full_since: Option<Instant>,
}

impl Quota {
    /// A quota of `limit` bytes over the tree at `root` (a tenant's root directory).
    pub fn new(store: Store, root: Ino, limit: u64) -> Quota {
        let charged = usage(&store, root);
        Quota {
            store,
            root,
            state: Mutex::new(State {
                limit,
                charged,
                full_since: None,
            }),
        }
    }

    /// Changes the limit (a later pod of the same tenant with another quota).
    pub fn set_limit(&self, limit: u64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.limit = limit;
        s.full_since = None;
    }

    /// The bytes the tenant's files hold now (a fresh count).
    pub fn used(&self) -> u64 {
        usage(&self.store, self.root)
    }
}

impl crate::wasi::SpaceLimit for Quota {
    fn charge(&self, bytes: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.charged.saturating_add(bytes) <= s.limit {
            s.charged += bytes;
            return true;
        }
        if s.full_since.is_some_and(|t| t.elapsed() < RECOUNT_AFTER) {
            return false;
        }
        s.charged = usage(&self.store, self.root);
        if s.charged.saturating_add(bytes) <= s.limit {
            s.charged += bytes;
            s.full_since = None;
            true
        } else {
            s.full_since = Some(Instant::now());
            false
        }
    }
}

/// Sum of the sizes of the files under `root`, each inode once. Entries that vanish while
/// we walk are skipped (another thread of the tenant removed them).
fn usage(store: &Store, root: Ino) -> u64 {
    let mut seen = HashSet::new();
    let mut dirs = vec![root];
    let mut total = 0u64;
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = store.read_dir(dir) else {
            continue;
        };
        for e in entries {
            if !seen.insert(e.ino) {
                continue;
            }
            match e.kind {
                FileKind::Dir => dirs.push(e.ino),
                _ => {
                    if let Ok(m) = store.metadata(e.ino) {
                        total = total.saturating_add(m.size);
                    }
                }
            }
        }
    }
    total
}
