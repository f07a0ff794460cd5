//! The store's own threads (the background writer, the reclaimer, the image's fill-ahead)
//! run below the guests' priority: their work is real but never urgent, and on a machine
//! with as many busy guests as cores a background thread that takes a core from a guest
//! shows up as that guest's tail latency, tenants that never wrote anything included. The
//! guests still wait for them where they must (a full buffer pool, a device out of zones),
//! and then an idle core runs them.

/// Nice value of the store's threads (guests run at the process's own, usually 0).
const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's priority (a Linux thread has its own nice value). Best
/// effort: where it is refused the thread runs at the normal priority.
pub(crate) fn lower_this_thread() {
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE);
    }
}
