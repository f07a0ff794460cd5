//! Plain host directories behind guest descriptors (`--dir HOST::GUEST`), through cap-std,
//! whose path resolution never leaves the preopened directory (`..`, absolute paths and
//! symlinks that lead out are refused), as stock wasmtime does.
//!
//! Beyond stock: `fd_sync` / `fd_datasync` of a directory really fsync it (a program that
//! renames a file into place and syncs the directory gets what it asked for), and every
//! write of an `O_SYNC` descriptor is fsynced before it returns, of an `O_DSYNC` (or
//! `O_RSYNC`) one fdatasynced.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::Mutex;

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsMaybeDirExt};
use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};

use super::abi::{filetype, oflags, Errno, Filestat};
use super::dirlist::{Cookies, Item};
use super::table::Kind;
use super::TimeSpec;

/// An open host file.
pub struct HostFile {
    pub file: File,
}

/// An open host directory.
pub struct HostDir {
    pub dir: Dir,
    pub cookies: Mutex<Cookies>,
}

/// The type a directory entry's `d_type` gives, or `None` where the file system did not say
/// (`DT_UNKNOWN`: some file systems, XFS without `ftype` among them, never do).
fn kind_of(ft: cap_std::fs::FileType) -> Option<u8> {
    use cap_std::fs::FileTypeExt;
    Some(if ft.is_dir() {
        filetype::DIRECTORY
    } else if ft.is_file() {
        filetype::REGULAR_FILE
    } else if ft.is_symlink() {
        filetype::SYMBOLIC_LINK
    } else if ft.is_char_device() {
        filetype::CHARACTER_DEVICE
    } else if ft.is_block_device() {
        filetype::BLOCK_DEVICE
    } else if ft.is_socket() {
        filetype::SOCKET_STREAM
    } else if ft.is_fifo() {
        // WASI has no type for a FIFO.
        filetype::UNKNOWN
    } else {
        return None;
    })
}

/// The type of a file with mode `mode` (`st_mode`): one mapping for `fd_filestat_get`,
/// `path_filestat_get`, `fd_fdstat_get` and a `DT_UNKNOWN` entry of `fd_readdir`.
pub(super) fn kind_of_mode(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => filetype::DIRECTORY,
        libc::S_IFREG => filetype::REGULAR_FILE,
        libc::S_IFLNK => filetype::SYMBOLIC_LINK,
        libc::S_IFCHR => filetype::CHARACTER_DEVICE,
        libc::S_IFBLK => filetype::BLOCK_DEVICE,
        libc::S_IFSOCK => filetype::SOCKET_STREAM,
        _ => filetype::UNKNOWN,
    }
}

fn nanos(secs: i64, nsec: i64) -> u64 {
    (secs.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(nsec.max(0) as u64)
}

fn stat_of(m: &cap_std::fs::Metadata) -> Filestat {
    Filestat {
        dev: m.dev(),
        ino: m.ino(),
        filetype: kind_of_mode(m.mode()),
        nlink: m.nlink(),
        size: m.len(),
        atim: nanos(m.atime(), m.atime_nsec()),
        mtim: nanos(m.mtime(), m.mtime_nsec()),
        ctim: nanos(m.ctime(), m.ctime_nsec()),
    }
}

fn std_stat(m: &std::fs::Metadata) -> Filestat {
    use std::os::unix::fs::MetadataExt as _;
    Filestat {
        dev: m.dev(),
        ino: m.ino(),
        filetype: kind_of_mode(m.mode()),
        nlink: m.nlink(),
        size: m.len(),
        atim: nanos(m.atime(), m.atime_nsec()),
        mtim: nanos(m.mtime(), m.mtime_nsec()),
        ctim: nanos(m.ctime(), m.ctime_nsec()),
    }
}

fn cap_spec(t: Option<TimeSpec>) -> Option<cap_fs_ext::SystemTimeSpec> {
    t.map(|t| match t {
        TimeSpec::Now => cap_fs_ext::SystemTimeSpec::SymbolicNow,
        TimeSpec::At(ns) => {
            cap_fs_ext::SystemTimeSpec::Absolute(cap_std::time::SystemTime::from_std(
                std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns),
            ))
        }
    })
}

/// `futimens` on an open descriptor (cap-std sets times by path only).
fn futimens(fd: i32, atim: Option<TimeSpec>, mtim: Option<TimeSpec>) -> Result<(), Errno> {
    let spec = |t: Option<TimeSpec>| match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeSpec::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeSpec::At(ns)) => libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        },
    };
    let times = [spec(atim), spec(mtim)];
    // SAFETY: `fd` is open for the call; `times` is two valid timespecs.
    if unsafe { libc::futimens(fd, times.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

impl HostDir {
    pub fn new(dir: Dir) -> HostDir {
        HostDir {
            dir,
            cookies: Mutex::default(),
        }
    }

    /// Opens a host directory for a preopen.
    pub fn open_ambient(path: &std::path::Path) -> io::Result<HostDir> {
        Ok(HostDir::new(Dir::open_ambient_dir(
            path,
            cap_std::ambient_authority(),
        )?))
    }

    /// `path_open`. `write`: the descriptor may write, and so the host file is opened for
    /// writing; without it the host file is opened read-only even to create or truncate it
    /// (`O_RDONLY | O_CREAT`, which Linux allows, opens an existing read-only file).
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
        let mut opts = OpenOptions::new();
        opts.maybe_dir(true);
        // Flags std's options cannot say: a directory asked for is opened with
        // O_DIRECTORY (ENOTDIR at once; opening a FIFO would wait for a writer), and a
        // read-only open that creates or truncates passes those flags itself (std
        // refuses them without write access).
        let mut extra = 0;
        if want_dir {
            extra |= libc::O_DIRECTORY;
        }
        if write {
            if of & oflags::CREAT != 0 {
                match of & oflags::EXCL != 0 {
                    true => opts.create_new(true),
                    false => opts.create(true),
                };
            }
            opts.truncate(of & oflags::TRUNC != 0);
        } else {
            if of & oflags::CREAT != 0 {
                extra |= libc::O_CREAT;
                if of & oflags::EXCL != 0 {
                    extra |= libc::O_EXCL;
                }
            }
            if of & oflags::TRUNC != 0 {
                extra |= libc::O_TRUNC;
            }
        }
        opts.custom_flags(extra);
        opts.read(read || !write).write(write);
        opts.follow(if follow {
            FollowSymlinks::Yes
        } else {
            FollowSymlinks::No
        });
        let file = self.dir.open_with(path, &opts)?.into_std();
        if file.metadata()?.is_dir() {
            Ok(Kind::HostDir(HostDir::new(Dir::from_std_file(file))))
        } else if want_dir {
            Err(Errno::NOTDIR)
        } else {
            let file = HostFile { file };
            // O_APPEND is set after the open: std refuses append with truncate, which
            // Linux allows.
            if append && write {
                file.set_append(true)?;
            }
            Ok(Kind::HostFile(file))
        }
    }

    pub fn create_dir(&self, path: &str) -> Result<(), Errno> {
        Ok(self.dir.create_dir(path)?)
    }

    pub fn remove_dir(&self, path: &str) -> Result<(), Errno> {
        Ok(self.dir.remove_dir(path)?)
    }

    pub fn unlink(&self, path: &str) -> Result<(), Errno> {
        Ok(self.dir.remove_file_or_symlink(path)?)
    }

    pub fn rename(&self, from: &str, to_dir: &HostDir, to: &str) -> Result<(), Errno> {
        Ok(self.dir.rename(from, &to_dir.dir, to)?)
    }

    pub fn link(&self, from: &str, to_dir: &HostDir, to: &str) -> Result<(), Errno> {
        Ok(self.dir.hard_link(from, &to_dir.dir, to)?)
    }

    pub fn symlink(&self, target: &str, new_path: &str) -> Result<(), Errno> {
        Ok(self.dir.symlink(target, new_path)?)
    }

    pub fn readlink(&self, path: &str) -> Result<String, Errno> {
        let target = self.dir.read_link_contents(path)?;
        target
            .into_os_string()
            .into_string()
            .map_err(|_| Errno::ILSEQ)
    }

    pub fn stat(&self) -> Result<Filestat, Errno> {
        Ok(stat_of(&self.dir.dir_metadata()?))
    }

    pub fn stat_path(&self, path: &str, follow: bool) -> Result<Filestat, Errno> {
        let m = if follow {
            self.dir.metadata(path)?
        } else {
            self.dir.symlink_metadata(path)?
        };
        Ok(stat_of(&m))
    }

    /// By path (`.`): the descriptor may be `O_PATH`, which futimens refuses.
    pub fn set_times(&self, atim: Option<TimeSpec>, mtim: Option<TimeSpec>) -> Result<(), Errno> {
        Ok(self.dir.set_times(".", cap_spec(atim), cap_spec(mtim))?)
    }

    pub fn set_times_path(
        &self,
        path: &str,
        follow: bool,
        atim: Option<TimeSpec>,
        mtim: Option<TimeSpec>,
    ) -> Result<(), Errno> {
        let (a, m) = (cap_spec(atim), cap_spec(mtim));
        if follow {
            self.dir.set_times(path, a, m)?;
        } else {
            self.dir.set_symlink_times(path, a, m)?;
        }
        Ok(())
    }

    /// The entries sorted by name, and the inodes of `.` and `..`.
    pub fn list(&self) -> Result<(u64, u64, Vec<Item>), Errno> {
        let dot = self.dir.dir_metadata()?.ino();
        let dotdot = self.dir.metadata("..").map(|m| m.ino()).unwrap_or(dot);
        let mut items = Vec::new();
        for e in self.dir.entries()? {
            let e = e?;
            // A name WASI cannot carry: EILSEQ, as stock wasmtime says, rather than a
            // listing that leaves the entry out (a guest would take a directory that is
            // not empty for an empty one).
            let name = e.file_name().into_string().map_err(|_| Errno::ILSEQ)?;
            // lstat, as `d_type` is: a symlink is listed as a symlink. An entry removed
            // meanwhile keeps what `d_type` said.
            let meta = cap_fs_ext::DirEntryExt::full_metadata(&e).ok();
            let filetype = match (kind_of(e.file_type()?), &meta) {
                (Some(t), _) => t,
                (None, Some(m)) => kind_of_mode(m.mode()),
                (None, None) => filetype::UNKNOWN,
            };
            items.push(Item {
                name,
                ino: meta.map(|m| m.ino()).unwrap_or(0),
                filetype,
            });
        }
        items.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((dot, dotdot, items))
    }

    /// `fsync` of the directory itself, through a descriptor opened for reading (cap-std
    /// may hold directories as `O_PATH` descriptors, which fsync refuses).
    pub fn sync(&self) -> Result<(), Errno> {
        // SAFETY: openat on an open directory descriptor with a NUL-terminated path.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `fd` was just opened and is closed once, here.
        let synced = unsafe { libc::fsync(fd) };
        let err = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { libc::close(fd) };
        if synced != 0 {
            return Err(err.into());
        }
        Ok(())
    }
}

impl HostFile {
    pub fn stat(&self) -> Result<Filestat, Errno> {
        Ok(std_stat(&self.file.metadata()?))
    }

    pub fn set_times(&self, atim: Option<TimeSpec>, mtim: Option<TimeSpec>) -> Result<(), Errno> {
        futimens(self.file.as_raw_fd(), atim, mtim)
    }

    /// `fd_allocate`: the host's `posix_fallocate`, which grows the file and never shrinks
    /// it, whatever another writer did meanwhile.
    pub fn allocate(&self, offset: u64, len: u64) -> Result<(), Errno> {
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(Errno::FBIG);
        };
        // SAFETY: a descriptor this file owns; posix_fallocate returns the error number.
        match unsafe { libc::posix_fallocate(self.file.as_raw_fd(), offset, len) } {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e).into()),
        }
    }

    /// Turns the host descriptor's `O_APPEND` on or off (`fd_fdstat_set_flags`): an append
    /// descriptor's writes go through the kernel's append, which places each at the end of
    /// every write before it, whichever thread or process made that one.
    pub fn set_append(&self, append: bool) -> Result<(), Errno> {
        let fd = self.file.as_raw_fd();
        // SAFETY: F_GETFL and F_SETFL on a descriptor this file owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error().into());
        }
        let wanted = if append {
            flags | libc::O_APPEND
        } else {
            flags & !libc::O_APPEND
        };
        // SAFETY: as above.
        if wanted != flags && unsafe { libc::fcntl(fd, libc::F_SETFL, wanted) } < 0 {
            return Err(io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// Appends `data` at the end of the file with the kernel's `O_APPEND` (set by
    /// [`HostDir::open`] or [`HostFile::set_append`]); returns the bytes written and the
    /// offset after them: the host descriptor's own position, which only appends move
    /// (every other call names its offset). As [`HostFile::write_at`], a write that runs
    /// out of room part way counts what it wrote.
    pub fn append(&self, data: &[u8]) -> Result<(usize, u64), Errno> {
        use std::io::{Seek, Write};
        if data.is_empty() {
            return Ok((0, self.file.metadata()?.len()));
        }
        let mut file = &self.file;
        let done = write_some(data, |rest| file.write(rest))?;
        Ok((done, file.stream_position()?))
    }

    /// Writes `data` at `at`, as much of it as the host takes: a write that fails part way
    /// (ENOSPC, EDQUOT, EFBIG) returns what it wrote, as Linux's `pwrite` does; only one
    /// that wrote nothing returns the error.
    pub fn write_at(&self, data: &[u8], at: u64) -> Result<usize, Errno> {
        use std::os::unix::fs::FileExt;
        write_some(data, |rest| {
            self.file
                .write_at(rest, at + (data.len() - rest.len()) as u64)
        })
    }

    /// The file's type, for `fd_fdstat_get`.
    pub fn filetype(&self) -> Result<u8, Errno> {
        use std::os::unix::fs::MetadataExt as _;
        Ok(kind_of_mode(self.file.metadata()?.mode()))
    }

    /// Closes the file (the guest's last reference to it) with the result of close(2),
    /// which NFS and FUSE use to report writes that failed after they returned. EINTR
    /// counts as closed: Linux has released the descriptor by then.
    pub fn close(self) -> Result<(), Errno> {
        close_fd(self.file.into_raw_fd())
    }

    /// A close while another thread of the guest is still in a call on the file (it
    /// closes when that call ends): the file system is asked to flush it all the same, as
    /// close(2) of any one descriptor of a file does, through a duplicate closed here.
    pub fn flush_by_close(&self) -> Result<(), Errno> {
        // SAFETY: dup of a descriptor this file owns; the duplicate is closed once, below.
        let dup = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error().into());
        }
        close_fd(dup)
    }
}

/// close(2) of a descriptor the caller owns, with its error (EINTR is no error: the
/// descriptor is released whatever it says).
fn close_fd(fd: i32) -> Result<(), Errno> {
    // SAFETY: `fd` is owned by the caller and closed once, here.
    if unsafe { libc::close(fd) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINTR) => Ok(()),
        _ => Err(e.into()),
    }
}

/// Writes `data` by calls of `write` on what is left, until all of it is written or a call
/// fails (EINTR is retried): the bytes written, or the error if there are none.
fn write_some(
    data: &[u8],
    mut write: impl FnMut(&[u8]) -> io::Result<usize>,
) -> Result<usize, Errno> {
    let mut done = 0;
    while done < data.len() {
        match write(&data[done..]) {
            // As write_all: a file system that takes nothing will not take more later.
            Ok(0) if done == 0 => return Err(Errno::IO),
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if done == 0 => return Err(e.into()),
            Err(_) => break,
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_err(r: Result<Kind, Errno>) -> Errno {
        match r {
            Ok(_) => panic!("opened"),
            Err(e) => e,
        }
    }

    /// A directory holding an entry whose name is not UTF-8 is not listed as if it were
    /// empty: EILSEQ, as stock wasmtime says.
    #[test]
    fn a_name_that_is_not_utf8_makes_the_listing_eilseq() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
        std::fs::write(tmp.path().join(name), "x").unwrap();
        let dir = HostDir::open_ambient(tmp.path()).unwrap();
        assert_eq!(dir.list().err(), Some(Errno::ILSEQ));
    }

    /// The listing's types: a symlink is a symlink (lstat), not what it names.
    #[test]
    fn a_listing_gives_each_entry_its_own_type() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), "x").unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::os::unix::fs::symlink("d", tmp.path().join("l")).unwrap();
        let dir = HostDir::open_ambient(tmp.path()).unwrap();
        let (_, _, items) = dir.list().unwrap();
        let types: Vec<(&str, u8)> = items
            .iter()
            .map(|i| (i.name.as_str(), i.filetype))
            .collect();
        assert_eq!(
            types,
            [
                ("d", filetype::DIRECTORY),
                ("f", filetype::REGULAR_FILE),
                ("l", filetype::SYMBOLIC_LINK)
            ]
        );
    }

    /// The one mapping from a mode, which a `DT_UNKNOWN` entry falls back to.
    #[test]
    fn every_mode_has_its_type() {
        for (mode, want) in [
            (libc::S_IFDIR, filetype::DIRECTORY),
            (libc::S_IFREG, filetype::REGULAR_FILE),
            (libc::S_IFLNK, filetype::SYMBOLIC_LINK),
            (libc::S_IFCHR, filetype::CHARACTER_DEVICE),
            (libc::S_IFBLK, filetype::BLOCK_DEVICE),
            (libc::S_IFSOCK, filetype::SOCKET_STREAM),
            (libc::S_IFIFO, filetype::UNKNOWN),
        ] {
            assert_eq!(kind_of_mode(mode | 0o644), want, "{mode:o}");
        }
    }

    /// A FIFO asked for as a directory is ENOTDIR at once; opening it without O_DIRECTORY
    /// would wait for a writer that never comes.
    #[test]
    fn a_fifo_asked_for_as_a_directory_is_enotdir_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let dir = HostDir::open_ambient(tmp.path()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = dir.open("fifo", true, oflags::DIRECTORY, true, false, false);
            tx.send(kind_err(r)).ok();
        });
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(e) => assert_eq!(e, Errno::NOTDIR),
            Err(_) => {
                // Let the blocked open go before failing.
                let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
                panic!("path_open of a FIFO with O_DIRECTORY waited for a writer");
            }
        }
    }

    /// A write that fails part way counts what it wrote; one that wrote nothing is the
    /// error; EINTR is retried.
    #[test]
    fn a_write_counts_what_it_wrote_before_an_error() {
        let data = [7u8; 10];
        let mut calls = 0;
        let partial = write_some(&data, |rest| {
            calls += 1;
            match calls {
                1 => Ok(4),
                2 => Err(io::Error::from_raw_os_error(libc::EINTR)),
                3 => Ok(rest.len().min(2)),
                _ => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            }
        });
        assert_eq!(partial, Ok(6));
        let none = write_some(&data, |_| Err(io::Error::from_raw_os_error(libc::EDQUOT)));
        assert_eq!(none, Err(Errno::DQUOT));
        assert_eq!(write_some(&data, |rest| Ok(rest.len())), Ok(10));
    }
}
