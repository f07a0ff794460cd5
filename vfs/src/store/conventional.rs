//! The conventional area: files updated in place (LOCK, CURRENT, small config) live in a host
//! directory, one host file per inode, named by inode number. Names, links and sizes stay in
//! the store's namespace; only the bytes live on the host.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, MutexGuard};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};

use super::state::Ino;
use super::{Inner, Store};
use crate::{Error, Result};

/// The host directory of conventional files.
pub struct ConventionalArea {
    dir: Dir,
    /// Inodes freed since the last commit; their host files go once the free is durable.
    freed: Vec<Ino>,
    /// A host file was created since the directory was last synced.
    dir_dirty: bool,
    /// Opened by a read-only store: host files are opened for reading, never created.
    read_only: bool,
}

impl ConventionalArea {
    pub fn open(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path)?;
        let dir = Dir::open_ambient_dir(path, ambient_authority())?;
        Ok(ConventionalArea {
            dir,
            freed: Vec::new(),
            dir_dirty: false,
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
                dir_dirty: false,
                read_only: true,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn open_file(&mut self, ino: Ino) -> Result<File> {
        let name = ino.to_string();
        let mut opts = OpenOptions::new();
        opts.read(true).write(!self.read_only);
        match self.dir.open_with(&name, &opts) {
            Ok(f) => Ok(f.into_std()),
            Err(e) if self.read_only => Err(e.into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                opts.create(true);
                self.dir_dirty = true;
                Ok(self.dir.open_with(&name, &opts)?.into_std())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Queues a freed inode's host file for removal after the next commit.
    pub fn forget(&mut self, ino: Ino) {
        self.freed.push(ino);
    }

    /// Removes the host files of inodes whose free is now durable.
    pub fn remove_freed(&mut self) -> Result<()> {
        for ino in std::mem::take(&mut self.freed) {
            match self.dir.remove_file(ino.to_string()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The directory to fsync so that created host files' entries are durable, if one was
    /// created since the last such sync (the caller syncs it, and marks it dirty again if
    /// that fails).
    fn take_dir_to_sync(&mut self) -> Result<Option<File>> {
        if !self.dir_dirty {
            return Ok(None);
        }
        let dir = self.dir.open(".")?.into_std();
        self.dir_dirty = false;
        Ok(Some(dir))
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
}

/// Reads `buf.len()` bytes at `offset` of a conventional file's host file; bytes past its
/// end read as zeros (a crash between growing the recorded size and writing the bytes).
pub(super) fn read_host(file: &File, buf: &mut [u8], offset: u64) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    buf[done..].fill(0);
    Ok(buf.len())
}

impl Store {
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
        let mut inner = self.lock()?;
        // Even a failed write may have left some of its bytes: they are the file's too.
        if let Ok(inode) = inner.state.grow(ino, offset + data.len() as u64) {
            inode.mtime_ns = super::now_ns();
        }
        if let Some(of) = inner.open.get_mut(&ino) {
            of.writing = false;
            of.host_dirty = true;
        }
        drop(inner);
        self.notify();
        Ok(written?)
    }

    /// Makes a conventional file's bytes durable (the fsync with the lock released) and
    /// journals its size.
    pub(super) fn sync_conventional(&self, ino: Ino) -> Result<()> {
        let (file, dir) = {
            let mut inner = self.lock()?;
            let dirty = inner.open.get(&ino).is_some_and(|o| o.host_dirty);
            if !dirty {
                return Ok(());
            }
            let file = inner.host_file(ino)?;
            inner.open.get_mut(&ino).expect("open").host_dirty = false;
            let dir = match &mut inner.conv {
                Some(conv) => conv.take_dir_to_sync()?,
                None => None,
            };
            (file, dir)
        };
        let synced = file
            .sync_data()
            .and_then(|()| dir.as_ref().map_or(Ok(()), File::sync_all));
        self.with(|inner| {
            if let Err(e) = synced {
                // Not durable: the next sync must try again (and report again).
                if let Some(of) = inner.open.get_mut(&ino) {
                    of.host_dirty = true;
                }
                if let (Some(conv), Some(_)) = (&mut inner.conv, dir) {
                    conv.dir_dirty = true;
                }
                return Err(e.into());
            }
            let inode = inner.state.inode(ino)?;
            let op = super::state::MetaOp::SetAttr {
                ino,
                size: inode.size,
                atime_ns: inode.atime_ns,
                mtime_ns: inode.mtime_ns,
                ctime_ns: inode.ctime_ns.max(inode.mtime_ns),
            };
            inner.record(op)
        })
    }
}

impl Inner {
    /// The host file of open conventional file `ino`, opened on first use.
    pub(super) fn host_file(&mut self, ino: Ino) -> Result<Arc<File>> {
        let of = self.open.get(&ino).ok_or(Error::BadHandle)?;
        if let Some(file) = &of.host {
            return Ok(file.clone());
        }
        let conv = self
            .conv
            .as_mut()
            .ok_or(Error::Unsupported("conventional area"))?;
        let file = Arc::new(conv.open_file(ino)?);
        self.open.get_mut(&ino).expect("open").host = Some(file.clone());
        Ok(file)
    }

    /// `ftruncate` of a conventional file, first half: the new size in the namespace. A
    /// smaller size is journaled, and must be durable before any byte goes (returns true:
    /// the caller commits, then calls [`Inner::set_len_conventional_host`]), so a crash
    /// leaves the file as it was before the truncate or after it, never zeros past a new end.
    pub(super) fn set_len_conventional(&mut self, ino: Ino, size: u64) -> Result<bool> {
        let now = super::now_ns();
        let shrinking = size < self.state.inode(ino)?.size;
        let inode = self.state.set_size(ino, size)?;
        inode.mtime_ns = now;
        inode.ctime_ns = now;
        if shrinking {
            let op = super::state::MetaOp::SetAttr {
                ino,
                size,
                atime_ns: self.state.inode(ino)?.atime_ns,
                mtime_ns: now,
                ctime_ns: now,
            };
            self.record(op)?;
        }
        Ok(shrinking)
    }

    /// `ftruncate` of a conventional file, second half: the host file.
    pub(super) fn set_len_conventional_host(&mut self, ino: Ino, size: u64) -> Result<()> {
        self.host_file(ino)?.set_len(size)?;
        if let Some(of) = self.open.get_mut(&ino) {
            of.host_dirty = true;
        }
        Ok(())
    }
}
