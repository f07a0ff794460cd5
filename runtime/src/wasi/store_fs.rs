//! Files and directories of the store behind guest descriptors: each WASIp1 path and file
//! call as the store's public API answers it (`valet_vfs::Store`, `FileHandle`).
//!
//! Every path is resolved by the store relative to a directory inode, with `..` bounded at
//! the mount and no symlinks, so no path reaches outside it. Where stock wasmtime falls
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
        filetype: match m.kind {
            FileKind::File => filetype::REGULAR_FILE,
            FileKind::Dir => filetype::DIRECTORY,
        },
        nlink: m.nlink as u64,
        size: match m.kind {
            FileKind::File => m.size,
            FileKind::Dir => 4096,
        },
        atim: m.atime_ns,
        mtim: m.mtime_ns,
        ctim: m.ctime_ns,
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

    /// `path_open`.
    pub fn open(
        &self,
        path: &str,
        of: u16,
        read: bool,
        write: bool,
        append: bool,
    ) -> Result<Kind, Errno> {
        let want_dir = of & oflags::DIRECTORY != 0;
        if want_dir && of & (oflags::CREAT | oflags::TRUNC | oflags::EXCL) != 0 {
            return Err(Errno::INVAL);
        }
        let existing = match self.store.lookup(self.ino, path) {
            Ok(ino) => Some(ino),
            Err(valet_vfs::Error::NotFound) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(ino) = existing {
            let kind = self.store.metadata(ino)?.kind;
            if of & oflags::CREAT != 0 && of & oflags::EXCL != 0 {
                return Err(Errno::EXIST);
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
            write: write || append,
            create: of & oflags::CREAT != 0,
            exclusive: of & oflags::EXCL != 0,
            truncate: of & oflags::TRUNC != 0,
            append,
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

    pub fn link(&self, from: &str, to_dir: &StoreDir, to: &str) -> Result<(), Errno> {
        Ok(self.store.link(self.ino, from, to_dir.ino, to)?)
    }

    /// The store has no symlinks: EPERM, as POSIX says where a filesystem cannot make one,
    /// after the checks of the new name every `symlink` makes (in Linux's order).
    pub fn symlink(&self, new_path: &str) -> Result<(), Errno> {
        match self.store.lookup(self.ino, new_path) {
            Ok(_) => return Err(Errno::EXIST),
            Err(valet_vfs::Error::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        let trimmed = new_path.trim_end_matches('/');
        if let Some((head, _)) = trimmed.rsplit_once('/') {
            if !head.is_empty() {
                let parent = self.store.lookup(self.ino, head)?;
                if self.store.metadata(parent)?.kind != FileKind::Dir {
                    return Err(Errno::NOTDIR);
                }
            }
        }
        Err(Errno::PERM)
    }

    /// Every existing path names a file or directory, never a link.
    pub fn readlink(&self, path: &str) -> Result<String, Errno> {
        self.store.lookup(self.ino, path)?;
        Err(Errno::INVAL)
    }

    pub fn stat(&self) -> Result<Filestat, Errno> {
        Ok(filestat(&self.store.metadata(self.ino)?))
    }

    pub fn stat_path(&self, path: &str) -> Result<Filestat, Errno> {
        let ino = self.store.lookup(self.ino, path)?;
        Ok(filestat(&self.store.metadata(ino)?))
    }

    pub fn set_times(&self, atim: Option<TimeSpec>, mtim: Option<TimeSpec>) -> Result<(), Errno> {
        Ok(self.store.set_times(self.ino, ns(atim), ns(mtim))?)
    }

    pub fn set_times_path(
        &self,
        path: &str,
        atim: Option<TimeSpec>,
        mtim: Option<TimeSpec>,
    ) -> Result<(), Errno> {
        let ino = self.store.lookup(self.ino, path)?;
        Ok(self.store.set_times(ino, ns(atim), ns(mtim))?)
    }

    /// The entries (sorted by name), and the inodes of `.` and `..`.
    pub fn list(&self) -> Result<(u64, u64, Vec<Item>), Errno> {
        let parent = self.store.parent(self.ino)?;
        let items = self
            .store
            .read_dir(self.ino)?
            .into_iter()
            .map(|e| Item {
                name: e.name,
                ino: e.ino,
                filetype: match e.kind {
                    FileKind::File => filetype::REGULAR_FILE,
                    FileKind::Dir => filetype::DIRECTORY,
                },
            })
            .collect();
        Ok((self.ino, parent, items))
    }

    /// `fd_sync` / `fd_datasync` of a directory: the store's metadata durable.
    pub fn sync(&self) -> Result<(), Errno> {
        Ok(self.store.sync()?)
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
