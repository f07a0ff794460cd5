//! `--tcplisten ADDR`: a listener preopened for the guest (after the directories, as
//! `wasmtime run` does). The guest (WAT) accepts one connection, receives four bytes (all of
//! them: `RECV_WAITALL`), answers with them reversed, and shuts the connection down.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// fd 3 is the store, fd 4 the listener.
const GUEST: &str = r#"(module
  (import "wasi_snapshot_preview1" "sock_accept" (func $accept (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_recv"
    (func $recv (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_send" (func $send (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_shutdown" (func $shutdown (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func $check (param $step i32) (param $e i32)
    (if (local.get $e)
      (then (call $exit (i32.add (i32.mul (local.get $step) (i32.const 10)) (local.get $e))))))
  (func (export "_start") (local $fd i32) (local $n i32) (local $i i32)
    (call $check (i32.const 1) (call $accept (i32.const 4) (i32.const 0) (i32.const 0)))
    (local.set $fd (i32.load (i32.const 0)))
    ;; one iovec at 16 -> buffer at 64, 4 bytes
    (i32.store (i32.const 16) (i32.const 64))
    (i32.store (i32.const 20) (i32.const 4))
    (call $check (i32.const 2) (call $recv (local.get $fd) (i32.const 16) (i32.const 1)
      (i32.const 2) (i32.const 24) (i32.const 28)))
    (local.set $n (i32.load (i32.const 24)))
    ;; reverse the n bytes into 128
    (block $done (loop $rev
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (i32.store8 (i32.add (i32.const 128) (local.get $i))
        (i32.load8_u (i32.add (i32.const 64)
          (i32.sub (i32.sub (local.get $n) (i32.const 1)) (local.get $i)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rev)))
    (i32.store (i32.const 32) (i32.const 128))
    (i32.store (i32.const 36) (local.get $n))
    (call $check (i32.const 3) (call $send (local.get $fd) (i32.const 32) (i32.const 1)
      (i32.const 0) (i32.const 40)))
    (call $check (i32.const 4) (call $shutdown (local.get $fd) (i32.const 3)))
    (call $exit (i32.const 0))))"#;

#[test]
fn a_guest_accepts_on_a_preopened_listener() {
    let tmp = tempfile::tempdir().unwrap();
    let app = tmp.path().join("app.wasm");
    std::fs::write(&app, wat::parse_str(GUEST).unwrap()).unwrap();
    // A free loopback port (released just before valet-run binds it).
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(tmp.path().join("dev"))
        .args(["--zone-size", "16", "--zones", "16", "--tcplisten"])
        .arg(addr.to_string())
        .arg(&app)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut conn = loop {
        match TcpStream::connect(addr) {
            Ok(c) => break c,
            Err(_) if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("valet-run never listened on {addr}: {e}"),
        }
    };
    // In two parts: the guest's RECV_WAITALL waits for all four bytes.
    conn.write_all(b"ab").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    conn.write_all(b"cd").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(answer, "dcba");
}
