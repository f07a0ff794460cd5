//! Stock wasmtime WASI (wasmtime-wasi 48's preview1, the same wasmtime release as valet-run):
//! what a user runs without Valet. Differential tests and the comparison report run guests
//! with plain host directories preopened through it.

use std::path::Path;

use wasmtime::{Engine, Linker, Module, Store};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

/// How a guest run under stock WASI ended.
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `module` with `args` (starting with the program name) and each `(host, guest)`
/// directory preopened with every permission.
pub fn run(module: &str, args: &[&str], dirs: &[(&Path, &str)]) -> Output {
    let engine = Engine::default();
    let module = Module::from_file(&engine, module).expect("loading the guest");
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    p1::add_to_linker_sync(&mut linker, |t| t).expect("linking WASI");
    // A bound, not an allocation: the long mode's transcripts run past 64 MiB (6,000
    // `fsrandom` seeds write about 72 MB), and a full pipe is an EIO the guest panics on.
    let stdout = MemoryOutputPipe::new(1 << 30);
    let stderr = MemoryOutputPipe::new(1 << 20);
    let mut builder = WasiCtxBuilder::new();
    // File calls run on this thread, not bounced through tokio's blocking pool: what the
    // `wasmtime run` CLI does, and the fair baseline for a synchronous embedder.
    builder
        .allow_blocking_current_thread(true)
        .args(args)
        .stdout(stdout.clone())
        .stderr(stderr.clone());
    for (host, guest) in dirs {
        builder
            .preopened_dir(host, guest, FsPerms::ReadWrite)
            .expect("preopening a host directory");
    }
    let mut store = Store::new(&engine, builder.build_p1());
    let instance = linker
        .instantiate(&mut store, &module)
        .expect("instantiating the guest");
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .expect("the guest has a _start");
    let mut trap = String::new();
    let code = match start.call(&mut store, ()) {
        Ok(()) => 0,
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => exit.0,
            // A trap: exit code and message as valet-run gives them.
            None => {
                trap = format!("guest trapped: {e:?}\n");
                134
            }
        },
    };
    drop(store);
    Output {
        code,
        stdout: String::from_utf8_lossy(&stdout.contents()).into_owned(),
        stderr: String::from_utf8_lossy(&stderr.contents()).into_owned() + &trap,
    }
}
