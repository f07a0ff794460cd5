//! Termination signals (SIGINT, SIGTERM, SIGHUP): what a guest wrote survives them.
//!
//! A signal that ends a native program leaves every byte it wrote in the host's page
//! cache, synced or not, and programs count on that: LevelDB's unsynced writes, for one,
//! are documented to survive a crash of the process. The store's write buffers and its
//! uncommitted metadata are ours, in our memory, and would die with us. So these signals
//! do not end the process at once. [`install`], called before any other thread starts,
//! blocks them in every thread and starts one thread that waits for them. The first one
//! runs the action set by [`on_signal`] (stop the guest, unmount the store) on a thread of
//! its own, then ends the process by that same signal, with its default action restored,
//! so that whoever waits for us sees what a native program would show. A second signal
//! while the action runs ends the process at once, as does a first one before any action
//! is set (nothing is mounted yet).
//!
//! SIGKILL cannot be caught: what a guest wrote and did not sync is lost then, as after a
//! power cut (what it synced never is).

use std::sync::{Mutex, OnceLock};

use valet_vfs::Store;

/// The signals that end a process by default and that an operator sends to stop one.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

type Action = Box<dyn FnOnce(i32) + Send>;

/// What the first signal runs; `None` before [`on_signal`], and after the action was taken.
static ACTION: Mutex<Option<Action>> = Mutex::new(None);
/// The first signal received.
static RECEIVED: OnceLock<i32> = OnceLock::new();

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set; sigaddset adds valid signal numbers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in SIGNALS {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Blocks the termination signals in this thread, and so in every thread it starts from
/// now on, and starts the thread that waits for them. Call before any other thread starts
/// (a thread started before would take the signal with its default action).
pub fn install() -> std::io::Result<()> {
    let set = signal_set();
    // SAFETY: a valid set; changes only this thread's mask.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new()
        .name("valet-signals".into())
        .stack_size(64 << 10)
        .spawn(move || wait(set))?;
    Ok(())
}

/// Sets what the first termination signal runs before the process ends by it (replacing
/// any action set before).
fn on_signal(action: impl FnOnce(i32) + Send + 'static) {
    *ACTION.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(action));
}

/// Sets the action of a process that runs guests on `store`: `stop_guests` (which stops
/// them, as far as the process can), then unmount the store, so that everything the
/// guests wrote is on it and committed before the signal ends the process.
pub fn keep_writes_of(store: &Store, stop_guests: impl FnOnce(i32) + Send + 'static) {
    let store = store.clone();
    on_signal(move |sig| {
        stop_guests(sig);
        if let Err(e) = store.unmount() {
            eprintln!("valet-run: error: syncing the store before ending by signal {sig}: {e}");
        }
    });
}

/// The termination signal received, if one was: a run that ends meanwhile ends by it too.
pub fn received() -> Option<i32> {
    RECEIVED.get().copied()
}

fn wait(set: libc::sigset_t) {
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: a valid set, every signal of which is blocked in this thread.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        if RECEIVED.set(sig).is_err() {
            // A second signal: the operator does not want to wait for the action.
            end_by(sig);
        }
        let action = ACTION.lock().unwrap_or_else(|p| p.into_inner()).take();
        match action {
            None => end_by(sig),
            Some(action) => {
                let ran = std::thread::Builder::new()
                    .name("valet-stopping".into())
                    .spawn(move || {
                        action(sig);
                        end_by(sig)
                    });
                if ran.is_err() {
                    end_by(sig);
                }
            }
        }
    }
}

/// Ends the process by `sig`, with its default action.
pub fn end_by(sig: i32) -> ! {
    // Nothing to flush first: a guest's output is written through at once, and the host's
    // own lines go to stderr (taking stdout's lock could wait forever for a guest thread
    // blocked writing to a pipe nobody reads).
    // SAFETY: restoring the default disposition, unblocking the signal in this thread and
    // sending it to this thread are plain calls with valid arguments; the default action of
    // each of these signals ends the whole process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::raise(sig);
        // Not reached; if it were, the exit code says the same.
        libc::_exit(128 + sig)
    }
}
