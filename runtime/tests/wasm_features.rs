//! Guests wasmtime 36 could not run: the exception-handling proposal (`try_table`, `throw`),
//! and modules with imports nothing provides (`--trap-unknown-imports`). The guests are
//! hand-written WAT, so each test says exactly what it exercises.

use std::path::Path;
use std::process::{Command, Output};

fn run(dir: &Path, wat: &str, extra: &[&str]) -> Output {
    let app = dir.join("app.wasm");
    std::fs::write(&app, wat::parse_str(wat).unwrap()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(dir.join("dev"))
        .args(["--zone-size", "16", "--zones", "16"])
        .args(extra)
        .arg(&app)
        .output()
        .unwrap()
}

/// Throws a tag carrying 42 two calls deep, catches it in `_start`, exits with the
/// payload; uncaught (`catch` off), the exception ends the guest as a trap.
fn thrower(catch: bool) -> String {
    let body = if catch {
        "(block $caught (result i32)
           (try_table (catch $e $caught) (call $outer (i32.const 42)))
           (i32.const 1))
         (call $exit)"
    } else {
        "(call $outer (i32.const 42))"
    };
    format!(
        r#"(module
          (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
          (tag $e (param i32))
          (func $inner (param i32) (throw $e (local.get 0)))
          (func $outer (param i32) (call $inner (local.get 0)))
          (func (export "_start") {body}))"#
    )
}

#[test]
fn exception_handling_guests_load_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(tmp.path(), &thrower(true), &[]);
    assert_eq!(
        out.status.code(),
        Some(42),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(tmp.path(), &thrower(false), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(134), "{stderr}");
    assert!(stderr.contains("guest trapped"), "{stderr}");
}

/// Imports `env.missing`; calls it when `call` is set, else exits with 3.
fn importer(call: bool) -> String {
    let body = if call {
        "(call $missing)"
    } else {
        "(call $exit (i32.const 3))"
    };
    format!(
        r#"(module
          (import "env" "missing" (func $missing))
          (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
          (func (export "_start") {body}))"#
    )
}

#[test]
fn unknown_imports_refuse_the_module_or_trap_when_called() {
    let tmp = tempfile::tempdir().unwrap();
    // Without the option: refused before it runs, in one line that names the import.
    let out = run(tmp.path(), &importer(false), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("missing"), "{stderr}");

    // With it: runs while the import is not called...
    let out = run(tmp.path(), &importer(false), &["--trap-unknown-imports"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    // ...and a call traps, naming it.
    let out = run(tmp.path(), &importer(true), &["--trap-unknown-imports"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(134), "{stderr}");
    assert!(stderr.contains("env::missing"), "{stderr}");
}
