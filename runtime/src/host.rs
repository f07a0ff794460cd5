//! Running one guest: a wasmtime engine, a WASIp1 context whose preopened directories are
//! the store (and any plain host directories), and wasi-threads for guests built for
//! `wasm32-wasip1-threads`.
//!
//! Threads (wasmtime-wasi-threads 36): every `wasi::thread-spawn` starts an OS thread with a
//! new wasmtime store and instance on the guest's shared memory; the [`WasiCtx`] (its fd
//! table and preopens) is shared, so descriptors work across threads. Limits:
//! - a trap or `proc_exit` in a *spawned* thread ends the whole host process at once
//!   (`std::process::exit`, code 1 or the `proc_exit` code): no final store sync, no
//!   `--stats`, and with `--tenants` every other tenant dies too. Data the guest had
//!   fsynced is durable (the store's guarantee); anything else is lost as in a crash.
//!   A trap or exit in the main thread is reported normally.
//! - when `_start` returns, threads still running are cut off (as a native process's are).
//! - nothing bounds how many threads a guest spawns (one OS thread each).
//! - store calls run under the store's one lock, so threads' file I/O does not overlap.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use valet_vfs::{Ino, Store};
use wasi_common::sync::{ambient_authority, Dir, WasiCtxBuilder};
use wasi_common::{I32Exit, WasiCtx};
use wasmtime::{Cache, CacheConfig, Config, Engine, Linker, Module};
use wasmtime_wasi_threads::WasiThreadsCtx;

use crate::wasi_fs::{self, VfsDir};

/// A directory the guest sees.
#[derive(Clone)]
pub enum Preopen {
    /// A directory of the store (a tenant's root, usually).
    Store { ino: Ino, guest_path: String },
    /// A plain host directory (`--dir HOST::GUEST`), served by wasi-common's cap-std files.
    Host {
        host_path: PathBuf,
        guest_path: String,
    },
}

/// Everything one guest runs with.
#[derive(Clone)]
pub struct GuestSpec {
    /// argv, starting with the program name.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub preopens: Vec<Preopen>,
}

/// How a guest ended.
#[derive(Debug)]
pub enum GuestExit {
    /// `_start` returned or the guest called `proc_exit`.
    Code(i32),
    /// The guest trapped (a bug or abort in the guest, not ours).
    Trap(anyhow::Error),
}

/// Per-instance host state: the WASI context, shared by the threads of one guest.
#[derive(Clone)]
struct Host {
    wasi: WasiCtx,
    threads: Option<Arc<WasiThreadsCtx<Host>>>,
}

/// An engine able to run both plain and threaded WASIp1 guests.
///
/// Compiled modules are cached on disk (wasmtime's cache, in the user's cache directory), as
/// the wasmtime CLI does: a large guest (LevelDB, a Go program) compiles once, not at every
/// start. Without a usable cache directory the engine simply compiles every time.
pub fn engine() -> Result<Engine> {
    let mut config = Config::new();
    config.wasm_threads(true);
    config.cache(Cache::new(CacheConfig::new()).ok());
    Engine::new(&config).context("creating the wasmtime engine")
}

/// Compiles a guest module, with a message that names the file.
pub fn load(engine: &Engine, path: &Path) -> Result<Module> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Module::new(engine, &bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a valid WebAssembly module: {e:#}", path.display()))
}

fn imports_thread_spawn(module: &Module) -> bool {
    module
        .imports()
        .any(|i| i.module() == "wasi" && i.name() == "thread-spawn")
}

fn wasi_context(spec: &GuestSpec, store: &Store) -> Result<WasiCtx> {
    let mut builder = WasiCtxBuilder::new();
    builder.inherit_stdio();
    builder.args(&spec.args).context("guest arguments")?;
    builder.envs(&spec.env).context("guest environment")?;
    let wasi = builder.build();
    for preopen in &spec.preopens {
        match preopen {
            Preopen::Store { ino, guest_path } => {
                let dir = VfsDir::new(store.clone(), *ino);
                wasi.push_preopened_dir(Box::new(dir), guest_path)
                    .with_context(|| format!("preopening {guest_path}"))?;
            }
            Preopen::Host {
                host_path,
                guest_path,
            } => {
                let dir =
                    Dir::open_ambient_dir(host_path, ambient_authority()).with_context(|| {
                        format!("cannot open host directory {}", host_path.display())
                    })?;
                let dir = wasi_common::sync::dir::Dir::from_cap_std(dir);
                wasi.push_preopened_dir(Box::new(dir), guest_path)
                    .with_context(|| format!("preopening {guest_path}"))?;
            }
        }
    }
    Ok(wasi)
}

/// Runs a guest to completion on `store`.
pub fn run(engine: &Engine, module: &Module, spec: &GuestSpec, store: &Store) -> Result<GuestExit> {
    let wasi = wasi_context(spec, store)?;
    let mut linker: Linker<Host> = Linker::new(engine);
    wasi_common::sync::add_to_linker(&mut linker, |h: &mut Host| &mut h.wasi)?;
    wasi_fs::shadow_calls(&mut linker, |h: &mut Host| &mut h.wasi, Some(store.clone()))?;
    let mut wstore = wasmtime::Store::new(
        engine,
        Host {
            wasi,
            threads: None,
        },
    );
    if imports_thread_spawn(module) {
        wasmtime_wasi_threads::add_to_linker(&mut linker, &wstore, module, |h: &mut Host| {
            h.threads
                .as_ref()
                .expect("threads context set before start")
        })?;
        let threads = WasiThreadsCtx::new(module.clone(), Arc::new(linker.clone()))?;
        wstore.data_mut().threads = Some(Arc::new(threads));
    } else if module
        .imports()
        .any(|i| i.module() == "wasi" && i.name() != "thread-spawn")
    {
        bail!("module imports from \"wasi\" something other than thread-spawn");
    }
    let instance = linker
        .instantiate(&mut wstore, module)
        .context("instantiating the guest")?;
    let start = instance
        .get_typed_func::<(), ()>(&mut wstore, "_start")
        .context("the guest has no _start: is it a WASI command?")?;
    Ok(match start.call(&mut wstore, ()) {
        Ok(()) => GuestExit::Code(0),
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => GuestExit::Code(exit.0),
            None => GuestExit::Trap(e),
        },
    })
}
