//! A tenant's space quota (`valet-run --quota`, a tenant's `quota`, a pod's
//! `valet.io/quota`): the bytes its files may hold, as the store counts them
//! ([`Store::tenant_bytes`]: the sum of their sizes, each inode once, files removed while
//! still open included, since their data stays until the last close).
//!
//! The adapter asks before every write to a store file ([`crate::wasi::SpaceLimit`]); the
//! quota charges each written byte against a running total, so a write costs one
//! uncontended lock and not the store's. Overwrites, truncations and deletions are not
//! seen as they happen: when a charge would pass the limit, the quota reads the store's
//! count again (kept as sizes change, so reading it walks nothing and a pod hammering a
//! full quota costs the other pods one short hold of the store's lock per write) and only
//! refuses if the true total is over. The true total is the store's count plus the bytes
//! of writes charged but not finished yet (the store cannot count them, and forgetting
//! them let two writers together pass the limit); the adapter says when each has
//! finished ([`crate::wasi::SpaceLimit::written`]).

use std::sync::Mutex;

use valet_vfs::{Store, TenantId};

pub struct Quota {
    store: Store,
    tenant: TenantId,
    state: Mutex<State>,
}

struct State {
    limit: u64,
    /// The store's count when last read plus everything charged since.
    charged: u64,
    /// Charged for writes that have not finished: not in the store's count yet.
    in_flight: u64,
    /// Charges refused (writes that got ENOSPC).
    refused: u64,
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
                in_flight: 0,
                refused: 0,
            }),
        }
    }

    /// Changes the limit (a later pod of the same tenant with another quota).
    pub fn set_limit(&self, limit: u64) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).limit = limit;
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).limit
    }

    /// How many charges it refused.
    pub fn refusals(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).refused
    }

    /// The bytes the tenant's files hold now.
    pub fn used(&self) -> u64 {
        usage(&self.store, self.tenant)
    }
}

impl crate::wasi::SpaceLimit for Quota {
    fn charge(&self, bytes: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.charged.saturating_add(bytes) > s.limit {
            s.charged = usage(&self.store, self.tenant).saturating_add(s.in_flight);
        }
        let fits = s.charged.saturating_add(bytes) <= s.limit;
        match fits {
            true => {
                s.charged += bytes;
                s.in_flight += bytes;
            }
            false => s.refused += 1,
        }
        fits
    }

    fn written(&self, bytes: u64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.in_flight = s.in_flight.saturating_sub(bytes);
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
        quota.written(900 * KB);
        store.unlink(root, "a").unwrap();
        assert!(
            !quota.charge(900 * KB),
            "the removed file's 900 KB still count"
        );
        assert!(quota.charge(100 * KB), "within the limit with them");
        quota.written(100 * KB);
        // The last close frees them, and the next charge past the limit sees it.
        held.close().unwrap();
        assert_eq!(quota.used(), 0);
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
            quota.written(300 * KB);
            f.close().unwrap();
            store.rename(root, "new", root, "a").unwrap();
        }
        assert_eq!(quota.used(), 300 * KB);
        assert!(!quota.charge(800 * KB));
        store.unlink(root, "a").unwrap();
        assert!(quota.charge(800 * KB));
    }

    /// Two writers charged at once: the second's charge past the limit counts the store
    /// again, and the first's bytes, charged but not written yet, count on top of what
    /// the store holds (they used to be forgotten, and both writes went through).
    #[test]
    fn a_charge_in_flight_counts_at_a_recount() {
        let store = store();
        let (tenant, root) = store.tenant("pod").unwrap();
        let quota = Quota::new(store.clone(), tenant, 1000 * KB);
        let f = store.open_file(root, "a", OpenOptions::create()).unwrap();
        assert!(quota.charge(600 * KB), "the first writer");
        assert!(
            !quota.charge(600 * KB),
            "the second writer, while the first's 600 KB are in flight"
        );
        f.write_at(&vec![5u8; 600 * KB as usize], 0).unwrap();
        quota.written(600 * KB);
        // Written, they are the store's: counted once, not twice.
        assert!(!quota.charge(401 * KB));
        assert!(quota.charge(400 * KB));
        quota.written(400 * KB);
    }

    /// The limit can change under a running tenant (a later pod with another quota), and
    /// a truncation makes room at the next charge past it.
    #[test]
    fn a_new_limit_holds_from_the_next_charge() {
        let store = store();
        let (tenant, root) = store.tenant("pod").unwrap();
        let quota = Quota::new(store.clone(), tenant, 1000 * KB);
        let f = store.open_file(root, "a", OpenOptions::create()).unwrap();
        assert!(quota.charge(600 * KB));
        f.write_at(&vec![3u8; 600 * KB as usize], 0).unwrap();
        quota.written(600 * KB);
        quota.set_limit(500 * KB);
        assert_eq!(quota.limit(), 500 * KB);
        assert!(!quota.charge(1), "600 KB held, 500 KB allowed");
        f.set_len(100 * KB).unwrap();
        assert!(quota.charge(400 * KB));
        f.write_at(&vec![4u8; 400 * KB as usize], 100 * KB).unwrap();
        quota.written(400 * KB);
        assert!(!quota.charge(1), "500 KB held");
        assert_eq!(quota.refusals(), 2);
    }
}
