//! The conventional area: files updated in place (LOCK, CURRENT, small config) live in a host
//! directory, one host file per inode, named by inode number. Names, links and sizes stay in
//! the store's namespace; only the bytes live on the host.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};

use super::state::Ino;
use super::Inner;
use crate::{Error, Result};

/// The host directory of conventional files.
pub struct ConventionalArea {
    dir: Dir,
    /// Inodes freed since the last commit; their host files go once the free is durable.
    freed: Vec<Ino>,
    /// A host file was created since the directory was last synced.
    dir_dirty: bool,
}

impl ConventionalArea {
    pub fn open(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path)?;
        let dir = Dir::open_ambient_dir(path, ambient_authority())?;
        Ok(ConventionalArea {
            dir,
            freed: Vec::new(),
            dir_dirty: false,
        })
    }

    fn open_file(&mut self, ino: Ino) -> Result<File> {
        let name = ino.to_string();
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        match self.dir.open_with(&name, &opts) {
            Ok(f) => Ok(f.into_std()),
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

    /// Makes created host files' directory entries durable.
    fn sync_dir(&mut self) -> Result<()> {
        if self.dir_dirty {
            self.dir.open(".")?.sync_all()?;
            self.dir_dirty = false;
        }
        Ok(())
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

impl Inner {
    fn host_file(&mut self, ino: Ino) -> Result<&File> {
        let of = self.open.get(&ino).ok_or(Error::BadHandle)?;
        if of.host.is_none() {
            let conv = self
                .conv
                .as_mut()
                .ok_or(Error::Unsupported("conventional area"))?;
            let file = conv.open_file(ino)?;
            self.open.get_mut(&ino).expect("open").host = Some(file);
        }
        Ok(self.open[&ino].host.as_ref().expect("just opened"))
    }

    pub(super) fn write_conventional(&mut self, ino: Ino, data: &[u8], offset: u64) -> Result<()> {
        self.host_file(ino)?.write_all_at(data, offset)?;
        let tenant = {
            let inode = self.state.inode_mut(ino)?;
            inode.size = inode.size.max(offset + data.len() as u64);
            inode.mtime_ns = super::now_ns();
            inode.tenant
        };
        *self.counters.conventional.entry(tenant).or_default() += data.len() as u64;
        self.open.get_mut(&ino).expect("open").host_dirty = true;
        Ok(())
    }

    pub(super) fn read_conventional(
        &mut self,
        ino: Ino,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<usize> {
        let file = self.host_file(ino)?;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        // A host file shorter than the recorded size (a crash between the two) reads zeros.
        buf[done..].fill(0);
        Ok(buf.len())
    }

    /// `ftruncate` of a conventional file, first half: the new size in the namespace. A
    /// smaller size is journaled, and must be durable before any byte goes (returns true:
    /// the caller commits, then calls [`Inner::set_len_conventional_host`]), so a crash
    /// leaves the file as it was before the truncate or after it, never zeros past a new end.
    pub(super) fn set_len_conventional(&mut self, ino: Ino, size: u64) -> Result<bool> {
        let now = super::now_ns();
        let inode = self.state.inode_mut(ino)?;
        let shrinking = size < inode.size;
        inode.size = size;
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

    /// Makes a conventional file's bytes durable and journals its size.
    pub(super) fn sync_conventional(&mut self, ino: Ino) -> Result<()> {
        let dirty = self.open.get(&ino).is_some_and(|o| o.host_dirty);
        if !dirty {
            return Ok(());
        }
        self.host_file(ino)?.sync_data()?;
        if let Some(conv) = &mut self.conv {
            conv.sync_dir()?;
        }
        self.open.get_mut(&ino).expect("open").host_dirty = false;
        let inode = self.state.inode(ino)?;
        let op = super::state::MetaOp::SetAttr {
            ino,
            size: inode.size,
            atime_ns: inode.atime_ns,
            mtime_ns: inode.mtime_ns,
            ctime_ns: inode.ctime_ns.max(inode.mtime_ns),
        };
        self.record(op)
    }
}
