//! Random sequences of WASIp1 file-system calls on one preopened directory, with a
//! transcript of one line per call (`label -> result`) that two correct hosts agree on;
//! shared by the `fsrandom` and `threads_fsrandom` guests.
//!
//! Where `fsprobe` calls every function once with its error cases, this one mixes them:
//! opens (create, exclusive, truncate, append) into a few descriptor slots, writes and reads
//! at the position and at offsets (sparse ones too), seeks, size changes, syncs, renames,
//! links, symlinks, unlinks of open files, directories made and removed (also while open),
//! listings by path and through descriptors, append mode switched on and off, descriptors
//! renumbered. Each seed works in a subdirectory of its own, `s<seed>`, and ends with a
//! listing of that subtree (every file's size and a hash of its bytes), which it leaves in
//! place: [`dump`] of the mount lists the whole tree again, so a second run after the host
//! remounts its store shows what survived. No path or link leads out of the seed's
//! subdirectory, so seeds run side by side in threads give the transcripts they give alone.
//!
//! The calls stay away from the differences the conformance test lists between valet-run
//! and stock wasmtime (one buffer per read or write, reads under 64 KiB, no `fd_allocate`,
//! no trailing slashes), and print nothing hosts may differ in (inode numbers, times,
//! directory sizes, listing order). Labels never depend on results.

use crate::rawfs::{errno_name, readdir, ALL, FOLLOW, R, RO};
use wasi::Fd;

/// Paths a sequence works on, relative to its subdirectory: a few names at two depths,
/// so renames and links move files between directories and over each other.
const PATHS: &[&str] = &[
    "a", "b", "c", "d", "e", "d/a", "d/b", "d/d", "d/d/a", "e/a", "e/b", "l", "d/../c", "e/../d/b",
];
/// What symlinks point at. Those that climb out of the seed's subdirectory are refused
/// when followed (a path never climbs above the descriptor it is relative to).
const TARGETS: &[&str] = &["a", "d", "d/a", "b", "nowhere", "..", "d/..", "../s0"];
const SLOTS: usize = 4;
/// Reads stay under stock wasmtime's 64 KiB cap on one read.
const MAX_READ: u64 = 60_000;

/// What a sequence prints: one line per call.
#[derive(Default)]
pub struct Transcript(pub String);

impl Transcript {
    fn line(&mut self, line: String) {
        self.0 += &line;
        self.0.push('\n');
    }

    /// `label -> ok[ detail]` or `label -> ENAME`, as [`crate::rawfs::show`] prints.
    fn show(&mut self, label: &str, r: R<String>) {
        self.line(match r {
            Ok(s) if s.is_empty() => format!("{label} -> ok"),
            Ok(s) => format!("{label} -> ok {s}"),
            Err(e) => format!("{label} -> {}", errno_name(e)),
        });
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len() as u64) as usize]
    }
}

/// FNV-1a: enough to tell contents apart in a transcript line.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// `len` bytes that depend on `seed`, so every write is told apart from the others.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9e37)) as u8 | 1)
        .collect()
}

fn describe(data: &[u8]) -> String {
    format!("n={} hash={:016x}", data.len(), hash(data))
}

fn pwrite(fd: Fd, data: &[u8], at: Option<u64>) -> R<String> {
    let iov = [wasi::Ciovec {
        buf: data.as_ptr(),
        buf_len: data.len(),
    }];
    let n = match at {
        Some(at) => unsafe { wasi::fd_pwrite(fd, &iov, at) }?,
        None => unsafe { wasi::fd_write(fd, &iov) }?,
    };
    Ok(n.to_string())
}

fn pread(fd: Fd, len: usize, at: Option<u64>) -> R<String> {
    let mut buf = vec![0u8; len];
    let iov = [wasi::Iovec {
        buf: buf.as_mut_ptr(),
        buf_len: len,
    }];
    let n = match at {
        Some(at) => unsafe { wasi::fd_pread(fd, &iov, at) }?,
        None => unsafe { wasi::fd_read(fd, &iov) }?,
    };
    Ok(describe(&buf[..n]))
}

fn stat_line(st: &wasi::Filestat) -> String {
    if st.filetype == wasi::FILETYPE_DIRECTORY {
        st.filetype.name().to_string()
    } else {
        format!("{} size={} nlink={}", st.filetype.name(), st.size, st.nlink)
    }
}

/// The names in directory `path` (under `dir`), sorted, each with its type's initial.
fn list(dir: Fd, path: &str) -> R<String> {
    let fd = unsafe { wasi::path_open(dir, FOLLOW, path, wasi::OFLAGS_DIRECTORY, RO, RO, 0) }?;
    let entries = readdir(fd, 256, 0);
    unsafe { wasi::fd_close(fd) }?;
    let mut names: Vec<String> = entries?
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| {
            let kind = e.kind.name().chars().next().unwrap_or('?');
            format!("{}:{kind}", String::from_utf8_lossy(&e.name))
        })
        .collect();
    names.sort();
    Ok(names.join(" "))
}

/// Prints every entry under `path`, depth first in name order: a directory's listing, a
/// file's size and hash (read whole), a symlink's target.
pub fn dump(t: &mut Transcript, dir: Fd, path: &str) {
    let listing = list(dir, path);
    t.show(&format!("dump {path}/"), listing.clone());
    let Ok(listing) = listing else { return };
    for entry in listing.split(' ').filter(|e| !e.is_empty()) {
        let (name, kind) = entry.rsplit_once(':').unwrap();
        let child = format!("{path}/{name}");
        match kind {
            "D" => dump(t, dir, &child),
            "S" => t.show(&format!("dump {child}"), readlink(dir, &child)),
            _ => t.show(&format!("dump {child}"), read_whole(dir, &child)),
        }
    }
}

fn readlink(dir: Fd, path: &str) -> R<String> {
    let mut buf = vec![0u8; 256];
    let n = unsafe { wasi::path_readlink(dir, path, buf.as_mut_ptr(), buf.len()) }?;
    Ok(format!("-> {}", String::from_utf8_lossy(&buf[..n])))
}

fn read_whole(dir: Fd, path: &str) -> R<String> {
    let fd = unsafe { wasi::path_open(dir, 0, path, 0, RO, RO, 0) }?;
    let mut data = Vec::new();
    let result = loop {
        let mut buf = vec![0u8; MAX_READ as usize];
        let iov = [wasi::Iovec {
            buf: buf.as_mut_ptr(),
            buf_len: buf.len(),
        }];
        match unsafe { wasi::fd_read(fd, &iov) } {
            Ok(0) => break Ok(describe(&data)),
            Ok(n) => data.extend_from_slice(&buf[..n]),
            Err(e) => break Err(e),
        }
    };
    unsafe { wasi::fd_close(fd) }?;
    result
}

fn unit(r: R<()>) -> R<String> {
    r.map(|()| String::new())
}

/// One seed's sequence of `ops` calls in the fresh subdirectory `s<seed>`.
pub fn run(t: &mut Transcript, root: Fd, seed: u64, ops: u64) {
    let base = format!("s{seed}");
    t.line(format!("seed {seed}"));
    t.show(
        &format!("mkdir {base}"),
        unit(unsafe { wasi::path_create_directory(root, &base) }),
    );
    let dir =
        match unsafe { wasi::path_open(root, FOLLOW, &base, wasi::OFLAGS_DIRECTORY, RO, RO, 0) } {
            Ok(fd) => fd,
            Err(e) => {
                t.line(format!("open {base} -> {}", errno_name(e)));
                return;
            }
        };
    for path in ["d", "e", "d/d"] {
        t.show(
            &format!("mkdir {path}"),
            unit(unsafe { wasi::path_create_directory(dir, path) }),
        );
    }
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut slots: [Option<Fd>; SLOTS] = [None; SLOTS];
    for i in 0..ops {
        // Mostly a slot that holds a descriptor, so that few calls find theirs empty.
        let mut slot = rng.below(SLOTS as u64) as usize;
        if rng.below(5) != 0 {
            let open: Vec<usize> = (0..SLOTS).filter(|&s| slots[s].is_some()).collect();
            if !open.is_empty() {
                slot = open[rng.below(open.len() as u64) as usize];
            }
        }
        let fd = slots[slot];
        let label = |what: String| format!("{i} {what}");
        match rng.below(27) {
            0..=2 => {
                let path = rng.pick(PATHS);
                let mut oflags = 0;
                let mut fdflags = 0;
                let mut mode = String::new();
                if rng.below(4) != 0 {
                    oflags |= wasi::OFLAGS_CREAT;
                    mode += "creat ";
                }
                if rng.below(6) == 0 {
                    oflags |= wasi::OFLAGS_EXCL;
                    mode += "excl ";
                }
                if rng.below(5) == 0 {
                    oflags |= wasi::OFLAGS_TRUNC;
                    mode += "trunc ";
                }
                if rng.below(4) == 0 {
                    fdflags |= wasi::FDFLAGS_APPEND;
                    mode += "append ";
                }
                let rights = if rng.below(5) == 0 && oflags & wasi::OFLAGS_TRUNC == 0 {
                    mode += "ro";
                    RO
                } else {
                    mode += "rw";
                    ALL
                };
                if let Some(old) = slots[slot].take() {
                    let _ = unsafe { wasi::fd_close(old) };
                }
                let opened =
                    unsafe { wasi::path_open(dir, FOLLOW, path, oflags, rights, rights, fdflags) };
                t.show(
                    &label(format!("open {slot} {path} {mode}")),
                    opened.map(|fd| {
                        slots[slot] = Some(fd);
                        String::new()
                    }),
                );
            }
            3 => {
                t.show(
                    &label(format!("close {slot}")),
                    match slots[slot].take() {
                        Some(fd) => unit(unsafe { wasi::fd_close(fd) }),
                        None => Ok("empty".into()),
                    },
                );
            }
            4..=7 => {
                let len = match rng.below(4) {
                    0 => rng.below(16) as usize,
                    1 => rng.below(5000) as usize,
                    _ => rng.below(70_000) as usize,
                };
                let data = bytes(len, rng.next());
                let at = match rng.below(3) {
                    0 => None,
                    1 => Some(rng.below(200_000)),
                    _ => Some(rng.below(4 << 20)),
                };
                let what = match at {
                    None => format!("write {slot} {len}"),
                    Some(at) => format!("pwrite {slot} {len} at {at}"),
                };
                t.show(
                    &label(what),
                    fd.map_or(Ok("empty".into()), |fd| pwrite(fd, &data, at)),
                );
            }
            8..=10 => {
                let len = rng.below(MAX_READ) as usize;
                let at = match rng.below(2) {
                    0 => None,
                    _ => Some(rng.below(300_000)),
                };
                let what = match at {
                    None => format!("read {slot} {len}"),
                    Some(at) => format!("pread {slot} {len} at {at}"),
                };
                t.show(
                    &label(what),
                    fd.map_or(Ok("empty".into()), |fd| pread(fd, len, at)),
                );
            }
            11 => {
                let (whence, name) = match rng.below(3) {
                    0 => (wasi::WHENCE_SET, "set"),
                    1 => (wasi::WHENCE_CUR, "cur"),
                    _ => (wasi::WHENCE_END, "end"),
                };
                let offset = rng.below(300_000) as i64 - 100_000;
                t.show(
                    &label(format!("seek {slot} {name} {offset}")),
                    fd.map_or(Ok("empty".into()), |fd| {
                        unsafe { wasi::fd_seek(fd, offset, whence) }.map(|p| p.to_string())
                    }),
                );
            }
            12 => {
                let size = match rng.below(3) {
                    0 => rng.below(5000),
                    1 => rng.below(300_000),
                    _ => rng.below(3 << 20),
                };
                t.show(
                    &label(format!("set_size {slot} {size}")),
                    fd.map_or(Ok("empty".into()), |fd| {
                        unit(unsafe { wasi::fd_filestat_set_size(fd, size) })
                    }),
                );
            }
            13 => {
                let data = rng.below(2) == 0;
                t.show(
                    &label(format!("{} {slot}", if data { "datasync" } else { "sync" })),
                    // With the descriptor's type: hosts differ on syncing a directory.
                    fd.map_or(Ok("empty".into()), |fd| {
                        let kind = unsafe { wasi::fd_filestat_get(fd) }?.filetype.name();
                        let synced = unsafe {
                            if data {
                                wasi::fd_datasync(fd)
                            } else {
                                wasi::fd_sync(fd)
                            }
                        };
                        Ok(format!(
                            "{kind} {}",
                            synced.map_or_else(errno_name, |()| "ok".into())
                        ))
                    }),
                );
            }
            14 => {
                t.show(
                    &label(format!("fstat {slot}")),
                    fd.map_or(Ok("empty".into()), |fd| {
                        unsafe { wasi::fd_filestat_get(fd) }.map(|s| stat_line(&s))
                    }),
                );
                t.show(
                    &label(format!("tell {slot}")),
                    fd.map_or(Ok("empty".into()), |fd| {
                        unsafe { wasi::fd_tell(fd) }.map(|p| p.to_string())
                    }),
                );
            }
            15 => {
                let path = rng.pick(PATHS);
                let follow = rng.below(2) == 0;
                t.show(
                    &label(format!("stat {path} follow={follow}")),
                    unsafe { wasi::path_filestat_get(dir, if follow { FOLLOW } else { 0 }, path) }
                        .map(|s| stat_line(&s)),
                );
            }
            16 | 17 => {
                let (from, to) = (rng.pick(PATHS), rng.pick(PATHS));
                t.show(
                    &label(format!("rename {from} {to}")),
                    unit(unsafe { wasi::path_rename(dir, from, dir, to) }),
                );
            }
            18 => {
                let path = rng.pick(PATHS);
                t.show(
                    &label(format!("unlink {path}")),
                    unit(unsafe { wasi::path_unlink_file(dir, path) }),
                );
            }
            19 => {
                let (from, to) = (rng.pick(PATHS), rng.pick(PATHS));
                t.show(
                    &label(format!("link {from} {to}")),
                    unit(unsafe { wasi::path_link(dir, 0, from, dir, to) }),
                );
            }
            20 => {
                let path = rng.pick(PATHS);
                t.show(
                    &label(format!("mkdir {path}")),
                    unit(unsafe { wasi::path_create_directory(dir, path) }),
                );
            }
            21 => {
                let path = rng.pick(PATHS);
                t.show(
                    &label(format!("rmdir {path}")),
                    unit(unsafe { wasi::path_remove_directory(dir, path) }),
                );
            }
            22 => {
                let (target, path) = (rng.pick(TARGETS), rng.pick(PATHS));
                t.show(
                    &label(format!("symlink {target} {path}")),
                    unit(unsafe { wasi::path_symlink(target, dir, path) }),
                );
            }
            23 => {
                let append = rng.below(2) == 0;
                t.show(
                    &label(format!("set_flags {slot} append={append}")),
                    fd.map_or(Ok("empty".into()), |fd| {
                        let flags = if append { wasi::FDFLAGS_APPEND } else { 0 };
                        unit(unsafe { wasi::fd_fdstat_set_flags(fd, flags) })
                    }),
                );
            }
            25 => {
                // Another slot's descriptor number takes this one's place.
                let to = rng.below(SLOTS as u64) as usize;
                t.show(
                    &label(format!("renumber {slot} {to}")),
                    match (slots[slot], slots[to]) {
                        (Some(from_fd), Some(to_fd)) => {
                            unit(unsafe { wasi::fd_renumber(from_fd, to_fd) }).inspect(|_| {
                                if slot != to {
                                    slots[slot] = None;
                                }
                            })
                        }
                        _ => Ok("empty".into()),
                    },
                );
            }
            24 => {
                // A listing through the slot's descriptor (a directory opened read-only).
                t.show(
                    &label(format!("readdir {slot}")),
                    fd.map_or(Ok("empty".into()), |fd| {
                        let mut names: Vec<String> = readdir(fd, 128, 0)?
                            .into_iter()
                            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                            .filter(|n| n != "." && n != "..")
                            .collect();
                        names.sort();
                        Ok(names.join(" "))
                    }),
                );
            }
            _ => {
                let path = *[".", "d", "e", "d/d"].get(rng.below(4) as usize).unwrap();
                t.show(&label(format!("ls {path}")), list(dir, path));
            }
        }
    }
    for fd in slots.into_iter().flatten() {
        let _ = unsafe { wasi::fd_close(fd) };
    }
    t.show("close dir", unit(unsafe { wasi::fd_close(dir) }));
    dump(t, root, &base);
}
