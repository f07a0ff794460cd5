//! valet-run's own WASIp1 layer (`wasi_snapshot_preview1`), on the `wasmtime` crate alone.
//!
//! This module is the WASI adapter: the one place that knows both WASI and the store. It
//! owns the guest's descriptor table ([`table`]), and serves each descriptor from the
//! store ([`store_fs`]), from a plain host directory ([`host_fs`]), from stdio, or from a
//! preopened TCP listener. [`calls`] registers every preview1 function with
//! `Linker::func_wrap` and does the marshalling by hand ([`mem`]), so a call costs what it
//! does: a table lookup, the store call, and an errno that is a plain number (never a boxed
//! error or a captured backtrace, whatever `RUST_BACKTRACE` says). Only a trap or an exit
//! leaves a call as a `wasmtime::Error`.
//!
//! One [`WasiCtx`] serves every thread of a guest (wasip1-threads): each thread has its own
//! wasmtime store whose [`GuestState`] shares the context and the memory.
//!
//! Not here: running a guest, threads and exit codes ([`crate::host`]); the store itself
//! (valet-vfs, which knows nothing of WASI).

pub mod abi;
mod calls;
mod dirlist;
pub mod host_fs;
pub mod mem;
mod poll;
pub mod store_fs;
pub mod table;

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use valet_vfs::{Ino, Store};
use wasmtime::{Caller, Memory, SharedMemory};

use abi::Errno;
use mem::GuestMem;
use table::{Desc, Kind, Table};

pub use calls::add_to_linker;

/// A time a guest asks to set: now, or nanoseconds since the epoch.
#[derive(Clone, Copy, Debug)]
pub enum TimeSpec {
    Now,
    At(u64),
}

impl TimeSpec {
    pub fn ns(self) -> u64 {
        match self {
            TimeSpec::At(ns) => ns,
            TimeSpec::Now => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        }
    }
}

/// How a guest asked to end: `proc_exit(code)`. Carried as the `wasmtime::Error` of the
/// call that ended it.
#[derive(Debug, Clone, Copy)]
pub struct Exit(pub i32);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the guest exited with code {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// The trap every call of a guest that is ending raises (another thread exited or trapped).
#[derive(Debug, Clone, Copy)]
pub struct Ending;

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the guest is ending (another of its threads exited or trapped)")
    }
}

impl std::error::Error for Ending {}

/// What a host descriptor the guest writes to is: a pipe or a socket can make a write wait
/// for its reader, for as long as the reader likes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outlet {
    Plain,
    Pipe,
    Socket,
}

impl Outlet {
    fn of(fd: i32) -> Outlet {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes a stat into the buffer it is given, which outlives the call.
        if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
            return Outlet::Plain;
        }
        // SAFETY: fstat succeeded, so it filled the buffer.
        match unsafe { st.assume_init() }.st_mode & libc::S_IFMT {
            libc::S_IFIFO => Outlet::Pipe,
            libc::S_IFSOCK => Outlet::Socket,
            _ => Outlet::Plain,
        }
    }
}

/// A directory (or socket) the guest gets at start.
pub enum Preopened {
    Store {
        store: Store,
        ino: Ino,
        guest_path: String,
    },
    Host {
        dir: host_fs::HostDir,
        guest_path: String,
    },
    Listener(TcpListener),
}

/// A limit on the bytes a guest may write to the store (the node agent's pod quota). The
/// adapter asks before every write that may grow a store file; a refusal is ENOSPC.
pub trait SpaceLimit: Send + Sync {
    /// Asks for `bytes` more: every byte written to a store file, and the growth of a
    /// `fd_filestat_set_size` or `fd_allocate`. False refuses them.
    fn charge(&self, bytes: u64) -> bool;

    /// The write, resize or allocation `bytes` were charged for has finished (it wrote
    /// them, or failed): whatever it added is in the store's count now. Until then a
    /// limit that counts the store again must count them on top.
    fn written(&self, _bytes: u64) {}
}

/// Bytes charged against a guest's space limit for one write still in flight; dropped
/// when the write has finished, which tells the limit ([`SpaceLimit::written`]).
pub(crate) struct Charge<'a> {
    space: Option<&'a dyn SpaceLimit>,
    bytes: u64,
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.space {
            s.written(self.bytes);
        }
    }
}

/// One guest's WASI state, shared by its threads.
pub struct WasiCtx {
    args: Vec<String>,
    env: Vec<String>,
    table: Mutex<Table>,
    /// Set once any thread exits or traps; calls of the other threads then trap.
    ending: AtomicBool,
    /// An eventfd made readable when `ending` is set: every blocking wait of a call watches
    /// it too (see [`WasiCtx::wait`]), so that a guest stopped while it sleeps or waits on
    /// a socket or stdin stops then, not when the wait would have ended.
    waker: OwnedFd,
    /// stdin, stdout, stderr handed in by the embedder (the node agent gives each pod its
    /// own); `None` is the process's own.
    stdio: [Option<Arc<File>>; 3],
    /// What is behind each of them, for writes that may wait for a reader.
    outlets: [Outlet; 3],
    space: Option<Arc<dyn SpaceLimit>>,
}

impl WasiCtx {
    /// A context with stdio on descriptors 0–2 and the preopens from 3 on, as wasmtime does.
    pub fn new(
        args: Vec<String>,
        env: Vec<(String, String)>,
        preopens: Vec<Preopened>,
    ) -> Result<WasiCtx> {
        let mut table = Table::default();
        for kind in [Kind::Stdin, Kind::Stdout, Kind::Stderr] {
            table.push(Arc::new(Desc::new(kind, 0))).ok();
        }
        for p in preopens {
            let (kind, path) = match p {
                Preopened::Store {
                    store,
                    ino,
                    guest_path,
                } => (
                    Kind::StoreDir(store_fs::StoreDir::new(store, ino)),
                    Some(guest_path),
                ),
                Preopened::Host { dir, guest_path } => (Kind::HostDir(dir), Some(guest_path)),
                Preopened::Listener(l) => (Kind::Listener(l), None),
            };
            let mut desc = Desc::new(kind, 0);
            desc.preopen = path;
            table
                .push(Arc::new(desc))
                .map_err(|_| anyhow::anyhow!("too many preopens"))?;
        }
        for s in args.iter().chain(env.iter().map(|(k, _)| k)) {
            if s.contains('\0') {
                anyhow::bail!("a guest argument or variable holds a NUL byte: {s:?}");
            }
        }
        // SAFETY: eventfd takes no pointers; on success the descriptor is ours alone.
        let waker = match unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) } {
            fd if fd >= 0 => unsafe { OwnedFd::from_raw_fd(fd) },
            _ => {
                let e = std::io::Error::last_os_error();
                anyhow::bail!("cannot create the guest's wake-up eventfd: {e}")
            }
        };
        Ok(WasiCtx {
            args,
            env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            table: Mutex::new(table),
            ending: AtomicBool::new(false),
            waker,
            stdio: [None, None, None],
            outlets: [0, 1, 2].map(Outlet::of),
            space: None,
        })
    }

    /// Gives the guest these files as stdin, stdout and stderr instead of the process's.
    /// The context keeps descriptors of its own for them (duplicates), which
    /// [`WasiCtx::release_stdio`] lets go of when the guest ends.
    pub fn with_stdio(mut self, stdio: [Option<Arc<File>>; 3]) -> Result<WasiCtx> {
        for (slot, file) in self.stdio.iter_mut().zip(stdio) {
            if let Some(f) = file {
                let own = f
                    .try_clone()
                    .map_err(|e| anyhow::anyhow!("duplicating a stdio descriptor: {e}"))?;
                *slot = Some(Arc::new(own));
            }
        }
        self.outlets = [0, 1, 2].map(|n| Outlet::of(self.stdio_fd(n)));
        Ok(self)
    }

    /// Lets go of the stdio files handed in, once the guest is ending and the last line
    /// for it is written: each of the context's descriptors for them now names
    /// `/dev/null` (dup3), so the pipe or FIFO behind it is closed here (a container's log
    /// sees its end) even while a thread of the guest still holds this context, and a
    /// descriptor number that a call of such a thread still uses never names another file.
    pub fn release_stdio(&self) {
        debug_assert!(self.is_ending(), "stdio let go of while the guest runs");
        let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        else {
            return;
        };
        for f in self.stdio.iter().flatten() {
            // SAFETY: both descriptors are open and ours; dup3 replaces the second
            // atomically, and it stays owned by its `File`.
            unsafe { libc::dup3(null.as_raw_fd(), f.as_raw_fd(), libc::O_CLOEXEC) };
        }
    }

    /// Limits what the guest may write to the store.
    pub fn with_space_limit(mut self, space: Option<Arc<dyn SpaceLimit>>) -> WasiCtx {
        self.space = space;
        self
    }

    /// The host descriptor behind stdio descriptor `n` (0–2).
    pub(crate) fn stdio_fd(&self, n: usize) -> i32 {
        match &self.stdio[n] {
            Some(f) => f.as_raw_fd(),
            None => n as i32,
        }
    }

    pub(crate) fn stdin_read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &self.stdio[0] {
            Some(f) => (&**f).read(buf),
            None => std::io::stdin().lock().read(buf),
        }
    }

    /// Writes to stdout (`n` = 1) or stderr (2); the process's stdout is flushed after. A
    /// pipe or socket whose reader does not read makes the write wait where a stopped guest
    /// is woken ([`WasiCtx::write_waking`]).
    pub(crate) fn stdio_write(&self, n: usize, data: &[u8]) -> std::result::Result<(), Errno> {
        let outlet = self.outlets[n];
        match (&self.stdio[n], n) {
            (Some(f), _) if outlet == Outlet::Plain => Ok((&**f).write_all(data)?),
            (Some(f), _) => self.write_waking(f.as_raw_fd(), data, outlet),
            (None, 1) => {
                // Locked, so that the host's own prints do not interleave.
                let mut out = std::io::stdout().lock();
                match outlet {
                    Outlet::Plain => Ok(out.write_all(data).and_then(|()| out.flush())?),
                    // Past std's buffer, which holds at most the host's own prints.
                    _ => {
                        out.flush()?;
                        self.write_waking(1, data, outlet)
                    }
                }
            }
            (None, _) => {
                let mut err = std::io::stderr().lock();
                match outlet {
                    Outlet::Plain => Ok(err.write_all(data)?),
                    _ => self.write_waking(2, data, outlet),
                }
            }
        }
    }

    /// Writes all of `data` to the pipe or socket `fd` without ever blocking in the write
    /// itself: a full pipe or socket buffer is waited for in [`WasiCtx::wait_for`], which a
    /// stopped guest leaves at once (EINTR).
    pub(crate) fn write_waking(
        &self,
        fd: i32,
        mut rest: &[u8],
        outlet: Outlet,
    ) -> std::result::Result<(), Errno> {
        while !rest.is_empty() {
            // SAFETY: `rest` is a valid buffer of its length for each call.
            let written = unsafe {
                match outlet {
                    Outlet::Socket => libc::send(
                        fd,
                        rest.as_ptr().cast(),
                        rest.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    ),
                    _ => {
                        let iov = libc::iovec {
                            iov_base: rest.as_ptr() as *mut libc::c_void,
                            iov_len: rest.len(),
                        };
                        libc::pwritev2(fd, &iov, 1, -1, libc::RWF_NOWAIT)
                    }
                }
            };
            if written >= 0 {
                rest = &rest[written as usize..];
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) => self.wait_for(fd, libc::POLLOUT)?,
                // A kernel without RWF_NOWAIT for pipes (or without pwritev2): once the
                // pipe has room, a write of at most PIPE_BUF bytes does not block.
                Some(libc::EOPNOTSUPP | libc::ENOSYS) => {
                    self.wait_for(fd, libc::POLLOUT)?;
                    let len = rest.len().min(libc::PIPE_BUF);
                    // SAFETY: as above, for the first `len` bytes.
                    match unsafe { libc::write(fd, rest.as_ptr().cast(), len) } {
                        n if n >= 0 => rest = &rest[n as usize..],
                        _ => {
                            let e = std::io::Error::last_os_error();
                            if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                                return Err(e.into());
                            }
                        }
                    }
                }
                _ => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Charges `bytes` against the space limit, if any, for a write the returned charge
    /// is held over.
    #[inline]
    pub(crate) fn charge(&self, bytes: u64) -> Result<Charge<'_>, Errno> {
        match self.space.as_deref() {
            Some(s) if !s.charge(bytes) => Err(Errno::NOSPC),
            space => Ok(Charge { space, bytes }),
        }
    }

    pub(crate) fn has_space_limit(&self) -> bool {
        self.space.is_some()
    }

    /// The descriptor `fd`, cloned out of the table.
    #[inline]
    pub fn get(&self, fd: u32) -> Result<Arc<Desc>, Errno> {
        self.table().get(fd).cloned()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the guest as ending, and wakes its threads' blocking waits; returns whether
    /// it already was ending.
    pub fn end(&self) -> bool {
        let was = self.ending.swap(true, Ordering::SeqCst);
        if !was {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes the 8 bytes of a local to our eventfd. It cannot fail but by
            // overflowing the counter, which one write never does.
            unsafe { libc::write(self.waker.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
        was
    }

    /// Waits as ppoll(2) until one of `fds` is ready (their `revents` are set) or `timeout`
    /// has passed (`None`: no limit), or until the guest is ending: then EINTR, at once.
    pub(crate) fn wait(
        &self,
        fds: &mut [libc::pollfd],
        timeout: Option<Duration>,
    ) -> std::result::Result<(), Errno> {
        let mut all = fds.to_vec();
        all.push(self.waker_pollfd());
        self.poll_woken(&mut all, timeout)?;
        for (fd, polled) in fds.iter_mut().zip(&all) {
            fd.revents = polled.revents;
        }
        Ok(())
    }

    /// Waits until host descriptor `fd` is ready for `events` (`POLLIN` before a blocking
    /// read of a socket or stdin, `POLLOUT` before a send), unless the guest is ending
    /// (EINTR). Allocates nothing: it runs before reads.
    pub(crate) fn wait_for(&self, fd: i32, events: i16) -> std::result::Result<(), Errno> {
        let one = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        self.poll_woken(&mut [one, self.waker_pollfd()], None)
    }

    fn waker_pollfd(&self) -> libc::pollfd {
        libc::pollfd {
            fd: self.waker.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }
    }

    /// ppoll(2) on `all`, whose last entry is the waker, retried after a signal: EINTR if
    /// the guest is ending or the waker fired.
    fn poll_woken(
        &self,
        all: &mut [libc::pollfd],
        timeout: Option<Duration>,
    ) -> std::result::Result<(), Errno> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if self.is_ending() {
                return Err(Errno::INTR);
            }
            let left = deadline.map(|d| {
                let left = d.saturating_duration_since(Instant::now());
                libc::timespec {
                    tv_sec: left.as_secs() as libc::time_t,
                    tv_nsec: left.subsec_nanos() as libc::c_long,
                }
            });
            let left_ptr = left.as_ref().map_or(std::ptr::null(), |t| t as *const _);
            // SAFETY: `all` is an array of pollfd of its length; `left_ptr` is null or
            // points at a timespec that outlives the call; no signal mask.
            let r = unsafe {
                libc::ppoll(
                    all.as_mut_ptr(),
                    all.len() as libc::nfds_t,
                    left_ptr,
                    std::ptr::null(),
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if all.last().is_some_and(|w| w.revents != 0) {
                return Err(Errno::INTR);
            }
            return Ok(());
        }
    }

    pub fn is_ending(&self) -> bool {
        self.ending.load(Ordering::Relaxed)
    }

    /// Closes every descriptor the guest left open; the first close that fails is returned
    /// (a store file whose last flush fails).
    pub fn close_all(&self) -> std::result::Result<(), Errno> {
        let all = self.table().drain();
        let mut first = Ok(());
        for d in all {
            if let Err(e) = calls::close_desc(d) {
                first = first.and(Err(e));
            }
        }
        first
    }
}

/// The guest memory a thread's calls use.
#[derive(Clone)]
pub enum MemRef {
    None,
    Plain(Memory),
    Shared(SharedMemory),
}

/// Per-thread host state: the wasmtime store's data.
pub struct GuestState {
    pub wasi: Arc<WasiCtx>,
    pub mem: MemRef,
    /// Staging for copies in and out of a shared memory (kept, so no call allocates).
    scratch: Vec<u8>,
    /// What `wasi::thread-spawn` needs (set by [`crate::host`] for threaded guests).
    pub threads: Option<Arc<crate::host::Threads>>,
    /// The store's resource limiter: a pod's memory limit, and the memory the guest grew
    /// to (none by default; see [`crate::guest_memory`]).
    pub limits: crate::guest_memory::MemoryLimiter,
    /// This thread's share of the guest's CPU limit, kept at epoch checks (none by
    /// default; see [`crate::cpu_limit`]).
    pub cpu: Option<crate::cpu_limit::ThreadMeter>,
}

impl GuestState {
    pub fn new(wasi: Arc<WasiCtx>, mem: MemRef) -> GuestState {
        GuestState {
            wasi,
            mem,
            scratch: Vec::new(),
            threads: None,
            limits: crate::guest_memory::MemoryLimiter::default(),
            cpu: None,
        }
    }
}

/// A call's view: the guest's memory, the shared context, and the scratch buffer.
#[inline]
pub(crate) fn view<'a>(
    caller: &'a mut Caller<'_, GuestState>,
) -> (GuestMem, &'a WasiCtx, &'a mut Vec<u8>) {
    let (mem, st) = match &caller.data().mem {
        MemRef::Plain(m) => {
            let m = *m;
            let (data, st) = m.data_and_store_mut(caller);
            (GuestMem::plain(data), st)
        }
        MemRef::Shared(s) => {
            let data = s.data();
            let mem = GuestMem::shared(data.as_ptr() as *mut u8, data.len());
            (mem, caller.data_mut())
        }
        MemRef::None => (GuestMem::none(), caller.data_mut()),
    };
    let GuestState { wasi, scratch, .. } = st;
    (mem, &**wasi, scratch)
}
