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

/// Bad apps, policies and options: one line, exit 125, and no store made on disk (a store
/// made by a mistake would keep the geometry of that command, not the next one's).
#[test]
fn our_failures_are_one_line_and_exit_125() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("bad.wasm");
    std::fs::write(&garbage, b"not wasm at all").unwrap();
    let garbage = garbage.to_str().unwrap();
    let good = valet_guests::HELLO_STORE;
    let missing = dir.path().join("missing");
    let missing_dir = format!("{}::/x", missing.display());
    let missing_trace = missing.join("t.jsonl");
    let missing_trace = missing_trace.to_str().unwrap();
    let cases: [(&str, &[&str], &str); 11] = [
        (garbage, &[], "not a valid WebAssembly module"),
        ("/no/such.wasm", &[], "/no/such.wasm"),
        (good, &["--policy", "nosuch"], "no policy named nosuch"),
        (good, &["--policy", "/no/such.wasm"], "cannot read policy"),
        (good, &["--policy", garbage], "policy bad: not a valid"),
        (good, &["--policy", good], "a policy may import nothing"),
        (good, &["--dir", &missing_dir], "cannot open host directory"),
        (good, &["--env", "NOVALUE"], "--env NOVALUE: expected K=V"),
        (good, &["--admin", "8.8.8.8:9"], "loopback addresses only"),
        (good, &["--record-trace", missing_trace], "creating trace"),
        (good, &["--zones", "3"], "the store needs at least 4"),
    ];
    for (app, options, what) in cases {
        let out = valet_run()
            .arg("--device")
            .arg(dir.path().join("dev"))
            .args(options)
            .arg(app)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("valet-run: error: "), "{stderr}");
        assert!(stderr.contains(what), "expected {what:?}: {stderr}");
        let made = dir.path().join("dev").exists();
        assert!(!made, "{app} {options:?} made a store");
    }
    // The node agent too.
    let out = valet_run()
        .args(["node", "--admin", "nonsense", "--device"])
        .arg(dir.path().join("dev"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("--admin nonsense"), "{stderr}");
    assert!(!dir.path().join("dev").exists(), "the agent made a store");
}

/// A guest that fills the device: its sync gets ENOSPC, the error names the room the data
/// has, and `--stats` is still printed although the exit sync fails too (the guest's last
/// file cannot fit).
#[test]
fn a_full_device_is_reported_with_the_stats() {
    let dir = tempfile::tempdir().unwrap();
    let out = valet_run()
        .arg("--device")
        .arg(dir.path())
        .args(["--zone-size", "1", "--zones", "6", "--stats"])
        .arg(valet_guests::WRITE_BENCH)
        .args(["files", "262144", "64", "/data"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("WAF"), "stats summary on stderr: {stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("valet-run: error: syncing the store at exit: no space left")
            && last.contains("4 data zones"),
        "{stderr}"
    );
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

/// `--timeout` also stops a guest blocked in the host, which no epoch check reaches: one
/// asleep in `poll_oneoff` for an hour, one reading a stdin that stays open and silent, one
/// writing to a socket whose peer never reads, one writing to a stdout pipe nobody reads,
/// one waiting for all of 100 bytes (`RECV_WAITALL`) of which its peer sent 10.
/// Each ends with 124 once the limit passes, not when its wait would have.
#[test]
fn timeout_stops_a_guest_asleep_or_blocked_in_a_read() {
    let dir = tempfile::tempdir().unwrap();
    let guest = |name: &str, body: &str| {
        let path = dir.path().join(name);
        let wat = format!(
            r#"(module
                 (import "wasi_snapshot_preview1" "poll_oneoff"
                   (func $poll (param i32 i32 i32 i32) (result i32)))
                 (import "wasi_snapshot_preview1" "fd_read"
                   (func $read (param i32 i32 i32 i32) (result i32)))
                 (import "wasi_snapshot_preview1" "fd_write"
                   (func $write (param i32 i32 i32 i32) (result i32)))
                 (import "wasi_snapshot_preview1" "sock_accept"
                   (func $accept (param i32 i32 i32) (result i32)))
                 (import "wasi_snapshot_preview1" "sock_recv"
                   (func $recv (param i32 i32 i32 i32 i32 i32) (result i32)))
                 (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
                 (memory (export "memory") 1)
                 (func (export "_start") {body}))"#
        );
        std::fs::write(&path, wat::parse_str(wat).unwrap()).unwrap();
        path
    };
    // One monotonic clock subscription at 0, an hour from now.
    let sleeper = guest(
        "sleep.wasm",
        "(i32.store (i32.const 16) (i32.const 1))
         (i64.store (i32.const 24) (i64.const 3600000000000))
         (drop (call $poll (i32.const 0) (i32.const 100) (i32.const 1) (i32.const 200)))",
    );
    // One iovec at 100 of 10 bytes at 200.
    let reader = guest(
        "read.wasm",
        "(i32.store (i32.const 100) (i32.const 200))
         (i32.store (i32.const 104) (i32.const 10))
         (drop (call $read (i32.const 0) (i32.const 100) (i32.const 1) (i32.const 300)))",
    );
    // Accepts a connection on the listener (descriptor 4, after the store's directory),
    // then writes 60,000 bytes at a time to it (one iovec at 100) until stopped; exits
    // with 7 if the accept or a write fails.
    let writer = guest(
        "write.wasm",
        "(i32.store (i32.const 100) (i32.const 1000))
         (i32.store (i32.const 104) (i32.const 60000))
         (if (call $accept (i32.const 4) (i32.const 0) (i32.const 200))
           (then (call $exit (i32.const 7))))
         (loop $l
           (if (call $write (i32.load (i32.const 200)) (i32.const 100) (i32.const 1)
                            (i32.const 300))
             (then (call $exit (i32.const 7))))
           (br $l))",
    );
    // Writes 60,000 bytes at a time to stdout, a pipe nobody reads, until stopped.
    let printer = guest(
        "print.wasm",
        "(i32.store (i32.const 100) (i32.const 1000))
         (i32.store (i32.const 104) (i32.const 60000))
         (loop $l
           (if (call $write (i32.const 1) (i32.const 100) (i32.const 1) (i32.const 300))
             (then (call $exit (i32.const 7))))
           (br $l))",
    );
    // Accepts a connection, then receives 100 bytes with RIFLAGS_RECV_WAITALL (one iovec at
    // 100 of 100 bytes at 1000); the peer sends 10 and stalls.
    let receiver = guest(
        "recv.wasm",
        "(i32.store (i32.const 100) (i32.const 1000))
         (i32.store (i32.const 104) (i32.const 100))
         (if (call $accept (i32.const 4) (i32.const 0) (i32.const 200))
           (then (call $exit (i32.const 7))))
         (drop (call $recv (i32.load (i32.const 200)) (i32.const 100) (i32.const 1)
                           (i32.const 2) (i32.const 300) (i32.const 304)))",
    );
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    for app in [&sleeper, &reader, &writer, &printer, &receiver] {
        let started = std::time::Instant::now();
        let mut child = valet_run()
            .arg("--device")
            .arg(dir.path().join("dev"))
            .args(["--zone-size", "16", "--zones", "16", "--timeout", "500ms"])
            .args(["--tcplisten", &format!("127.0.0.1:{port}")])
            .arg(app)
            .stdin(std::process::Stdio::piped())
            // Read only once it ended: the printer fills the pipe, then waits.
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Held open, never written: the reader's stdin has nothing to give and no end.
        let _stdin = child.stdin.take();
        // Connected, never read: the writer fills the socket's buffers, then waits.
        // The receiver's peer sends 10 of the 100 bytes it waits for, then nothing.
        let _peer = (app == &writer || app == &receiver).then(|| loop {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(mut peer) => {
                    if app == &receiver {
                        std::io::Write::write_all(&mut peer, b"0123456789").unwrap();
                    }
                    break peer;
                }
                Err(e) if started.elapsed().as_secs() > 30 => panic!("connecting: {e}"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        });
        // Far below the hour, and below any wait on stdin: only the limit can end it.
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > std::time::Duration::from_secs(60) {
                child.kill().unwrap();
                panic!("{} was not stopped by --timeout", app.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(124), "{}: {stderr}", app.display());
        assert!(stderr.contains("ran past --timeout"), "{stderr}");
    }
}
