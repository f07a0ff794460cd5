//! `poll_oneoff`: clock subscriptions (relative or absolute, on the realtime or monotonic
//! clock), and readiness of descriptors. Files and directories are always ready, stdout and
//! stderr are ready for writing; stdin and sockets are asked with poll(2), waiting at most
//! until the earliest clock subscription is due (not at all when another subscription is
//! ready already: they are still asked, so every ready one is reported).

use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::abi::{clock, Errno, EVENT_SIZE, SUBSCRIPTION_SIZE};
use super::calls::clock_now;
use super::mem::GuestMem;
use super::table::{Desc, Kind, MAX_OPEN};
use super::WasiCtx;

/// Most subscriptions one call takes: as Linux's poll refuses more descriptors than
/// `RLIMIT_NOFILE` (EINVAL), past the most a guest may hold open. The host's list of them
/// is sized by the count, which the guest's memory alone would let reach 89 million.
const MAX_SUBSCRIPTIONS: u32 = MAX_OPEN as u32;

const EVENT_CLOCK: u8 = 0;
const EVENT_FD_READ: u8 = 1;
const EVENT_FD_WRITE: u8 = 2;
const ABSTIME: u16 = 1;
/// `eventrwflags.fd_readwrite_hangup`.
const HANGUP: u16 = 1;

struct Event {
    userdata: u64,
    error: Errno,
    ty: u8,
    nbytes: u64,
    flags: u16,
}

enum Sub {
    /// Due at this monotonic time (ns).
    Clock { userdata: u64, due: u64 },
    /// Ready now.
    Ready(Event),
    /// Ask poll(2) about this host descriptor. The guest's descriptor is held meanwhile,
    /// so another thread's `fd_close` cannot close the host one under the poll (nor its
    /// number be reused by another open, in the node agent another pod's).
    Os {
        userdata: u64,
        ty: u8,
        fd: i32,
        _held: Option<Arc<Desc>>,
    },
}

pub fn poll_oneoff(
    m: &GuestMem,
    w: &WasiCtx,
    subs: u32,
    events: u32,
    n: u32,
) -> Result<u32, Errno> {
    if n == 0 || n > MAX_SUBSCRIPTIONS {
        return Err(Errno::INVAL);
    }
    m.array(subs, n, SUBSCRIPTION_SIZE)?;
    m.array(events, n, EVENT_SIZE)?;
    let mut list = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = subs
            .checked_add(i.checked_mul(SUBSCRIPTION_SIZE).ok_or(Errno::FAULT)?)
            .ok_or(Errno::FAULT)?;
        let userdata = m.u64(at)?;
        let tag = m.u8(at + 8)?;
        list.push(match tag {
            EVENT_CLOCK => {
                let id = m.u32(at + 16)?;
                let timeout = m.u64(at + 24)?;
                let flags = m.u16(at + 40)?;
                let now_mono = clock_now(clock::MONOTONIC)?;
                let due = if flags & ABSTIME != 0 {
                    match id {
                        clock::MONOTONIC => timeout,
                        clock::REALTIME => {
                            let now = clock_now(clock::REALTIME)?;
                            now_mono.saturating_add(timeout.saturating_sub(now))
                        }
                        _ => return Err(Errno::INVAL),
                    }
                } else {
                    match id {
                        clock::MONOTONIC | clock::REALTIME => now_mono.saturating_add(timeout),
                        _ => return Err(Errno::INVAL),
                    }
                };
                Sub::Clock { userdata, due }
            }
            EVENT_FD_READ | EVENT_FD_WRITE => {
                let fd = m.u32(at + 16)?;
                let ready = |error: Errno, nbytes: u64| {
                    Sub::Ready(Event {
                        userdata,
                        error,
                        ty: tag,
                        nbytes,
                        flags: 0,
                    })
                };
                match w.get(fd) {
                    Err(e) => ready(e, 0),
                    Ok(d) => match (&d.kind, tag) {
                        (Kind::StoreFile(f), EVENT_FD_READ) => {
                            let size = f.size().unwrap_or(0);
                            let pos = *d.position();
                            ready(Errno::SUCCESS, size.saturating_sub(pos))
                        }
                        (Kind::HostFile(f), EVENT_FD_READ) => {
                            let size = f.file.metadata().map(|m| m.len()).unwrap_or(0);
                            let pos = *d.position();
                            ready(Errno::SUCCESS, size.saturating_sub(pos))
                        }
                        (Kind::StoreFile(_) | Kind::HostFile(_), _) => ready(Errno::SUCCESS, 0),
                        (Kind::Stdout | Kind::Stderr, EVENT_FD_WRITE) => ready(Errno::SUCCESS, 0),
                        (Kind::Stdin, EVENT_FD_READ) => Sub::Os {
                            userdata,
                            ty: tag,
                            fd: w.stdio_fd(0),
                            _held: None,
                        },
                        (Kind::Stream(s), _) => Sub::Os {
                            userdata,
                            ty: tag,
                            fd: s.as_raw_fd(),
                            _held: Some(d.clone()),
                        },
                        (Kind::Listener(l), EVENT_FD_READ) => Sub::Os {
                            userdata,
                            ty: tag,
                            fd: l.as_raw_fd(),
                            _held: Some(d.clone()),
                        },
                        _ => ready(Errno::BADF, 0),
                    },
                }
            }
            _ => return Err(Errno::INVAL),
        });
    }

    let mut out: Vec<Event> = Vec::new();
    let mut list: Vec<Sub> = list
        .into_iter()
        .filter_map(|s| match s {
            Sub::Ready(e) => {
                out.push(e);
                None
            }
            other => Some(other),
        })
        .collect();
    list.shrink_to_fit();
    let earliest = list
        .iter()
        .filter_map(|s| match s {
            Sub::Clock { due, .. } => Some(*due),
            _ => None,
        })
        .min();
    let os: Vec<(u64, u8, i32)> = list
        .iter()
        .filter_map(|s| match s {
            Sub::Os {
                userdata, ty, fd, ..
            } => Some((*userdata, *ty, *fd)),
            _ => None,
        })
        .collect();

    // Wait only when nothing is ready yet; when something is, the host descriptors are
    // still asked (without waiting), so that each of them that is ready is reported too. A
    // guest that is stopped meanwhile gets EINTR at once (see `WasiCtx::wait`).
    if out.is_empty() || !os.is_empty() {
        let timeout = match out.is_empty() {
            true => {
                let now = clock_now(clock::MONOTONIC)?;
                earliest.map(|due| std::time::Duration::from_nanos(due.saturating_sub(now)))
            }
            false => Some(std::time::Duration::ZERO),
        };
        let mut fds: Vec<libc::pollfd> = os
            .iter()
            .map(|&(_, ty, fd)| libc::pollfd {
                fd,
                events: if ty == EVENT_FD_READ {
                    libc::POLLIN
                } else {
                    libc::POLLOUT
                },
                revents: 0,
            })
            .collect();
        w.wait(&mut fds, timeout)?;
        for (pfd, &(userdata, ty, fd)) in fds.iter().zip(&os) {
            if pfd.revents == 0 {
                continue;
            }
            let mut nbytes = 0i32;
            if ty == EVENT_FD_READ {
                // SAFETY: FIONREAD writes one int.
                unsafe { libc::ioctl(fd, libc::FIONREAD, &mut nbytes) };
            }
            let hup = pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0;
            out.push(Event {
                userdata,
                error: Errno::SUCCESS,
                ty,
                nbytes: nbytes.max(0) as u64,
                flags: if hup { HANGUP } else { 0 },
            });
        }
    }
    let now = clock_now(clock::MONOTONIC)?;
    for s in &list {
        if let Sub::Clock { userdata, due } = s {
            if *due <= now {
                out.push(Event {
                    userdata: *userdata,
                    error: Errno::SUCCESS,
                    ty: EVENT_CLOCK,
                    nbytes: 0,
                    flags: 0,
                });
            }
        }
    }
    for (i, e) in out.iter().enumerate() {
        let at = events + i as u32 * EVENT_SIZE;
        m.put_u64(at, e.userdata)?;
        m.put_u16(at + 8, e.error.0)?;
        m.put_u8(at + 10, e.ty)?;
        m.put_u64(at + 16, e.nbytes)?;
        m.put_u16(at + 24, e.flags)?;
    }
    Ok(out.len() as u32)
}
