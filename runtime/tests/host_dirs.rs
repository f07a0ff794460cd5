//! Plain host directories (`--dir HOST::GUEST`) served by our WASIp1 layer: a guest writes,
//! renames into place and syncs the directory (a real fsync of the host directory, where
//! stock wasmtime says EBADF), and the host sees the result.

use std::process::Command;

/// In the host preopen (fd 4; the store is fd 3): create `tmp`, write "durable", close, rename `tmp` -> `final`,
/// open `.` as a directory and `fd_sync` it, `fd_datasync` the preopen itself and set its
/// times to now. Exit code:
/// the first failing step's number times 100 plus its errno, or 0.
const GUEST: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_sync" (func $sync (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_datasync" (func $datasync (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_rename"
    (func $rename (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_set_times"
    (func $times (param i32 i64 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "tmp")
  (data (i32.const 8) "final")
  (data (i32.const 16) ".")
  (data (i32.const 24) "durable")
  (func $check (param $step i32) (param $e i32)
    (if (local.get $e)
      (then (call $exit (i32.add (i32.mul (local.get $step) (i32.const 100)) (local.get $e))))))
  (func (export "_start") (local $fd i32)
    (call $check (i32.const 1) (call $open (i32.const 4) (i32.const 1) (i32.const 0) (i32.const 3)
      (i32.const 1) (i64.const 64) (i64.const 64) (i32.const 0) (i32.const 64)))
    (local.set $fd (i32.load (i32.const 64)))
    (i32.store (i32.const 72) (i32.const 24))
    (i32.store (i32.const 76) (i32.const 7))
    (call $check (i32.const 2) (call $write (local.get $fd) (i32.const 72) (i32.const 1) (i32.const 80)))
    (call $check (i32.const 3) (call $close (local.get $fd)))
    (call $check (i32.const 4) (call $rename (i32.const 4) (i32.const 0) (i32.const 3)
      (i32.const 4) (i32.const 8) (i32.const 5)))
    ;; path_open(4, follow, ".", DIRECTORY, no rights)
    (call $check (i32.const 5) (call $open (i32.const 4) (i32.const 1) (i32.const 16) (i32.const 1)
      (i32.const 2) (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 64)))
    (call $check (i32.const 6) (call $sync (i32.load (i32.const 64))))
    (call $check (i32.const 7) (call $datasync (i32.const 4)))
    ;; fd_filestat_set_times(4, 0, 0, ATIM_NOW|MTIM_NOW) on the preopen itself
    (call $check (i32.const 8) (call $times (i32.const 4) (i64.const 0) (i64.const 0) (i32.const 10)))
    (call $exit (i32.const 0))))"#;

#[test]
fn a_guest_renames_into_place_and_syncs_a_host_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let app = tmp.path().join("app.wasm");
    std::fs::write(&app, wat::parse_str(GUEST).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(tmp.path().join("dev"))
        .args([
            "--zone-size",
            "16",
            "--zones",
            "16",
            "--mount",
            "/data",
            "--dir",
        ])
        .arg(format!("{}::/h", host.display()))
        .arg(&app)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(host.join("final")).unwrap(),
        "durable"
    );
    assert!(!host.join("tmp").exists());
}

// The guests below run in this process (`host::run`), with one host directory preopened at
// fd 3 and nothing else.

use std::path::Path;
use std::sync::Arc;

use valet_runtime::host::{self, GuestExit, GuestSpec, Preopen};
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Store, StoreConfig};

/// What every guest imports, and `$check`: exit with the step's number times 100 plus its
/// errno when the errno is not 0.
const IMPORTS: &str = r#"
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_seek" (func $seek (param i32 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_allocate"
    (func $allocate (param i32 i64 i64) (result i32)))
  (import "wasi_snapshot_preview1" "fd_fdstat_get" (func $fdstat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_get"
    (func $filestat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_filestat_get"
    (func $pathstat (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func $check (param $step i32) (param $e i32)
    (if (local.get $e)
      (then (call $exit (i32.add (i32.mul (local.get $step) (i32.const 100)) (local.get $e))))))
"#;

/// Runs the guest whose data and `_start` are `rest` with `host` preopened at fd 3 (`/h`);
/// returns its exit code.
fn run_in(host: &Path, rest: &str) -> i32 {
    let geometry = Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 8,
        max_active: 8,
    };
    let device = Arc::new(MemoryDevice::new(geometry).unwrap()) as Arc<dyn ZonedDevice>;
    let store = Store::open(device, StoreConfig::default()).unwrap();
    let engine = host::engine(host::Stopping::NoChecks).unwrap();
    let wat = format!("(module {IMPORTS} {rest})");
    let module = wasmtime::Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
    let spec = GuestSpec {
        args: vec!["guest".into()],
        preopens: vec![Preopen::Host {
            host_path: host.to_path_buf(),
            guest_path: "/h".into(),
        }],
        ..GuestSpec::default()
    };
    match host::run(&engine, &module, &spec, &store).unwrap() {
        GuestExit::Code(code) => code,
        other => panic!("{other:?}"),
    }
}

/// Opens `f` (100 bytes) read-only and asks `fd_allocate` for its first 10 bytes: EBADF
/// (8), as posix_fallocate says for a descriptor not open for writing, even though the
/// file is already that large (it used to say OK).
#[test]
fn fd_allocate_on_a_read_only_host_file_is_ebadf() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), [1u8; 100]).unwrap();
    let code = run_in(
        tmp.path(),
        r#"(data (i32.const 0) "f")
  (func (export "_start")
    ;; path_open(3, follow, "f", 0, FD_READ, FD_READ, 0, &fd at 64)
    (call $check (i32.const 1) (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1)
      (i32.const 0) (i64.const 2) (i64.const 2) (i32.const 0) (i32.const 64)))
    (call $exit (call $allocate (i32.load (i32.const 64)) (i64.const 0) (i64.const 10))))"#,
    );
    assert_eq!(code, 8, "want EBADF");
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 100);
}
