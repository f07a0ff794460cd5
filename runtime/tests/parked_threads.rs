//! A wasi-threads guest whose thread is parked in `memory.atomic.wait32` with no timeout
//! when the guest ends: the thread is woken and ends (it used to stay parked until the
//! process exited, an OS thread and the guest's shared memory kept for nothing in the
//! long-running node agent). One test in this binary, so the threads it counts are its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use valet_runtime::host::{self, GuestExit, GuestSpec, Stopping};
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Store, StoreConfig};

/// `_start` spawns a thread that says it runs, then waits on an address nobody notifies,
/// again and again (as an idle pthread does on its condition variable); `_start` returns
/// once the thread runs, which ends the guest (exit 0).
const PARKS_A_THREAD: &str = r#"(module
  (import "wasi" "thread-spawn" (func $spawn (param i32) (result i32)))
  (import "env" "memory" (memory 1 1 shared))
  (func (export "wasi_thread_start") (param $tid i32) (param $arg i32)
    (i32.atomic.store (i32.const 0) (i32.const 1))
    (loop $park
      (drop (memory.atomic.wait32 (i32.const 64) (i32.const 0) (i64.const -1)))
      (br $park)))
  (func (export "_start")
    (if (i32.lt_s (call $spawn (i32.const 0)) (i32.const 0)) (then unreachable))
    (loop $until_it_runs
      (br_if $until_it_runs (i32.eqz (i32.atomic.load (i32.const 0)))))))"#;

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn a_thread_parked_with_no_timeout_ends_after_its_guest() {
    let geometry = Geometry {
        zone_count: 12,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 6,
        max_active: 8,
    };
    let device = Arc::new(MemoryDevice::new(geometry).unwrap()) as Arc<dyn ZonedDevice>;
    let store = Store::open(device, StoreConfig::default()).unwrap();
    let engine = host::engine(Stopping::EpochChecks).unwrap();
    let module = wasmtime::Module::new(&engine, wat::parse_str(PARKS_A_THREAD).unwrap()).unwrap();
    let spec = GuestSpec {
        args: vec!["parks".into()],
        ..GuestSpec::default()
    };
    match host::run(&engine, &module, &spec, &store).unwrap() {
        GuestExit::Code(0) => {}
        other => panic!("{other:?}"),
    }
    let ended = Instant::now();
    while threads_named("guest-thread") > 0 {
        assert!(
            ended.elapsed() < Duration::from_secs(10),
            "the parked thread is still there {:?} after its guest ended",
            ended.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Not before the grace its guest's threads have to end by themselves.
    assert!(
        ended.elapsed() >= host::PARKED_GRACE / 2,
        "{:?}",
        ended.elapsed()
    );
}

/// What waking every waiter costs: one `atomic_notify` per 4-byte-aligned address, as
/// the agent does for an ended guest with threads still parked. Run by hand:
/// `cargo test -p valet-runtime --test parked_threads -- --ignored --nocapture`.
#[test]
#[ignore]
fn the_cost_of_notifying_every_address() {
    let engine = host::engine(Stopping::EpochChecks).unwrap();
    for mib in [64u32, 512] {
        let pages = mib * 16;
        let memory =
            wasmtime::SharedMemory::new(&engine, wasmtime::MemoryType::shared(pages, pages))
                .unwrap();
        let start = Instant::now();
        let size = memory.data_size() as u64;
        for addr in (0..size).step_by(4) {
            memory.atomic_notify(addr, u32::MAX).unwrap();
        }
        println!("{mib} MiB: {:?}", start.elapsed());
    }
}
