//! Every `wasi_snapshot_preview1` function, registered with `Linker::func_wrap`.
//!
//! Each wrapper takes the call's view of memory and context ([`super::view`]), runs the
//! call as a function returning `Result<_, Errno>`, and hands the guest the number. The
//! write path of a store file (`fd_write`) allocates nothing and boxes nothing: one table
//! lookup under a short lock, the iovecs read in place, one store call per buffer (an
//! append of several buffers gathers them into the thread's scratch buffer for one).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use wasmtime::{Caller, Linker};

use super::abi::{
    self, clock, fdflags, filetype, fstflags, oflags, rights, whence, Errno, Filestat,
};
use super::dirlist;
use super::mem::{GuestMem, GATHER_MAX};
use super::table::{Desc, Kind};
use super::Outlet;
use super::{view, Ending, Exit, GuestState, TimeSpec, WasiCtx};

const MODULE: &str = "wasi_snapshot_preview1";

type R<T> = Result<T, Errno>;

/// The errno a call's result stands for.
#[inline]
fn ret(r: R<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => e.0 as i32,
    }
}

/// The call's view, or the trap of a guest that is ending.
#[inline]
fn enter<'a>(
    caller: &'a mut Caller<'_, GuestState>,
) -> wasmtime::Result<(GuestMem, &'a WasiCtx, &'a mut Vec<u8>)> {
    let v = view(caller);
    if v.1.is_ending() {
        return Err(wasmtime::Error::new(Ending));
    }
    Ok(v)
}

/// Registers the whole preview1 interface.
pub fn add_to_linker(linker: &mut Linker<GuestState>) -> anyhow::Result<()> {
    macro_rules! wrap {
        ($name:literal, |$m:ident, $w:ident, $s:ident $(, $a:ident : $t:ty)*| $body:expr) => {
            linker.func_wrap(
                MODULE,
                $name,
                #[allow(unused_variables)]
                |mut caller: Caller<'_, GuestState>, $($a: $t),*| -> wasmtime::Result<i32> {
                    let ($m, $w, $s) = enter(&mut caller)?;
                    Ok(ret($body))
                },
            ).map_err(|e| anyhow::anyhow!("linking {}: {e}", $name))?;
        };
    }

    wrap!("args_get", |m, w, s, argv: i32, buf: i32| strings_get(
        &m,
        &w.args,
        argv as u32,
        buf as u32
    ));
    wrap!("args_sizes_get", |m, w, s, count: i32, size: i32| {
        strings_sizes(&m, &w.args, count as u32, size as u32)
    });
    wrap!("environ_get", |m, w, s, envp: i32, buf: i32| strings_get(
        &m,
        &w.env,
        envp as u32,
        buf as u32
    ));
    wrap!("environ_sizes_get", |m, w, s, count: i32, size: i32| {
        strings_sizes(&m, &w.env, count as u32, size as u32)
    });
    wrap!("clock_res_get", |m, w, s, id: i32, out: i32| clock_res(
        id as u32
    )
    .and_then(|r| m.put_u64(out as u32, r)));
    wrap!("clock_time_get", |m,
                             w,
                             s,
                             id: i32,
                             _precision: i64,
                             out: i32| {
        clock_now(id as u32).and_then(|t| m.put_u64(out as u32, t))
    });
    wrap!("fd_advise", |m,
                        w,
                        s,
                        fd: i32,
                        offset: i64,
                        len: i64,
                        advice: i32| fd_advise(
        w,
        fd as u32,
        offset as u64,
        len as u64,
        advice as u8
    ));
    wrap!("fd_allocate", |m, w, s, fd: i32, offset: i64, len: i64| {
        fd_allocate(w, fd as u32, offset, len)
    });
    wrap!("fd_close", |m, w, s, fd: i32| fd_close(w, fd as u32));
    wrap!("fd_datasync", |m, w, s, fd: i32| fd_sync(
        w, fd as u32, true
    ));
    wrap!("fd_sync", |m, w, s, fd: i32| fd_sync(w, fd as u32, false));
    wrap!("fd_fdstat_get", |m, w, s, fd: i32, out: i32| fd_fdstat_get(
        &m, w, fd as u32, out as u32
    ));
    wrap!("fd_fdstat_set_flags", |m, w, s, fd: i32, flags: i32| {
        fd_fdstat_set_flags(w, fd as u32, flags as u16)
    });
    wrap!(
        "fd_fdstat_set_rights",
        |m, w, s, fd: i32, _base: i64, _inh: i64| w.get(fd as u32).map(|_| ())
    );
    wrap!("fd_filestat_get", |m, w, s, fd: i32, out: i32| fd_filestat(
        w, fd as u32
    )
    .and_then(|st| put_filestat(&m, out as u32, &st)));
    wrap!("fd_filestat_set_size", |m, w, s, fd: i32, size: i64| {
        fd_set_size(w, fd as u32, size as u64)
    });
    wrap!(
        "fd_filestat_set_times",
        |m, w, s, fd: i32, atim: i64, mtim: i64, fst: i32| fd_set_times(
            w,
            fd as u32,
            atim as u64,
            mtim as u64,
            fst as u16
        )
    );
    wrap!("fd_pread", |m,
                       w,
                       s,
                       fd: i32,
                       iovs: i32,
                       n: i32,
                       offset: i64,
                       out: i32| {
        file_offset(offset)
            .and_then(|at| fd_read(&m, w, s, fd as u32, iovs as u32, n as u32, Some(at)))
            .and_then(|r| m.put_u32(out as u32, r))
    });
    wrap!("fd_prestat_get", |m, w, s, fd: i32, out: i32| {
        fd_prestat_get(&m, w, fd as u32, out as u32)
    });
    wrap!(
        "fd_prestat_dir_name",
        |m, w, s, fd: i32, buf: i32, len: i32| fd_prestat_dir_name(
            &m, w, fd as u32, buf as u32, len as u32
        )
    );
    wrap!("fd_pwrite", |m,
                        w,
                        s,
                        fd: i32,
                        iovs: i32,
                        n: i32,
                        offset: i64,
                        out: i32| {
        file_offset(offset)
            .and_then(|at| fd_write(&m, w, s, fd as u32, iovs as u32, n as u32, Some(at)))
            .and_then(|r| m.put_u32(out as u32, r))
    });
    wrap!("fd_read", |m,
                      w,
                      s,
                      fd: i32,
                      iovs: i32,
                      n: i32,
                      out: i32| fd_read(
        &m,
        w,
        s,
        fd as u32,
        iovs as u32,
        n as u32,
        None
    )
    .and_then(|r| m.put_u32(out as u32, r)));
    wrap!("fd_readdir", |m,
                         w,
                         s,
                         fd: i32,
                         buf: i32,
                         len: i32,
                         cookie: i64,
                         out: i32| fd_readdir(
        &m,
        w,
        fd as u32,
        buf as u32,
        len as u32,
        cookie as u64
    )
    .and_then(|r| m.put_u32(out as u32, r)));
    wrap!("fd_renumber", |m, w, s, from: i32, to: i32| fd_renumber(
        w,
        from as u32,
        to as u32
    ));
    wrap!("fd_seek", |m,
                      w,
                      s,
                      fd: i32,
                      offset: i64,
                      wh: i32,
                      out: i32| fd_seek(
        w, fd as u32, offset, wh as u8
    )
    .and_then(|p| m.put_u64(out as u32, p)));
    wrap!("fd_tell", |m, w, s, fd: i32, out: i32| fd_seek(
        w,
        fd as u32,
        0,
        whence::CUR
    )
    .and_then(|p| m.put_u64(out as u32, p)));
    wrap!("fd_write", |m,
                       w,
                       s,
                       fd: i32,
                       iovs: i32,
                       n: i32,
                       out: i32| fd_write(
        &m,
        w,
        s,
        fd as u32,
        iovs as u32,
        n as u32,
        None
    )
    .and_then(|r| m.put_u32(out as u32, r)));
    wrap!(
        "path_create_directory",
        |m, w, s, fd: i32, p: i32, pl: i32| path_op(
            &m,
            w,
            fd as u32,
            p as u32,
            pl as u32,
            PathOp::Mkdir
        )
    );
    wrap!(
        "path_filestat_get",
        |m, w, s, fd: i32, flags: i32, p: i32, pl: i32, out: i32| path_stat(
            &m,
            w,
            fd as u32,
            flags as u32,
            p as u32,
            pl as u32
        )
        .and_then(|st| put_filestat(&m, out as u32, &st))
    );
    wrap!(
        "path_filestat_set_times",
        |m, w, s, fd: i32, flags: i32, p: i32, pl: i32, atim: i64, mtim: i64, fst: i32| {
            path_set_times(
                &m,
                w,
                fd as u32,
                flags as u32,
                p as u32,
                pl as u32,
                atim as u64,
                mtim as u64,
                fst as u16,
            )
        }
    );
    wrap!("path_link", |m,
                        w,
                        s,
                        fd: i32,
                        flags: i32,
                        p: i32,
                        pl: i32,
                        fd2: i32,
                        p2: i32,
                        pl2: i32| {
        let op = match flags as u32 & abi::SYMLINK_FOLLOW != 0 {
            true => TwoPath::LinkFollow,
            false => TwoPath::Link,
        };
        two_path_op(
            &m, w, fd as u32, p as u32, pl as u32, fd2 as u32, p2 as u32, pl2 as u32, op,
        )
    });
    wrap!("path_open", |m,
                        w,
                        s,
                        fd: i32,
                        dirflags: i32,
                        p: i32,
                        pl: i32,
                        of: i32,
                        base: i64,
                        _inh: i64,
                        fdf: i32,
                        out: i32| path_open(
        &m,
        w,
        fd as u32,
        dirflags as u32,
        p as u32,
        pl as u32,
        of as u16,
        base as u64,
        fdf as u16
    )
    .and_then(|fd| m.put_u32(out as u32, fd)));
    wrap!("path_readlink", |m,
                            w,
                            s,
                            fd: i32,
                            p: i32,
                            pl: i32,
                            buf: i32,
                            len: i32,
                            out: i32| {
        path_readlink(
            &m, w, fd as u32, p as u32, pl as u32, buf as u32, len as u32,
        )
        .and_then(|n| m.put_u32(out as u32, n))
    });
    wrap!(
        "path_remove_directory",
        |m, w, s, fd: i32, p: i32, pl: i32| path_op(
            &m,
            w,
            fd as u32,
            p as u32,
            pl as u32,
            PathOp::Rmdir
        )
    );
    wrap!("path_rename", |m,
                          w,
                          s,
                          fd: i32,
                          p: i32,
                          pl: i32,
                          fd2: i32,
                          p2: i32,
                          pl2: i32| {
        two_path_op(
            &m,
            w,
            fd as u32,
            p as u32,
            pl as u32,
            fd2 as u32,
            p2 as u32,
            pl2 as u32,
            TwoPath::Rename,
        )
    });
    wrap!("path_symlink", |m,
                           w,
                           s,
                           old: i32,
                           oldl: i32,
                           fd: i32,
                           p: i32,
                           pl: i32| {
        path_symlink(
            &m,
            w,
            old as u32,
            oldl as u32,
            fd as u32,
            p as u32,
            pl as u32,
        )
    });
    wrap!("path_unlink_file", |m, w, s, fd: i32, p: i32, pl: i32| {
        path_op(&m, w, fd as u32, p as u32, pl as u32, PathOp::Unlink)
    });
    wrap!("poll_oneoff", |m,
                          w,
                          s,
                          subs: i32,
                          events: i32,
                          n: i32,
                          out: i32| {
        super::poll::poll_oneoff(&m, w, subs as u32, events as u32, n as u32)
            .and_then(|k| m.put_u32(out as u32, k))
    });
    wrap!("proc_raise", |m, w, s, _sig: i32| Err(Errno::NOTSUP));
    wrap!("random_get", |m, w, s, buf: i32, len: i32| random_get(
        &m, s, buf as u32, len as u32
    ));
    wrap!("sched_yield", |m, w, s| {
        std::thread::yield_now();
        Ok(())
    });
    wrap!("sock_accept", |m, w, s, fd: i32, flags: i32, out: i32| {
        sock_accept(w, fd as u32, flags as u16).and_then(|fd| m.put_u32(out as u32, fd))
    });
    wrap!("sock_recv", |m,
                        w,
                        s,
                        fd: i32,
                        iovs: i32,
                        n: i32,
                        flags: i32,
                        out: i32,
                        oflags_out: i32| {
        sock_recv(&m, w, s, fd as u32, iovs as u32, n as u32, flags as u16).and_then(|k| {
            m.put_u32(out as u32, k)?;
            m.put_u16(oflags_out as u32, 0)
        })
    });
    wrap!("sock_send", |m,
                        w,
                        s,
                        fd: i32,
                        iovs: i32,
                        n: i32,
                        _flags: i32,
                        out: i32| sock_send(
        &m,
        w,
        s,
        fd as u32,
        iovs as u32,
        n as u32
    )
    .and_then(|k| m.put_u32(out as u32, k)));
    wrap!("sock_shutdown", |m, w, s, fd: i32, how: i32| sock_shutdown(
        w, fd as u32, how as u8
    ));

    linker
        .func_wrap(
            MODULE,
            "proc_exit",
            |_caller: Caller<'_, GuestState>, code: i32| -> wasmtime::Result<()> {
                Err(wasmtime::Error::new(Exit(code)))
            },
        )
        .map_err(|e| anyhow::anyhow!("linking proc_exit: {e}"))?;
    Ok(())
}

fn strings_sizes(m: &GuestMem, list: &[String], count: u32, size: u32) -> R<()> {
    m.put_u32(count, list.len() as u32)?;
    m.put_u32(size, list.iter().map(|s| s.len() as u32 + 1).sum())
}

fn strings_get(m: &GuestMem, list: &[String], ptrs: u32, buf: u32) -> R<()> {
    let mut at = buf;
    for (i, s) in list.iter().enumerate() {
        m.put_u32(ptrs + 4 * i as u32, at)?;
        m.write_bytes(at, s.as_bytes())?;
        m.put_u8(at + s.len() as u32, 0)?;
        at += s.len() as u32 + 1;
    }
    Ok(())
}

fn os_clock(id: u32) -> R<libc::clockid_t> {
    Ok(match id {
        clock::REALTIME => libc::CLOCK_REALTIME,
        clock::MONOTONIC => libc::CLOCK_MONOTONIC,
        clock::PROCESS_CPUTIME => libc::CLOCK_PROCESS_CPUTIME_ID,
        clock::THREAD_CPUTIME => libc::CLOCK_THREAD_CPUTIME_ID,
        _ => return Err(Errno::INVAL),
    })
}

fn clock_res(id: u32) -> R<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out pointer.
    if unsafe { libc::clock_getres(os_clock(id)?, &mut ts) } != 0 {
        return Err(Errno::INVAL);
    }
    Ok((ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64).max(1))
}

/// The clock `id` now, in nanoseconds (the monotonic clock is the host's own).
pub(super) fn clock_now(id: u32) -> R<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out pointer.
    if unsafe { libc::clock_gettime(os_clock(id)?, &mut ts) } != 0 {
        return Err(Errno::INVAL);
    }
    Ok((ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64)
}

fn fd_advise(w: &WasiCtx, fd: u32, offset: u64, len: u64, advice: u8) -> R<()> {
    let d = w.get(fd)?;
    if advice > abi::ADVICE_MAX {
        return Err(Errno::INVAL);
    }
    match &d.kind {
        Kind::StoreFile(f) if advice == abi::ADVICE_WILLNEED => {
            if d.read {
                f.handle.prefetch(offset, len)?;
            }
            Ok(())
        }
        Kind::StoreFile(_) | Kind::HostFile(_) => Ok(()),
        _ => Err(Errno::BADF),
    }
}

/// `fd_allocate` grows the file as `posix_fallocate` does (stock wasmtime dropped it).
fn fd_allocate(w: &WasiCtx, fd: u32, offset: i64, len: i64) -> R<()> {
    let d = w.get(fd)?;
    let size = match &d.kind {
        Kind::StoreFile(f) => f.size()?,
        Kind::HostFile(f) => f.file.metadata()?.len(),
        _ => return Err(Errno::BADF),
    };
    let (Ok(offset), Ok(len)) = (u64::try_from(offset), u64::try_from(len)) else {
        return Err(Errno::INVAL);
    };
    if len == 0 {
        return Err(Errno::INVAL);
    }
    // As posix_fallocate: a descriptor not open for writing is EBADF even where the file
    // is already as large.
    if !d.write {
        return Err(Errno::BADF);
    }
    let end = offset.checked_add(len).ok_or(Errno::FBIG)?;
    if end <= size {
        return Ok(());
    }
    // Growing only, decided with the file's other writes held off (the size read above
    // may be stale): an append that landed meanwhile is never cut.
    match &d.kind {
        Kind::StoreFile(f) => {
            let _in_flight = w.charge(end - size)?;
            Ok(f.handle.allocate(end)?)
        }
        Kind::HostFile(f) => f.allocate(offset, len),
        _ => Err(Errno::BADF),
    }
}

/// Closes a descriptor taken out of the table. A store file is closed here when this was
/// its last user, so an error of its final flush reaches the guest (EIO) instead of being
/// dropped. A file another thread is still in a call on closes when that call ends; this
/// close makes what was written before it durable all the same, and reports how that went.
/// A host file's close(2) is reported the same way (NFS and FUSE report writes that failed
/// after they returned there); one still in another thread's call is flushed through a
/// duplicate's close.
pub(super) fn close_desc(d: Arc<Desc>) -> R<()> {
    match Arc::try_unwrap(d) {
        Ok(Desc {
            kind: Kind::StoreFile(f),
            ..
        }) => Ok(f.handle.close()?),
        Ok(Desc {
            kind: Kind::HostFile(f),
            ..
        }) => f.close(),
        Ok(_) => Ok(()),
        Err(shared) => match &shared.kind {
            Kind::StoreFile(f) => Ok(f.handle.sync_all()?),
            Kind::HostFile(f) => f.flush_by_close(),
            _ => Ok(()),
        },
    }
}

fn fd_close(w: &WasiCtx, fd: u32) -> R<()> {
    let d = w.table().remove(fd)?;
    close_desc(d)
}

fn fd_sync(w: &WasiCtx, fd: u32, data_only: bool) -> R<()> {
    let d = w.get(fd)?;
    match &d.kind {
        Kind::StoreFile(f) if data_only => Ok(f.handle.sync_data()?),
        Kind::StoreFile(f) => Ok(f.handle.sync_all()?),
        Kind::StoreDir(dir) => dir.sync(),
        Kind::HostFile(f) if data_only => Ok(f.file.sync_data()?),
        Kind::HostFile(f) => Ok(f.file.sync_all()?),
        Kind::HostDir(dir) => dir.sync(),
        _ => Err(Errno::BADF),
    }
}

fn isatty(fd: i32) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

fn stdio_type(fd: i32) -> u8 {
    if isatty(fd) {
        filetype::CHARACTER_DEVICE
    } else {
        filetype::UNKNOWN
    }
}

fn fd_fdstat_get(m: &GuestMem, w: &WasiCtx, fd: u32, out: u32) -> R<()> {
    let d = w.get(fd)?;
    let dir_rights = rights::ALL & !(1 << 2) & !(1 << 22) & !(1 << 19);
    let (ty, base, inh) = match &d.kind {
        Kind::Stdin => (stdio_type(w.stdio_fd(0)), rights::FD_READ, rights::FD_READ),
        Kind::Stdout => (
            stdio_type(w.stdio_fd(1)),
            rights::FD_WRITE,
            rights::FD_WRITE,
        ),
        Kind::Stderr => (
            stdio_type(w.stdio_fd(2)),
            rights::FD_WRITE,
            rights::FD_WRITE,
        ),
        Kind::StoreDir(_) | Kind::HostDir(_) => (filetype::DIRECTORY, dir_rights, rights::ALL),
        Kind::StoreFile(_) | Kind::HostFile(_) => {
            let mut r = rights::ALL;
            if !d.read {
                r &= !rights::FD_READ & !(1 << 14);
            }
            if !d.write {
                r &= !rights::FD_WRITE;
            }
            // A host file may be a device (`/dev/null` under a `--dir /dev`): its real
            // type, as fd_filestat_get and path_filestat_get say.
            let ty = match &d.kind {
                Kind::HostFile(f) => f.filetype()?,
                _ => filetype::REGULAR_FILE,
            };
            (ty, r, r)
        }
        Kind::Listener(_) | Kind::Stream(_) => (filetype::SOCKET_STREAM, rights::ALL, rights::ALL),
    };
    m.put_u8(out, ty)?;
    m.put_u8(out + 1, 0)?;
    m.put_u16(out + 2, d.flags())?;
    m.put_u32(out + 4, 0)?;
    m.put_u64(out + 8, base)?;
    m.put_u64(out + 16, inh)
}

fn fd_fdstat_set_flags(w: &WasiCtx, fd: u32, flags: u16) -> R<()> {
    let d = w.get(fd)?;
    if flags & !fdflags::ALL != 0 {
        return Err(Errno::INVAL);
    }
    match &d.kind {
        Kind::StoreFile(f) => f.handle.set_append(flags & fdflags::APPEND != 0)?,
        Kind::HostFile(f) => f.set_append(flags & fdflags::APPEND != 0)?,
        Kind::Stream(s) => s.set_nonblocking(flags & fdflags::NONBLOCK != 0)?,
        Kind::Listener(l) => l.set_nonblocking(flags & fdflags::NONBLOCK != 0)?,
        _ => return Err(Errno::BADF),
    }
    // As Linux's F_SETFL, which changes the append and non-blocking flags only: a
    // descriptor opened O_DSYNC or O_SYNC stays so (storing the new flags whole used to
    // turn sync-on-write off without a word).
    let kept = fdflags::DSYNC | fdflags::RSYNC | fdflags::SYNC;
    d.flags
        .store(flags & !kept | d.flags() & kept, Ordering::Relaxed);
    Ok(())
}

fn stdio_stat(fd: i32) -> Filestat {
    Filestat {
        filetype: stdio_type(fd),
        ..Filestat::default()
    }
}

fn fd_filestat(w: &WasiCtx, fd: u32) -> R<Filestat> {
    let d = w.get(fd)?;
    match &d.kind {
        Kind::Stdin => Ok(stdio_stat(w.stdio_fd(0))),
        Kind::Stdout => Ok(stdio_stat(w.stdio_fd(1))),
        Kind::Stderr => Ok(stdio_stat(w.stdio_fd(2))),
        Kind::StoreFile(f) => f.stat(),
        Kind::StoreDir(dir) => dir.stat(),
        Kind::HostFile(f) => f.stat(),
        Kind::HostDir(dir) => dir.stat(),
        Kind::Listener(_) | Kind::Stream(_) => Ok(Filestat {
            filetype: filetype::SOCKET_STREAM,
            ..Filestat::default()
        }),
    }
}

fn put_filestat(m: &GuestMem, out: u32, st: &Filestat) -> R<()> {
    m.put_u64(out, st.dev)?;
    m.put_u64(out + 8, st.ino)?;
    m.put_u64(out + 16, st.filetype as u64)?;
    m.put_u64(out + 24, st.nlink)?;
    m.put_u64(out + 32, st.size)?;
    m.put_u64(out + 40, st.atim)?;
    m.put_u64(out + 48, st.mtim)?;
    m.put_u64(out + 56, st.ctim)
}

fn set_size(d: &Desc, size: u64) -> R<()> {
    if !d.write {
        return Err(Errno::BADF);
    }
    match &d.kind {
        Kind::StoreFile(f) => Ok(f.handle.set_len(size)?),
        Kind::HostFile(f) => Ok(f.file.set_len(size)?),
        _ => Err(Errno::BADF),
    }
}

fn fd_set_size(w: &WasiCtx, fd: u32, size: u64) -> R<()> {
    let d = w.get(fd)?;
    if size > i64::MAX as u64 {
        return Err(Errno::INVAL);
    }
    let _in_flight = match (&d.kind, w.has_space_limit()) {
        (Kind::StoreFile(f), true) => Some(w.charge(size.saturating_sub(f.size()?))?),
        _ => None,
    };
    match set_size(&d, size) {
        // POSIX: EINVAL when the descriptor is not open for writing.
        Err(Errno::BADF) if matches!(d.kind, Kind::StoreFile(_) | Kind::HostFile(_)) => {
            Err(Errno::INVAL)
        }
        r => r,
    }
}

/// The two times of a `*_set_times` call.
fn times(atim: u64, mtim: u64, fst: u16) -> R<(Option<TimeSpec>, Option<TimeSpec>)> {
    if fst & !15 != 0
        || (fst & fstflags::ATIM != 0 && fst & fstflags::ATIM_NOW != 0)
        || (fst & fstflags::MTIM != 0 && fst & fstflags::MTIM_NOW != 0)
    {
        return Err(Errno::INVAL);
    }
    let one = |set: u16, now: u16, t: u64| {
        if fst & now != 0 {
            Some(TimeSpec::Now)
        } else if fst & set != 0 {
            Some(TimeSpec::At(t))
        } else {
            None
        }
    };
    Ok((
        one(fstflags::ATIM, fstflags::ATIM_NOW, atim),
        one(fstflags::MTIM, fstflags::MTIM_NOW, mtim),
    ))
}

fn fd_set_times(w: &WasiCtx, fd: u32, atim: u64, mtim: u64, fst: u16) -> R<()> {
    let d = w.get(fd)?;
    let (a, m) = times(atim, mtim, fst)?;
    match &d.kind {
        Kind::StoreFile(f) => f.set_times(a, m),
        Kind::StoreDir(dir) => dir.set_times(a, m),
        Kind::HostFile(f) => f.set_times(a, m),
        Kind::HostDir(dir) => dir.set_times(a, m),
        _ => Err(Errno::BADF),
    }
}

fn fd_prestat_get(m: &GuestMem, w: &WasiCtx, fd: u32, out: u32) -> R<()> {
    let d = w.get(fd)?;
    let path = d.preopen.as_ref().ok_or(Errno::BADF)?;
    m.put_u32(out, abi::PREOPEN_DIR as u32)?;
    m.put_u32(out + 4, path.len() as u32)
}

fn fd_prestat_dir_name(m: &GuestMem, w: &WasiCtx, fd: u32, buf: u32, len: u32) -> R<()> {
    let d = w.get(fd)?;
    let path = d.preopen.as_ref().ok_or(Errno::BADF)?;
    if (len as usize) < path.len() {
        return Err(Errno::NAMETOOLONG);
    }
    m.write_bytes(buf, path.as_bytes())
}

/// The offset of an `fd_pread` or `fd_pwrite`: a negative one (as `off_t`) is EINVAL,
/// before anything else is looked at, as Linux's `pread` and `pwrite` answer.
fn file_offset(offset: i64) -> R<u64> {
    u64::try_from(offset).map_err(|_| Errno::INVAL)
}

/// `fd_read` (`offset` None, at and moving the position) and `fd_pread`. Every buffer is
/// filled from the file while data lasts: no cap per call.
fn fd_read(
    m: &GuestMem,
    w: &WasiCtx,
    scratch: &mut Vec<u8>,
    fd: u32,
    iovs: u32,
    n: u32,
    offset: Option<u64>,
) -> R<u32> {
    let d = w.get(fd)?;
    let mut total = 0u32;
    match &d.kind {
        Kind::StoreFile(_) | Kind::HostFile(_) => {
            if !d.read {
                return Err(Errno::BADF);
            }
            m.check_iovecs(iovs, n)?;
            let (mut held, mut at) = d.start_at(offset);
            for i in 0..n {
                let (buf, whole) = m.iovec(iovs, i)?;
                let len = m.room(total, whole);
                let got = m.fill(buf, len, scratch, |b: &mut [u8]| -> R<usize> {
                    match &d.kind {
                        Kind::StoreFile(f) => Ok(f.handle.read_at(b, at)?),
                        Kind::HostFile(f) => read_full_at(&f.file, b, at),
                        _ => unreachable!(),
                    }
                });
                let got = match got {
                    Ok(g) => g,
                    Err(e) if total == 0 => return Err(e),
                    Err(_) => break,
                };
                total += got as u32;
                at += got as u64;
                if got < whole as usize {
                    break;
                }
            }
            if let Some(pos) = held.as_deref_mut() {
                *pos = at;
            }
        }
        Kind::Stdin | Kind::Stream(_) => {
            if offset.is_some() {
                return Err(Errno::SPIPE);
            }
            let host_fd = match &d.kind {
                Kind::Stream(s) => s.as_raw_fd(),
                _ => w.stdio_fd(0),
            };
            m.check_iovecs(iovs, n)?;
            wait_unless_nonblocking(w, &d, host_fd)?;
            // One read into the first non-empty buffer, as a pipe or socket gives.
            for i in 0..n {
                let (buf, whole) = m.iovec(iovs, i)?;
                if whole == 0 {
                    continue;
                }
                let len = m.room(0, whole);
                total = m.fill(buf, len, scratch, |b: &mut [u8]| -> R<usize> {
                    match &d.kind {
                        Kind::Stdin => Ok(w.stdin_read(b)?),
                        Kind::Stream(s) => Ok((&*s).read(b)?),
                        _ => unreachable!(),
                    }
                })? as u32;
                break;
            }
        }
        _ => return Err(Errno::BADF),
    }
    Ok(total)
}

/// Fills `buf` from the blocking socket `fd` (as MSG_WAITALL does) unless the peer shuts
/// down first; returns what arrived.
fn recv_all(w: &WasiCtx, fd: i32, buf: &mut [u8]) -> R<usize> {
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        // SAFETY: `rest` is a valid writable buffer of its length for the call.
        let r = unsafe { libc::recv(fd, rest.as_mut_ptr().cast(), rest.len(), libc::MSG_DONTWAIT) };
        match r {
            0 => break,
            r if r > 0 => got += r as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) => w.wait_for(fd, libc::POLLIN)?,
                    _ if got > 0 => break,
                    _ => return Err(e.into()),
                }
            }
        }
    }
    Ok(got)
}

/// Writes all of `data` to a socket. On a blocking one (as the guest sees it), each send
/// takes what fits without blocking, and when nothing fits it waits for room where a
/// stopped guest can be woken (see `WasiCtx::wait`), so a peer that stops reading cannot
/// hold a killed guest. A non-blocking one gives EAGAIN as before.
fn send_all(w: &WasiCtx, d: &Desc, s: &std::net::TcpStream, data: &[u8]) -> R<()> {
    if d.flags() & fdflags::NONBLOCK != 0 {
        return Ok((&*s).write_all(data)?);
    }
    w.write_waking(s.as_raw_fd(), data, Outlet::Socket)
}

/// Before a blocking read of a socket or stdin: wait for data where a stopped guest can be
/// woken (see `WasiCtx::wait`). Nothing to wait for on a descriptor the guest made
/// non-blocking: its read returns EAGAIN.
fn wait_unless_nonblocking(w: &WasiCtx, d: &Desc, host_fd: i32) -> R<()> {
    if d.flags() & fdflags::NONBLOCK != 0 {
        return Ok(());
    }
    w.wait_for(host_fd, libc::POLLIN)
}

fn read_full_at(f: &std::fs::File, buf: &mut [u8], mut at: u64) -> R<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], at) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if done == 0 => return Err(e.into()),
            Err(_) => break,
        }
    }
    Ok(done)
}

/// `fd_write` (`offset` None: at the position, or the end for an append descriptor) and
/// `fd_pwrite`. Every buffer is written, as `writev` does.
fn fd_write(
    m: &GuestMem,
    w: &WasiCtx,
    scratch: &mut Vec<u8>,
    fd: u32,
    iovs: u32,
    n: u32,
    offset: Option<u64>,
) -> R<u32> {
    let d = w.get(fd)?;
    let mut total = 0u32;
    match &d.kind {
        Kind::StoreFile(f) => {
            if !d.write {
                return Err(Errno::BADF);
            }
            m.check_iovecs(iovs, n)?;
            let append = d.flags() & fdflags::APPEND != 0;
            let (mut held, at) = d.start_at(offset);
            // An append of several buffers lands as one write, so that no other append
            // comes between them (wasi-libc's stdio writes two), as Linux's writev holds
            // the inode lock for the whole call. One of more than GATHER_MAX bytes, or
            // one the space limit refuses whole, is written a buffer at a time, as any
            // other write (the buffers that fit the limit are written).
            let gathered = append && n > 1 && m.gather(iovs, n, GATHER_MAX, scratch)?;
            let charged = match gathered {
                true => w.charge(scratch.len() as u64).ok(),
                false => None,
            };
            let end;
            (total, end) = match charged {
                // Held until the write has finished: the limit counts it meanwhile.
                Some(_in_flight) => {
                    let len = scratch.len() as u64;
                    (len as u32, f.handle.write_at(scratch, at)? + len)
                }
                None => store_write_each(m, w, scratch, &d, f, iovs, n, at)?,
            };
            // The position moves only if the call succeeds: a write whose O_DSYNC sync
            // fails is retried at the same place (Linux moves `f_pos` only when the write
            // returns a count).
            if total > 0 {
                sync_written(&d)?;
            }
            if let Some(pos) = held.as_deref_mut() {
                *pos = end;
            }
        }
        Kind::HostFile(f) => {
            if !d.write {
                return Err(Errno::BADF);
            }
            // An append descriptor writes at the end, `fd_pwrite` too (as Linux's pwrite on
            // an O_APPEND file, stock, and the store's append handles do), through the
            // kernel's append, so concurrent appenders never write over each other.
            let append = d.flags() & fdflags::APPEND != 0;
            m.check_iovecs(iovs, n)?;
            let (mut held, mut at) = d.start_at(offset);
            for i in 0..n {
                let (buf, whole) = m.iovec(iovs, i)?;
                let len = m.room(total, whole);
                let data = m.bytes(buf, len, scratch)?;
                // A write that runs out of room part way counts what it wrote, and the
                // position moves past it, as Linux's writev; only a call that wrote
                // nothing returns the error.
                let written = match append {
                    true => f.append(data).map(|(done, end)| {
                        at = end;
                        done
                    }),
                    false => f.write_at(data, at).inspect(|&done| at += done as u64),
                };
                let done = match written {
                    Ok(done) => done as u32,
                    Err(e) if total == 0 => return Err(e),
                    Err(_) => break,
                };
                total += done;
                if done < whole {
                    break;
                }
            }
            if total > 0 {
                sync_written(&d)?;
            }
            if let Some(pos) = held.as_deref_mut() {
                *pos = at;
            }
        }
        Kind::Stdout | Kind::Stderr | Kind::Stream(_) => {
            if offset.is_some() {
                return Err(Errno::SPIPE);
            }
            m.check_iovecs(iovs, n)?;
            for i in 0..n {
                let (buf, whole) = m.iovec(iovs, i)?;
                let len = m.room(total, whole);
                let data = m.bytes(buf, len, scratch)?;
                let r = match &d.kind {
                    Kind::Stdout => w.stdio_write(1, data),
                    Kind::Stderr => w.stdio_write(2, data),
                    Kind::Stream(s) => send_all(w, &d, s, data),
                    _ => unreachable!(),
                };
                match r {
                    Ok(()) => total += len,
                    Err(e) if total == 0 => return Err(e),
                    Err(_) => break,
                }
                if len < whole {
                    break;
                }
            }
        }
        _ => return Err(Errno::BADF),
    }
    Ok(total)
}

/// The buffers of a store file's write, one store write each, from `at`; returns the bytes
/// written and where the last ended. A write that runs out of room part way counts what it
/// wrote; only one that wrote nothing returns the error.
#[allow(clippy::too_many_arguments)]
fn store_write_each(
    m: &GuestMem,
    w: &WasiCtx,
    scratch: &mut Vec<u8>,
    d: &Desc,
    f: &super::store_fs::StoreFile,
    iovs: u32,
    n: u32,
    mut at: u64,
) -> R<(u32, u64)> {
    let append = d.flags() & fdflags::APPEND != 0;
    let mut total = 0u32;
    for i in 0..n {
        let (buf, whole) = m.iovec(iovs, i)?;
        let len = m.room(total, whole);
        let data = m.bytes(buf, len, scratch)?;
        // Every byte is charged at first; past the limit only what the write adds to the
        // file's size is (an overwrite in place needs no more room).
        let charged = w.charge(len as u64).or_else(|_| {
            let grows = match append {
                true => len as u64,
                false => {
                    let end = at.checked_add(len as u64).ok_or(Errno::FBIG)?;
                    end.saturating_sub(f.size()?)
                }
            };
            w.charge(grows)
        });
        // Held until the write has finished: the limit counts it meanwhile.
        let _in_flight = match charged {
            Ok(c) => c,
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        };
        match f.handle.write_at(data, at) {
            Ok(landed) => at = landed + len as u64,
            Err(e) if total == 0 => return Err(e.into()),
            Err(_) => break,
        }
        total += len;
        if len < whole {
            break;
        }
    }
    Ok((total, at))
}

/// Before a file write that wrote something returns: on an `O_SYNC` descriptor the data
/// and all the metadata durable (fsync); `O_DSYNC` / `O_RSYNC`, the data and what is needed
/// to read it back (fdatasync).
fn sync_written(d: &Desc) -> R<()> {
    match (&d.kind, write_sync(d.flags())) {
        (_, None) => {}
        (Kind::StoreFile(f), Some(WriteSync::All)) => f.handle.sync_all()?,
        (Kind::StoreFile(f), Some(WriteSync::Data)) => f.handle.sync_data()?,
        (Kind::HostFile(f), Some(WriteSync::All)) => f.file.sync_all()?,
        (Kind::HostFile(f), Some(WriteSync::Data)) => f.file.sync_data()?,
        _ => {}
    }
    Ok(())
}

/// What a write on a descriptor with `flags` makes durable before it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteSync {
    /// `O_SYNC`: `fsync`.
    All,
    /// `O_DSYNC`, `O_RSYNC`: `fdatasync`.
    Data,
}

fn write_sync(flags: u16) -> Option<WriteSync> {
    if flags & fdflags::SYNC != 0 {
        Some(WriteSync::All)
    } else if flags & (fdflags::DSYNC | fdflags::RSYNC) != 0 {
        Some(WriteSync::Data)
    } else {
        None
    }
}

fn fd_readdir(m: &GuestMem, w: &WasiCtx, fd: u32, buf: u32, len: u32, cookie: u64) -> R<u32> {
    let d = w.get(fd)?;
    let (cookies, (dot, dotdot, items)) = match &d.kind {
        Kind::StoreDir(dir) => (&dir.cookies, dir.list()?),
        Kind::HostDir(dir) => (&dir.cookies, dir.list()?),
        _ => return Err(Errno::BADF),
    };
    dirlist::pack(cookies, m, buf, len, cookie, dot, dotdot, items)
}

/// `fd_renumber`, as Linux's `dup2`: the descriptor `to` named is closed, and an error of
/// that close is not the call's (the renumber has happened). The close still makes a store
/// file's data durable; when that fails, the data stays with the file for a later sync,
/// whose error the guest then sees.
fn fd_renumber(w: &WasiCtx, from: u32, to: u32) -> R<()> {
    let old = w.table().renumber(from, to)?;
    if let Some(d) = old {
        let _ = close_desc(d);
    }
    Ok(())
}

fn fd_seek(w: &WasiCtx, fd: u32, offset: i64, wh: u8) -> R<u64> {
    let d = w.get(fd)?;
    let size = || -> R<u64> {
        match &d.kind {
            Kind::StoreFile(f) => f.size(),
            Kind::HostFile(f) => Ok(f.file.metadata()?.len()),
            _ => Err(Errno::BADF),
        }
    };
    match &d.kind {
        Kind::StoreFile(_) | Kind::HostFile(_) => {}
        Kind::StoreDir(_) | Kind::HostDir(_) => return Err(Errno::BADF),
        _ => return Err(Errno::SPIPE),
    }
    let mut pos = d.position();
    let base = match wh {
        whence::SET => 0,
        whence::CUR => *pos,
        whence::END => size()?,
        _ => return Err(Errno::INVAL),
    };
    let new = base.checked_add_signed(offset).ok_or(Errno::INVAL)?;
    if new > i64::MAX as u64 {
        return Err(Errno::INVAL);
    }
    *pos = new;
    Ok(new)
}

/// A directory descriptor's two kinds. Any other descriptor where a directory is needed is
/// EBADF, as in stock wasmtime (only `path_open` says ENOTDIR for a file).
enum DirRef<'a> {
    Store(&'a super::store_fs::StoreDir),
    Host(&'a super::host_fs::HostDir),
}

fn dir_of(d: &Desc) -> R<DirRef<'_>> {
    match &d.kind {
        Kind::StoreDir(dir) => Ok(DirRef::Store(dir)),
        Kind::HostDir(dir) => Ok(DirRef::Host(dir)),
        _ => Err(Errno::BADF),
    }
}

enum PathOp {
    Mkdir,
    Rmdir,
    Unlink,
}

fn path_op(m: &GuestMem, w: &WasiCtx, fd: u32, p: u32, pl: u32, op: PathOp) -> R<()> {
    let d = w.get(fd)?;
    let dir = dir_of(&d)?;
    let path = m.string(p, pl)?;
    match (dir, op) {
        (DirRef::Store(s), PathOp::Mkdir) => s.create_dir(&path),
        (DirRef::Store(s), PathOp::Rmdir) => s.remove_dir(&path),
        (DirRef::Store(s), PathOp::Unlink) => s.unlink(&path),
        (DirRef::Host(h), PathOp::Mkdir) => h.create_dir(&path),
        (DirRef::Host(h), PathOp::Rmdir) => h.remove_dir(&path),
        (DirRef::Host(h), PathOp::Unlink) => h.unlink(&path),
    }
}

fn path_stat(m: &GuestMem, w: &WasiCtx, fd: u32, flags: u32, p: u32, pl: u32) -> R<Filestat> {
    let d = w.get(fd)?;
    let dir = dir_of(&d)?;
    let path = m.string(p, pl)?;
    let follow = flags & abi::SYMLINK_FOLLOW != 0;
    match dir {
        DirRef::Store(s) => s.stat_path(&path, follow),
        DirRef::Host(h) => h.stat_path(&path, follow),
    }
}

#[allow(clippy::too_many_arguments)]
fn path_set_times(
    m: &GuestMem,
    w: &WasiCtx,
    fd: u32,
    flags: u32,
    p: u32,
    pl: u32,
    atim: u64,
    mtim: u64,
    fst: u16,
) -> R<()> {
    let d = w.get(fd)?;
    let dir = dir_of(&d)?;
    let path = m.string(p, pl)?;
    let (a, t) = times(atim, mtim, fst)?;
    let follow = flags & abi::SYMLINK_FOLLOW != 0;
    match dir {
        DirRef::Store(s) => s.set_times_path(&path, follow, a, t),
        DirRef::Host(h) => h.set_times_path(&path, follow, a, t),
    }
}

/// The calls with two paths.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TwoPath {
    Rename,
    Link,
    /// `path_link` with `SYMLINK_FOLLOW`: links what a final symlink of the old path names.
    LinkFollow,
}

/// `path_rename` and `path_link`: both ends in the same kind of directory (the store, or
/// host directories), else EXDEV.
#[allow(clippy::too_many_arguments)]
fn two_path_op(
    m: &GuestMem,
    w: &WasiCtx,
    fd: u32,
    p: u32,
    pl: u32,
    fd2: u32,
    p2: u32,
    pl2: u32,
    op: TwoPath,
) -> R<()> {
    let (d, d2) = (w.get(fd)?, w.get(fd2)?);
    let (from, to) = (dir_of(&d)?, dir_of(&d2)?);
    let (path, path2) = (m.string(p, pl)?, m.string(p2, pl2)?);
    let follow = op == TwoPath::LinkFollow;
    match (from, to, op) {
        (DirRef::Store(a), DirRef::Store(b), TwoPath::Rename) => {
            match a.rename(&path, b, &path2) {
                // A final `.` or `..`: POSIX says EINVAL, Linux (and so stock wasmtime)
                // EBUSY; programs are written against Linux.
                Err(Errno::INVAL) if ends_in_dot(&path) || ends_in_dot(&path2) => Err(Errno::BUSY),
                r => r,
            }
        }
        (DirRef::Store(a), DirRef::Store(b), _) => a.link(&path, follow, b, &path2),
        (DirRef::Host(a), DirRef::Host(b), TwoPath::Rename) => a.rename(&path, b, &path2),
        // cap-std has no following hard link: as stock, EINVAL.
        (DirRef::Host(_), DirRef::Host(_), TwoPath::LinkFollow) => Err(Errno::INVAL),
        (DirRef::Host(a), DirRef::Host(b), TwoPath::Link) => a.link(&path, b, &path2),
        _ => Err(Errno::XDEV),
    }
}

/// Whether a path's last component is `.` or `..`.
fn ends_in_dot(path: &str) -> bool {
    let last = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    last == "." || last == ".."
}

#[allow(clippy::too_many_arguments)]
fn path_open(
    m: &GuestMem,
    w: &WasiCtx,
    fd: u32,
    dirflags: u32,
    p: u32,
    pl: u32,
    of: u16,
    base: u64,
    fdf: u16,
) -> R<u32> {
    let d = w.get(fd)?;
    if matches!(d.kind, Kind::StoreFile(_) | Kind::HostFile(_)) {
        return Err(Errno::NOTDIR);
    }
    let dir = dir_of(&d)?;
    let path = m.string(p, pl)?;
    if fdf & !fdflags::ALL != 0 || of & !15 != 0 {
        return Err(Errno::INVAL);
    }
    // What wasmtime's preview1 opens for: creating or truncating writes; no write right
    // means read. The descriptor writes only with a write right, though: POSIX's
    // O_RDONLY | O_CREAT (a lock file's open) gives one whose writes fail with EBADF, and
    // so does O_RDONLY | O_APPEND.
    let write = base & rights::FD_WRITE != 0 || of & (oflags::CREAT | oflags::TRUNC) != 0;
    let writable = write && base & rights::WRITES != 0;
    let read = base & rights::FD_READ != 0 || !write;
    let append = fdf & fdflags::APPEND != 0;
    let follow = dirflags & abi::SYMLINK_FOLLOW != 0;
    let kind = match dir {
        DirRef::Store(s) => s.open(&path, follow, of, read, write, append)?,
        // The host file is opened for writing only if the descriptor may write: an
        // `O_RDONLY | O_CREAT` of an existing read-only (0444) file opens, as on Linux.
        DirRef::Host(h) => h.open(&path, follow, of, read, writable, append)?,
    };
    let is_dir = matches!(kind, Kind::StoreDir(_) | Kind::HostDir(_));
    let mut desc = Desc::new(kind, if is_dir { 0 } else { fdf });
    desc.read = read || is_dir;
    desc.write = writable && !is_dir;
    w.table().push(Arc::new(desc))
}

#[allow(clippy::too_many_arguments)]
fn path_readlink(
    m: &GuestMem,
    w: &WasiCtx,
    fd: u32,
    p: u32,
    pl: u32,
    buf: u32,
    len: u32,
) -> R<u32> {
    let d = w.get(fd)?;
    let dir = dir_of(&d)?;
    let path = m.string(p, pl)?;
    let target = match dir {
        DirRef::Store(s) => s.readlink(&path)?,
        DirRef::Host(h) => h.readlink(&path)?,
    };
    let n = target.len().min(len as usize);
    m.write_bytes(buf, &target.as_bytes()[..n])?;
    Ok(n as u32)
}

fn path_symlink(m: &GuestMem, w: &WasiCtx, old: u32, oldl: u32, fd: u32, p: u32, pl: u32) -> R<()> {
    let d = w.get(fd)?;
    let dir = dir_of(&d)?;
    let target = m.string(old, oldl)?;
    let path = m.string(p, pl)?;
    match dir {
        DirRef::Store(s) => s.symlink(&target, &path),
        DirRef::Host(h) => h.symlink(&target, &path),
    }
}

fn random_get(m: &GuestMem, scratch: &mut Vec<u8>, buf: u32, len: u32) -> R<()> {
    m.array(buf, len, 1)?;
    // All of it, a piece at a time through a shared memory's scratch.
    let mut done = 0;
    while done < len {
        let piece = m.room(0, len - done);
        m.fill(buf + done, piece, scratch, |b: &mut [u8]| -> R<usize> {
            getrandom::fill(b).map_err(|_| Errno::IO)?;
            Ok(b.len())
        })?;
        done += piece;
    }
    Ok(())
}

fn sock_accept(w: &WasiCtx, fd: u32, flags: u16) -> R<u32> {
    let d = w.get(fd)?;
    let Kind::Listener(l) = &d.kind else {
        return Err(Errno::NOTSOCK);
    };
    if flags & !fdflags::NONBLOCK != 0 {
        return Err(Errno::INVAL);
    }
    wait_unless_nonblocking(w, &d, l.as_raw_fd())?;
    let (s, _) = l.accept()?;
    s.set_nonblocking(flags & fdflags::NONBLOCK != 0)?;
    s.set_nodelay(true).ok();
    w.table().push(Arc::new(Desc::new(Kind::Stream(s), flags)))
}

#[allow(clippy::too_many_arguments)]
fn sock_recv(
    m: &GuestMem,
    w: &WasiCtx,
    scratch: &mut Vec<u8>,
    fd: u32,
    iovs: u32,
    n: u32,
    flags: u16,
) -> R<u32> {
    const PEEK: u16 = 1;
    const WAITALL: u16 = 2;
    let d = w.get(fd)?;
    let Kind::Stream(s) = &d.kind else {
        return Err(Errno::NOTSOCK);
    };
    if flags & !(PEEK | WAITALL) != 0 {
        return Err(Errno::INVAL);
    }
    wait_unless_nonblocking(w, &d, s.as_raw_fd())?;
    // WAITALL on a blocking socket: received piece by piece, each wait for more where a
    // stopped guest is woken (a peer that sends part and stalls cannot hold it).
    let waitall = flags & WAITALL != 0 && flags & PEEK == 0 && d.flags() & fdflags::NONBLOCK == 0;
    m.check_iovecs(iovs, n)?;
    for i in 0..n {
        let (buf, whole) = m.iovec(iovs, i)?;
        if whole == 0 {
            continue;
        }
        let len = m.room(0, whole);
        let got = m.fill(buf, len, scratch, |b: &mut [u8]| -> R<usize> {
            if waitall {
                return recv_all(w, s.as_raw_fd(), b);
            }
            let mut os_flags = 0;
            if flags & PEEK != 0 {
                os_flags |= libc::MSG_PEEK;
            }
            if flags & WAITALL != 0 {
                os_flags |= libc::MSG_WAITALL;
            }
            // SAFETY: `b` is a valid writable buffer of its length for the call.
            let r = unsafe { libc::recv(s.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), os_flags) };
            if r < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            Ok(r as usize)
        })?;
        return Ok(got as u32);
    }
    Ok(0)
}

/// `sock_send`: `fd_write` on a socket; any other descriptor is ENOTSOCK, as Linux's
/// `send` answers (it used to write to a file or stdout).
fn sock_send(
    m: &GuestMem,
    w: &WasiCtx,
    scratch: &mut Vec<u8>,
    fd: u32,
    iovs: u32,
    n: u32,
) -> R<u32> {
    if !matches!(w.get(fd)?.kind, Kind::Stream(_) | Kind::Listener(_)) {
        return Err(Errno::NOTSOCK);
    }
    fd_write(m, w, scratch, fd, iovs, n, None)
}

fn sock_shutdown(w: &WasiCtx, fd: u32, how: u8) -> R<()> {
    let d = w.get(fd)?;
    let Kind::Stream(s) = &d.kind else {
        return Err(Errno::NOTSOCK);
    };
    let how = match how {
        1 => std::net::Shutdown::Read,
        2 => std::net::Shutdown::Write,
        3 => std::net::Shutdown::Both,
        _ => return Err(Errno::INVAL),
    };
    Ok(s.shutdown(how)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wasi::store_fs::StoreFile;
    use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
    use valet_vfs::{OpenOptions, Store, StoreConfig};

    /// O_SYNC is fsync, O_DSYNC and O_RSYNC fdatasync (O_SYNC was taken for O_DSYNC).
    #[test]
    fn each_sync_flag_syncs_what_it_promises() {
        use fdflags::{APPEND, DSYNC, RSYNC, SYNC};
        assert_eq!(write_sync(0), None);
        assert_eq!(write_sync(APPEND), None);
        assert_eq!(write_sync(SYNC), Some(WriteSync::All));
        assert_eq!(write_sync(SYNC | DSYNC), Some(WriteSync::All));
        assert_eq!(write_sync(DSYNC), Some(WriteSync::Data));
        assert_eq!(write_sync(RSYNC), Some(WriteSync::Data));
    }

    /// A close while another thread is still in a call on the descriptor (it holds the
    /// descriptor, as `w.get` does) makes what was written durable: after a power failure
    /// right after the close, a fresh mount reads it back.
    #[test]
    fn a_close_during_another_threads_call_is_durable() {
        let mut geometry = Geometry::EMBEDDED_DEFAULT;
        geometry.zone_count = 16;
        geometry.zone_size = 1 << 20;
        geometry.zone_capacity = 1 << 20;
        let dev = Arc::new(MemoryDevice::new(geometry).unwrap());
        let store =
            Store::open(dev.clone() as Arc<dyn ZonedDevice>, StoreConfig::default()).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let handle = store.open_file(root, "f", OpenOptions::create()).unwrap();
        handle.write_at(b"written before the close", 0).unwrap();
        let desc = Arc::new(Desc::new(Kind::StoreFile(StoreFile { handle }), 0));
        let in_call = desc.clone();
        close_desc(desc).unwrap();
        dev.power_fail();
        // The old store and the other thread's descriptor are abandoned, as at a crash.
        std::mem::forget((in_call, store));
        let store = Store::open(dev as Arc<dyn ZonedDevice>, StoreConfig::default()).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let f = store.open_file(root, "f", OpenOptions::read()).unwrap();
        let mut buf = [0u8; 24];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 24);
        assert_eq!(&buf, b"written before the close");
    }
}
