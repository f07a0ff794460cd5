//! The background writer: full write buffers go to the device on its thread, so a guest's
//! `fd_write` that fills a buffer returns at once.
//!
//! The queue holds inode numbers; for each, the writer writes that file's detached buffers
//! oldest first ([`Store::write_queued`]), sharing the work with a sync of the same file
//! that may be writing them too. A write that fails leaves its buffer with the file; the
//! next sync of the file tries again and reports the error. When the last user handle of
//! the store is dropped, the writer finishes its queue and the drop waits for it to end.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;

use super::state::Ino;
use super::Store;

enum Job {
    Write(Ino),
    Stop,
}

/// The sending side and the thread, kept in the store.
#[derive(Default)]
pub(super) struct Queue {
    tx: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Queue {
    /// Starts the writer thread; `store` is its own handle to the store.
    pub fn start(&self, store: Store) {
        let (tx, rx) = channel();
        let thread = crate::background::spawn("valet-writer", move || run(store, rx))
            .expect("spawning the store's writer thread");
        *self.tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
    }

    /// Asks the writer to write `ino`'s detached buffers.
    pub fn push(&self, ino: Ino) {
        if let Some(tx) = &*self.tx.lock().unwrap_or_else(|p| p.into_inner()) {
            // Fails only once the writer stopped, when no user handle is left to push.
            let _ = tx.send(Job::Write(ino));
        }
    }

    /// Lets the writer finish its queue, then waits for it to end.
    pub fn stop(&self) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(Job::Stop);
        }
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn run(store: Store, rx: Receiver<Job>) {
    loop {
        match rx.recv() {
            // A failure stays with the file (see the module docs); the next sync reports it.
            Ok(Job::Write(ino)) => {
                let _ = store.work_for_file(ino, || store.write_queued(ino));
            }
            Ok(Job::Stop) | Err(_) => return,
        }
    }
}
