//! WASI file writes from a guest: `valet-run`'s host on the zoned store versus stock wasmtime
//! WASI on a host directory of the same disk, in one criterion run.
//!
//!     cargo bench -p valet-benches --bench wasi_write
//!
//! Cases (one criterion group each, `store` and `stock` in every group):
//!
//! - `fd_write/16B`, `fd_write/64B`, `fd_write/4KiB`: one `fd_write` of that many bytes per
//!   iteration to an open file, no sync (the file wraps to offset 0 every 8 MiB, in the loop).
//!   The target for 16 B through our adapter is ≤ 250 ns.
//! - `create_write_fsync_close/4KiB`: per iteration, create a new file, write 4 KiB, `fsync`,
//!   close. The files are removed after the loop, outside the measurement.
//! - `stat_missing_depth150`: per iteration, one stat of a missing file (ENOENT) from a guest
//!   150 calls deep, on the store, with `RUST_BACKTRACE=1` and `=0` in the environment. An
//!   errno must cost the same either way (no error object, no backtrace). std reads
//!   `RUST_BACKTRACE` once per process, so each sample runs in a child process (this
//!   executable again, with `WASI_WRITE_CHILD` set); the figure is still the guest's own loop.
//!
//! `store` is `valet_runtime::host::run` in-process on a store mounted from an `ImageDevice`
//! (+ conventional area) in a temp directory, as `valet-run` does; `stock` is wasmtime-wasi 48
//! `preview1` with the same temp directory's sibling preopened, the same engine and the same
//! compiled module. Stock runs with `allow_blocking_current_thread(true)`, as embedders that
//! run WASI synchronously do, so its file calls are not bounced through tokio's blocking pool.
//!
//! How per-operation cost is measured: the guest (`guests/programs/src/bin/write_bench.rs`)
//! times only its loop with the WASI monotonic clock and writes the nanoseconds to a file in
//! a preopened host directory. The benchmarks use criterion's `iter_custom`: for a sample of
//! N iterations the host runs one fresh instance with COUNT = N and returns the guest's own
//! loop time, so instantiation, opening the file, the final close (which on the store makes
//! the data durable) and clean-up are never in the figure, and criterion's linear sampling
//! (N, 2N, ... per sample) turns the loop times into a per-operation slope. Clock reads cost
//! two host calls per sample, nothing per operation. Before every sample the host calls
//! `sync(2)` (unmeasured), so no sample pays for the writeback of data an earlier one left
//! dirty in the page cache.
//!
//! The figures are wall-clock time measured inside the guest: on a shared machine, other
//! load shows up in them (`nice -n -20 cargo bench ...` helps).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use valet_runtime::device::DeviceSpec;
use valet_runtime::host::{self, GuestExit, GuestSpec, Preopen};
use valet_vfs::device::{Geometry, IoMode};
use valet_vfs::Store;
use wasmtime::{Engine, Linker, Module};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

const MIB: u64 = 1 << 20;

/// Room for the 8 MiB wrapping file many times over and a few thousand small files.
fn geometry() -> Geometry {
    Geometry {
        zone_count: 64,
        zone_size: 64 * MIB,
        zone_capacity: 64 * MIB,
        block_size: 4096,
        max_open: 14,
        max_active: 14,
    }
}

/// Everything both hosts share: the engine, the compiled guest and the directories.
struct Bench {
    engine: Engine,
    module: Module,
    _tmp: tempfile::TempDir,
    /// The stock host's preopened `/data`.
    stock_dir: PathBuf,
    /// Where the guest writes its loop time (`/out`, a plain host directory for both).
    out_dir: PathBuf,
    store: Store,
    store_root: valet_vfs::Ino,
}

impl Bench {
    fn new() -> Result<Bench> {
        let tmp = tempfile::tempdir()?;
        let engine = host::engine(host::Stopping::EpochChecks)?;
        let module = host::load(&engine, Path::new(valet_guests::WRITE_BENCH))?;
        let stock_dir = tmp.path().join("stock");
        let out_dir = tmp.path().join("out");
        std::fs::create_dir_all(&stock_dir)?;
        std::fs::create_dir_all(&out_dir)?;
        let spec = DeviceSpec {
            dir: tmp.path().join("device"),
            zonefs: None,
            zonefs_capacity: None,
            fdp: None,
            geometry: geometry(),
            io: IoMode::Auto,
            writeback: Some(valet_runtime::device::DEFAULT_WRITEBACK),
            handoff: Some(valet_runtime::device::DEFAULT_HANDOFF),
        };
        let store = spec.mount()?;
        let (_, store_root) = store.tenant("bench")?;
        Ok(Bench {
            engine,
            module,
            _tmp: tmp,
            stock_dir,
            out_dir,
            store,
            store_root,
        })
    }

    fn args(mode: &str, size: usize, count: u64) -> Vec<String> {
        [
            "write_bench",
            mode,
            &size.to_string(),
            &count.to_string(),
            "/data",
            "/out/ns",
        ]
        .map(String::from)
        .to_vec()
    }

    /// The loop time the guest reported.
    fn loop_time(&self) -> Result<Duration> {
        let path = self.out_dir.join("ns");
        let text = std::fs::read_to_string(&path).context("the guest's loop time")?;
        std::fs::remove_file(&path)?;
        Ok(Duration::from_nanos(text.trim().parse()?))
    }

    fn run_store(&self, mode: &str, size: usize, count: u64) -> Result<Duration> {
        let spec = self.store_spec(mode, size, count);
        match host::run(&self.engine, &self.module, &spec, &self.store)? {
            GuestExit::Code(0) => self.loop_time(),
            other => bail!("write_bench on the store: {other:?}"),
        }
    }

    fn store_spec(&self, mode: &str, size: usize, count: u64) -> GuestSpec {
        GuestSpec {
            args: Self::args(mode, size, count),
            env: Vec::new(),
            preopens: vec![
                Preopen::Store {
                    ino: self.store_root,
                    guest_path: "/data".into(),
                },
                Preopen::Host {
                    host_path: self.out_dir.clone(),
                    guest_path: "/out".into(),
                },
            ],
            trap_unknown_imports: false,
            ..GuestSpec::default()
        }
    }

    fn run_stock(&self, mode: &str, size: usize, count: u64) -> Result<Duration> {
        let mut linker: Linker<WasiP1Ctx> = Linker::new(&self.engine);
        p1::add_to_linker_sync(&mut linker, |t| t).map_err(anyhow::Error::from)?;
        let mut builder = WasiCtxBuilder::new();
        // Set before the preopens, which copy it.
        builder.allow_blocking_current_thread(true);
        builder.inherit_stderr();
        builder.args(&Self::args(mode, size, count));
        builder
            .preopened_dir(&self.stock_dir, "/data", FsPerms::ReadWrite)
            .map_err(anyhow::Error::from)?;
        builder
            .preopened_dir(&self.out_dir, "/out", FsPerms::ReadWrite)
            .map_err(anyhow::Error::from)?;
        let mut store = wasmtime::Store::new(&self.engine, builder.build_p1());
        // The shared engine interrupts on epochs (valet-run stops a threaded guest's
        // threads that way); stock's store never asks to be interrupted.
        store.set_epoch_deadline(u64::MAX);
        let instance = linker
            .instantiate(&mut store, &self.module)
            .map_err(anyhow::Error::from)?;
        let start = instance
            .get_typed_func::<(), ()>(&mut store, "_start")
            .map_err(anyhow::Error::from)?;
        match start.call(&mut store, ()) {
            Ok(()) => {}
            Err(e) => match e.downcast_ref::<I32Exit>() {
                Some(I32Exit(0)) => {}
                _ => bail!("write_bench on stock WASI: {e:?}"),
            },
        }
        self.loop_time()
    }
}

/// Writes back every dirty page of the machine, so that one case does not pay for the
/// writeback of another's data (called between samples, outside the measurement).
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn wasi_write(c: &mut Criterion) {
    let bench = Bench::new().expect("setting up the benchmark");
    // One instance per sample: make sure both paths work before criterion starts counting.
    bench.run_store("write", 16, 10).expect("store smoke run");
    bench.run_stock("write", 16, 10).expect("stock smoke run");

    let mut group = c.benchmark_group("fd_write");
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(30);
    for (size, label) in [(16, "16B"), (64, "64B"), (4096, "4KiB")] {
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new("store", label), |b| {
            b.iter_custom(|n| {
                settle();
                bench.run_store("write", size, n).expect("store run")
            })
        });
        group.bench_function(BenchmarkId::new("stock", label), |b| {
            b.iter_custom(|n| {
                settle();
                bench.run_stock("write", size, n).expect("stock run")
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("create_write_fsync_close");
    group.measurement_time(Duration::from_secs(6));
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("store", "4KiB"), |b| {
        b.iter_custom(|n| {
            settle();
            bench.run_store("files", 4096, n).expect("store run")
        })
    });
    group.bench_function(BenchmarkId::new("stock", "4KiB"), |b| {
        b.iter_custom(|n| {
            settle();
            bench.run_stock("files", 4096, n).expect("stock run")
        })
    });
    group.finish();

    let report = bench.store.fsck().expect("fsck");
    assert!(report.is_clean(), "fsck after the benchmark: {report:?}");
}

/// The child of `stat_missing_depth150`: one store run of `statmiss` with COUNT stats, its
/// loop time in nanoseconds on stdout.
fn child(count: u64) -> Result<()> {
    let bench = Bench::new()?;
    let spec = bench.store_spec("statmiss", 150, count);
    match host::run(&bench.engine, &bench.module, &spec, &bench.store)? {
        GuestExit::Code(0) => println!("{}", bench.loop_time()?.as_nanos()),
        other => bail!("write_bench statmiss: {other:?}"),
    }
    Ok(())
}

fn stat_missing(c: &mut Criterion) {
    let exe = std::env::current_exe().expect("this executable");
    let run = |backtrace: &str, n: u64| -> Duration {
        let out = std::process::Command::new(&exe)
            .env("WASI_WRITE_CHILD", n.to_string())
            .env("RUST_BACKTRACE", backtrace)
            .output()
            .expect("running the child");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Duration::from_nanos(text.trim().parse().expect("the child's loop time"))
    };
    let mut group = c.benchmark_group("stat_missing_depth150");
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    for (label, value) in [("backtrace_off", "0"), ("backtrace_on", "1")] {
        group.bench_function(BenchmarkId::new("store", label), |b| {
            b.iter_custom(|n| run(value, n))
        });
    }
    group.finish();
}

criterion_group!(benches, wasi_write, stat_missing);

fn main() {
    if let Ok(count) = std::env::var("WASI_WRITE_CHILD") {
        let count = count.parse().expect("WASI_WRITE_CHILD is a count");
        if let Err(e) = child(count) {
            eprintln!("wasi_write child: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
