//! Files and directories of the store behind guest descriptors: each WASIp1 path and file
//! call as the store's public API answers it (`valet_vfs::Store`, `FileHandle`).
//!
//! Every path is resolved by the store relative to a directory inode, with `..` bounded at
//! the descriptor's directory, and symlinks are the store's own: made, read and followed by
//! the store under that same bound (an absolute or climbing target is EPERM when followed
//! out), so no path reaches outside the mount. Where stock wasmtime falls
//! short for real software this layer is more complete: reads return every requested byte
//! that exists (no 64 KiB cap), vectored writes write every buffer, `fd_sync` of a
//! directory makes the store's metadata durable, and `O_DSYNC` / `O_SYNC` are honoured.

use std::sync::Mutex;

use valet_vfs::{FileHandle, FileKind, Ino, Metadata, OpenOptions, Store};

use super::abi::{filetype, oflags, Errno, Filestat};
use super::dirlist::{Cookies, Item};
use super::table::Kind;
use super::TimeSpec;

/// An open file of the store.
pub struct StoreFile {
    pub handle: FileHandle,
}

/// A directory of the store.
pub struct StoreDir {
    pub store: Store,
    pub ino: Ino,
    pub cookies: Mutex<Cookies>,
}

pub fn filestat(m: &Metadata) -> Filestat {
    Filestat {
        dev: 0,
        ino: m.ino,
        filetype: file_type(m.kind),
        nlink: m.nlink as u64,
        size: match m.kind {
            FileKind::File | FileKind::Symlink => m.size,
            FileKind::Dir => 4096,
        },
        atim: m.atime_ns,
        mtim: m.mtime_ns,
        ctim: m.ctime_ns,
    }
}

fn file_type(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => filetype::REGULAR_FILE,
        FileKind::Dir => filetype::DIRECTORY,
        FileKind::Symlink => filetype::SYMBOLIC_LINK,
    }
}

fn ns(spec: Option<TimeSpec>) -> Option<u64> {
    spec.map(|s| s.ns())
}

impl StoreDir {
    pub fn new(store: Store, ino: Ino) -> StoreDir {
        StoreDir {
            store,
            ino,
            cookies: Mutex::default(),
        }
    }

    /// `path_open`; a final symlink is followed if `follow`, else opening it is ELOOP
    /// (`O_NOFOLLOW`).
    pub fn open(
        &self,
        path: &str,
        follow: bool,
        of: u16,
        read: bool,
        write: bool,
        append: bool,
    ) -> Result<Kind, Errno> {
        let want_dir = of & oflags::DIRECTORY != 0;
        if want_dir && of & (oflags::CREAT | oflags::TRUNC | oflags::EXCL) != 0 {
            return Err(Errno::INVAL);
        }
        let exclusive = of & oflags::CREAT != 0 && of & oflags::EXCL != 0;
        // A create with a trailing slash is EISDIR once the walk to the last component
        // succeeds, whatever that names (Linux checks the slash before the name): an
        // existing file's NotDir below would be ENOTDIR. A missing last component is
        // left to the store's create, which says EISDIR too.
        if of & oflags::CREAT != 0 && path.ends_with('/') {
            let trimmed = path.trim_end_matches('/');
            match self.store.lookup_at(self.ino, trimmed, false) {
                Ok(_) => return Err(Errno::ISDIR),
                Err(valet_vfs::Error::NotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let existing = match self.store.lookup_at(self.ino, path, follow && !exclusive) {
            Ok(ino) => Some(ino),
            Err(valet_vfs::Error::NotFound) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(ino) = existing {
            let kind = self.store.metadata(ino)?.kind;
            if exclusive {
                return Err(Errno::EXIST);
            }
            if kind == FileKind::Symlink {
                return Err(Errno::LOOP);
            }
            if kind == FileKind::Dir {
                if write {
                    return Err(Errno::ISDIR);
                }
                return Ok(Kind::StoreDir(StoreDir::new(self.store.clone(), ino)));
            }
            if want_dir {
                return Err(Errno::NOTDIR);
            }
        } else if want_dir {
            return Err(Errno::NOENT);
        }
        let opts = OpenOptions {
            read,
            write,
            // The store's append implies write (as std's does); a read-only descriptor
            // keeps its append flag (`fd_fdstat_get`) but writes nothing.
            append: append && write,
            create: of & oflags::CREAT != 0,
            exclusive: of & oflags::EXCL != 0,
            truncate: of & oflags::TRUNC != 0,
            nofollow: !follow,
        };
        let handle = self.store.open_file(self.ino, path, opts)?;
        Ok(Kind::StoreFile(StoreFile { handle }))
    }

    pub fn create_dir(&self, path: &str) -> Result<(), Errno> {
        self.store.create_dir(self.ino, path)?;
        Ok(())
    }

    pub fn remove_dir(&self, path: &str) -> Result<(), Errno> {
        Ok(self.store.remove_dir(self.ino, path)?)
    }

    pub fn unlink(&self, path: &str) -> Result<(), Errno> {
        Ok(self.store.unlink(self.ino, path)?)
    }

    pub fn rename(&self, from: &str, to_dir: &StoreDir, to: &str) -> Result<(), Errno> {
        Ok(self.store.rename(self.ino, from, to_dir.ino, to)?)
    }

    /// `path_link`; `follow` links what a final symlink of `from` names (stock refuses it).
    pub fn link(&self, from: &str, follow: bool, to_dir: &StoreDir, to: &str) -> Result<(), Errno> {
        Ok(self.store.link_at(self.ino, from, follow, to_dir.ino, to)?)
    }

    /// A link in the store: an absolute target is EPERM (as stock refuses it), a relative
    /// one is kept as it is and resolved, within this mount, each time it is followed.
    pub fn symlink(&self, target: &str, new_path: &str) -> Result<(), Errno> {
        self.store.symlink(self.ino, target, new_path)?;
        Ok(())
    }

    pub fn readlink(&self, path: &str) -> Result<String, Errno> {
        Ok(self.store.read_link(self.ino, path)?)
    }

    /// A removed directory (inode numbers are never reused) still has a stat, as Linux
    /// gives one: a directory with no links and no size.
    pub fn stat(&self) -> Result<Filestat, Errno> {
        match self.store.metadata(self.ino) {
            Ok(m) => Ok(filestat(&m)),
            Err(valet_vfs::Error::NotFound) => Ok(Filestat {
                ino: self.ino,
                filetype: filetype::DIRECTORY,
                ..Filestat::default()
            }),
            Err(e) => Err(e.into()),
        }
    }

    pub fn stat_path(&self, path: &str, follow: bool) -> Result<Filestat, Errno> {
        let ino = self.store.lookup_at(self.ino, path, follow)?;
        Ok(filestat(&self.store.metadata(ino)?))
    }

    pub fn set_times(&self, atim: Option<TimeSpec>, mtim: Option<TimeSpec>) -> Result<(), Errno> {
        Ok(self.store.set_times(self.ino, ns(atim), ns(mtim))?)
    }

    pub fn set_times_path(
        &self,
        path: &str,
        follow: bool,
        atim: Option<TimeSpec>,
        mtim: Option<TimeSpec>,
    ) -> Result<(), Errno> {
        let ino = self.store.lookup_at(self.ino, path, follow)?;
        Ok(self.store.set_times(ino, ns(atim), ns(mtim))?)
    }

    /// The entries (sorted by name), and the inodes of `.` and `..`. A removed directory
    /// lists as empty (glibc's `readdir` of one ends at once).
    pub fn list(&self) -> Result<(u64, u64, Vec<Item>), Errno> {
        let parent = match self.store.parent(self.ino) {
            Ok(parent) => parent,
            Err(valet_vfs::Error::NotFound) => return Ok((self.ino, self.ino, Vec::new())),
            Err(e) => return Err(e.into()),
        };
        let items = self
            .store
            .read_dir(self.ino)?
            .into_iter()
            .map(|e| Item {
                name: e.name,
                ino: e.ino,
                filetype: file_type(e.kind),
            })
            .collect();
        Ok((self.ino, parent, items))
    }

    /// `fd_sync` / `fd_datasync` of a directory: its entries durable.
    pub fn sync(&self) -> Result<(), Errno> {
        Ok(self.store.sync_dir(self.ino)?)
    }
}

impl StoreFile {
    pub fn stat(&self) -> Result<Filestat, Errno> {
        Ok(filestat(&self.handle.metadata()?))
    }

    pub fn size(&self) -> Result<u64, Errno> {
        Ok(self.handle.metadata()?.size)
    }

    pub fn set_times(&self, atim: Option<TimeSpec>, mtim: Option<TimeSpec>) -> Result<(), Errno> {
        Ok(self.handle.set_times(ns(atim), ns(mtim))?)
    }
}
