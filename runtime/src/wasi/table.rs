//! The descriptor table: what each guest fd stands for, shared by every thread of a guest.
//!
//! Numbering follows wasmtime-wasi's preview1 exactly (guests print and compare fd numbers):
//! a new descriptor takes the highest number freed so far, else one past the highest in use.
//! Lookups clone the entry's `Arc` under a short lock, so a slow call on one descriptor (a
//! read of stdin, an fsync) never holds the table against other threads.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::abi::Errno;
use super::host_fs::{HostDir, HostFile};
use super::store_fs::{StoreDir, StoreFile};

/// What a descriptor is.
pub enum Kind {
    Stdin,
    Stdout,
    Stderr,
    StoreFile(StoreFile),
    StoreDir(StoreDir),
    HostFile(HostFile),
    HostDir(HostDir),
    /// A listening socket the embedder handed in (`wasmtime run --tcplisten`'s model).
    Listener(std::net::TcpListener),
    /// A connection accepted from a listener.
    Stream(std::net::TcpStream),
}

/// One open descriptor.
pub struct Desc {
    pub kind: Kind,
    /// The guest path of a preopened directory.
    pub preopen: Option<String>,
    /// `fdflags` as the guest last set them.
    pub flags: AtomicU16,
    /// The file position (files only). A read or write at the position holds it for the
    /// whole call, as Linux's `f_pos_lock` does, so threads sharing a descriptor never read
    /// or write the same bytes twice; see [`Desc::position`].
    pos: Mutex<u64>,
    /// Opened for reading / for writing (what `fd_fdstat_get` reports as rights).
    pub read: bool,
    pub write: bool,
}

impl Desc {
    pub fn new(kind: Kind, flags: u16) -> Desc {
        Desc {
            kind,
            preopen: None,
            flags: AtomicU16::new(flags),
            pos: Mutex::new(0),
            read: true,
            write: true,
        }
    }

    pub fn flags(&self) -> u16 {
        self.flags.load(Ordering::Relaxed)
    }

    /// Where a read or write starts: at `offset` (`fd_pread`, `fd_pwrite`), or at the
    /// position, then held for the call (the guard, to be set to where the call ended).
    pub fn start_at(&self, offset: Option<u64>) -> (Option<MutexGuard<'_, u64>>, u64) {
        match offset {
            Some(at) => (None, at),
            None => {
                let pos = self.position();
                let at = *pos;
                (Some(pos), at)
            }
        }
    }

    /// The file position, held until the guard drops. A call that panicked while holding
    /// it left a position, not a broken invariant: it is used as is.
    pub fn position(&self) -> MutexGuard<'_, u64> {
        self.pos.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Most descriptors a guest holds open at once (preopens and stdio included), as a
/// process's `RLIMIT_NOFILE` a database's service raises its own to: past it, EMFILE. A
/// guest's host-directory files are the host process's own descriptors (the node agent's,
/// shared by every pod), so one guest must not take them all.
pub const MAX_OPEN: usize = 65_536;

/// The table itself (behind the guest's lock).
#[derive(Default)]
pub struct Table {
    entries: Vec<Option<Arc<Desc>>>,
    free: BTreeSet<u32>,
    used: usize,
}

impl Table {
    #[inline]
    pub fn get(&self, fd: u32) -> Result<&Arc<Desc>, Errno> {
        match self.entries.get(fd as usize) {
            Some(Some(d)) => Ok(d),
            _ => Err(Errno::BADF),
        }
    }

    pub fn contains(&self, fd: u32) -> bool {
        self.get(fd).is_ok()
    }

    fn highest_used(&self) -> Option<u32> {
        self.entries
            .iter()
            .rposition(|e| e.is_some())
            .map(|i| i as u32)
    }

    pub fn push(&mut self, desc: Arc<Desc>) -> Result<u32, Errno> {
        if self.used >= MAX_OPEN {
            return Err(Errno::MFILE);
        }
        let fd = match self.free.pop_last() {
            Some(fd) => fd,
            None => match self.highest_used() {
                Some(fd) => fd.checked_add(1).ok_or(Errno::MFILE)?,
                None => 0,
            },
        };
        self.put(fd, desc);
        Ok(fd)
    }

    fn put(&mut self, fd: u32, desc: Arc<Desc>) {
        let i = fd as usize;
        if self.entries.len() <= i {
            self.entries.resize(i + 1, None);
        }
        if self.entries[i].replace(desc).is_none() {
            self.used += 1;
        }
    }

    pub fn remove(&mut self, fd: u32) -> Result<Arc<Desc>, Errno> {
        let desc = self
            .entries
            .get_mut(fd as usize)
            .and_then(Option::take)
            .ok_or(Errno::BADF)?;
        self.used -= 1;
        self.free.insert(fd);
        while self.entries.last().is_some_and(Option::is_none) {
            self.entries.pop();
        }
        Ok(desc)
    }

    /// `fd_renumber`: `to` (which must be open) is replaced by `from`; returns what `to` was.
    pub fn renumber(&mut self, from: u32, to: u32) -> Result<Option<Arc<Desc>>, Errno> {
        if !self.contains(from) || !self.contains(to) {
            return Err(Errno::BADF);
        }
        if from == to {
            return Ok(None);
        }
        let old = self.remove(to)?;
        let desc = self.remove(from)?;
        self.free.remove(&to);
        self.put(to, desc);
        Ok(Some(old))
    }

    /// Every descriptor, for the end of a guest.
    pub fn drain(&mut self) -> Vec<Arc<Desc>> {
        self.free.clear();
        self.used = 0;
        self.entries.drain(..).flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> Arc<Desc> {
        Arc::new(Desc::new(Kind::Stdin, 0))
    }

    #[test]
    fn numbering_follows_wasmtime_preview1() {
        let mut t = Table::default();
        for want in 0..6 {
            assert_eq!(t.push(desc()).unwrap(), want);
        }
        // Freed numbers come back highest first, before any new one.
        t.remove(2).unwrap();
        t.remove(4).unwrap();
        assert_eq!(t.push(desc()).unwrap(), 4);
        assert_eq!(t.push(desc()).unwrap(), 2);
        assert_eq!(t.push(desc()).unwrap(), 6);
        // Closing the highest then pushing reuses it.
        t.remove(6).unwrap();
        assert_eq!(t.push(desc()).unwrap(), 6);
        assert_eq!(t.remove(9).err(), Some(Errno::BADF));
        assert_eq!(t.get(9).err(), Some(Errno::BADF));
    }

    #[test]
    fn a_guest_holds_at_most_max_open_descriptors() {
        let mut t = Table::default();
        let one = desc();
        for _ in 0..MAX_OPEN {
            t.push(one.clone()).unwrap();
        }
        assert_eq!(t.push(one.clone()).err(), Some(Errno::MFILE));
        t.remove(7).unwrap();
        assert_eq!(t.push(one).unwrap(), 7);
    }

    #[test]
    fn renumber_replaces_the_target_and_frees_the_source() {
        let mut t = Table::default();
        for _ in 0..5 {
            t.push(desc()).unwrap();
        }
        let moved = t.get(4).unwrap().clone();
        assert!(t.renumber(4, 1).unwrap().is_some());
        assert!(Arc::ptr_eq(t.get(1).unwrap(), &moved));
        assert!(!t.contains(4));
        // The source's number is free again; the target's is not.
        assert_eq!(t.push(desc()).unwrap(), 4);
        assert_eq!(t.renumber(1, 9).err(), Some(Errno::BADF));
        assert!(t.renumber(3, 3).unwrap().is_none());
    }
}
