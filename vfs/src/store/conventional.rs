//! The conventional area: files updated in place (LOCK, CURRENT, small config) live in a host
//! directory, one host file per inode, named by inode number. Names, links and sizes stay in
//! the store's namespace; only the bytes live on the host.
//!
//! The journal never records a size the host file does not hold durably: a write grows the
//! size in memory only; a sync records the size the file had when its host fsync began,
//! once that fsync is done (writes go on meanwhile); a truncation to a smaller size syncs
//! the host file before it records the new size; checkpoints and time changes record at
//! most the size last synced ([`State::recorded_sizes`]). So after any crash a host file is at
//! least as long as its recorded size (mount cuts off what is past it), and one that is
//! shorter or missing was damaged on the host: its reads fail (EIO) rather than return
//! zeros, and fsck names it.
//!
//! Syncs of one file may overlap (a guest's and the writeback round's): each makes its
//! own unless a sync that began after the file's last write has completed, so none returns
//! on the strength of one still in flight. A host fsync that fails is final for the file
//! (Linux reports a failed writeback once and then calls the pages clean): its later syncs
//! fail too, and fsck names it. A freed file's host file is removed by the commit whose
//! record frees it, after that record's flush, never by one that was under way already.
//!
//! [`State::recorded_sizes`]: super::state::State::recorded_sizes

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, MutexGuard};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};

use super::state::{FileKind, Ino};
use super::{Inner, OpenFile, Store};
use crate::hint::Class;
use crate::{Error, Result};

/// The host directory of conventional files.
pub struct ConventionalArea {
    dir: Dir,
    /// Inodes freed since the last commit; their host files go once the free is durable.
    freed: Vec<Ino>,
    /// Host files created, and how many of them a completed directory sync covers. Counts,
    /// not a flag: a sync that finds one in flight must make its own, not trust it.
    dir_creates: u64,
    dir_synced: u64,
    /// Files whose host fsync failed, with the error. Linux reports a failed writeback
    /// once and then calls the pages clean, so a later fsync would succeed on bytes the
    /// host lost: every later sync of the file fails instead, until it is removed.
    failed: BTreeMap<Ino, String>,
    /// Opened by a read-only store: host files are opened for reading, never created.
    read_only: bool,
}

/// The area's directory to sync, and the count of host files created it covers.
struct DirSync {
    dir: File,
    creates: u64,
}

impl ConventionalArea {
    pub fn open(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path)?;
        let dir = Dir::open_ambient_dir(path, ambient_authority())?;
        Ok(ConventionalArea {
            dir,
            freed: Vec::new(),
            dir_creates: 0,
            dir_synced: 0,
            failed: BTreeMap::new(),
            read_only: false,
        })
    }

    /// The area of a read-only store, or None when its directory does not exist (no
    /// conventional file was ever written).
    pub fn open_read_only(path: &Path) -> Result<Option<Self>> {
        match Dir::open_ambient_dir(path, ambient_authority()) {
            Ok(dir) => Ok(Some(ConventionalArea {
                dir,
                freed: Vec::new(),
                dir_creates: 0,
                dir_synced: 0,
                failed: BTreeMap::new(),
                read_only: true,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The host file of `ino`, a file of `size` bytes; created if it has none yet.
    fn open_file(&mut self, ino: Ino, size: u64) -> Result<File> {
        let name = ino.to_string();
        let mut opts = OpenOptions::new();
        opts.read(true).write(!self.read_only);
        match self.dir.open_with(&name, &opts) {
            Ok(f) => Ok(f.into_std()),
            // Made again, it would read as zeros.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && size > 0 => {
                Err(Error::Corrupt(missing(ino)))
            }
            Err(e) if self.read_only => Err(e.into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                opts.create(true);
                self.dir_creates += 1;
                Ok(self.dir.open_with(&name, &opts)?.into_std())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Queues a freed inode's host file for removal once its free is durable (see
    /// [`ConventionalArea::take_freed`]).
    pub fn forget(&mut self, ino: Ino) {
        self.freed.push(ino);
        self.failed.remove(&ino);
    }

    /// The inodes freed so far, taken by a commit together with the pending operations
    /// that free them: only those are durably free once its flush is done (ones freed
    /// meanwhile are in the next record, and their host files wait for its commit).
    pub fn take_freed(&mut self) -> Vec<Ino> {
        std::mem::take(&mut self.freed)
    }

    /// Removes the host files of `inos`, whose free is now durable.
    pub fn remove_freed(&mut self, inos: Vec<Ino>) -> Result<()> {
        for ino in inos {
            match self.dir.remove_file(ino.to_string()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Gives back inodes a failed commit took (their host files wait for the next one).
    pub fn give_back_freed(&mut self, inos: Vec<Ino>) {
        self.freed.extend(inos);
    }

    /// The directory to fsync so that created host files' entries are durable, if one was
    /// created since the last such sync completed, with the count it covers (for
    /// [`ConventionalArea::dir_synced`] once it is done).
    fn dir_to_sync(&self) -> Result<Option<DirSync>> {
        if self.dir_creates == self.dir_synced {
            return Ok(None);
        }
        let dir = self.dir.open(".")?.into_std();
        Ok(Some(DirSync {
            dir,
            creates: self.dir_creates,
        }))
    }

    fn dir_synced(&mut self, creates: u64) {
        self.dir_synced = self.dir_synced.max(creates);
    }

    /// Cuts host files back to their recorded size (a crash between committing a truncate
    /// and shrinking the host file leaves them longer).
    pub fn trim(&mut self, files: impl Iterator<Item = (Ino, u64)>) -> Result<()> {
        for (ino, size) in files {
            let name = ino.to_string();
            let mut opts = OpenOptions::new();
            opts.write(true);
            match self.dir.open_with(&name, &opts) {
                Ok(f) => {
                    if f.metadata()?.len() > size {
                        f.set_len(size)?;
                        f.sync_all()?;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// What is wrong with the host files of these conventional files of the given sizes:
    /// one missing or shorter than its file (see the module docs).
    pub fn damage(&self, files: impl Iterator<Item = (Ino, u64)>) -> Vec<String> {
        let mut found: Vec<String> = self.failed.values().cloned().collect();
        for (ino, size) in files.filter(|&(_, size)| size > 0) {
            match self.dir.metadata(ino.to_string()) {
                Ok(m) if m.len() < size => found.push(short(ino, m.len(), size)),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => found.push(missing(ino)),
                Err(e) => found.push(format!("conventional file {ino}: {e}")),
            }
        }
        found
    }

    /// Removes host files that no live conventional inode owns (left by a crash).
    pub fn remove_orphans(&mut self, live: impl Fn(Ino) -> bool) -> Result<()> {
        for entry in self.dir.entries()? {
            let name = entry?.file_name();
            let Some(ino) = name.to_str().and_then(|n| n.parse::<Ino>().ok()) else {
                continue;
            };
            if !live(ino) {
                self.dir.remove_file(&name)?;
            }
        }
        Ok(())
    }

    /// Whether a sync of `ino`'s host file failed (see [`ConventionalArea::failed`]).
    pub(super) fn sync_failed(&self, ino: Ino) -> bool {
        self.failed.contains_key(&ino)
    }

    /// The error every later sync of `ino` returns once a sync of its host file failed.
    fn check_synced(&self, ino: Ino) -> Result<()> {
        match self.failed.get(&ino) {
            Some(why) => Err(Error::Io(std::io::Error::other(why.clone()))),
            None => Ok(()),
        }
    }

    fn note_failure(&mut self, ino: Ino, e: &std::io::Error) {
        self.failed.entry(ino).or_insert_with(|| {
            format!(
                "conventional file {ino}: a sync of its host file failed ({e}): what was \
                 written since its last good sync may be lost"
            )
        });
    }
}

fn missing(ino: Ino) -> String {
    format!("conventional file {ino}: its host file is missing")
}

fn short(ino: Ino, len: u64, size: u64) -> String {
    format!("conventional file {ino}: its host file holds {len} of its {size} bytes")
}

impl Store {
    /// Reads `buf.len()` bytes at `offset` of conventional file `ino`, within its size, from
    /// its host file with the lock released. The host file holds them all unless it was
    /// damaged (see the module docs) or a truncation came meanwhile.
    pub(super) fn read_conventional(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        ino: Ino,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<usize> {
        let file = inner.host_file(ino)?;
        drop(inner);
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        if done < buf.len() {
            let size = self.lock()?.state.inode(ino)?.size;
            if size > offset + done as u64 {
                let len = file.metadata()?.len();
                return Err(Error::Corrupt(short(ino, len, size)));
            }
        }
        Ok(done)
    }

    /// A write to a conventional file: the bytes go to the host file with the lock released
    /// (the file's `writing` flag set meanwhile, so that no other write or truncation comes
    /// between), and only then do the size grow and the file get marked dirty, together: a
    /// reader never finds zeros where the bytes are still on their way, and a sync that
    /// began meanwhile cannot clear the mark before these bytes are in the file.
    pub(super) fn write_conventional(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        ino: Ino,
        data: &[u8],
        offset: u64,
    ) -> Result<()> {
        let file = inner.host_file(ino)?;
        let tenant = inner.state.inode(ino)?.tenant;
        *inner.counters.conventional.entry(tenant).or_default() += data.len() as u64;
        if let Some(of) = inner.open.get_mut(&ino) {
            of.writing = true;
        }
        drop(inner);
        let written = file.write_all_at(data, offset);
        let mut end = offset + data.len() as u64;
        if written.is_err() {
            // Some of its bytes may have reached the host file: those are the file's too.
            end = end.min(file.metadata().map_or(0, |m| m.len()));
        }
        let mut inner = self.lock()?;
        let grown = inner.grow_conventional(ino, end);
        let tick = inner.touch();
        if let Some(of) = inner.open.get_mut(&ino) {
            of.writing = false;
            of.host_write_tick = tick;
        }
        drop(inner);
        self.notify();
        written?;
        grown
    }

    /// Makes a conventional file's bytes durable (the fsync with the lock released) and
    /// journals the size they reached when it began. A sync that finds another in flight
    /// makes its own: the other may not be done (or journaled) when this one returns.
    pub(super) fn sync_conventional(&self, ino: Ino) -> Result<()> {
        let (file, dir, size, shrinks, tick) = {
            let mut inner = self.lock()?;
            inner.check_host_synced(ino)?;
            if !inner.open.get(&ino).is_some_and(OpenFile::host_dirty) {
                return Ok(());
            }
            let file = inner.host_file(ino)?;
            let dir = inner.host_dir_to_sync()?;
            let shrinks = inner.state.host_shrinks.get(&ino).copied();
            let size = inner.state.inode(ino)?.size;
            (file, dir, size, shrinks, inner.touch())
        };
        self.sync_host(ino, &file, dir)?;
        self.with(|inner| {
            if let Some(of) = inner.open.get_mut(&ino) {
                of.host_sync_tick = of.host_sync_tick.max(tick);
            }
            // A file closed while it still had bytes to sync (its close's sync failed)
            // is let go now.
            inner.settle_closed(ino)?;
            if inner.state.host_shrinks.get(&ino).copied() != shrinks {
                // A truncation came meanwhile: it synced the host file and journaled its
                // size itself, which keeps all of what this sync was to keep that it did
                // not cut off.
                return Ok(());
            }
            let inode = inner.state.inode(ino)?;
            // Grows the recorded size to what was synced; writes since keep theirs.
            let op = super::state::MetaOp::Extend {
                ino,
                size,
                mtime_ns: inode.mtime_ns,
            };
            // The record moves the recordable size up to it (see `State::size_recorded`).
            inner.record(op)
        })
    }

    /// Syncs `ino`'s host file, then the area's directory when a host file was made since
    /// it was last synced (`dir`, from [`Inner::host_dir_to_sync`]). On failure nothing is
    /// marked synced, and the file's syncs fail from then on (see
    /// [`ConventionalArea::failed`]).
    fn sync_host(&self, ino: Ino, file: &File, dir: Option<DirSync>) -> Result<()> {
        let synced = file.sync_data().and_then(|()| match &dir {
            Some(DirSync { dir, .. }) => dir.sync_all(),
            None => Ok(()),
        });
        let mut inner = self.lock()?;
        let Some(conv) = &mut inner.conv else {
            return Ok(synced?);
        };
        match synced {
            Ok(()) => {
                if let Some(DirSync { creates, .. }) = dir {
                    conv.dir_synced(creates);
                }
                Ok(())
            }
            Err(e) => {
                conv.note_failure(ino, &e);
                Err(e.into())
            }
        }
    }

    /// [`Store::set_len`] of a conventional file, with the file's `writing` flag set. A
    /// larger size reaches the host file first (a reader never finds the host file shorter
    /// than the file). A smaller one reaches the journal first (a crash leaves the file as
    /// it was before the truncate or after it, never zeros past its new end), once the host
    /// file is synced (it may then record the new size, see the module docs).
    pub(super) fn change_len_conventional(&self, ino: Ino, size: u64) -> Result<()> {
        let shrinking = self.with(|inner| Ok(size < inner.state.inode(ino)?.size))?;
        if shrinking {
            let (file, dir) = self.with(|inner| {
                inner.check_host_synced(ino)?;
                Ok((inner.host_file(ino)?, inner.host_dir_to_sync()?))
            })?;
            self.sync_host(ino, &file, dir)?;
            self.with(|inner| inner.set_len_conventional(ino, size))?;
            self.commit()?;
            self.with(|inner| inner.set_len_conventional_host(ino, size))
        } else {
            self.with(|inner| inner.set_len_conventional_host(ino, size))?;
            self.with(|inner| inner.set_len_conventional(ino, size))
        }
    }
}

/// What [`Store::fsck`] finds wrong with the conventional area's host files.
pub(super) fn damage(inner: &Inner) -> Vec<String> {
    let files = inner
        .state
        .inodes
        .iter()
        .filter(|(_, i)| i.kind == FileKind::File && i.hint.class == Class::Conventional)
        .map(|(&ino, i)| (ino, i.size));
    match &inner.conv {
        Some(conv) => conv.damage(files),
        None if inner.config.read_only => files
            .filter(|&(_, size)| size > 0)
            .map(|(ino, _)| missing(ino))
            .collect(),
        None => Vec::new(),
    }
}

impl Inner {
    /// The host file of open conventional file `ino`, opened on first use.
    pub(super) fn host_file(&mut self, ino: Ino) -> Result<Arc<File>> {
        let of = self.open.get(&ino).ok_or(Error::BadHandle)?;
        if let Some(file) = &of.host {
            return Ok(file.clone());
        }
        let size = self.state.inode(ino)?.size;
        let file = match self.conv.as_mut() {
            Some(conv) => Arc::new(conv.open_file(ino, size)?),
            // A read-only store's area whose directory was never made.
            None if self.config.read_only && size > 0 => return Err(Error::Corrupt(missing(ino))),
            None => return Err(Error::Unsupported("conventional area")),
        };
        self.open.get_mut(&ino).expect("open").host = Some(file.clone());
        Ok(file)
    }

    /// A conventional file's size grown to at least `end` by bytes now in its host file,
    /// not yet synced: a journal record claims no more than the size before.
    fn grow_conventional(&mut self, ino: Ino, end: u64) -> Result<()> {
        self.state.grow_unrecorded(ino, end)?.mtime_ns = super::now_ns();
        Ok(())
    }

    /// `ftruncate` of a conventional file in the namespace. A smaller size is journaled
    /// (the caller has synced the host file, and commits the record before cutting it).
    fn set_len_conventional(&mut self, ino: Ino, size: u64) -> Result<()> {
        let now = super::now_ns();
        let old = self.state.inode(ino)?.size;
        let inode = match size > old {
            true => self.state.grow_unrecorded(ino, size)?,
            false => self.state.set_size(ino, size)?,
        };
        inode.mtime_ns = now;
        inode.ctime_ns = now;
        if size < old {
            // Its record makes the smaller size recordable whole (`State::size_recorded`).
            *self.state.host_shrinks.entry(ino).or_default() += 1;
            let op = super::state::MetaOp::SetAttr {
                ino,
                size,
                atime_ns: self.state.inode(ino)?.atime_ns,
                mtime_ns: now,
                ctime_ns: now,
            };
            self.record(op)?;
        }
        Ok(())
    }

    /// Fails once a sync of `ino`'s host file failed (see [`ConventionalArea::failed`]).
    fn check_host_synced(&self, ino: Ino) -> Result<()> {
        self.conv.as_ref().map_or(Ok(()), |c| c.check_synced(ino))
    }

    /// The area's directory to sync with a host file, if a host file was made since it was
    /// last synced (see [`Store::sync_host`]).
    fn host_dir_to_sync(&self) -> Result<Option<DirSync>> {
        match &self.conv {
            Some(conv) => conv.dir_to_sync(),
            None => Ok(None),
        }
    }

    /// `ftruncate` of a conventional file: the host file.
    fn set_len_conventional_host(&mut self, ino: Ino, size: u64) -> Result<()> {
        self.host_file(ino)?.set_len(size)?;
        let tick = self.touch();
        if let Some(of) = self.open.get_mut(&ino) {
            of.host_write_tick = tick;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Geometry, MemoryDevice};
    use crate::{OpenOptions, StoreConfig};

    fn device() -> Arc<MemoryDevice> {
        let geometry = Geometry {
            zone_count: 16,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            block_size: 4096,
            max_open: 4,
            max_active: 5,
        };
        Arc::new(MemoryDevice::new(geometry).unwrap())
    }

    fn config(host: &Path) -> StoreConfig {
        StoreConfig {
            conventional_dir: Some(host.to_path_buf()),
            ..Default::default()
        }
    }

    /// Notes a failed host fsync of `name`, as `sync_host` notes a real one (no file
    /// system here fails an fsync on demand).
    fn fail_host_sync(store: &Store, root: Ino, name: &str) {
        let ino = store.lookup(root, name).unwrap();
        let eio = std::io::Error::from_raw_os_error(libc::EIO);
        store
            .lock()
            .unwrap()
            .conv
            .as_mut()
            .unwrap()
            .note_failure(ino, &eio);
    }

    /// A failed host fsync is not retried into a success: Linux reports a failed writeback
    /// once, so every later sync of the file fails, its close too, and fsck names it until
    /// the file is removed.
    #[test]
    fn a_failed_host_sync_fails_every_later_sync_of_the_file() {
        let host = tempfile::tempdir().unwrap();
        let store = Store::open(device(), config(host.path())).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let f = store
            .open_file(root, "CURRENT", OpenOptions::create())
            .unwrap();
        f.write_at(b"MANIFEST-000001\n", 0).unwrap();
        f.sync_all().unwrap();
        f.write_at(b"MANIFEST-000002\n", 0).unwrap();
        fail_host_sync(&store, root, "CURRENT");
        let failed = |r: Result<()>| match r {
            Err(e) => {
                assert_eq!(e.errno(), libc::EIO, "{e}");
                assert!(e.to_string().contains("may be lost"), "{e}");
            }
            Ok(()) => panic!("a sync after a failed one succeeded"),
        };
        failed(f.sync_data());
        failed(f.sync_all());
        failed(f.close());
        let f = store
            .open_file(root, "CURRENT", OpenOptions::read())
            .unwrap();
        failed(f.sync_all());
        drop(f);
        let report = store.fsck().unwrap();
        assert!(report.is_consistent(), "{}", report.findings());
        assert_eq!(report.damaged.len(), 1, "{}", report.findings());
        assert!(report.damaged[0].contains("a sync of its host file failed"));
        // Gone with the file.
        store.unlink(root, "CURRENT").unwrap();
        store.sync().unwrap();
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "{}", report.findings());
    }

    /// One file's failure does not stop the writeback rounds for the others (it used to end
    /// the writeback thread: nothing written after it reached the device until a sync).
    #[test]
    fn writeback_goes_on_past_one_files_failure() {
        let host = tempfile::tempdir().unwrap();
        let dev = device();
        let writing_back = StoreConfig {
            writeback: Some(std::time::Duration::from_millis(5)),
            ..config(host.path())
        };
        let store = Store::open(dev.clone(), writing_back).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let current = store
            .open_file(root, "CURRENT", OpenOptions::create())
            .unwrap();
        current.write_at(b"MANIFEST-000001\n", 0).unwrap();
        fail_host_sync(&store, root, "CURRENT");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let log = store
            .open_file(root, "000003.log", OpenOptions::create())
            .unwrap();
        log.write_at(&[7; 3000], 0).unwrap();
        // A power cut once some rounds have passed finds the log's bytes (never synced).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let copy = Arc::new(dev.durable_copy());
            let copy_host = tempfile::tempdir().unwrap();
            let recovered = Store::open(copy, config(copy_host.path())).unwrap();
            let (_, root) = recovered.tenant("app").unwrap();
            let size = recovered
                .lookup(root, "000003.log")
                .and_then(|ino| recovered.metadata(ino))
                .map_or(0, |m| m.size);
            if size == 3000 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the log's bytes never reached the device: writeback stopped"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
