//! Running one guest: the wasmtime engine, the guest's WASI context ([`crate::wasi`]) with
//! the store (and any plain host directories) preopened, and wasi-threads for guests built
//! for `wasm32-wasip1-threads`.
//!
//! Threads: every `wasi::thread-spawn` starts an OS thread with its own wasmtime store and
//! instance on the guest's shared memory; the WASI context (descriptor table, preopens) is
//! shared, so descriptors work across threads. The first thread to end the program decides
//! how it ends: `_start` returning (exit 0), `proc_exit(n)` in any thread (exit n), or a trap
//! in any thread. Then the guest is marked as ending: every later WASI call of its other
//! threads traps, and running guest code is interrupted at its next epoch check (an
//! engine of [`Stopping::EpochChecks`] has epoch interruption on; an epoch tick asks each
//! store whether its guest is ending; under [`Stopping::NoChecks`] the process's exit
//! stops that code instead). A thread blocked in `memory.atomic.wait` (with no timeout, or
//! a long one) is woken once the guest has ended and its threads have had
//! [`PARKED_GRACE`] to end: wasmtime has no "wake every waiter", so a background thread
//! of low priority notifies every 4-byte-aligned address of the guest's shared memory
//! ([`Threads::wake_parked`]; in the test profile, wasmtime unoptimised, 1.8 s for 64 MiB
//! and 17 s for 512 MiB: `the_cost_of_notifying_every_address` in `tests/parked_threads.rs`),
//! then ticks the epoch; the woken thread traps at its next epoch check or WASI call, and
//! its OS thread and the memory go. (Under [`Stopping::NoChecks`] a woken thread runs
//! until its next WASI call.) Each guest thread is an OS thread; a guest's
//! [`GuestSpec::thread_limit`] bounds how many run at once, and its [`GuestSpec::cpu`]
//! limit the CPU time they use, charged at epoch checks ([`crate::cpu_limit`]).
//!
//! A trap is reported with the guest's own backtrace (wasm frames), never a host Rust
//! backtrace.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use anyhow::{bail, Context, Result};
use valet_vfs::{Ino, Store};
use wasmtime::{
    Cache, CacheConfig, Config, Engine, ExternType, Linker, MemoryType, Module, SharedMemory,
    UpdateDeadline,
};

use crate::cpu_limit::{CpuBudget, CpuMetering, ThreadMeter};
use crate::epoch_clock;
use crate::guest_memory::{GuestMemory, MemoryAccount, MemoryLimiter};
use crate::wasi::{self, Ending, Exit, GuestState, MemRef, Preopened, WasiCtx};

/// A directory (or socket) the guest sees.
#[derive(Clone)]
pub enum Preopen {
    /// A directory of the store (a tenant's root, usually).
    Store { ino: Ino, guest_path: String },
    /// A plain host directory (`--dir HOST::GUEST`).
    Host {
        host_path: PathBuf,
        guest_path: String,
    },
    /// A host directory already open (the node agent: a container's rootfs, handed over by
    /// its shim as a descriptor).
    HostDir {
        dir: Arc<cap_std::fs::Dir>,
        guest_path: String,
    },
    /// A TCP listener bound here before the guest starts (`--tcplisten ADDR`), as
    /// `wasmtime run` preopens one: the guest finds it as a descriptor after the
    /// directories and calls `sock_accept` on it.
    TcpListen(SocketAddr),
}

/// Everything one guest runs with.
#[derive(Clone, Default)]
pub struct GuestSpec {
    /// argv, starting with the program name.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub preopens: Vec<Preopen>,
    /// Imports nothing provides become functions that trap with their name when called,
    /// instead of refusing the module (`wasmtime run --trap-unknown-imports`).
    pub trap_unknown_imports: bool,
    /// The guest's stdin, stdout and stderr; `None` is the process's own.
    pub stdio: [Option<Arc<std::fs::File>>; 3],
    /// A limit on what the guest writes to the store (ENOSPC past it).
    pub space_limit: Option<Arc<dyn wasi::SpaceLimit>>,
    /// Lets another thread stop the guest (see [`Stop`]).
    pub stop: Option<Arc<Stop>>,
    /// The most linear memory the guest may have, in bytes (a pod's memory limit): a
    /// module that needs more at start is refused, and a `memory.grow` past it fails (-1),
    /// as an allocation fails in a process at its cgroup's limit.
    pub memory_limit: Option<u64>,
    /// The most threads a wasi-threads guest may run at once, its first included (a pod's
    /// pids limit): a `thread-spawn` past it fails, as `clone` fails at a cgroup's pids
    /// limit, and wasi-libc's `pthread_create` returns EAGAIN.
    pub thread_limit: Option<u32>,
    /// How the guest's CPU time is metered, and limited (a pod's CPU limit, `--cpus`; see
    /// [`crate::cpu_limit`]). Kept at epoch checks: the engine must have them
    /// ([`Stopping::EpochChecks`]).
    pub cpu: Option<CpuMetering>,
    /// The tenant's account of its guests' linear memory, which this guest joins while it
    /// runs (see [`crate::guest_memory`]).
    pub memory: Option<Arc<MemoryAccount>>,
    /// A trap is also told on the guest's stderr (`valet: guest trapped: ...`), the last
    /// line written for the guest (the node agent: a container's log).
    pub trap_on_stderr: bool,
}

/// Stops a running guest from another thread, as a signal stops a process (the node
/// agent's `kill`): its threads trap at their next WASI call or epoch check, and the guest
/// ends with exit code 128 + the signal's number, unless it had already ended. Descriptors
/// are closed as at any end, so what the guest had synced stays and nothing is half-done
/// in the store.
#[derive(Default)]
pub struct Stop {
    state: Mutex<StopState>,
}

#[derive(Default)]
struct StopState {
    signal: Option<i32>,
    engine: Option<Engine>,
    wasi: Option<Arc<WasiCtx>>,
    threads: Option<Arc<Threads>>,
}

impl Stop {
    /// Stops the guest now, or as soon as it starts.
    pub fn stop(&self, signal: i32) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.signal.get_or_insert(signal);
        Self::fire(&state);
    }

    /// The signal the guest was stopped with, if any.
    pub fn signal(&self) -> Option<i32> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).signal
    }

    fn fire(state: &StopState) {
        let Some(signal) = state.signal else { return };
        if let Some(threads) = &state.threads {
            threads.finish(Some(End::Code(128 + signal)));
        } else if let (Some(engine), Some(wasi)) = (&state.engine, &state.wasi) {
            wasi.end();
            engine.increment_epoch();
        }
    }

    /// Forgets the guest once it has ended, so that a `Stop` kept by its owner (the node
    /// agent keeps it until the shim hangs up) holds neither its stdio nor its memory.
    fn detach(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.engine = None;
        state.wasi = None;
        state.threads = None;
    }

    fn attach(&self, engine: &Engine, wasi: &Arc<WasiCtx>, threads: Option<&Arc<Threads>>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.engine = Some(engine.clone());
        state.wasi = Some(wasi.clone());
        state.threads = threads.cloned();
        Self::fire(&state);
    }

    /// The end of a guest whose threads all stopped because it was ending.
    fn end(stop: Option<&Arc<Stop>>) -> End {
        End::Code(stop.and_then(|s| s.signal()).map_or(0, |s| 128 + s))
    }
}

/// How a guest ended.
#[derive(Debug)]
pub enum GuestExit {
    /// `_start` returned or the guest called `proc_exit`.
    Code(i32),
    /// The guest trapped (a bug or abort in the guest, not ours): the trap and the guest's
    /// backtrace, as text.
    Trap(String),
}

/// Stack for each guest thread (main and spawned): room for wasmtime's guest stack and
/// the host frames under it.
const THREAD_STACK: usize = 8 << 20;

/// How long the threads of an ended guest have to end by themselves (at their next epoch
/// check or WASI call) before those still parked in `memory.atomic.wait` are woken.
pub const PARKED_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// How the threads of a guest that has ended are stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stopping {
    /// Guest code checks the engine's epoch at every function entry and loop head, so a
    /// guest's threads stop wherever they are once it ends or is killed. Needed wherever a
    /// guest may have to stop while the process goes on: the node agent (a pod is killed),
    /// a threaded guest among `valet-run`'s tenants (its other threads, once it ends),
    /// tests. The checks cost RocksDB's `db_bench` here 11 % of its fill rate and 20 % of
    /// its read rate.
    EpochChecks,
    /// No checks in guest code, as the wasmtime CLI compiles by default: for a guest that
    /// nothing has to stop from outside. `valet-run` with one guest exits when it ends,
    /// which stops every thread still running guest code, and a guest of one thread ends
    /// with that thread. A thread that calls WASI after its guest ended still traps there.
    NoChecks,
}

/// An engine able to run both plain and threaded WASIp1 guests, with exception handling
/// (on by default in wasmtime 48) and, when `stopping` asks for it, epoch interruption.
///
/// Compiled modules are cached on disk (wasmtime's cache, in the user's cache directory), as
/// the wasmtime CLI does: a large guest (LevelDB, a Go program) compiles once, not at every
/// start. Without a usable cache directory the engine simply compiles every time.
pub fn engine(stopping: Stopping) -> Result<Engine> {
    let mut config = Config::new();
    config.wasm_threads(true);
    config.shared_memory(true);
    config.wasm_exceptions(true);
    config.epoch_interruption(stopping == Stopping::EpochChecks);
    config.cache(Cache::new(CacheConfig::new()).ok());
    if std::env::var_os("VALET_PORTABLE_CODE").is_some_and(|v| v == "1") {
        portable_code(&mut config)?;
    }
    Engine::new(&config)
        .map_err(anyhow::Error::from)
        .context("creating the wasmtime engine")
}

/// `VALET_PORTABLE_CODE=1`: code for x86-64-v2 (SSE4.2, POPCNT, CMPXCHG16B) instead of every
/// feature of this CPU, so that a module compiled and cached on one machine loads on
/// another: the VM tests compile guests on the host and run them under QEMU's emulated CPU,
/// where Cranelift itself would be an order of magnitude slower.
fn portable_code(config: &mut Config) -> Result<()> {
    if !cfg!(target_arch = "x86_64") {
        anyhow::bail!("VALET_PORTABLE_CODE is only defined for x86-64");
    }
    config.target("x86_64-unknown-linux-gnu")?;
    for flag in [
        "has_sse3",
        "has_ssse3",
        "has_sse41",
        "has_sse42",
        "has_popcnt",
        "has_cmpxchg16b",
    ] {
        // SAFETY: every x86-64-v2 CPU has these; wasmtime checks them against the host
        // before it runs code that uses them.
        unsafe {
            config.cranelift_flag_enable(flag);
        }
    }
    Ok(())
}

/// Compiles a guest module, with a message that names the file.
pub fn load(engine: &Engine, path: &Path) -> Result<Module> {
    compile(engine, path, &read_module(path)?)
}

/// The bytes of the module file at `path`, with a message that names it.
pub fn read_module(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Compiles `bytes`, the module file at `path`.
pub fn compile(engine: &Engine, path: &Path, bytes: &[u8]) -> Result<Module> {
    Module::new(engine, bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a valid WebAssembly module: {e:#}", path.display()))
}

/// Whether `module` imports wasi-threads' `thread-spawn`.
pub fn is_threaded(module: &Module) -> bool {
    module
        .imports()
        .any(|i| i.module() == "wasi" && i.name() == "thread-spawn")
}

/// Whether a module's bytes may import wasi-threads' `thread-spawn`, before compiling it:
/// the import entry's two length-prefixed names, found anywhere in the module. A match
/// elsewhere (in a data segment, say) is a false positive; [`is_threaded`] decides.
pub fn may_spawn_threads(bytes: &[u8]) -> bool {
    const IMPORT: &[u8] = b"\x04wasi\x0cthread-spawn";
    bytes.windows(IMPORT.len()).any(|w| w == IMPORT)
}

/// Sets a store up for epoch interruption: at every tick it goes on, unless its guest is
/// ending; a thread of a metered guest is charged for its CPU time there, and pauses
/// while the guest is over its limit, if it has one.
fn watch_epochs(store: &mut wasmtime::Store<GuestState>, budget: Option<&Arc<CpuBudget>>) {
    store.data_mut().cpu = budget.map(|b| ThreadMeter::new(b.clone()));
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut ctx| {
        let GuestState { cpu, wasi, .. } = ctx.data_mut();
        if let Some(meter) = cpu {
            meter.check(|| wasi.is_ending());
        }
        if ctx.data().wasi.is_ending() {
            Err(wasmtime::Error::new(Ending))
        } else {
            Ok(UpdateDeadline::Continue(1))
        }
    });
}

/// How the first thread to end the guest ended it.
enum End {
    Code(i32),
    Trap(String),
}

/// The trap text: the trap and the guest's backtrace, without any host backtrace.
fn trap_text(e: &wasmtime::Error) -> String {
    let mut text = String::new();
    for (i, cause) in e.chain().enumerate() {
        if i > 0 {
            text.push_str("\n  caused by: ");
        }
        text.push_str(&cause.to_string());
    }
    text
}

/// What a guest thread's call result means: `None` for a thread that stopped because the
/// guest was already ending.
fn end_of(result: wasmtime::Result<()>) -> Option<End> {
    match result {
        Ok(()) => Some(End::Code(0)),
        Err(e) => {
            if let Some(Exit(code)) = e.downcast_ref::<Exit>() {
                Some(End::Code(*code))
            } else if e.downcast_ref::<Ending>().is_some() {
                None
            } else {
                Some(End::Trap(trap_text(&e)))
            }
        }
    }
}

/// The threads of one threaded guest.
pub struct Threads {
    engine: Engine,
    module: Module,
    linker: Linker<GuestState>,
    memory: SharedMemory,
    wasi: Arc<WasiCtx>,
    next_tid: AtomicU32,
    /// Threads running, the first included, and the most that may ([`GuestSpec::thread_limit`]).
    running: AtomicU32,
    limit: u32,
    /// The guest's CPU budget, when it is metered: every thread's store is charged to it.
    cpu: Option<Arc<CpuBudget>>,
    end: Mutex<Option<End>>,
    ended: Condvar,
}

impl Threads {
    /// Records how the guest ends (the first report wins) and stops its other threads.
    fn finish(&self, end: Option<End>) {
        let Some(end) = end else { return };
        let mut slot = self.end.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(end);
            self.wasi.end();
            self.engine.increment_epoch();
            self.ended.notify_all();
        }
    }

    fn new_store(self: &Arc<Self>) -> wasmtime::Store<GuestState> {
        let mut state = GuestState::new(self.wasi.clone(), MemRef::Shared(self.memory.clone()));
        state.threads = Some(self.clone());
        let mut store = wasmtime::Store::new(&self.engine, state);
        watch_epochs(&mut store, self.cpu.as_ref());
        store
    }

    /// `wasi::thread-spawn`: the new thread's id (1..2^29), or a negative number when no
    /// thread could be started.
    fn spawn(self: &Arc<Self>, start_arg: i32) -> i32 {
        if self.running.fetch_add(1, Ordering::Relaxed) >= self.limit {
            self.running.fetch_sub(1, Ordering::Relaxed);
            return -1;
        }
        let tid = self.next_tid.fetch_add(1, Ordering::Relaxed);
        if tid == 0 || tid >= 1 << 29 {
            self.running.fetch_sub(1, Ordering::Relaxed);
            return -1;
        }
        let this = self.clone();
        let started = std::thread::Builder::new()
            .name(format!("guest-thread-{tid}"))
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let mut store = this.new_store();
                let mut run = || -> wasmtime::Result<()> {
                    let instance = this.linker.instantiate(&mut store, &this.module)?;
                    let start = instance
                        .get_typed_func::<(i32, i32), ()>(&mut store, "wasi_thread_start")?;
                    start.call(&mut store, (tid as i32, start_arg))
                };
                match run() {
                    // A thread returning ends only itself.
                    Ok(()) => {}
                    Err(e) => this.finish(end_of(Err(e))),
                }
                drop(store);
                this.running.fetch_sub(1, Ordering::Release);
            });
        match started {
            Ok(_) => tid as i32,
            Err(_) => {
                self.running.fetch_sub(1, Ordering::Relaxed);
                -1
            }
        }
    }

    /// Once the guest has ended: gives its threads [`PARKED_GRACE`] to end, then wakes
    /// those still parked in `memory.atomic.wait32/64` by notifying every 4-byte-aligned
    /// address of the shared memory (a 64-bit wait is on such an address too), and ticks
    /// the epoch so that a woken thread meets a passed deadline at its next check; up to
    /// three rounds, for a thread that waits again before any check. On a thread of its
    /// own, at the lowest priority: the sweep costs a lock and a lookup per address (see
    /// the module docs), and is only made when a thread is left after the grace.
    fn wake_parked(self: Arc<Self>) {
        let waker = std::thread::Builder::new()
            .name("guest-waker".into())
            .spawn(move || {
                // SAFETY: setpriority(2) on this thread (its kernel id); no pointers.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
                }
                for _ in 0..3 {
                    if self.threads_end_within(PARKED_GRACE) {
                        return;
                    }
                    self.notify_every_address();
                    self.engine.increment_epoch();
                }
            });
        // Without a thread for it, parked threads stay parked, as they always did.
        drop(waker);
    }

    /// Whether every thread of the guest ends within `limit`.
    fn threads_end_within(&self, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        while self.running.load(Ordering::Acquire) > 0 {
            if start.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        true
    }

    /// Wakes every waiter of the shared memory; returns how many were woken.
    fn notify_every_address(&self) -> u64 {
        let size = self.memory.data_size() as u64;
        let mut woken = 0;
        for addr in (0..size).step_by(4) {
            woken += u64::from(self.memory.atomic_notify(addr, u32::MAX).unwrap_or(0));
        }
        woken
    }
}

fn wasi_context(spec: &GuestSpec, store: &Store) -> Result<WasiCtx> {
    let mut preopens = Vec::new();
    for preopen in &spec.preopens {
        preopens.push(match preopen {
            Preopen::Store { ino, guest_path } => Preopened::Store {
                store: store.clone(),
                ino: *ino,
                guest_path: guest_path.clone(),
            },
            Preopen::Host {
                host_path,
                guest_path,
            } => Preopened::Host {
                dir: wasi::host_fs::HostDir::open_ambient(host_path).with_context(|| {
                    format!("cannot open host directory {}", host_path.display())
                })?,
                guest_path: guest_path.clone(),
            },
            Preopen::HostDir { dir, guest_path } => Preopened::Host {
                dir: wasi::host_fs::HostDir::new(
                    dir.try_clone()
                        .context("cannot duplicate a host directory's descriptor")?,
                ),
                guest_path: guest_path.clone(),
            },
            Preopen::TcpListen(addr) => Preopened::Listener(
                std::net::TcpListener::bind(addr)
                    .with_context(|| format!("cannot listen on {addr}"))?,
            ),
        });
    }
    Ok(WasiCtx::new(spec.args.clone(), spec.env.clone(), preopens)?
        .with_stdio(spec.stdio.clone())?
        .with_space_limit(spec.space_limit.clone()))
}

/// Runs a guest to completion on `store`. Descriptors it leaves open are closed at the end
/// (a store file's close makes its data durable), and its stdio let go of
/// ([`WasiCtx::release_stdio`]), even while a thread of it is still to stop.
pub fn run(engine: &Engine, module: &Module, spec: &GuestSpec, store: &Store) -> Result<GuestExit> {
    let wasi = Arc::new(wasi_context(spec, store)?);
    let mut linker: Linker<GuestState> = Linker::new(engine);
    wasi::add_to_linker(&mut linker)?;
    let threaded = is_threaded(module);
    // A metered guest keeps the epoch clock ticking while it runs.
    let budget = spec.cpu.clone().map(CpuBudget::new);
    let _ticking = budget.as_ref().map(|_| {
        epoch_clock::register(engine);
        epoch_clock::Running::start()
    });
    if threaded {
        linker
            .func_wrap(
                "wasi",
                "thread-spawn",
                |caller: wasmtime::Caller<'_, GuestState>, start_arg: i32| -> i32 {
                    match caller.data().threads.clone() {
                        Some(threads) => threads.spawn(start_arg),
                        None => -1,
                    }
                },
            )
            .map_err(|e| anyhow::anyhow!("linking thread-spawn: {e}"))?;
    }
    // Counted in the tenant's memory until this returns.
    let memory = spec.memory.as_ref().map(|account| account.guest());
    let run = if threaded { run_threaded } else { run_plain };
    let ran = run(
        engine,
        module,
        linker,
        spec,
        wasi.clone(),
        budget,
        memory.as_ref(),
    );
    if let Some(stop) = &spec.stop {
        stop.detach();
    }
    let end = match ran {
        Ok(end) => end,
        Err(e) => {
            wasi.end();
            wasi.release_stdio();
            return Err(e);
        }
    };
    wasi.end();
    match (wasi.close_all(), &end) {
        (Ok(()), _) => {}
        (Err(e), End::Code(0)) => bail!("closing the files the guest left open: errno {}", e.0),
        (Err(e), _) => {
            // The guest's own ending stands; its stderr (a container's log, under the node
            // agent) still says what was not made durable.
            let line = format!(
                "valet: closing the files the guest left open: errno {}: what it wrote to \
                 them since its last sync may be lost\n",
                e.0
            );
            let _ = wasi.stdio_write(2, line.as_bytes());
        }
    }
    if let (End::Trap(trap), true) = (&end, spec.trap_on_stderr) {
        // Through the context's stdio: a reader that does not read costs the write, not
        // a wait (the guest is ending, so a full pipe is given up on at once).
        let _ = wasi.stdio_write(2, format!("valet: guest trapped: {trap}\n").as_bytes());
    }
    wasi.release_stdio();
    Ok(match end {
        End::Code(code) => GuestExit::Code(code),
        End::Trap(text) => GuestExit::Trap(text),
    })
}

fn check_imports(linker: &mut Linker<GuestState>, module: &Module, spec: &GuestSpec) -> Result<()> {
    if spec.trap_unknown_imports {
        linker
            .define_unknown_imports_as_traps(module)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

fn instantiate_error(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("instantiating the guest: {}", trap_text(&e))
}

fn run_plain(
    engine: &Engine,
    module: &Module,
    mut linker: Linker<GuestState>,
    spec: &GuestSpec,
    wasi: Arc<WasiCtx>,
    budget: Option<Arc<CpuBudget>>,
    memory: Option<&Arc<GuestMemory>>,
) -> Result<End> {
    check_imports(&mut linker, module, spec)?;
    if let Some(stop) = &spec.stop {
        stop.attach(engine, &wasi, None);
    }
    let mut store = wasmtime::Store::new(engine, GuestState::new(wasi.clone(), MemRef::None));
    if let Some(limit) = spec.memory_limit {
        if let Some(ExternType::Memory(ty)) = module.get_export("memory") {
            fits(&ty, limit)?;
        }
    }
    if spec.memory_limit.is_some() || memory.is_some() {
        store.data_mut().limits = MemoryLimiter {
            limit: spec
                .memory_limit
                .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX)),
            gauge: memory.cloned(),
        };
        store.limiter(|state| &mut state.limits);
    }
    watch_epochs(&mut store, budget.as_ref());
    let instance = linker
        .instantiate(&mut store, module)
        .map_err(instantiate_error)?;
    if let Some(exported) = instance.get_memory(&mut store, "memory") {
        if let Some(gauge) = memory {
            gauge.locate(exported.data_ptr(&store));
        }
        store.data_mut().mem = MemRef::Plain(exported);
    }
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(|_| anyhow::anyhow!("the guest has no _start: is it a WASI command?"))?;
    let result = start.call(&mut store, ());
    // A guest stopped before it ended ends as stopped, even if `_start` then returned (a
    // wait it was in came back with EINTR, and it gave up): as a threaded guest does, where
    // the first end wins.
    let stopped = spec.stop.as_ref().and_then(|s| s.signal());
    match (wasi.end(), stopped) {
        (true, Some(signal)) => Ok(End::Code(128 + signal)),
        _ => Ok(end_of(result).unwrap_or_else(|| Stop::end(spec.stop.as_ref()))),
    }
}

const PAGE: u64 = 64 << 10;

/// Refuses a memory that starts over `limit` bytes, in the guest's terms.
fn fits(ty: &MemoryType, limit: u64) -> Result<()> {
    if ty.minimum() > limit / PAGE {
        bail!(
            "the guest's memory starts at {} bytes, over its limit of {limit} bytes",
            ty.minimum() * PAGE
        );
    }
    Ok(())
}

/// A shared memory's type with its maximum lowered to `limit` bytes: a shared memory grows
/// under no store's limiter, so its type is what bounds it.
fn capped(ty: &MemoryType, limit: u64) -> Result<MemoryType> {
    fits(ty, limit)?;
    let pages = limit / PAGE;
    let maximum = ty.maximum().map_or(pages, |m| m.min(pages));
    // Both fit u32: wasi-threads memories are 32-bit, with at most 65,536 pages.
    Ok(MemoryType::shared(ty.minimum() as u32, maximum as u32))
}

fn run_threaded(
    engine: &Engine,
    module: &Module,
    mut linker: Linker<GuestState>,
    spec: &GuestSpec,
    wasi: Arc<WasiCtx>,
    budget: Option<Arc<CpuBudget>>,
    memory: Option<&Arc<GuestMemory>>,
) -> Result<End> {
    let Some(import) = module
        .imports()
        .find(|i| matches!(i.ty(), ExternType::Memory(_)))
    else {
        bail!("a wasi-threads guest must import its shared memory");
    };
    let ExternType::Memory(ty) = import.ty() else {
        unreachable!()
    };
    if !ty.is_shared() {
        bail!("a wasi-threads guest must import a shared memory");
    }
    let ty = match spec.memory_limit {
        Some(limit) => capped(&ty, limit)?,
        None => ty,
    };
    let shared = SharedMemory::new(engine, ty)
        .map_err(|e| anyhow::anyhow!("the guest's shared memory: {e}"))?;
    if let Some(gauge) = memory {
        gauge.share(shared.clone());
    }
    let (mem_module, mem_name) = (import.module().to_string(), import.name().to_string());
    {
        let store = wasmtime::Store::new(engine, GuestState::new(wasi.clone(), MemRef::None));
        linker
            .define(&store, &mem_module, &mem_name, shared.clone())
            .map_err(|e| anyhow::anyhow!("the guest's shared memory: {e}"))?;
    }
    check_imports(&mut linker, module, spec)?;
    let threads = Arc::new(Threads {
        engine: engine.clone(),
        module: module.clone(),
        linker,
        memory: shared,
        wasi,
        next_tid: AtomicU32::new(1),
        running: AtomicU32::new(1),
        limit: spec.thread_limit.unwrap_or(u32::MAX),
        cpu: budget,
        end: Mutex::new(None),
        ended: Condvar::new(),
    });
    if let Some(stop) = &spec.stop {
        stop.attach(engine, &threads.wasi, Some(&threads));
    }
    let mut store = threads.new_store();
    let instance = threads
        .linker
        .instantiate(&mut store, module)
        .map_err(instantiate_error)?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(|_| anyhow::anyhow!("the guest has no _start: is it a WASI command?"))?;
    // The main thread runs on a thread of its own, so that whichever guest thread ends the
    // program first, this one sees it at once.
    let main = threads.clone();
    let started = std::thread::Builder::new()
        .name("guest-main".into())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            let result = start.call(&mut store, ());
            main.finish(end_of(result));
            drop(store);
            main.running.fetch_sub(1, Ordering::Release);
        });
    if let Err(e) = started {
        return Err(e).context("starting the guest's main thread");
    }
    let mut slot = threads.end.lock().unwrap_or_else(|p| p.into_inner());
    let end = loop {
        if let Some(end) = slot.take() {
            break end;
        }
        slot = threads.ended.wait(slot).unwrap_or_else(|p| p.into_inner());
    };
    drop(slot);
    threads.clone().wake_parked();
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threaded_modules_are_told_from_plain_ones_before_and_after_compiling() {
        let threaded = wat::parse_str(
            r#"(module
                 (import "wasi" "thread-spawn" (func (param i32) (result i32)))
                 (import "env" "memory" (memory 1 1 shared))
                 (func (export "_start")))"#,
        )
        .unwrap();
        // The same names in a data segment: a false positive of the byte search only.
        let plain = wat::parse_str(
            r#"(module
                 (memory 1)
                 (data (i32.const 0) "\04wasi\0cthread-spawn")
                 (func (export "_start")))"#,
        )
        .unwrap();
        assert!(may_spawn_threads(&threaded));
        assert!(may_spawn_threads(&plain));
        assert!(!may_spawn_threads(&wat::parse_str("(module)").unwrap()));
        let engine = engine(Stopping::NoChecks).unwrap();
        let path = Path::new("test.wasm");
        assert!(is_threaded(&compile(&engine, path, &threaded).unwrap()));
        assert!(!is_threaded(&compile(&engine, path, &plain).unwrap()));
    }
}
