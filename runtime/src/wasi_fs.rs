//! The WASI filesystem over valet-vfs: wasi-common's `WasiDir` and `WasiFile` implemented on
//! the store, plus the few WASIp1 calls wasi-common does not route through those traits.
//!
//! This is the only module that knows wasi-common: moving to another WASIp1 layer (or to a
//! `wasi:filesystem` host) replaces this file and nothing else.
//!
//! Every path a guest passes is resolved by the store relative to a directory inode, with
//! `..` bounded at that directory (as WASI requires of a directory descriptor) and no
//! symlinks, so no path reaches outside the mount.
//! Behaviour chosen where stock wasmtime falls short for real software: a read returns
//! every requested byte that exists (no 64 KiB cap), and `fd_sync` / `fd_datasync` on a
//! directory make the store's metadata durable instead of failing with EBADF, and
//! `fd_readdir` cookies name entries rather than positions, so a program that removes
//! entries while listing (`rm -r`, Rust's `remove_dir_all`) still sees every one.

use std::any::Any;
use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut, SeekFrom};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use valet_vfs::{FileHandle, FileKind, Ino, Metadata, OpenOptions, Store};
use wasi_common::dir::{OpenResult, ReaddirCursor, ReaddirEntity};
use wasi_common::file::{Advice, FdFlags, FileType, Filestat, OFlags};
use wasi_common::snapshots::preview_1::types::{self, Errno};
use wasi_common::snapshots::preview_1::wasi_snapshot_preview1::WasiSnapshotPreview1;
use wasi_common::{Error, ErrorExt, SystemTimeSpec, WasiCtx, WasiDir, WasiFile};
use wiggle::{run_in_dummy_executor, GuestMemory};

/// A store error as the errno a POSIX filesystem would give.
fn errno(e: valet_vfs::Error) -> Error {
    Error::from(std::io::Error::from_raw_os_error(e.errno()))
}

fn to_system_time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn time_spec_ns(spec: Option<SystemTimeSpec>) -> Option<u64> {
    spec.map(|s| match s {
        SystemTimeSpec::SymbolicNow => SystemTime::now(),
        SystemTimeSpec::Absolute(t) => t.into_std(),
    })
    .map(|t| {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

fn filestat(m: &Metadata) -> Filestat {
    Filestat {
        device_id: 0,
        inode: m.ino,
        filetype: match m.kind {
            FileKind::File => FileType::RegularFile,
            FileKind::Dir => FileType::Directory,
        },
        nlink: m.nlink as u64,
        size: match m.kind {
            FileKind::File => m.size,
            FileKind::Dir => 4096,
        },
        atim: Some(to_system_time(m.atime_ns)),
        mtim: Some(to_system_time(m.mtime_ns)),
        ctim: Some(to_system_time(m.ctime_ns)),
    }
}

/// A directory of the store, as a WASI directory handle.
pub struct VfsDir {
    store: Store,
    ino: Ino,
    cookies: Arc<Mutex<Cookies>>,
}

/// The `fd_readdir` cookies one directory handle has handed out. Cookies 1 and 2 follow `.`
/// and `..`; cookie `FIRST + i` follows the entry called `names[i]`, so resuming continues
/// with the next name in order even when that entry, or any other, was removed meanwhile
/// (position cookies would skip entries). Bounded by the names this handle has listed.
#[derive(Default)]
struct Cookies {
    names: Vec<String>,
    by_name: HashMap<String, u64>,
}

impl Cookies {
    const FIRST: u64 = 3;
    /// A listing from the start forgets older cookies once this many names are held.
    const MAX: usize = 1 << 16;

    fn cookie(&mut self, name: &str) -> u64 {
        if let Some(&c) = self.by_name.get(name) {
            return c;
        }
        let c = Self::FIRST + self.names.len() as u64;
        self.names.push(name.to_string());
        self.by_name.insert(name.to_string(), c);
        c
    }
}

impl VfsDir {
    pub fn new(store: Store, ino: Ino) -> Self {
        VfsDir {
            store,
            ino,
            cookies: Arc::default(),
        }
    }
}

/// The other end of a rename or link must be in the same store.
fn same_store(dir: &dyn WasiDir) -> Result<&VfsDir, Error> {
    dir.as_any()
        .downcast_ref::<VfsDir>()
        .ok_or_else(|| Errno::Xdev.into())
}

#[wiggle::async_trait]
impl WasiDir for VfsDir {
    fn as_any(&self) -> &dyn Any {
        self
    }

    async fn open_file(
        &self,
        _symlink_follow: bool,
        path: &str,
        oflags: OFlags,
        read: bool,
        write: bool,
        fdflags: FdFlags,
    ) -> Result<OpenResult, Error> {
        let want_dir = oflags.contains(OFlags::DIRECTORY);
        if want_dir && oflags.intersects(OFlags::CREATE | OFlags::TRUNCATE) {
            return Err(Error::invalid_argument());
        }
        let existing = match self.store.lookup(self.ino, path) {
            Ok(ino) => Some(ino),
            Err(valet_vfs::Error::NotFound) => None,
            Err(e) => return Err(errno(e)),
        };
        if let Some(ino) = existing {
            let kind = self.store.metadata(ino).map_err(errno)?.kind;
            if oflags.contains(OFlags::CREATE | OFlags::EXCLUSIVE) {
                return Err(Error::exist());
            }
            if kind == FileKind::Dir {
                if write || oflags.contains(OFlags::TRUNCATE) {
                    return Err(Errno::Isdir.into());
                }
                return Ok(OpenResult::Dir(Box::new(VfsDir::new(
                    self.store.clone(),
                    ino,
                ))));
            }
            if want_dir {
                return Err(Error::not_dir());
            }
        } else if want_dir {
            return Err(Error::not_found());
        }
        let append = fdflags.contains(FdFlags::APPEND);
        let opts = OpenOptions {
            read,
            write: write || append,
            create: oflags.contains(OFlags::CREATE),
            exclusive: oflags.contains(OFlags::EXCLUSIVE),
            truncate: oflags.contains(OFlags::TRUNCATE),
            append,
        };
        let handle = self.store.open_file(self.ino, path, opts).map_err(errno)?;
        Ok(OpenResult::File(Box::new(VfsFile::new(handle, fdflags))))
    }

    async fn create_dir(&self, path: &str) -> Result<(), Error> {
        self.store
            .create_dir(self.ino, path)
            .map(|_| ())
            .map_err(errno)
    }

    async fn readdir(
        &self,
        cursor: ReaddirCursor,
    ) -> Result<Box<dyn Iterator<Item = Result<ReaddirEntity, Error>> + Send>, Error> {
        let parent = self.store.parent(self.ino).map_err(errno)?;
        let cursor = u64::from(cursor);
        let dots = [(".", self.ino, 1u64), ("..", parent, 2u64)]
            .into_iter()
            .skip(cursor.min(2) as usize)
            .map(|(name, inode, next)| {
                Ok(ReaddirEntity {
                    next: ReaddirCursor::from(next),
                    inode,
                    name: name.to_string(),
                    filetype: FileType::Directory,
                })
            });
        // Entries come in name order; resume after the name the cookie stands for.
        let after = if cursor < Cookies::FIRST {
            if cursor == 0 {
                let mut cookies = self.cookies.lock().unwrap_or_else(|p| p.into_inner());
                if cookies.names.len() > Cookies::MAX {
                    *cookies = Cookies::default();
                }
            }
            None
        } else {
            let cookies = self.cookies.lock().unwrap_or_else(|p| p.into_inner());
            match cookies.names.get((cursor - Cookies::FIRST) as usize) {
                Some(name) => Some(name.clone()),
                // Not a cookie of this handle: past the end.
                None => return Ok(Box::new(std::iter::empty())),
            }
        };
        let entries = self.store.read_dir(self.ino).map_err(errno)?;
        let cookies = self.cookies.clone();
        let rest = entries
            .into_iter()
            .filter(move |e| after.as_ref().is_none_or(|a| e.name > *a))
            .map(move |e| {
                let next = cookies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .cookie(&e.name);
                Ok(ReaddirEntity {
                    next: ReaddirCursor::from(next),
                    inode: e.ino,
                    name: e.name,
                    filetype: match e.kind {
                        FileKind::File => FileType::RegularFile,
                        FileKind::Dir => FileType::Directory,
                    },
                })
            });
        Ok(Box::new(dots.chain(rest)))
    }

    async fn symlink(&self, _old_path: &str, new_path: &str) -> Result<(), Error> {
        // The store has no symlinks; POSIX says EPERM where a filesystem cannot make one,
        // after the checks of the new name every `symlink` makes (as Linux orders them).
        match self.store.lookup(self.ino, new_path) {
            Ok(_) => return Err(Error::exist()),
            Err(valet_vfs::Error::NotFound) => {}
            Err(e) => return Err(errno(e)),
        }
        let trimmed = new_path.trim_end_matches('/');
        if let Some((head, _)) = trimmed.rsplit_once('/') {
            if !head.is_empty() {
                let parent = self.store.lookup(self.ino, head).map_err(errno)?;
                if self.store.metadata(parent).map_err(errno)?.kind != FileKind::Dir {
                    return Err(Error::not_dir());
                }
            }
        }
        Err(Error::perm())
    }

    async fn remove_dir(&self, path: &str) -> Result<(), Error> {
        self.store.remove_dir(self.ino, path).map_err(errno)
    }

    async fn unlink_file(&self, path: &str) -> Result<(), Error> {
        self.store.unlink(self.ino, path).map_err(errno)
    }

    async fn read_link(&self, path: &str) -> Result<std::path::PathBuf, Error> {
        // Every existing path names a file or directory, never a link.
        self.store.lookup(self.ino, path).map_err(errno)?;
        Err(Error::invalid_argument())
    }

    async fn get_filestat(&self) -> Result<Filestat, Error> {
        self.store
            .metadata(self.ino)
            .map(|m| filestat(&m))
            .map_err(errno)
    }

    async fn get_path_filestat(&self, path: &str, _follow: bool) -> Result<Filestat, Error> {
        let ino = self.store.lookup(self.ino, path).map_err(errno)?;
        self.store
            .metadata(ino)
            .map(|m| filestat(&m))
            .map_err(errno)
    }

    async fn rename(&self, path: &str, dest_dir: &dyn WasiDir, dest: &str) -> Result<(), Error> {
        let to = same_store(dest_dir)?;
        self.store
            .rename(self.ino, path, to.ino, dest)
            .map_err(errno)
    }

    async fn hard_link(
        &self,
        path: &str,
        target_dir: &dyn WasiDir,
        target: &str,
    ) -> Result<(), Error> {
        let to = same_store(target_dir)?;
        self.store
            .link(self.ino, path, to.ino, target)
            .map_err(errno)
    }

    async fn set_times(
        &self,
        path: &str,
        atime: Option<SystemTimeSpec>,
        mtime: Option<SystemTimeSpec>,
        _follow: bool,
    ) -> Result<(), Error> {
        let ino = self.store.lookup(self.ino, path).map_err(errno)?;
        self.store
            .set_times(ino, time_spec_ns(atime), time_spec_ns(mtime))
            .map_err(errno)
    }
}

/// An open file of the store, with the file position WASI keeps per descriptor.
pub struct VfsFile {
    handle: FileHandle,
    pos: AtomicU64,
    flags: Mutex<FdFlags>,
}

impl VfsFile {
    fn new(handle: FileHandle, flags: FdFlags) -> Self {
        VfsFile {
            handle,
            pos: AtomicU64::new(0),
            flags: Mutex::new(flags),
        }
    }

    fn flags(&self) -> FdFlags {
        *self.flags.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `O_DSYNC` / `O_SYNC`: every write is durable before it returns.
    fn sync_if_asked(&self) -> Result<(), Error> {
        if self
            .flags()
            .intersects(FdFlags::DSYNC | FdFlags::SYNC | FdFlags::RSYNC)
        {
            self.handle.sync_data().map_err(errno)?;
        }
        Ok(())
    }

    fn read_at(&self, bufs: &mut [IoSliceMut<'_>], mut offset: u64) -> Result<u64, Error> {
        let mut total = 0u64;
        for buf in bufs.iter_mut() {
            let n = self.handle.read_at(buf, offset).map_err(errno)?;
            total += n as u64;
            offset += n as u64;
            if n < buf.len() {
                break;
            }
        }
        Ok(total)
    }

    fn write_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> Result<(u64, u64), Error> {
        let mut total = 0u64;
        let mut at = offset;
        for buf in bufs {
            let landed = self.handle.write_at(buf, at).map_err(errno)?;
            at = landed + buf.len() as u64;
            total += buf.len() as u64;
        }
        self.sync_if_asked()?;
        Ok((total, at))
    }
}

#[wiggle::async_trait]
impl WasiFile for VfsFile {
    fn as_any(&self) -> &dyn Any {
        self
    }

    async fn get_filetype(&self) -> Result<FileType, Error> {
        Ok(FileType::RegularFile)
    }

    async fn datasync(&self) -> Result<(), Error> {
        self.handle.sync_data().map_err(errno)
    }

    async fn sync(&self) -> Result<(), Error> {
        self.handle.sync_all().map_err(errno)
    }

    async fn get_fdflags(&self) -> Result<FdFlags, Error> {
        Ok(self.flags())
    }

    async fn set_fdflags(&mut self, flags: FdFlags) -> Result<(), Error> {
        self.handle
            .set_append(flags.contains(FdFlags::APPEND))
            .map_err(errno)?;
        *self.flags.lock().unwrap_or_else(|p| p.into_inner()) = flags;
        Ok(())
    }

    async fn get_filestat(&self) -> Result<Filestat, Error> {
        self.handle.metadata().map(|m| filestat(&m)).map_err(errno)
    }

    async fn set_filestat_size(&self, size: u64) -> Result<(), Error> {
        self.handle.set_len(size).map_err(errno)
    }

    async fn advise(&self, offset: u64, len: u64, advice: Advice) -> Result<(), Error> {
        if matches!(advice, Advice::WillNeed) {
            self.handle.prefetch(offset, len).map_err(errno)?;
        }
        Ok(())
    }

    async fn set_times(
        &self,
        atime: Option<SystemTimeSpec>,
        mtime: Option<SystemTimeSpec>,
    ) -> Result<(), Error> {
        self.handle
            .set_times(time_spec_ns(atime), time_spec_ns(mtime))
            .map_err(errno)
    }

    async fn read_vectored<'a>(&self, bufs: &mut [IoSliceMut<'a>]) -> Result<u64, Error> {
        let pos = self.pos.load(Ordering::Acquire);
        let n = self.read_at(bufs, pos)?;
        self.pos.store(pos + n, Ordering::Release);
        Ok(n)
    }

    async fn read_vectored_at<'a>(
        &self,
        bufs: &mut [IoSliceMut<'a>],
        offset: u64,
    ) -> Result<u64, Error> {
        self.read_at(bufs, offset)
    }

    async fn write_vectored<'a>(&self, bufs: &[IoSlice<'a>]) -> Result<u64, Error> {
        let pos = self.pos.load(Ordering::Acquire);
        let (n, end) = self.write_at(bufs, pos)?;
        self.pos.store(end, Ordering::Release);
        Ok(n)
    }

    async fn write_vectored_at<'a>(&self, bufs: &[IoSlice<'a>], offset: u64) -> Result<u64, Error> {
        self.write_at(bufs, offset).map(|(n, _)| n)
    }

    async fn seek(&self, pos: SeekFrom) -> Result<u64, Error> {
        let new = match pos {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.load(Ordering::Acquire).checked_add_signed(d),
            SeekFrom::End(d) => {
                let size = self.handle.metadata().map_err(errno)?.size;
                size.checked_add_signed(d)
            }
        };
        let new = new.ok_or_else(Error::invalid_argument)?;
        if new > i64::MAX as u64 {
            return Err(Error::invalid_argument());
        }
        self.pos.store(new, Ordering::Release);
        Ok(new)
    }

    async fn peek(&self, buf: &mut [u8]) -> Result<u64, Error> {
        let pos = self.pos.load(Ordering::Acquire);
        self.read_at(&mut [IoSliceMut::new(buf)], pos)
    }

    fn num_ready_bytes(&self) -> Result<u64, Error> {
        let size = self.handle.metadata().map_err(errno)?.size;
        Ok(size.saturating_sub(self.pos.load(Ordering::Acquire)))
    }

    async fn readable(&self) -> Result<(), Error> {
        Ok(())
    }

    async fn writable(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// Redefines the WASIp1 calls wasi-common answers without asking the file or directory:
/// `fd_sync` / `fd_datasync` on a directory (stock: EBADF; LevelDB and badger sync their
/// directory after a MANIFEST change) make the store's metadata durable, and `fd_allocate`
/// (stock: ENOTSUP) extends a file the way `posix_fallocate` does. Both go through
/// wasi-common's own preview-1 calls, so descriptor checks stay exactly its own.
pub fn shadow_calls<T: 'static>(
    linker: &mut wasmtime::Linker<T>,
    ctx: fn(&mut T) -> &mut WasiCtx,
    store: Option<Store>,
) -> anyhow::Result<()> {
    const MODULE: &str = "wasi_snapshot_preview1";
    linker.allow_shadowing(true);
    for datasync in [false, true] {
        let name = if datasync { "fd_datasync" } else { "fd_sync" };
        let store = store.clone();
        linker.func_wrap(
            MODULE,
            name,
            move |mut caller: wasmtime::Caller<'_, T>, fd: i32| -> anyhow::Result<i32> {
                let wasi = ctx(caller.data_mut());
                let fd = types::Fd::from(fd as u32);
                let mut no_memory = GuestMemory::Unshared(&mut []);
                let synced = if datasync {
                    run_in_dummy_executor(wasi.fd_datasync(&mut no_memory, fd))?
                } else {
                    run_in_dummy_executor(wasi.fd_sync(&mut no_memory, fd))?
                };
                let refused = match synced {
                    Ok(()) => return Ok(0),
                    Err(e) => errno_of(e)?,
                };
                let is_dir = run_in_dummy_executor(wasi.fd_fdstat_get(&mut no_memory, fd))?
                    .is_ok_and(|st| st.fs_filetype == types::Filetype::Directory);
                match (&store, is_dir && refused == Errno::Badf) {
                    (Some(store), true) => Ok(match store.sync() {
                        Ok(()) => 0,
                        Err(e) => errno_of(errno(e))? as i32,
                    }),
                    _ => Ok(refused as i32),
                }
            },
        )?;
    }
    linker.func_wrap(
        MODULE,
        "fd_allocate",
        move |mut caller: wasmtime::Caller<'_, T>,
              fd: i32,
              offset: i64,
              len: i64|
              -> anyhow::Result<i32> {
            let wasi = ctx(caller.data_mut());
            let fd = types::Fd::from(fd as u32);
            let mut no_memory = GuestMemory::Unshared(&mut []);
            let stat = match run_in_dummy_executor(wasi.fd_filestat_get(&mut no_memory, fd))? {
                Ok(stat) => stat,
                Err(e) => return Ok(errno_of(e)? as i32),
            };
            if stat.filetype != types::Filetype::RegularFile {
                return Ok(Errno::Badf as i32);
            }
            let (Ok(offset), Ok(len)) = (u64::try_from(offset), u64::try_from(len)) else {
                return Ok(Errno::Inval as i32);
            };
            if len == 0 {
                return Ok(Errno::Inval as i32);
            }
            let Some(end) = offset.checked_add(len) else {
                return Ok(Errno::Fbig as i32);
            };
            if end <= stat.size {
                return Ok(0);
            }
            let grown = run_in_dummy_executor(wasi.fd_filestat_set_size(&mut no_memory, fd, end))?;
            Ok(match grown {
                Ok(()) => 0,
                // Not open for writing: `posix_fallocate` says EBADF where `ftruncate` EINVAL.
                Err(e) => match errno_of(e)? {
                    Errno::Inval => Errno::Badf as i32,
                    e => e as i32,
                },
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The errno a wasi-common error stands for; a trap stays a trap.
fn errno_of(e: Error) -> anyhow::Result<Errno> {
    e.downcast()
}
