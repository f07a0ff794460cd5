//! The linear memory of guests: a pod's memory limit (the OCI spec's
//! `linux.resources.memory.limit`), and what each tenant's running guests hold, which the
//! metrics serve. Every pod runs in the node agent's process, so no cgroup of a pod's shows
//! its memory (`kubectl top` sees none); this does.
//!
//! A plain guest's memory grows through its store's limiter ([`MemoryLimiter`]), which
//! refuses growth past the limit and adds what it allows to the guest's [`GuestMemory`]
//! (wasmtime asks it for a memory's first pages at instantiation too). A wasi-threads
//! guest's memory is shared and grows under no store's limiter (its type's maximum bounds
//! it, see `host::capped`), so its size is read from the memory itself when asked.
//!
//! A tenant's [`MemoryAccount`] holds its running guests weakly: a guest that ended is
//! dropped from the sum at the next read.
//!
//! What a guest grew its memory to is what its limit bounds; what it touched is what the
//! host's RAM holds for it (a C or Go runtime grows its heap in large steps and uses it
//! piece by piece). So each guest's memory is also found in the address space, and the
//! resident part counted with `mincore`, which only asks the kernel about the pages and
//! never reads them: a memory that moved or was unmapped since it was found is an error
//! of the call, counted as nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use wasmtime::{ResourceLimiter, SharedMemory};

/// One running guest's linear memory.
#[derive(Default)]
pub struct GuestMemory {
    /// Bytes its store's limiter let the memories of a plain guest grow to.
    plain: AtomicU64,
    /// Where a plain guest's exported memory starts in this process (0: not known).
    plain_base: AtomicUsize,
    /// A threaded guest's shared memory.
    shared: OnceLock<SharedMemory>,
}

impl GuestMemory {
    /// The bytes of linear memory the guest has now (reserved to it, whether or not it
    /// touched them yet).
    pub fn bytes(&self) -> u64 {
        match self.shared.get() {
            Some(memory) => memory.data_size() as u64,
            None => self.plain.load(Ordering::Relaxed),
        }
    }

    /// The bytes of its linear memory in RAM now (see the module docs).
    pub fn resident(&self) -> u64 {
        let (base, len) = match self.shared.get() {
            Some(memory) => (memory.data().as_ptr() as usize, memory.data_size()),
            None => (
                self.plain_base.load(Ordering::Relaxed),
                self.plain.load(Ordering::Relaxed) as usize,
            ),
        };
        match base {
            0 => 0,
            base => resident_bytes(base, len),
        }
    }

    /// Counts `memory` as the guest's (a threaded guest's, once it is made).
    pub fn share(&self, memory: SharedMemory) {
        let _ = self.shared.set(memory);
    }

    /// Where a plain guest's memory starts, once it is instantiated.
    pub fn locate(&self, base: *const u8) {
        self.plain_base.store(base as usize, Ordering::Relaxed);
    }
}

/// Bytes of the `len` bytes at `base` that are in RAM (0 where the kernel refuses: not
/// mapped any more).
fn resident_bytes(base: usize, len: usize) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => return 0,
    };
    if base % page != 0 {
        return 0;
    }
    // Asked a chunk at a time: one byte of answer per page.
    const CHUNK_PAGES: usize = 16 << 10;
    let mut answer = vec![0u8; CHUNK_PAGES];
    let mut resident = 0u64;
    let pages = len.div_ceil(page);
    let mut at = 0;
    while at < pages {
        let n = (pages - at).min(CHUNK_PAGES);
        // SAFETY: mincore reads no memory at the address, it only asks about the mapping
        // there (failing with ENOMEM where there is none); `answer` holds `n` bytes.
        let rc = unsafe {
            libc::mincore(
                (base + at * page) as *mut libc::c_void,
                n * page,
                answer.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return 0;
        }
        let in_ram = answer[..n].iter().filter(|&&b| b & 1 == 1).count();
        resident += (in_ram * page) as u64;
        at += n;
    }
    resident
}

/// A tenant's running guests' memory.
#[derive(Default)]
pub struct MemoryAccount {
    guests: Mutex<Vec<Weak<GuestMemory>>>,
}

impl MemoryAccount {
    /// A new guest of the tenant, counted while the returned value lives.
    pub fn guest(&self) -> Arc<GuestMemory> {
        let guest = Arc::new(GuestMemory::default());
        let mut guests = self.guests.lock().unwrap_or_else(|p| p.into_inner());
        guests.retain(|g| g.strong_count() > 0);
        guests.push(Arc::downgrade(&guest));
        guest
    }

    /// The bytes of linear memory of the tenant's guests running now.
    pub fn bytes(&self) -> u64 {
        self.sum(GuestMemory::bytes)
    }

    /// The bytes of it in RAM now.
    pub fn resident(&self) -> u64 {
        self.sum(GuestMemory::resident)
    }

    fn sum(&self, of: impl Fn(&GuestMemory) -> u64) -> u64 {
        let mut guests = self.guests.lock().unwrap_or_else(|p| p.into_inner());
        guests.retain(|g| g.strong_count() > 0);
        guests
            .iter()
            .filter_map(Weak::upgrade)
            .map(|g| of(&g))
            .sum()
    }
}

/// The resource limiter of a plain guest's store: its memory limit, and the memory it grew
/// to. Tables, instances and memories are not limited (as wasmtime's own limits by default).
#[derive(Default)]
pub struct MemoryLimiter {
    /// The most bytes of linear memory, over all the guest's memories.
    pub limit: Option<usize>,
    pub gauge: Option<Arc<GuestMemory>>,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if self.limit.is_some_and(|limit| desired > limit) {
            // The guest's `memory.grow` returns -1, as an allocation fails at a cgroup's
            // limit.
            return Ok(false);
        }
        if let Some(gauge) = &self.gauge {
            let grown = desired.saturating_sub(current) as u64;
            gauge.plain.fetch_add(grown, Ordering::Relaxed);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_counts_the_growth_of_its_running_guests_only() {
        let account = MemoryAccount::default();
        let first = account.guest();
        let mut limiter = MemoryLimiter {
            limit: Some(4 << 16),
            gauge: Some(first.clone()),
        };
        assert!(limiter.memory_growing(0, 2 << 16, None).unwrap());
        assert!(limiter.memory_growing(2 << 16, 3 << 16, None).unwrap());
        // Past the limit: refused, and not counted.
        assert!(!limiter.memory_growing(3 << 16, 5 << 16, None).unwrap());
        let second = account.guest();
        second.plain.store(1 << 16, Ordering::Relaxed);
        assert_eq!(account.bytes(), 4 << 16);
        drop((limiter, first));
        assert_eq!(account.bytes(), 1 << 16, "an ended guest counts no more");
        drop(second);
        assert_eq!(account.bytes(), 0);
    }
}
