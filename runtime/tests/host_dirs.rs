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
