//! The store's own threads (the background writer, the reclaimer, the image's fill-ahead)
//! run below the guests' priority: their work is real but never urgent, and on a machine
//! with as many busy guests as cores a background thread that takes a core from a guest
//! shows up as that guest's tail latency, tenants that never wrote anything included. The
//! guests still wait for them where they must (a full buffer pool, a device out of zones),
//! and then an idle core runs them.
//!
//! They also start on a core other than their spawner's. The thread that mounts a store is
//! usually the one that then runs the guest, and Linux wakes a sleeping thread on the core
//! it last ran on unless it sees an idle one at that moment: a writer first run on the
//! guest's core was woken there by the guest's first full buffer and took the core from
//! the guest for the whole write (about 0.2 ms for 512 KiB; see the README's tails).

use std::cell::Cell;
use std::io;
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Nice value of the store's threads (guests run at the process's own, usually 0).
const BACKGROUND_NICE: i32 = 10;

thread_local! {
    /// Set on the store's own threads: their work for a tenant is charged to it (see the
    /// store's `work` module), where a guest's thread has its own CPU clock.
    static STORE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Starts one of the store's threads: named `name`, off the caller's core, at the
/// background priority.
pub(crate) fn spawn<T, F>(name: &str, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let spawner = current_core();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(core) = spawner {
                leave_core(core);
            }
            lower_this_thread();
            STORE_THREAD.with(|t| t.set(true));
            f()
        })
}

/// Waits on `wake` for `time` unless `stopping(state)` turns true first: true once the time
/// has passed, false when the thread must stop (a store thread's rest between rounds).
pub(crate) fn rest<T>(
    state: &Mutex<T>,
    wake: &Condvar,
    time: Duration,
    stopping: impl Fn(&T) -> bool,
) -> bool {
    let deadline = Instant::now() + time;
    let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
    while !stopping(&guard) {
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        guard = wake
            .wait_timeout(guard, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    false
}

/// Whether the calling thread is one of the store's own.
pub fn is_store_thread() -> bool {
    STORE_THREAD.with(Cell::get)
}

/// The CPU time the calling thread has used (system time included).
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; this clock exists on every Linux.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Waits for a store thread that was told to stop, unless the caller is that thread.
pub(crate) fn join(thread: &Mutex<Option<JoinHandle<()>>>) {
    let thread = thread.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(thread) = thread {
        if thread.thread().id() != std::thread::current().id() {
            let _ = thread.join();
        }
    }
}

/// Lowers the calling thread's priority (a Linux thread has its own nice value). Best
/// effort: where it is refused the thread runs at the normal priority.
fn lower_this_thread() {
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE);
    }
}

/// The core the calling thread runs on now.
fn current_core() -> Option<usize> {
    // SAFETY: a plain syscall.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// Moves the calling thread to another core than `core` (the affinity change migrates it at
/// once), then lets it run anywhere again: only where it first runs, and so where it is
/// first woken, changes. Returns the core it moved to. Best effort: nothing happens where
/// the thread may run on one core only or the calls are refused.
fn leave_core(core: usize) -> Option<usize> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: the masks are plain bit sets of `size` bytes, read and set for the calling
    // thread (pid 0) only.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0
            || core >= libc::CPU_SETSIZE as usize
            || !libc::CPU_ISSET(core, &allowed)
            || libc::CPU_COUNT(&allowed) < 2
        {
            return None;
        }
        let mut elsewhere = allowed;
        libc::CPU_CLR(core, &mut elsewhere);
        if libc::sched_setaffinity(0, size, &elsewhere) != 0 {
            return None;
        }
        let moved_to = current_core();
        libc::sched_setaffinity(0, size, &allowed);
        moved_to
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed_cores() -> Vec<usize> {
        // SAFETY: reads the calling thread's mask into a zeroed set of the right size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    #[test]
    fn a_thread_leaves_its_spawners_core_and_may_then_run_anywhere() {
        let before = allowed_cores();
        let here = current_core().expect("sched_getcpu");
        let moved_to = leave_core(here);
        match before.len() {
            1 => assert_eq!(moved_to, None, "one allowed core: nowhere to go"),
            _ => {
                let to = moved_to.expect("two or more allowed cores");
                assert_ne!(to, here);
                assert!(before.contains(&to));
            }
        }
        assert_eq!(
            allowed_cores(),
            before,
            "the thread's mask is given back whole"
        );
    }
}
