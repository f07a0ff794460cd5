//! The CPU time the store's own threads spend for each tenant.
//!
//! A guest's writes cost CPU twice: on its own thread (the copy into a write buffer, its
//! syncs) and on the store's threads, which write its full buffers to the device, hand its
//! unsynced tails off, and collect its zones. Measured here: `write_bench` writing 4 GiB
//! in 1 MiB writes under `valet-run --cpus 0.25` kept about one whole core busy, most of it
//! the background writer's copies into the host's page cache, which no guest's thread
//! clock counted. So each round of a store thread's work for one tenant reads the thread's
//! CPU clock before and after, and adds the difference to that tenant's [`TenantWork`];
//! the runtime charges it to the tenant as its guests' own CPU time (metering and CPU
//! limits), and the stats show it.
//!
//! Work done on a guest's thread (a sync that writes its own file's buffers, a GC pass an
//! allocation runs when the device is full) is already in that thread's clock and is not
//! counted again. Work no tenant owns (the journal, the image's fill-ahead, zone resets) is
//! charged to none.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Ino, Store, TenantId};
use crate::background;

/// CPU time the store's threads spent on one tenant's files, summed since the mount.
#[derive(Debug, Default)]
pub struct TenantWork {
    ns: AtomicU64,
}

impl TenantWork {
    pub fn cpu(&self) -> Duration {
        Duration::from_nanos(self.ns.load(Ordering::Relaxed))
    }

    /// Counts `cpu` more.
    pub fn add(&self, cpu: Duration) {
        let ns = u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Every tenant's [`TenantWork`], by tenant id.
#[derive(Default)]
pub(super) struct WorkLedger(Mutex<Vec<Arc<TenantWork>>>);

impl WorkLedger {
    fn of(&self, tenant: TenantId) -> Arc<TenantWork> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let i = tenant as usize;
        if all.len() <= i {
            all.resize_with(i + 1, Default::default);
        }
        all[i].clone()
    }

    /// Each tenant's CPU time so far, by tenant id.
    pub fn all(&self) -> Vec<Duration> {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().map(|w| w.cpu()).collect()
    }
}

/// Where a round of work began: the thread's CPU clock, on a store thread only (on any
/// other thread the work is already that thread's own).
#[derive(Clone, Copy)]
pub(super) struct WorkStart(Option<Duration>);

impl WorkStart {
    pub fn now() -> WorkStart {
        WorkStart(background::is_store_thread().then(background::thread_cpu_time))
    }
}

impl Store {
    /// The CPU time the store's threads spent and will spend on `tenant`'s files (a live
    /// counter, kept by the store for as long as it is mounted).
    pub fn tenant_work(&self, tenant: TenantId) -> Arc<TenantWork> {
        self.shared.work.of(tenant)
    }

    /// Charges the work since `start` to `tenant`.
    pub(super) fn charge_work(&self, tenant: TenantId, start: WorkStart) {
        let Some(started) = start.0 else {
            return;
        };
        let used = background::thread_cpu_time().saturating_sub(started);
        self.shared.work.of(tenant).add(used);
    }

    /// Runs `work` on `ino`'s behalf: its CPU time, on a store thread, is charged to the
    /// file's tenant.
    pub(super) fn work_for_file<T>(&self, ino: Ino, work: impl FnOnce() -> T) -> T {
        let start = WorkStart::now();
        if start.0.is_none() {
            return work();
        }
        let tenant = self
            .lock()
            .ok()
            .and_then(|inner| inner.state.inode(ino).ok().map(|i| i.tenant));
        let out = work();
        if let Some(tenant) = tenant {
            self.charge_work(tenant, start);
        }
        out
    }
}
