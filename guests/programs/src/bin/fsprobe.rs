//! fsprobe: calls every WASIp1 filesystem function, with its error cases, on one preopened
//! directory and prints a deterministic transcript, one line per call: `label -> result`.
//!
//! The transcript holds only what two correct hosts agree on: sizes, contents, file kinds,
//! link counts, errno names, and whether a timestamp moved (never inode numbers, host times
//! or directory sizes). Directory listings are printed sorted because hosts list in their
//! own order; cookies are checked by resuming and comparing, not printed. Labels never
//! depend on results, so the transcripts of two hosts line up line by line.
//!
//! Usage: fsprobe [MOUNT]   (default `/data`; the directory must start empty)

#[path = "../rawfs.rs"]
mod rawfs;

use rawfs::{readdir, show, write_all, Entry, ALL, FOLLOW, R, RO, WO};
use wasi::{Fd, Filestat};

const NONE: wasi::Oflags = 0;
const CREAT: wasi::Oflags = wasi::OFLAGS_CREAT;
const EXCL: wasi::Oflags = wasi::OFLAGS_EXCL;
const TRUNC: wasi::Oflags = wasi::OFLAGS_TRUNC;
const DIRECTORY: wasi::Oflags = wasi::OFLAGS_DIRECTORY;

/// An mtime long past, set before an operation to see whether the operation moves it.
const OLD: u64 = 1_000_000_000_000_000_000;
const ATIME: u64 = 1_600_000_000_123_456_789;
const MTIME: u64 = 1_500_000_000_987_654_321;

fn open(dir: Fd, path: &str, oflags: wasi::Oflags, rights: wasi::Rights) -> R<Fd> {
    open_flags(dir, path, oflags, rights, 0)
}

fn open_flags(
    dir: Fd,
    path: &str,
    oflags: wasi::Oflags,
    rights: wasi::Rights,
    fdflags: wasi::Fdflags,
) -> R<Fd> {
    unsafe { wasi::path_open(dir, FOLLOW, path, oflags, rights, rights, fdflags) }
}

fn close(fd: Fd) -> R<()> {
    unsafe { wasi::fd_close(fd) }
}

fn kind(t: wasi::Filetype) -> &'static str {
    t.name()
}

fn fmt_stat(s: &Filestat) -> String {
    if s.filetype == wasi::FILETYPE_DIRECTORY {
        // Directory sizes are the host filesystem's business.
        format!("{} nlink={}", kind(s.filetype), s.nlink)
    } else {
        format!("{} size={} nlink={}", kind(s.filetype), s.size, s.nlink)
    }
}

fn pstat(dir: Fd, path: &str) -> R<Filestat> {
    unsafe { wasi::path_filestat_get(dir, FOLLOW, path) }
}

fn fstat(fd: Fd) -> R<Filestat> {
    unsafe { wasi::fd_filestat_get(fd) }
}

fn fdstat(fd: Fd) -> R<String> {
    let st = unsafe { wasi::fd_fdstat_get(fd) }?;
    let mut flags = Vec::new();
    for (bit, name) in [
        (wasi::FDFLAGS_APPEND, "APPEND"),
        (wasi::FDFLAGS_DSYNC, "DSYNC"),
        (wasi::FDFLAGS_NONBLOCK, "NONBLOCK"),
        (wasi::FDFLAGS_RSYNC, "RSYNC"),
        (wasi::FDFLAGS_SYNC, "SYNC"),
    ] {
        if st.fs_flags & bit != 0 {
            flags.push(name);
        }
    }
    Ok(format!(
        "{} flags=[{}]",
        kind(st.fs_filetype),
        flags.join(",")
    ))
}

/// Writes the buffers with one `fd_write` (or `fd_pwrite` at `at`); returns the count.
fn writev(fd: Fd, parts: &[&[u8]], at: Option<u64>) -> R<usize> {
    let iovs: Vec<wasi::Ciovec> = parts
        .iter()
        .map(|p| wasi::Ciovec {
            buf: p.as_ptr(),
            buf_len: p.len(),
        })
        .collect();
    match at {
        None => unsafe { wasi::fd_write(fd, &iovs) },
        Some(off) => unsafe { wasi::fd_pwrite(fd, &iovs, off) },
    }
}

/// Reads into buffers of the given sizes with one `fd_read` (or `fd_pread` at `at`).
fn readv(fd: Fd, sizes: &[usize], at: Option<u64>) -> R<Vec<u8>> {
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let iovs: Vec<wasi::Iovec> = bufs
        .iter_mut()
        .map(|b| wasi::Iovec {
            buf: b.as_mut_ptr(),
            buf_len: b.len(),
        })
        .collect();
    let n = match at {
        None => unsafe { wasi::fd_read(fd, &iovs) },
        Some(off) => unsafe { wasi::fd_pread(fd, &iovs, off) },
    }?;
    Ok(bufs.concat()[..n].to_vec())
}

fn text(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}

/// The whole content of a file, read through a fresh descriptor.
fn cat(dir: Fd, path: &str) -> R<String> {
    let fd = open(dir, path, NONE, RO)?;
    let mut all = Vec::new();
    loop {
        let chunk = readv(fd, &[4096], None);
        match chunk {
            Ok(c) if c.is_empty() => break,
            Ok(c) => all.extend(c),
            Err(e) => {
                close(fd)?;
                return Err(e);
            }
        }
    }
    close(fd)?;
    Ok(text(&all))
}

fn touch(dir: Fd, path: &str, content: &[u8]) -> R<()> {
    let fd = open(dir, path, CREAT | TRUNC, ALL)?;
    let r = write_all(fd, content);
    close(fd)?;
    r
}

fn names(entries: &[Entry]) -> Vec<String> {
    let mut v: Vec<String> = entries
        .iter()
        .map(|e| {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if e.kind == wasi::FILETYPE_DIRECTORY {
                format!("{name}/")
            } else if e.kind == wasi::FILETYPE_SYMBOLIC_LINK {
                format!("{name}@")
            } else {
                name
            }
        })
        .collect();
    v.sort();
    v
}

fn ls(dir: Fd, path: &str) -> R<String> {
    let fd = open(dir, path, DIRECTORY, RO)?;
    let entries = readdir(fd, 4096, 0);
    close(fd)?;
    Ok(names(&entries?).join(" "))
}

/// Sets a path's mtime far into the past (atime untouched).
fn age(dir: Fd, path: &str) -> R<()> {
    unsafe { wasi::path_filestat_set_times(dir, FOLLOW, path, 0, OLD, wasi::FSTFLAGS_MTIM) }
}

fn moved(dir: Fd, path: &str) -> R<String> {
    let st = pstat(dir, path)?;
    Ok(format!("mtime moved={}", st.mtim != OLD))
}

fn age_fd(fd: Fd) -> R<()> {
    unsafe { wasi::fd_filestat_set_times(fd, 0, OLD, wasi::FSTFLAGS_MTIM) }
}

fn moved_fd(fd: Fd) -> R<String> {
    let st = fstat(fd)?;
    Ok(format!("mtime moved={}", st.mtim != OLD))
}

/// Removes a tree below `dir` with whatever calls work, so later sections start clean.
fn rm_rf(dir: Fd, path: &str) {
    if unsafe { wasi::path_unlink_file(dir, path) }.is_ok() {
        return;
    }
    for _ in 0..100 {
        let Ok(fd) = open(dir, path, DIRECTORY, RO) else {
            return;
        };
        let entries = readdir(fd, 4096, 0).unwrap_or_default();
        let _ = close(fd);
        let mut left = 0;
        for e in entries {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            if name == "." || name == ".." {
                continue;
            }
            left += 1;
            rm_rf(dir, &format!("{path}/{name}"));
        }
        if left == 0 {
            break;
        }
    }
    let _ = unsafe { wasi::path_remove_directory(dir, path) };
}

fn main() {
    let mount = std::env::args().nth(1).unwrap_or_else(|| "/data".into());
    let Some(root) = rawfs::find_preopen(&mount) else {
        println!("no preopened directory {mount}");
        std::process::exit(2);
    };
    println!("fsprobe on a preopened directory");
    show("fd_fdstat_get(root)", fdstat(root));
    show(
        "fd_filestat_get(root)",
        fstat(root).map(|s| kind(s.filetype).into()),
    );
    show("ls root", ls(root, "."));
    show("path_create_directory(t)", unsafe {
        wasi::path_create_directory(root, "t").map(|_| String::new())
    });
    let d = match open(root, "t", DIRECTORY, RO) {
        Ok(fd) => fd,
        Err(e) => {
            println!("open t -> {}", rawfs::errno_name(e));
            std::process::exit(2);
        }
    };

    path_open(d);
    read_write(d);
    large(d);
    append(d);
    sync(d, root);
    filestat(d);
    set_size(d);
    times(d);
    readdir_cookies(d);
    directories(d);
    rename(d);
    link(d);
    allocate_advise(d);
    symlinks(d);
    unlink_while_open(d);
    paths(d, root);
    closed_fds(d);
    delete_while_listing(d);

    show("close t", close(d).map(|_| String::new()));
    rm_rf(root, "t");
    show("ls root at the end", ls(root, "."));
}

fn path_open(d: Fd) {
    println!("## path_open");
    let f = open(d, "a", CREAT, ALL);
    show("open a CREAT", f.map(|_| String::new()));
    let f = f.unwrap_or(u32::MAX);
    show("fdstat a", fdstat(f));
    show(
        "fd_write a",
        writev(f, &[b"0123456789"], None).map(|n| n.to_string()),
    );
    show("close a", close(f).map(|_| String::new()));
    show(
        "open a CREAT|EXCL",
        open(d, "a", CREAT | EXCL, ALL).map(|_| String::new()),
    );
    show(
        "open new CREAT|EXCL",
        open(d, "new", CREAT | EXCL, ALL).and_then(|fd| close(fd).map(|_| String::new())),
    );
    show(
        "open a (no flags, read)",
        open(d, "a", NONE, RO).and_then(|fd| {
            let s = readv(fd, &[100], None).map(|b| text(&b));
            close(fd)?;
            s
        }),
    );
    show(
        "open missing",
        open(d, "missing", NONE, RO).map(|_| String::new()),
    );
    show(
        "open nodir/x CREAT (missing parent)",
        open(d, "nodir/x", CREAT, ALL).map(|_| String::new()),
    );
    show(
        "open a/x CREAT (file as dir)",
        open(d, "a/x", CREAT, ALL).map(|_| String::new()),
    );
    show(
        "open a/x (file as dir)",
        open(d, "a/x", NONE, RO).map(|_| String::new()),
    );
    show(
        "open a/ (trailing slash on a file)",
        open(d, "a/", NONE, RO).map(|_| String::new()),
    );
    show(
        "open a DIRECTORY",
        open(d, "a", DIRECTORY, RO).map(|_| String::new()),
    );
    show(
        "open newdir/ CREAT (trailing slash)",
        open(d, "newdir/", CREAT, ALL).map(|_| String::new()),
    );
    show("stat newdir", pstat(d, "newdir").map(|s| fmt_stat(&s)));
    show("mkdir sub", unsafe {
        wasi::path_create_directory(d, "sub").map(|_| String::new())
    });
    show(
        "open sub DIRECTORY",
        open(d, "sub", DIRECTORY, RO).and_then(|fd| {
            let s = fdstat(fd);
            close(fd)?;
            s
        }),
    );
    show(
        "open sub (read, no DIRECTORY flag)",
        open(d, "sub", NONE, RO).and_then(|fd| {
            let s = fdstat(fd);
            close(fd)?;
            s
        }),
    );
    show(
        "open sub/ DIRECTORY",
        open(d, "sub/", DIRECTORY, RO).and_then(|fd| close(fd).map(|_| String::new())),
    );
    show(
        "open sub for write",
        open(d, "sub", NONE, ALL).map(|_| String::new()),
    );
    show(
        "open sub write-only",
        open(d, "sub", NONE, WO).map(|_| String::new()),
    );
    show(
        "open sub TRUNC",
        open(d, "sub", TRUNC, ALL).map(|_| String::new()),
    );
    show(
        "open sub CREAT|EXCL",
        open(d, "sub", CREAT | EXCL, ALL).map(|_| String::new()),
    );
    show(
        "open sub CREAT|DIRECTORY",
        open(d, "sub", CREAT | DIRECTORY, RO).map(|_| String::new()),
    );
    show(
        "open nosuch CREAT|DIRECTORY",
        open(d, "nosuch", CREAT | DIRECTORY, RO).map(|_| String::new()),
    );
    show(
        "open sub DIRECTORY|TRUNC",
        open(d, "sub", DIRECTORY | TRUNC, RO).map(|_| String::new()),
    );
    show(
        "open nosuch DIRECTORY",
        open(d, "nosuch", DIRECTORY, RO).map(|_| String::new()),
    );
    show(
        "open . DIRECTORY",
        open(d, ".", DIRECTORY, RO).and_then(|fd| {
            let s = fdstat(fd);
            close(fd)?;
            s
        }),
    );
    show("open \"\"", open(d, "", NONE, RO).map(|_| String::new()));
    show(
        "open a TRUNC (write)",
        open(d, "a", TRUNC, ALL).and_then(|fd| {
            let s = fstat(fd).map(|s| fmt_stat(&s));
            close(fd)?;
            s
        }),
    );
    touch(d, "ro", b"read only").ok();
    show(
        "open ro read-only, fd_write",
        open(d, "ro", NONE, RO).and_then(|fd| {
            let r = writev(fd, &[b"x"], None).map(|n| n.to_string());
            close(fd)?;
            r
        }),
    );
    show(
        "open ro write-only, fd_read",
        open(d, "ro", NONE, WO).and_then(|fd| {
            let r = readv(fd, &[4], None).map(|b| text(&b));
            close(fd)?;
            r
        }),
    );
    show(
        "open ro write-only, fd_pread",
        open(d, "ro", NONE, WO).and_then(|fd| {
            let r = readv(fd, &[4], Some(0)).map(|b| text(&b));
            close(fd)?;
            r
        }),
    );
    show(
        "open ro read-only, fd_pwrite",
        open(d, "ro", NONE, RO).and_then(|fd| {
            let r = writev(fd, &[b"x"], Some(0)).map(|n| n.to_string());
            close(fd)?;
            r
        }),
    );
    show("cat ro", cat(d, "ro"));
    show(
        "open dsync DSYNC|CREAT",
        open_flags(d, "dsync", CREAT, ALL, wasi::FDFLAGS_DSYNC).and_then(|fd| {
            let r = writev(fd, &[b"synced"], None).map(|n| n.to_string());
            close(fd)?;
            r
        }),
    );
}

fn read_write(d: Fd) {
    println!("## fd_read / fd_write / seek / tell");
    let f = open(d, "rw", CREAT | TRUNC, ALL).unwrap_or(u32::MAX);
    show(
        "fd_write [\"hello \", \"world\"]",
        writev(f, &[b"hello ", b"world"], None).map(|n| n.to_string()),
    );
    // Finish what a short write left, as a program would, so later lines agree.
    let size = fstat(f).map(|s| s.size).unwrap_or(0);
    if size < 11 {
        let _ = write_all(f, &b"hello world"[size as usize..]);
    }
    show(
        "fd_write [\"\", \"!\"] (empty first buffer)",
        writev(f, &[b"", b"!"], None).map(|n| n.to_string()),
    );
    show(
        "fd_write [] (no buffers)",
        writev(f, &[], None).map(|n| n.to_string()),
    );
    show(
        "fd_tell",
        unsafe { wasi::fd_tell(f) }.map(|n| n.to_string()),
    );
    show("fd_seek 0 SET", unsafe {
        wasi::fd_seek(f, 0, wasi::WHENCE_SET).map(|n| n.to_string())
    });
    show(
        "fd_read [4, 100]",
        readv(f, &[4, 100], None).map(|b| text(&b)),
    );
    show(
        "fd_tell",
        unsafe { wasi::fd_tell(f) }.map(|n| n.to_string()),
    );
    show(
        "fd_read [0, 3] (empty first buffer)",
        readv(f, &[0, 3], None).map(|b| text(&b)),
    );
    show("fd_read [100]", readv(f, &[100], None).map(|b| text(&b)));
    show(
        "fd_read [100] at EOF",
        readv(f, &[100], None).map(|b| text(&b)),
    );
    show("fd_seek -1 SET", unsafe {
        wasi::fd_seek(f, -1, wasi::WHENCE_SET).map(|n| n.to_string())
    });
    show("fd_seek -100 CUR", unsafe {
        wasi::fd_seek(f, -100, wasi::WHENCE_CUR).map(|n| n.to_string())
    });
    show("fd_seek -100 END", unsafe {
        wasi::fd_seek(f, -100, wasi::WHENCE_END).map(|n| n.to_string())
    });
    show("fd_tell after failed seeks", unsafe {
        wasi::fd_tell(f).map(|n| n.to_string())
    });
    show("fd_seek -3 END", unsafe {
        wasi::fd_seek(f, -3, wasi::WHENCE_END).map(|n| n.to_string())
    });
    show("fd_read [10]", readv(f, &[10], None).map(|b| text(&b)));
    show("fd_seek 2 CUR", unsafe {
        wasi::fd_seek(f, 2, wasi::WHENCE_CUR).map(|n| n.to_string())
    });
    show("fd_seek 5 END (past EOF)", unsafe {
        wasi::fd_seek(f, 5, wasi::WHENCE_END).map(|n| n.to_string())
    });
    show(
        "fd_write X past EOF",
        writev(f, &[b"X"], None).map(|n| n.to_string()),
    );
    show("size", fstat(f).map(|s| s.size.to_string()));
    show(
        "fd_pread [32] at 0 (hole reads as zeros)",
        readv(f, &[32], Some(0)).map(|b| text(&b)),
    );
    show(
        "fd_tell",
        unsafe { wasi::fd_tell(f) }.map(|n| n.to_string()),
    );
    let n = writev(f, &[b"AB", b"CD"], Some(1));
    show("fd_pwrite [\"AB\", \"CD\"] at 1", n.map(|n| n.to_string()));
    if let Ok(n @ 0..4) = n {
        let _ = writev(f, &[&b"ABCD"[n..]], Some(1 + n as u64));
    }
    show(
        "fd_tell after pwrite (unchanged)",
        unsafe { wasi::fd_tell(f) }.map(|n| n.to_string()),
    );
    show(
        "fd_pread [3, 10] at 0",
        readv(f, &[3, 10], Some(0)).map(|b| text(&b)),
    );
    show(
        "fd_pread [8] at 1000 (past EOF)",
        readv(f, &[8], Some(1000)).map(|b| text(&b)),
    );
    show(
        "fd_pwrite [\"Z\"] at 30 (past EOF)",
        writev(f, &[b"Z"], Some(30)).map(|n| n.to_string()),
    );
    show("size", fstat(f).map(|s| s.size.to_string()));
    show("fd_seek on a directory", unsafe {
        wasi::fd_seek(d, 0, wasi::WHENCE_SET).map(|n| n.to_string())
    });
    show("fd_tell on a directory", unsafe {
        wasi::fd_tell(d).map(|n| n.to_string())
    });
    show(
        "fd_read on a directory",
        readv(d, &[10], None).map(|b| text(&b)),
    );
    show(
        "fd_write on a directory",
        writev(d, &[b"x"], None).map(|n| n.to_string()),
    );
    show(
        "fd_pread on a directory",
        readv(d, &[10], Some(0)).map(|b| text(&b)),
    );
    show("close rw", close(f).map(|_| String::new()));
    show("cat rw", cat(d, "rw"));
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn large(d: Fd) {
    println!("## large reads");
    const LEN: usize = 1536 * 1024;
    let data = pattern(LEN);
    let f = open(d, "big", CREAT | TRUNC, ALL).unwrap_or(u32::MAX);
    show("write 1.5 MiB", write_all(f, &data).map(|_| String::new()));
    show("size", fstat(f).map(|s| s.size.to_string()));
    let check = |b: Vec<u8>, from: usize| -> String {
        let same = b[..] == data[from..from + b.len()];
        format!("n={} bytes match={same}", b.len())
    };
    show(
        "fd_pread [1.5 MiB] at 0",
        readv(f, &[LEN], Some(0)).map(|b| check(b, 0)),
    );
    show(
        "fd_pread [1 MiB] at 1 MiB (to EOF)",
        readv(f, &[1 << 20], Some(1 << 20)).map(|b| check(b, 1 << 20)),
    );
    show(
        "fd_pread [100000] at 12345",
        readv(f, &[100_000], Some(12345)).map(|b| check(b, 12345)),
    );
    show("fd_seek 0 SET", unsafe {
        wasi::fd_seek(f, 0, wasi::WHENCE_SET).map(|n| n.to_string())
    });
    show(
        "fd_read [1.5 MiB]",
        readv(f, &[LEN], None).map(|b| check(b, 0)),
    );
    show("close big", close(f).map(|_| String::new()));
}

fn append(d: Fd) {
    println!("## append mode");
    let f = open(d, "log", CREAT | TRUNC, ALL).unwrap_or(u32::MAX);
    show(
        "fd_write one",
        writev(f, &[b"one\n"], None).map(|n| n.to_string()),
    );
    show(
        "fd_fdstat_set_flags APPEND",
        unsafe { wasi::fd_fdstat_set_flags(f, wasi::FDFLAGS_APPEND) }.map(|_| String::new()),
    );
    show("fdstat", fdstat(f));
    show("fd_seek 0 SET", unsafe {
        wasi::fd_seek(f, 0, wasi::WHENCE_SET).map(|n| n.to_string())
    });
    show(
        "fd_write two",
        writev(f, &[b"two\n"], None).map(|n| n.to_string()),
    );
    show(
        "fd_tell after appending",
        unsafe { wasi::fd_tell(f) }.map(|n| n.to_string()),
    );
    show(
        "fd_pwrite three at 0 (appends)",
        writev(f, &[b"three\n"], Some(0)).map(|n| n.to_string()),
    );
    show("cat log", cat(d, "log"));
    show(
        "fd_fdstat_set_flags none",
        unsafe { wasi::fd_fdstat_set_flags(f, 0) }.map(|_| String::new()),
    );
    show("fdstat", fdstat(f));
    show("fd_seek 0 SET", unsafe {
        wasi::fd_seek(f, 0, wasi::WHENCE_SET).map(|n| n.to_string())
    });
    show(
        "fd_write ONE",
        writev(f, &[b"ONE"], None).map(|n| n.to_string()),
    );
    show("cat log", cat(d, "log"));
    show(
        "fd_fdstat_set_flags DSYNC",
        unsafe { wasi::fd_fdstat_set_flags(f, wasi::FDFLAGS_DSYNC) }.map(|_| String::new()),
    );
    show(
        "fd_fdstat_set_flags on a directory",
        unsafe { wasi::fd_fdstat_set_flags(d, wasi::FDFLAGS_APPEND) }.map(|_| String::new()),
    );
    show("close log", close(f).map(|_| String::new()));
    let f = open_flags(d, "log", NONE, ALL, wasi::FDFLAGS_APPEND).unwrap_or(u32::MAX);
    show("open log APPEND: fdstat", fdstat(f));
    show(
        "fd_write four",
        writev(f, &[b"four\n"], None).map(|n| n.to_string()),
    );
    show("close log", close(f).map(|_| String::new()));
    show("cat log", cat(d, "log"));
    // O_RDONLY | O_APPEND: the flag does not make the descriptor writable.
    let f = open_flags(d, "log", NONE, RO, wasi::FDFLAGS_APPEND).unwrap_or(u32::MAX);
    show("open log APPEND read-only: fdstat", fdstat(f));
    show(
        "fd_write five (read-only)",
        writev(f, &[b"five\n"], None).map(|n| n.to_string()),
    );
    show(
        "fd_pwrite five at 0 (read-only)",
        writev(f, &[b"five\n"], Some(0)).map(|n| n.to_string()),
    );
    show("close log", close(f).map(|_| String::new()));
    show("cat log", cat(d, "log"));
}

fn sync(d: Fd, root: Fd) {
    println!("## fd_sync / fd_datasync");
    let f = open(d, "s", CREAT | TRUNC, ALL).unwrap_or(u32::MAX);
    let _ = write_all(f, b"durable");
    show(
        "fd_sync file",
        unsafe { wasi::fd_sync(f) }.map(|_| String::new()),
    );
    show(
        "fd_datasync file",
        unsafe { wasi::fd_datasync(f) }.map(|_| String::new()),
    );
    let ro = open(d, "s", NONE, RO).unwrap_or(u32::MAX);
    show(
        "fd_sync read-only file",
        unsafe { wasi::fd_sync(ro) }.map(|_| String::new()),
    );
    let _ = close(ro);
    show(
        "fd_sync directory",
        unsafe { wasi::fd_sync(d) }.map(|_| String::new()),
    );
    show(
        "fd_datasync directory",
        unsafe { wasi::fd_datasync(d) }.map(|_| String::new()),
    );
    show(
        "fd_sync preopened root",
        unsafe { wasi::fd_sync(root) }.map(|_| String::new()),
    );
    show(
        "fd_sync bad fd",
        unsafe { wasi::fd_sync(9999) }.map(|_| String::new()),
    );
    show(
        "fd_datasync bad fd",
        unsafe { wasi::fd_datasync(9999) }.map(|_| String::new()),
    );
    let _ = close(f);
}

fn filestat(d: Fd) {
    println!("## fd_filestat_get / path_filestat_get");
    let _ = touch(d, "st", b"12345");
    let f = open(d, "st", NONE, ALL).unwrap_or(u32::MAX);
    show("fd_filestat_get st", fstat(f).map(|s| fmt_stat(&s)));
    show("path_filestat_get st", pstat(d, "st").map(|s| fmt_stat(&s)));
    show(
        "path_filestat_get st (no follow)",
        unsafe { wasi::path_filestat_get(d, 0, "st") }.map(|s| fmt_stat(&s)),
    );
    show(
        "path_filestat_get sub",
        pstat(d, "sub").map(|s| fmt_stat(&s)),
    );
    let _ = unsafe { wasi::path_create_directory(d, "sub/inner") };
    show(
        "path_filestat_get sub (one subdirectory)",
        pstat(d, "sub").map(|s| fmt_stat(&s)),
    );
    let _ = unsafe { wasi::path_remove_directory(d, "sub/inner") };
    show("path_filestat_get .", pstat(d, ".").map(|s| fmt_stat(&s)));
    show(
        "path_filestat_get missing",
        pstat(d, "missing").map(|s| fmt_stat(&s)),
    );
    show(
        "path_filestat_get st/ (trailing slash)",
        pstat(d, "st/").map(|s| fmt_stat(&s)),
    );
    show(
        "path_filestat_get st/x",
        pstat(d, "st/x").map(|s| fmt_stat(&s)),
    );
    show("path_filestat_get \"\"", pstat(d, "").map(|s| fmt_stat(&s)));
    show("fd_filestat_get directory", fstat(d).map(|s| fmt_stat(&s)));
    show("fd_filestat_get bad fd", fstat(9999).map(|s| fmt_stat(&s)));
    show("fd_fdstat_get bad fd", fdstat(9999));
    let _ = close(f);
}

fn set_size(d: Fd) {
    println!("## fd_filestat_set_size");
    let _ = touch(d, "sz", b"abcdef");
    let f = open(d, "sz", NONE, ALL).unwrap_or(u32::MAX);
    let _ = age_fd(f);
    show(
        "set_size 3",
        unsafe { wasi::fd_filestat_set_size(f, 3) }.map(|_| String::new()),
    );
    show("after shrink", fstat(f).map(|s| fmt_stat(&s)));
    show("mtime after set_size", moved_fd(f));
    show("cat sz", cat(d, "sz"));
    show(
        "set_size 10",
        unsafe { wasi::fd_filestat_set_size(f, 10) }.map(|_| String::new()),
    );
    show("cat sz (grown with zeros)", cat(d, "sz"));
    show(
        "set_size 0",
        unsafe { wasi::fd_filestat_set_size(f, 0) }.map(|_| String::new()),
    );
    show("size", fstat(f).map(|s| s.size.to_string()));
    let ro = open(d, "sz", NONE, RO).unwrap_or(u32::MAX);
    show(
        "set_size on a read-only fd",
        unsafe { wasi::fd_filestat_set_size(ro, 5) }.map(|_| String::new()),
    );
    let _ = close(ro);
    show(
        "set_size on a directory",
        unsafe { wasi::fd_filestat_set_size(d, 5) }.map(|_| String::new()),
    );
    let _ = close(f);
}

fn times(d: Fd) {
    println!("## set_times");
    let _ = touch(d, "tm", b"time");
    let f = open(d, "tm", NONE, ALL).unwrap_or(u32::MAX);
    let both = wasi::FSTFLAGS_ATIM | wasi::FSTFLAGS_MTIM;
    show(
        "fd_filestat_set_times atim+mtim",
        unsafe { wasi::fd_filestat_set_times(f, ATIME, MTIME, both) }.map(|_| String::new()),
    );
    show(
        "fd_filestat_get times",
        fstat(f).map(|s| format!("atim={} mtim={}", s.atim, s.mtim)),
    );
    show(
        "fd_filestat_set_times mtim only",
        unsafe { wasi::fd_filestat_set_times(f, 0, OLD, wasi::FSTFLAGS_MTIM) }
            .map(|_| String::new()),
    );
    show(
        "times (atim kept)",
        fstat(f).map(|s| format!("atim={} mtim={}", s.atim, s.mtim)),
    );
    show(
        "fd_filestat_set_times MTIM_NOW",
        unsafe { wasi::fd_filestat_set_times(f, 0, 0, wasi::FSTFLAGS_MTIM_NOW) }
            .map(|_| String::new()),
    );
    show("mtime after MTIM_NOW", moved_fd(f));
    show(
        "fd_filestat_set_times MTIM|MTIM_NOW",
        unsafe {
            wasi::fd_filestat_set_times(f, 0, 0, wasi::FSTFLAGS_MTIM | wasi::FSTFLAGS_MTIM_NOW)
        }
        .map(|_| String::new()),
    );
    show(
        "fd_filestat_set_times ATIM|ATIM_NOW",
        unsafe {
            wasi::fd_filestat_set_times(f, 0, 0, wasi::FSTFLAGS_ATIM | wasi::FSTFLAGS_ATIM_NOW)
        }
        .map(|_| String::new()),
    );
    let _ = age_fd(f);
    let _ = write_all(f, b"T");
    show("mtime after fd_write", moved_fd(f));
    let _ = age_fd(f);
    let _ = writev(f, &[b"P"], Some(0));
    show("mtime after fd_pwrite", moved_fd(f));
    let _ = age_fd(f);
    let _ = readv(f, &[4], Some(0));
    show("mtime after fd_pread (unchanged)", moved_fd(f));
    show(
        "fd_filestat_set_times on a directory",
        unsafe { wasi::fd_filestat_set_times(d, ATIME, MTIME, both) }.map(|_| String::new()),
    );
    show(
        "directory times",
        fstat(d).map(|s| format!("atim={} mtim={}", s.atim, s.mtim)),
    );
    let _ = close(f);

    show(
        "path_filestat_set_times tm",
        unsafe { wasi::path_filestat_set_times(d, FOLLOW, "tm", ATIME, MTIME, both) }
            .map(|_| String::new()),
    );
    show(
        "path_filestat_get tm times",
        pstat(d, "tm").map(|s| format!("atim={} mtim={}", s.atim, s.mtim)),
    );
    show(
        "path_filestat_set_times tm (no follow)",
        unsafe { wasi::path_filestat_set_times(d, 0, "tm", MTIME, ATIME, both) }
            .map(|_| String::new()),
    );
    show(
        "path_filestat_get tm times",
        pstat(d, "tm").map(|s| format!("atim={} mtim={}", s.atim, s.mtim)),
    );
    show(
        "path_filestat_set_times sub",
        unsafe { wasi::path_filestat_set_times(d, FOLLOW, "sub", ATIME, MTIME, both) }
            .map(|_| String::new()),
    );
    show(
        "path_filestat_get sub times",
        pstat(d, "sub").map(|s| format!("atim={} mtim={}", s.atim, s.mtim)),
    );
    show(
        "path_filestat_set_times missing",
        unsafe { wasi::path_filestat_set_times(d, FOLLOW, "missing", ATIME, MTIME, both) }
            .map(|_| String::new()),
    );
    show(
        "path_filestat_set_times MTIM|MTIM_NOW",
        unsafe {
            wasi::path_filestat_set_times(
                d,
                FOLLOW,
                "tm",
                0,
                0,
                wasi::FSTFLAGS_MTIM | wasi::FSTFLAGS_MTIM_NOW,
            )
        }
        .map(|_| String::new()),
    );
    let _ = age(d, "tm");
    show(
        "path_filestat_set_times MTIM_NOW",
        unsafe { wasi::path_filestat_set_times(d, FOLLOW, "tm", 0, 0, wasi::FSTFLAGS_MTIM_NOW) }
            .map(|_| String::new()),
    );
    show("tm mtime after MTIM_NOW", moved(d, "tm"));
    // A directory's mtime moves when an entry is created, renamed or removed.
    let _ = unsafe { wasi::path_create_directory(d, "dt") };
    let _ = age(d, "dt");
    let _ = touch(d, "dt/f", b"");
    show("dir mtime after a create in it", moved(d, "dt"));
    let _ = age(d, "dt");
    let _ = unsafe { wasi::path_rename(d, "dt/f", d, "dt/g") };
    show("dir mtime after a rename in it", moved(d, "dt"));
    let _ = age(d, "dt");
    let _ = unsafe { wasi::path_unlink_file(d, "dt/g") };
    show("dir mtime after an unlink in it", moved(d, "dt"));
    let _ = age(d, "dt");
    let _ = pstat(d, "dt");
    let _ = ls(d, "dt");
    show(
        "dir mtime after stat and listing (unchanged)",
        moved(d, "dt"),
    );
    let _ = unsafe { wasi::path_remove_directory(d, "dt") };
}

fn readdir_cookies(d: Fd) {
    println!("## fd_readdir");
    let _ = unsafe { wasi::path_create_directory(d, "rd") };
    for i in 0..12 {
        let _ = touch(d, &format!("rd/file{i:02}"), b"x");
    }
    let _ = unsafe { wasi::path_create_directory(d, "rd/subdir") };
    let fd = open(d, "rd", DIRECTORY, RO).unwrap_or(u32::MAX);
    let all = readdir(fd, 4096, 0);
    show(
        "readdir all (sorted)",
        all.clone().map(|e| names(&e).join(" ")),
    );
    let all = all.unwrap_or_default();
    show(
        "first two entries",
        Ok(all
            .iter()
            .take(2)
            .map(|e| format!("{} next={}", String::from_utf8_lossy(&e.name), e.next))
            .collect::<Vec<_>>()
            .join(", ")),
    );
    show(
        "cookies distinct and nonzero",
        Ok({
            let mut c: Vec<u64> = all.iter().map(|e| e.next).collect();
            c.sort();
            c.dedup();
            (c.len() == all.len() && !c.contains(&0)).to_string()
        }),
    );
    for k in [1usize, 2, 7, all.len().saturating_sub(1)] {
        let Some(e) = all.get(k.saturating_sub(1)) else {
            continue;
        };
        let label = format!("resume after entry {k}");
        show(
            &label,
            readdir(fd, 4096, e.next).map(|tail| {
                format!(
                    "{} entries, same as the rest of the full listing: {}",
                    tail.len(),
                    tail[..] == all[k..]
                )
            }),
        );
    }
    show(
        "resume at the last cookie",
        readdir(fd, 4096, all.last().map_or(0, |e| e.next)).map(|t| format!("{} entries", t.len())),
    );
    show(
        "readdir with 40-byte buffer (resuming by cookie)",
        readdir(fd, 40, 0).map(|e| format!("same as the full listing: {}", e == all)),
    );
    show("readdir with a 10-byte buffer", {
        let mut buf = [0u8; 10];
        unsafe { wasi::fd_readdir(fd, buf.as_mut_ptr(), buf.len(), 0) }.map(|n| n.to_string())
    });
    show(
        "readdir at cookie 1000000 (past the end)",
        readdir(fd, 4096, 1_000_000).map(|t| format!("{} entries", t.len())),
    );
    let f = open(d, "rd/file00", NONE, RO).unwrap_or(u32::MAX);
    show(
        "readdir on a file",
        readdir(f, 4096, 0).map(|t| format!("{} entries", t.len())),
    );
    let _ = close(f);
    let _ = close(fd);
    let sub = open(d, "rd/subdir", DIRECTORY, RO).unwrap_or(u32::MAX);
    show(
        "readdir of an empty directory",
        readdir(sub, 4096, 0).map(|e| names(&e).join(" ")),
    );
    let _ = close(sub);
    // Entries added and removed between two listings of one descriptor.
    let fd = open(d, "rd", DIRECTORY, RO).unwrap_or(u32::MAX);
    let _ = touch(d, "rd/added", b"");
    let _ = unsafe { wasi::path_unlink_file(d, "rd/file05") };
    show(
        "readdir after adding and removing (same fd)",
        readdir(fd, 4096, 0).map(|e| names(&e).join(" ")),
    );
    let _ = close(fd);
    rm_rf(d, "rd");
}

fn directories(d: Fd) {
    println!("## create / remove directory, unlink");
    let mk = |p: &str| unsafe { wasi::path_create_directory(d, p) }.map(|_| String::new());
    let rmd = |p: &str| unsafe { wasi::path_remove_directory(d, p) }.map(|_| String::new());
    let unl = |p: &str| unsafe { wasi::path_unlink_file(d, p) }.map(|_| String::new());
    show("mkdir dd", mk("dd"));
    show("mkdir dd again", mk("dd"));
    show("mkdir dd/e/ (trailing slash)", mk("dd/e/"));
    show("mkdir missing/x", mk("missing/x"));
    show("mkdir st/x (under a file)", mk("st/x"));
    show("mkdir st (a file's name)", mk("st"));
    show("mkdir \"\"", mk(""));
    show("mkdir .", mk("."));
    show("mkdir dd/..", mk("dd/.."));
    let _ = touch(d, "dd/file", b"");
    show("rmdir dd (not empty)", rmd("dd"));
    show("rmdir dd/file (a file)", rmd("dd/file"));
    show("rmdir missing", rmd("missing"));
    show("rmdir dd/e/ (trailing slash)", rmd("dd/e/"));
    let _ = rmd("dd/e");
    show("rmdir .", rmd("."));
    show("rmdir dd/.", rmd("dd/."));
    show("rmdir \"\"", rmd(""));
    show("rmdir dd/..", rmd("dd/.."));
    show("rmdir ..", rmd(".."));
    show("unlink .", unl("."));
    show("unlink dd/..", unl("dd/.."));
    show("unlink dd (a directory)", unl("dd"));
    show("unlink dd/ (a directory)", unl("dd/"));
    show(
        "unlink dd/file/ (trailing slash on a file)",
        unl("dd/file/"),
    );
    show("unlink missing", unl("missing"));
    show("unlink dd/missing/x", unl("dd/missing/x"));
    show("unlink \"\"", unl(""));
    show("unlink dd/file", unl("dd/file"));
    show("unlink dd/file again", unl("dd/file"));
    let held = open(d, "dd", DIRECTORY, RO).unwrap_or(u32::MAX);
    show("rmdir dd (now empty, held open)", rmd("dd"));
    show("stat dd", pstat(d, "dd").map(|s| fmt_stat(&s)));
    // Linux keeps a removed directory's descriptor usable for fstat and fsync; names
    // under it are gone.
    show(
        "fd_filestat_get of removed dd",
        fstat(held).map(|s| kind(s.filetype).into()),
    );
    show("fd_sync of removed dd", unsafe {
        wasi::fd_sync(held).map(|_| String::new())
    });
    show(
        "create under removed dd",
        open(held, "f", CREAT, ALL).map(|_| String::new()),
    );
    show(
        "fd_readdir of removed dd",
        readdir(held, 256, 0).map(|e| names(&e).join(" ")),
    );
    show("close removed dd", close(held).map(|_| String::new()));
    show("mkdir on a file fd", {
        let f = open(d, "st", NONE, RO).unwrap_or(u32::MAX);
        let r = unsafe { wasi::path_create_directory(f, "x") }.map(|_| String::new());
        let _ = close(f);
        r
    });
}

fn rename(d: Fd) {
    println!("## path_rename");
    let ren = |a: &str, b: &str| unsafe { wasi::path_rename(d, a, d, b) }.map(|_| String::new());
    let _ = unsafe { wasi::path_create_directory(d, "r1") };
    let _ = unsafe { wasi::path_create_directory(d, "r2") };
    let _ = touch(d, "r1/f", b"first");
    let _ = touch(d, "r1/g", b"second");
    show(
        "rename r1/f -> r2/f (across directories)",
        ren("r1/f", "r2/f"),
    );
    show("stat r1/f", pstat(d, "r1/f").map(|s| fmt_stat(&s)));
    show("cat r2/f", cat(d, "r2/f"));
    let r1 = open(d, "r1", DIRECTORY, RO).unwrap_or(u32::MAX);
    let r2 = open(d, "r2", DIRECTORY, RO).unwrap_or(u32::MAX);
    show(
        "rename r1:g -> r2:g (two directory fds)",
        unsafe { wasi::path_rename(r1, "g", r2, "g") }.map(|_| String::new()),
    );
    show("ls r1", ls(d, "r1"));
    show("ls r2", ls(d, "r2"));
    show("rename r2/f -> r2/g (file over file)", ren("r2/f", "r2/g"));
    show("cat r2/g", cat(d, "r2/g"));
    show("ls r2", ls(d, "r2"));
    let _ = unsafe { wasi::path_create_directory(d, "r1/empty") };
    let _ = unsafe { wasi::path_create_directory(d, "r2/dir") };
    let _ = touch(d, "r2/dir/inside", b"in");
    show(
        "rename r2/dir -> r1/empty (dir over empty dir)",
        ren("r2/dir", "r1/empty"),
    );
    show("cat r1/empty/inside", cat(d, "r1/empty/inside"));
    let _ = unsafe { wasi::path_create_directory(d, "r2/other") };
    show(
        "rename r2/other -> r1/empty (dir over non-empty dir)",
        ren("r2/other", "r1/empty"),
    );
    show(
        "rename r2/g -> r1/empty (file over dir)",
        ren("r2/g", "r1/empty"),
    );
    show(
        "rename r2/other -> r2/g (dir over file)",
        ren("r2/other", "r2/g"),
    );
    show("rename r2/missing -> r2/x", ren("r2/missing", "r2/x"));
    show(
        "rename r2/g -> r2/missing/x (missing target parent)",
        ren("r2/g", "r2/missing/x"),
    );
    show(
        "rename r1 -> r1/empty/below (into itself)",
        ren("r1", "r1/empty/below"),
    );
    show("rename r2/g -> r2/g (same name)", ren("r2/g", "r2/g"));
    show(
        "rename r2/g -> r2/h/ (trailing slash, file)",
        ren("r2/g", "r2/h/"),
    );
    show(
        "rename r2/other/ -> r2/moved/ (trailing slashes, dir)",
        ren("r2/other/", "r2/moved/"),
    );
    show(
        "rename r2/g -> r2/g/x (under a file)",
        ren("r2/g", "r2/g/x"),
    );
    show("rename r2/moved -> r2/.", ren("r2/moved", "r2/."));
    show("rename . -> r2/x", ren(".", "r2/x"));
    show("rename \"\" -> r2/x", ren("", "r2/x"));
    // A file renamed while open stays readable through its descriptor.
    let f = open(d, "r2/g", NONE, ALL).unwrap_or(u32::MAX);
    show("rename open r2/g -> r1/g2", ren("r2/g", "r1/g2"));
    show(
        "fd_pread renamed open file",
        readv(f, &[20], Some(0)).map(|b| text(&b)),
    );
    show(
        "fd_write renamed open file",
        writev(f, &[b"S"], None).map(|n| n.to_string()),
    );
    let _ = close(f);
    show("cat r1/g2", cat(d, "r1/g2"));
    show("rename with a file fd as directory", {
        let f = open(d, "r1/g2", NONE, RO).unwrap_or(u32::MAX);
        let r = unsafe { wasi::path_rename(f, "x", d, "y") }.map(|_| String::new());
        let _ = close(f);
        r
    });
    let _ = close(r1);
    let _ = close(r2);
    show("ls r1", ls(d, "r1"));
    show("ls r2", ls(d, "r2"));
    rm_rf(d, "r1");
    rm_rf(d, "r2");
}

fn link(d: Fd) {
    println!("## path_link");
    let lnk = |a: &str, b: &str| unsafe { wasi::path_link(d, 0, a, d, b) }.map(|_| String::new());
    let _ = touch(d, "l1", b"linked");
    let _ = unsafe { wasi::path_create_directory(d, "ldir") };
    show("link l1 -> ldir/l2", lnk("l1", "ldir/l2"));
    show("stat l1", pstat(d, "l1").map(|s| fmt_stat(&s)));
    show("stat ldir/l2", pstat(d, "ldir/l2").map(|s| fmt_stat(&s)));
    let f = open(d, "l1", NONE, ALL).unwrap_or(u32::MAX);
    let _ = writev(f, &[b"L"], Some(0));
    let _ = close(f);
    show("cat ldir/l2 (write through l1)", cat(d, "ldir/l2"));
    show("link l1 -> ldir/l2 (exists)", lnk("l1", "ldir/l2"));
    show("link ldir -> ldir2 (a directory)", lnk("ldir", "ldir2"));
    show("link missing -> x", lnk("missing", "x"));
    show("link l1 -> missing/x", lnk("l1", "missing/x"));
    show("link l1 -> l1/x (under a file)", lnk("l1", "l1/x"));
    show("link l1/ -> x (trailing slash)", lnk("l1/", "x"));
    show(
        "link l1 -> l3 with SYMLINK_FOLLOW",
        unsafe { wasi::path_link(d, FOLLOW, "l1", d, "l3") }.map(|_| String::new()),
    );
    // Hosts that refuse it and hosts that make it agree again from here on.
    rm_rf(d, "l3");
    show(
        "unlink l1",
        unsafe { wasi::path_unlink_file(d, "l1") }.map(|_| String::new()),
    );
    show("stat ldir/l2", pstat(d, "ldir/l2").map(|s| fmt_stat(&s)));
    show("cat ldir/l2", cat(d, "ldir/l2"));
    rm_rf(d, "ldir");
    rm_rf(d, "l3");
}

fn allocate_advise(d: Fd) {
    println!("## fd_allocate / fd_advise");
    let _ = touch(d, "al", b"abc");
    let f = open(d, "al", NONE, ALL).unwrap_or(u32::MAX);
    show(
        "fd_allocate 0+8192",
        unsafe { wasi::fd_allocate(f, 0, 8192) }.map(|_| String::new()),
    );
    show("size", fstat(f).map(|s| s.size.to_string()));
    show(
        "fd_allocate 0+10 (inside the file)",
        unsafe { wasi::fd_allocate(f, 0, 10) }.map(|_| String::new()),
    );
    show("size", fstat(f).map(|s| s.size.to_string()));
    show(
        "fd_allocate len 0",
        unsafe { wasi::fd_allocate(f, 0, 0) }.map(|_| String::new()),
    );
    let ro = open(d, "al", NONE, RO).unwrap_or(u32::MAX);
    show(
        "fd_allocate on a read-only fd",
        unsafe { wasi::fd_allocate(ro, 0, 1 << 20) }.map(|_| String::new()),
    );
    let _ = close(ro);
    show(
        "fd_allocate on a directory",
        unsafe { wasi::fd_allocate(d, 0, 10) }.map(|_| String::new()),
    );
    show(
        "fd_allocate bad fd",
        unsafe { wasi::fd_allocate(9999, 0, 10) }.map(|_| String::new()),
    );
    show("cat al (first bytes kept)", {
        readv(f, &[4], Some(0)).map(|b| text(&b))
    });
    for (name, advice) in [
        ("NORMAL", wasi::ADVICE_NORMAL),
        ("SEQUENTIAL", wasi::ADVICE_SEQUENTIAL),
        ("RANDOM", wasi::ADVICE_RANDOM),
        ("WILLNEED", wasi::ADVICE_WILLNEED),
        ("DONTNEED", wasi::ADVICE_DONTNEED),
        ("NOREUSE", wasi::ADVICE_NOREUSE),
    ] {
        show(
            &format!("fd_advise {name}"),
            unsafe { wasi::fd_advise(f, 0, 4096, advice) }.map(|_| String::new()),
        );
    }
    let big = open(d, "big", NONE, RO).unwrap_or(u32::MAX);
    show(
        "fd_advise WILLNEED 1 MiB of big, then pread",
        unsafe { wasi::fd_advise(big, 0, 1 << 20, wasi::ADVICE_WILLNEED) }.and_then(|_| {
            readv(big, &[1 << 20], Some(0))
                .map(|b| format!("n={} bytes match={}", b.len(), b == pattern(1 << 20)))
        }),
    );
    show(
        "fd_advise WILLNEED past EOF",
        unsafe { wasi::fd_advise(big, 1 << 30, 4096, wasi::ADVICE_WILLNEED) }
            .map(|_| String::new()),
    );
    let _ = close(big);
    show(
        "fd_advise on a directory",
        unsafe { wasi::fd_advise(d, 0, 10, wasi::ADVICE_WILLNEED) }.map(|_| String::new()),
    );
    let _ = close(f);
}

fn readlink(d: Fd, path: &str, len: usize) -> R<String> {
    let mut buf = vec![0u8; len];
    unsafe { wasi::path_readlink(d, path, buf.as_mut_ptr(), buf.len()) }.map(|n| text(&buf[..n]))
}

fn lstat(d: Fd, path: &str) -> R<Filestat> {
    unsafe { wasi::path_filestat_get(d, 0, path) }
}

fn symlink(target: &str, d: Fd, path: &str) -> R<String> {
    unsafe { wasi::path_symlink(target, d, path) }.map(|_| String::new())
}

fn unlink(d: Fd, path: &str) -> R<String> {
    unsafe { wasi::path_unlink_file(d, path) }.map(|_| String::new())
}

fn symlinks(d: Fd) {
    println!("## symlinks");
    let _ = touch(d, "target", b"pointed at");
    show(
        "symlink: path_symlink target -> sl",
        symlink("target", d, "sl"),
    );
    show("symlink: path_readlink sl", readlink(d, "sl", 64));
    show(
        "symlink: path_readlink sl into 3 bytes",
        readlink(d, "sl", 3),
    );
    show(
        "symlink: stat sl (no follow)",
        lstat(d, "sl").map(|s| kind(s.filetype).to_string()),
    );
    show(
        "symlink: stat sl (no follow) in full",
        lstat(d, "sl").map(|s| fmt_stat(&s)),
    );
    show(
        "symlink: stat sl (follow)",
        pstat(d, "sl").map(|s| fmt_stat(&s)),
    );
    show("symlink: cat sl", cat(d, "sl"));
    show(
        "symlink: write through sl",
        open(d, "sl", NONE, ALL).and_then(|fd| {
            let r = writev(fd, &[b"P"], Some(0)).map(|n| n.to_string());
            close(fd)?;
            r
        }),
    );
    show("symlink: cat target", cat(d, "target"));
    show(
        "symlink: open sl without SYMLINK_FOLLOW",
        unsafe { wasi::path_open(d, 0, "sl", NONE, RO, RO, 0) }.map(|_| String::new()),
    );
    show(
        "symlink: open sl CREAT|EXCL",
        open(d, "sl", CREAT | EXCL, ALL).map(|_| String::new()),
    );
    show(
        "symlink: open sl/ (trailing slash)",
        open(d, "sl/", NONE, RO).map(|_| String::new()),
    );
    show(
        "symlink: set times of sl (no follow)",
        unsafe { wasi::path_filestat_set_times(d, 0, "sl", 0, MTIME, wasi::FSTFLAGS_MTIM) }
            .map(|_| String::new()),
    );
    show(
        "symlink: the link's mtime, the target's mtime",
        lstat(d, "sl").and_then(|l| {
            pstat(d, "sl").map(|t| format!("link={} target={}", l.mtim == MTIME, t.mtim == MTIME))
        }),
    );
    show(
        "symlink: set times through sl (follow)",
        unsafe { wasi::path_filestat_set_times(d, FOLLOW, "sl", 0, OLD, wasi::FSTFLAGS_MTIM) }
            .map(|_| String::new()),
    );
    show(
        "symlink: the link's mtime, the target's mtime",
        lstat(d, "sl").and_then(|l| {
            pstat(d, "sl").map(|t| format!("link={} target={}", l.mtim == MTIME, t.mtim == OLD))
        }),
    );
    show(
        "symlink: hard link of sl -> hl (the link itself)",
        unsafe { wasi::path_link(d, 0, "sl", d, "hl") }.map(|_| String::new()),
    );
    show(
        "symlink: stat hl (no follow)",
        lstat(d, "hl").map(|s| fmt_stat(&s)),
    );
    show("symlink: path_readlink hl", readlink(d, "hl", 64));
    show("symlink: unlink hl", unlink(d, "hl"));
    show("symlink: rename sl -> sl2", unsafe {
        wasi::path_rename(d, "sl", d, "sl2").map(|_| String::new())
    });
    show("symlink: path_readlink sl2", readlink(d, "sl2", 64));
    show("symlink: cat sl2", cat(d, "sl2"));
    show("symlink: rename sl2/ -> sl3 (trailing slash)", unsafe {
        wasi::path_rename(d, "sl2/", d, "sl3").map(|_| String::new())
    });
    let _ = touch(d, "over", b"over");
    show("symlink: rename over -> sl2 (a file over a link)", unsafe {
        wasi::path_rename(d, "over", d, "sl2").map(|_| String::new())
    });
    show(
        "symlink: stat sl2 (no follow)",
        lstat(d, "sl2").map(|s| fmt_stat(&s)),
    );
    show("symlink: cat target (untouched)", cat(d, "target"));
    show("symlink: unlink sl2", unlink(d, "sl2"));

    println!("## symlinks to directories");
    let _ = unsafe { wasi::path_create_directory(d, "sdir") };
    let _ = touch(d, "sdir/in", b"inside");
    show(
        "symlink: path_symlink in -> sdir/lnk",
        symlink("in", d, "sdir/lnk"),
    );
    show("symlink: path_symlink sdir -> dl", symlink("sdir", d, "dl"));
    show(
        "symlink: stat dl (follow)",
        pstat(d, "dl").map(|s| fmt_stat(&s)),
    );
    show(
        "symlink: stat dl (no follow)",
        lstat(d, "dl").map(|s| kind(s.filetype).to_string()),
    );
    show(
        "symlink: stat dl/ (no follow, trailing slash)",
        lstat(d, "dl/").map(|s| kind(s.filetype).to_string()),
    );
    show("symlink: cat dl/in", cat(d, "dl/in"));
    show("symlink: ls dl", ls(d, "dl"));
    show(
        "symlink: open dl (no DIRECTORY flag)",
        open(d, "dl", NONE, RO).and_then(|fd| {
            let s = fdstat(fd);
            close(fd)?;
            s
        }),
    );
    show(
        "symlink: open dl DIRECTORY without SYMLINK_FOLLOW",
        unsafe { wasi::path_open(d, 0, "dl", DIRECTORY, RO, RO, 0) }.map(|_| String::new()),
    );
    show(
        "symlink: create dl/new through the link",
        touch(d, "dl/new", b"new").map(|_| String::new()),
    );
    show("symlink: ls sdir", ls(d, "sdir"));
    show(
        "symlink: stat dl/../target",
        pstat(d, "dl/../target").map(|s| fmt_stat(&s)),
    );
    show(
        "symlink: mkdir dl (exists as a link)",
        unsafe { wasi::path_create_directory(d, "dl") }.map(|_| String::new()),
    );
    show(
        "symlink: rmdir dl",
        unsafe { wasi::path_remove_directory(d, "dl") }.map(|_| String::new()),
    );
    show(
        "symlink: rmdir dl/",
        unsafe { wasi::path_remove_directory(d, "dl/") }.map(|_| String::new()),
    );
    show("symlink: unlink dl/", unlink(d, "dl/"));
    show("symlink: unlink dl", unlink(d, "dl"));
    show("symlink: ls sdir after unlinking dl", ls(d, "sdir"));
    rm_rf(d, "sdir");

    println!("## dangling symlinks and loops");
    show(
        "symlink: path_symlink nowhere -> dang",
        symlink("nowhere", d, "dang"),
    );
    show(
        "symlink: stat dang (follow)",
        pstat(d, "dang").map(|s| fmt_stat(&s)),
    );
    show(
        "symlink: stat dang (no follow)",
        lstat(d, "dang").map(|s| fmt_stat(&s)),
    );
    show("symlink: cat dang", cat(d, "dang"));
    show("symlink: path_readlink dang", readlink(d, "dang", 64));
    show(
        "symlink: open dang CREAT|EXCL",
        open(d, "dang", CREAT | EXCL, ALL).map(|_| String::new()),
    );
    show(
        "symlink: mkdir dang",
        unsafe { wasi::path_create_directory(d, "dang") }.map(|_| String::new()),
    );
    show(
        "symlink: open dang CREAT (creates the target)",
        touch(d, "dang", b"made").map(|_| String::new()),
    );
    show("symlink: cat nowhere", cat(d, "nowhere"));
    show("symlink: unlink dang", unlink(d, "dang"));
    show("symlink: unlink nowhere", unlink(d, "nowhere"));
    show(
        "symlink: path_symlink loop -> loop",
        symlink("loop", d, "loop"),
    );
    show(
        "symlink: stat loop (follow)",
        pstat(d, "loop").map(|s| fmt_stat(&s)),
    );
    show(
        "symlink: stat loop (no follow)",
        lstat(d, "loop").map(|s| kind(s.filetype).to_string()),
    );
    show("symlink: cat loop", cat(d, "loop"));
    show(
        "symlink: stat loop/x",
        pstat(d, "loop/x").map(|s| fmt_stat(&s)),
    );
    show(
        "symlink: create loop/x",
        touch(d, "loop/x", b"").map(|_| String::new()),
    );
    show(
        "symlink: path_symlink pong -> ping",
        symlink("pong", d, "ping"),
    );
    show(
        "symlink: path_symlink ping -> pong",
        symlink("ping", d, "pong"),
    );
    show("symlink: cat ping", cat(d, "ping"));
    show("symlink: unlink loop, ping, pong", {
        unlink(d, "loop")
            .and(unlink(d, "ping"))
            .and(unlink(d, "pong"))
    });
    // A chain: c0 -> target, c{i} -> c{i-1}. Reaching target from c{n} follows n + 1 links.
    let chain: Vec<String> = (0..=40)
        .map(|i| {
            let to = if i == 0 {
                "target".to_string()
            } else {
                format!("c{}", i - 1)
            };
            symlink(&to, d, &format!("c{i}")).map(|_| String::new())
        })
        .filter_map(|r| r.err().map(rawfs::errno_name))
        .collect();
    show("symlink: a chain of 41 links", Ok(chain.join(" ")));
    show("symlink: cat c39 (40 links)", cat(d, "c39"));
    show("symlink: cat c40 (41 links)", cat(d, "c40"));
    for i in 0..=40 {
        let _ = unlink(d, &format!("c{i}"));
    }

    println!("## symlinks that lead out");
    show(
        "symlink: path_symlink ../t/target -> esc",
        symlink("../t/target", d, "esc"),
    );
    show(
        "symlink: stat esc (follow)",
        pstat(d, "esc").map(|s| fmt_stat(&s)),
    );
    show(
        "symlink: stat esc (no follow)",
        lstat(d, "esc").map(|s| kind(s.filetype).to_string()),
    );
    show("symlink: cat esc", cat(d, "esc"));
    show("symlink: unlink esc", unlink(d, "esc"));
    let _ = unsafe { wasi::path_create_directory(d, "in") };
    show(
        "symlink: path_symlink ../target -> in/back",
        symlink("../target", d, "in/back"),
    );
    show("symlink: cat in/back (stays inside)", cat(d, "in/back"));
    show("symlink: unlink in/back", unlink(d, "in/back"));
    rm_rf(d, "in");
    show(
        "path_symlink to an absolute path",
        symlink("/etc/passwd", d, "abs"),
    );
    rm_rf(d, "abs");
    show("path_symlink with an empty target", symlink("", d, "empty"));
    rm_rf(d, "empty");
    show(
        "path_symlink over an existing file",
        symlink("target", d, "target"),
    );
    show(
        "path_symlink into a missing directory",
        symlink("target", d, "missing/sl"),
    );
    show(
        "path_symlink below a file",
        symlink("target", d, "target/sl"),
    );
    show("path_readlink of a regular file", readlink(d, "target", 64));
    show("path_readlink of a directory", readlink(d, "sub", 64));
    show("path_readlink missing", readlink(d, "missing", 64));
    rm_rf(d, "target");
}

fn unlink_while_open(d: Fd) {
    println!("## unlink while open");
    let _ = touch(d, "gone", b"still here");
    let f = open(d, "gone", NONE, ALL).unwrap_or(u32::MAX);
    show(
        "unlink gone (open)",
        unsafe { wasi::path_unlink_file(d, "gone") }.map(|_| String::new()),
    );
    show("stat gone", pstat(d, "gone").map(|s| fmt_stat(&s)));
    show("fd_pread", readv(f, &[64], Some(0)).map(|b| text(&b)));
    show("fd_filestat_get", fstat(f).map(|s| fmt_stat(&s)));
    show(
        "fd_pwrite",
        writev(f, &[b"STILL"], Some(0)).map(|n| n.to_string()),
    );
    show(
        "fd_sync",
        unsafe { wasi::fd_sync(f) }.map(|_| String::new()),
    );
    show("fd_pread", readv(f, &[64], Some(0)).map(|b| text(&b)));
    show(
        "create a new gone while the old one is open",
        touch(d, "gone", b"new").map(|_| String::new()),
    );
    show("fd_pread old", readv(f, &[64], Some(0)).map(|b| text(&b)));
    show("cat new gone", cat(d, "gone"));
    show("close old", close(f).map(|_| String::new()));
    show("cat new gone", cat(d, "gone"));
}

fn paths(d: Fd, root: Fd) {
    println!("## path forms");
    let _ = touch(d, "p", b"p");
    for path in [
        "p",
        "./p",
        "sub/../p",
        "sub//../p",
        ".//p",
        "sub/./../sub/../p",
        "..",
        "../t/p",
        "sub/../../t/p",
        "/p",
        "/etc/passwd",
        "p/.",
        "p/..",
        "nul\0name",
        &"n".repeat(255),
        &"n".repeat(256),
    ] {
        let label = if path.len() > 40 {
            format!("stat <{} bytes>", path.len())
        } else {
            format!("stat {path:?}")
        };
        show(&label, pstat(d, path).map(|s| kind(s.filetype).to_string()));
    }
    show(
        "stat t/p from the root",
        pstat(root, "t/p").map(|s| kind(s.filetype).to_string()),
    );
    let sub = open(d, "sub", DIRECTORY, RO).unwrap_or(u32::MAX);
    show(
        "stat ../p from a sub directory fd",
        pstat(sub, "../p").map(|s| kind(s.filetype).to_string()),
    );
    show(
        "stat x/../../p from a sub directory fd",
        pstat(sub, "x/../../p").map(|s| kind(s.filetype).to_string()),
    );
    show(
        "open .. from a sub directory fd",
        open(sub, "..", DIRECTORY, RO).map(|_| String::new()),
    );
    let _ = close(sub);
    show(
        "stat .. from the root",
        pstat(root, "..").map(|s| kind(s.filetype).to_string()),
    );
    show(
        "create a 255-byte name",
        touch(d, &"n".repeat(255), b"long").map(|_| String::new()),
    );
    show(
        "create a 256-byte name",
        touch(d, &"n".repeat(256), b"long").map(|_| String::new()),
    );
    show(
        "create nul\\0name",
        touch(d, "nul\0name", b"").map(|_| String::new()),
    );
    show(
        "create a name with a non-UTF-8 byte",
        rawfs::open_raw(d, FOLLOW, b"bad\xffname", CREAT, ALL, 0).map(|_| String::new()),
    );
    show(
        "create a UTF-8 name (ünï)",
        touch(d, "ünï", b"u").map(|_| String::new()),
    );
    show("cat ünï", cat(d, "ünï"));
    rm_rf(d, &"n".repeat(255));
    rm_rf(d, "ünï");
    rm_rf(d, "p");
}

fn closed_fds(d: Fd) {
    println!("## closed descriptors");
    let f = open(d, "cl", CREAT, ALL).unwrap_or(u32::MAX);
    show("close", close(f).map(|_| String::new()));
    show("close again", close(f).map(|_| String::new()));
    show("fd_read closed", readv(f, &[4], None).map(|b| text(&b)));
    show(
        "fd_write closed",
        writev(f, &[b"x"], None).map(|n| n.to_string()),
    );
    show("fd_filestat_get closed", fstat(f).map(|s| fmt_stat(&s)));
    show(
        "path_open on a closed dir fd",
        open(9999, "x", CREAT, ALL).map(|_| String::new()),
    );
    show("path_open with a file fd as directory", {
        let f = open(d, "cl", NONE, RO).unwrap_or(u32::MAX);
        let r = open(f, "x", NONE, RO).map(|_| String::new());
        let _ = close(f);
        r
    });
    rm_rf(d, "cl");
}

/// Removing entries while listing a directory, as `rm -r` and Rust's `remove_dir_all` do:
/// every entry must be seen once even though earlier ones disappear between reads.
fn delete_while_listing(d: Fd) {
    println!("## delete while listing");
    let _ = unsafe { wasi::path_create_directory(d, "many") };
    for i in 0..40 {
        let _ = touch(d, &format!("many/f{i:02}"), b"");
    }
    let fd = open(d, "many", DIRECTORY, RO).unwrap_or(u32::MAX);
    let mut cookie = 0;
    let mut deleted = 0;
    loop {
        let mut buf = vec![0u8; 128];
        let Ok(n) = (unsafe { wasi::fd_readdir(fd, buf.as_mut_ptr(), buf.len(), cookie) }) else {
            break;
        };
        let mut at = 0;
        let mut any = false;
        while at + 24 <= n {
            let next = u64::from_le_bytes(buf[at..at + 8].try_into().unwrap());
            let namlen = u32::from_le_bytes(buf[at + 16..at + 20].try_into().unwrap()) as usize;
            if at + 24 + namlen > n {
                break;
            }
            let name = String::from_utf8_lossy(&buf[at + 24..at + 24 + namlen]).into_owned();
            if name != "." && name != ".." {
                let path = format!("many/{name}");
                if unsafe { wasi::path_unlink_file(d, &path) }.is_ok() {
                    deleted += 1;
                }
            }
            cookie = next;
            at += 24 + namlen;
            any = true;
        }
        if n < buf.len() || !any {
            break;
        }
    }
    let _ = close(fd);
    println!("deleted while listing with a 128-byte buffer -> {deleted} of 40");
    show(
        "rmdir many",
        unsafe { wasi::path_remove_directory(d, "many") }.map(|_| String::new()),
    );
    rm_rf(d, "many");
}
