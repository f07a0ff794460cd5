//! Taking the store's lock: a short spin before sleeping.
//!
//! `Shared::inner` is held for memory work, microseconds at a time. A thread that sleeps
//! on it gives up its core, and where runnable threads outnumber cores (RocksDB's flush
//! and compaction threads beside its foreground and the store's writer) it must then wait
//! for a core again once woken, while the threads that kept their cores take the lock
//! meanwhile: RocksDB's foreground was seen waiting 0.2–4 ms for a lock that other threads
//! took and gave back dozens of times in that while. A thread that spins for a holder
//! still running keeps its core; one whose holder lost its core stops spinning after
//! [`SPIN`] and sleeps as before. A process that may run on one core only never spins:
//! there the holder cannot run while another thread spins.

use std::sync::{LockResult, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long a thread tries for the lock before it sleeps on it: about twice what a 512 KiB
/// copy into a window took under it (12–18 µs here; such copies now run with it released),
/// and short beside what sleeping costs where runnable threads outnumber cores.
const SPIN: Duration = Duration::from_micros(30);

/// Tries between two looks at the clock.
const TRIES_PER_LOOK: u32 = 64;

/// Whether the process may run on more than one core (read once).
fn cores_to_spin_on() -> bool {
    static MANY: OnceLock<bool> = OnceLock::new();
    *MANY.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// Locks `mutex`, spinning for up to [`SPIN`] before sleeping.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> LockResult<MutexGuard<'_, T>> {
    if !cores_to_spin_on() {
        return mutex.lock();
    }
    let mut started: Option<Instant> = None;
    loop {
        for _ in 0..TRIES_PER_LOOK {
            match mutex.try_lock() {
                Ok(guard) => return Ok(guard),
                Err(TryLockError::Poisoned(poisoned)) => return Err(poisoned),
                Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
            }
        }
        // The clock is read only once the lock was found taken.
        if started.get_or_insert_with(Instant::now).elapsed() >= SPIN {
            return mutex.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The store stops on a poisoned lock (see `Store::lock`); spinning must not hide one.
    #[test]
    fn a_poisoned_lock_is_reported_not_used() {
        let mutex = Arc::new(Mutex::new(()));
        let holder = mutex.clone();
        let _ = std::thread::spawn(move || {
            let _guard = holder.lock().unwrap();
            panic!("a panic under the lock");
        })
        .join();
        assert!(lock(&mutex).is_err());
    }
}
