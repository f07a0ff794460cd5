//! A tenant's space quota (`valet-run --quota`, a tenant's `quota`, a pod's
//! `valet.io/quota`): the bytes its files may hold, counted as the sum of their sizes (each inode once, files removed while still open included: their data
//! stays until the last close).
//!
//! The adapter asks before every write to a store file ([`crate::wasi::SpaceLimit`]); the
//! quota charges each written byte against a running total without looking at the store,
//! so a write costs one uncontended lock. Overwrites, truncations and deletions are not
//! seen as they happen: when a charge would pass the limit, the quota counts the tenant's
//! files again ([`Store::tenant_bytes`]) and only refuses if the true total is over. A
//! count that found the tenant over its limit is trusted for [`RECOUNT_AFTER`], so a pod
//! hammering a full quota does not count again at every write.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use valet_vfs::{Store, TenantId};

/// How long a count that found the tenant full is trusted.
pub const RECOUNT_AFTER: Duration = Duration::from_millis(50);

pub struct Quota {
    store: Store,
    tenant: TenantId,
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
    /// A quota of `limit` bytes over the files of `tenant`.
    pub fn new(store: Store, tenant: TenantId, limit: u64) -> Quota {
        let charged = usage(&store, tenant);
        Quota {
            store,
            tenant,
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
        usage(&self.store, self.tenant)
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
        s.charged = usage(&self.store, self.tenant);
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

/// The bytes the tenant's files hold; a store that cannot say (it stopped after a failed
/// commit) counts as full, so the write is refused.
fn usage(store: &Store, tenant: TenantId) -> u64 {
    store.tenant_bytes(tenant).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
    use valet_vfs::{OpenOptions, StoreConfig};

    use super::*;
    use crate::wasi::SpaceLimit;

    const KB: u64 = 1000;

    fn store() -> Store {
        let g = Geometry {
            zone_count: 16,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            block_size: 4096,
            max_open: 8,
            max_active: 10,
        };
        let dev = Arc::new(MemoryDevice::new(g).unwrap()) as Arc<dyn ZonedDevice>;
        Store::open(dev, StoreConfig::default()).unwrap()
    }

    /// A pod that removes a file it still holds open keeps its bytes on the device: they
    /// count until the last close, so unlinking cannot lift the quota.
    #[test]
    fn a_file_removed_while_open_still_counts() {
        let store = store();
        let (tenant, root) = store.tenant("pod").unwrap();
        let quota = Quota::new(store.clone(), tenant, 1000 * KB);
        let held = store.open_file(root, "a", OpenOptions::create()).unwrap();
        assert!(quota.charge(900 * KB));
        held.write_at(&vec![7u8; 900 * KB as usize], 0).unwrap();
        store.unlink(root, "a").unwrap();
        assert!(
            !quota.charge(900 * KB),
            "the removed file's 900 KB still count"
        );
        assert!(quota.charge(100 * KB), "within the limit with them");
        // The last close frees them; a refusal is trusted for RECOUNT_AFTER only.
        held.close().unwrap();
        std::thread::sleep(RECOUNT_AFTER * 2);
        assert!(quota.charge(900 * KB));
    }

    /// Rewrites and deletions are found at the next count: a charge past the limit is
    /// refused only if the files really hold that much.
    #[test]
    fn a_charge_past_the_limit_counts_again() {
        let store = store();
        let (tenant, root) = store.tenant("pod").unwrap();
        let quota = Quota::new(store.clone(), tenant, 1000 * KB);
        for _ in 0..5 {
            // A 300 KB file written again and again (a new version replacing the old).
            assert!(quota.charge(300 * KB));
            let f = store.open_file(root, "new", OpenOptions::create()).unwrap();
            f.write_at(&vec![1u8; 300 * KB as usize], 0).unwrap();
            f.close().unwrap();
            store.rename(root, "new", root, "a").unwrap();
        }
        assert_eq!(quota.used(), 300 * KB);
        assert!(!quota.charge(800 * KB));
        store.unlink(root, "a").unwrap();
        std::thread::sleep(RECOUNT_AFTER * 2);
        assert!(quota.charge(800 * KB));
    }
}
