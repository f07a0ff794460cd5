//! valet-run end to end: a real guest on a fresh device, exit codes, one-line errors.

use std::process::Command;

fn valet_run() -> Command {
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
}

#[test]
fn guest_round_trips_a_file_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = valet_run()
        .args(["--device"])
        .arg(dir.path())
        .args(["--zone-size", "16", "--zones", "16", "--stats"])
        .arg(valet_guests::HELLO_STORE)
        .arg("/data")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("hello, zones"), "{stdout}");
    assert!(stdout.contains("hello.txt"), "{stdout}");
    assert!(stderr.contains("WAF"), "stats summary on stderr: {stderr}");
    assert!(dir.path().join("zones.img").exists());
}

#[test]
fn our_failures_are_one_line_and_exit_125() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("bad.wasm");
    std::fs::write(&garbage, b"not wasm at all").unwrap();
    for app in [garbage.as_path(), std::path::Path::new("/no/such.wasm")] {
        let out = valet_run()
            .arg("--device")
            .arg(dir.path().join("dev"))
            .arg(app)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("valet-run: error: "), "{stderr}");
    }
}

#[test]
fn policy_given_as_a_missing_wasm_file_finds_the_builtin() {
    let dir = tempfile::tempdir().unwrap();
    let run = |policy: &str| {
        valet_run()
            .current_dir(dir.path())
            .arg("--device")
            .arg(dir.path().join("dev"))
            .args(["--zone-size", "16", "--zones", "16", "--policy", policy])
            .arg(valet_guests::HELLO_STORE)
            .arg("/data")
            .output()
            .unwrap()
    };
    // `rocks.wasm` does not exist here: the built-in rocks runs.
    let out = run("rocks.wasm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A name no built-in has stays an error that names the file.
    let out = run("nosuch.wasm");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("nosuch.wasm"), "{stderr}");
}

/// `--timeout` stops a guest that never makes a WASI call (only an epoch check can), and
/// leaves one that ends in time alone.
#[test]
fn timeout_stops_a_spinning_guest_and_spares_a_quick_one() {
    let dir = tempfile::tempdir().unwrap();
    let spin = dir.path().join("spin.wasm");
    std::fs::write(
        &spin,
        wat::parse_str(r#"(module (func (export "_start") (loop $l (br $l))))"#).unwrap(),
    )
    .unwrap();
    let quick = dir.path().join("quick.wasm");
    std::fs::write(
        &quick,
        wat::parse_str(
            r#"(module
                 (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
                 (func (export "_start") (call $exit (i32.const 7))))"#,
        )
        .unwrap(),
    )
    .unwrap();
    for (app, limit, code, says) in [(&spin, "300ms", 124, true), (&quick, "1h", 7, false)] {
        let out = valet_run()
            .arg("--device")
            .arg(dir.path().join("dev"))
            .args(["--zone-size", "16", "--zones", "16", "--timeout", limit])
            .arg(app)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{}: {stderr}", app.display());
        assert_eq!(stderr.contains("ran past --timeout"), says, "{stderr}");
    }
    for bad in ["0", "5x", "soon"] {
        let out = valet_run()
            .arg("--device")
            .arg(dir.path().join("dev"))
            .args(["--timeout", bad])
            .arg(&quick)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "--timeout {bad}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("--timeout"), "{stderr}");
    }
}
