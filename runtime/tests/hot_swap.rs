//! Hot swap under load, and hostile policy modules pushed while a guest keeps writing.
//!
//! `valet-run --admin 127.0.0.1:0 --policy one.wat` runs `steady_writer`, which creates small
//! files one after another (write, fsync, close; any failure ends it with an error). While it
//! writes, the test talks to the admin API (the address is read from valet-run's stderr):
//!
//! 1. hostile modules that must be refused at upload, each with a message naming the
//!    problem: an infinite loop in the start function, a wrong export signature, a WASI
//!    import, random bytes, a 100 MB module (413, from its Content-Length, before the body
//!    is sent); the last two also through the `valet-run policy push` client;
//! 2. hostile modules that load but misbehave in `valet_place` — an infinite loop, a trap, a
//!    `memory.grow` bomb — are activated one after another and contained: files created under
//!    them get the default decision, the stats count the faults, no write fails;
//! 3. the stream-1 policy again (re-uploaded and activated by `valet-run policy push`), then
//!    the swap: a stream-2 policy uploaded, then activated alone.
//!
//! Synchronisation is by the guest's stdout, never by sleeping: after each policy change the
//! test bumps `CTL/epoch`, and the guest names the first file it creates after seeing it. So
//! for each change, files closed before the request was sent must have the old placement,
//! files from the named one on the new one; only the few in between may have either, and
//! they switch once, in order. At the end the guest re-reads every file, the store is
//! mounted, fsck must be clean, and every file's stream and bytes are checked.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use valet_guests::content::{steady_file, steady_index, steady_name};
use valet_runtime::admin::{client, AdminAddr};
use valet_runtime::device::DeviceSpec;
use valet_vfs::device::{Geometry, IoMode};
use valet_vfs::{Class, DefaultPlacement, OpenOptions, OpenReason, Placement, PlacementRequest};

/// How long any one expected guest line may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(60);
/// The tenant `valet-run` runs a single guest as.
const TENANT: &str = "default";

/// The index of a file steady_writer named.
fn index(name: &str) -> u64 {
    steady_index(name).unwrap_or_else(|| panic!("not a steady_writer file name: {name:?}"))
}

/// A policy whose `valet_place` runs `body` and then decides zoned stream `stream`, group 0.
fn policy(start: &str, body: &str, stream: u32) -> String {
    format!(
        r#"(module
  (memory (export "memory") 1)
  {start}
  (func (export "valet_abi_version") (result i32) i32.const 1)
  (func (export "valet_buffer") (result i32) i32.const 1024)
  (func (export "valet_place") (param i32) (result i32)
    {body}
    (memory.fill (i32.const 1024) (i32.const 0) (i32.const 24))
    (i32.store (i32.const 1028) (i32.const {stream}))
    i32.const 0))
"#
    )
}

fn stream_policy(stream: u32) -> String {
    policy("", "", stream)
}

/// What the default placement decides for the guest's files (a faulting policy's fallback).
fn default_stream() -> u32 {
    let hint = DefaultPlacement.place(&PlacementRequest {
        tenant: 0,
        path: "f000001.dat",
        reason: OpenReason::Create,
        size: 0,
    });
    assert_eq!(hint.class, Class::Zoned);
    hint.stream
}

/// A policy change seen from the guest's files: every file up to `closed_before` was closed
/// before the change was requested; every file from `first_after` on was created after it.
struct Change {
    what: String,
    closed_before: u64,
    first_after: u64,
    stream: u32,
}

/// The running `valet-run` and what it said so far.
struct Run {
    child: Child,
    stdout: Receiver<String>,
    stdout_log: Vec<String>,
    stderr_log: Arc<Mutex<String>>,
    /// Ends when valet-run closes its stderr.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    /// Highest file the guest reported closed.
    closed: u64,
    ctl: PathBuf,
    dev: PathBuf,
    epoch: u32,
    addr: AdminAddr,
    addr_text: String,
    token: String,
    changes: Vec<Change>,
}

impl Drop for Run {
    fn drop(&mut self) {
        // Only matters when a test fails half way: do not leave the child running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Run {
    fn start(tmp: &Path, policy_file: &Path) -> Run {
        let dev = tmp.join("dev");
        let ctl = tmp.join("ctl");
        std::fs::create_dir_all(&ctl).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_valet-run"))
            .arg("--device")
            .arg(&dev)
            .args(["--zone-size", "16", "--zones", "48"])
            .args(["--admin", "127.0.0.1:0"])
            .arg("--policy")
            .arg(policy_file)
            .arg("--dir")
            .arg(format!("{}::/ctl", ctl.display()))
            .arg(valet_guests::STEADY_WRITER)
            .args(["/data", "/ctl"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();

        let stderr_log = Arc::new(Mutex::new(String::new()));
        let (admin_tx, admin_rx) = mpsc::channel();
        let err = BufReader::new(child.stderr.take().unwrap());
        let log = stderr_log.clone();
        let stderr_reader = std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("valet-run: admin API on ") {
                    let _ = admin_tx.send(rest.to_string());
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let (out_tx, stdout) = mpsc::channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if out_tx.send(line).is_err() {
                    break;
                }
            }
        });

        // "valet-run: admin API on ADDR (token in FILE)"
        let announced = admin_rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("no admin line; stderr:\n{}", stderr_log.lock().unwrap()));
        let (addr_text, token_file) = announced
            .strip_suffix(')')
            .and_then(|s| s.split_once(" (token in "))
            .unwrap_or_else(|| panic!("unexpected admin line: {announced:?}"));
        let addr = AdminAddr::parse(addr_text).unwrap();
        assert!(
            matches!(&addr, AdminAddr::Tcp(a) if a.port() != 0),
            "{addr}"
        );
        assert_eq!(Path::new(token_file), dev.join("admin.token"));
        let token = std::fs::read_to_string(token_file)
            .unwrap()
            .trim()
            .to_string();
        Run {
            child,
            stdout,
            stdout_log: Vec::new(),
            stderr_log,
            stderr_reader: Some(stderr_reader),
            closed: 0,
            ctl,
            dev,
            epoch: 0,
            addr,
            addr_text: addr_text.to_string(),
            token,
            changes: Vec::new(),
        }
    }

    fn show(&self) -> String {
        let tail: Vec<&String> = self.stdout_log.iter().rev().take(20).rev().collect();
        format!(
            "guest stdout (last lines): {tail:#?}\nvalet-run stderr:\n{}",
            self.stderr_log.lock().unwrap()
        )
    }

    fn take(&mut self, line: String) {
        if let Some(file) = line.strip_prefix("closed ") {
            let i = index(file);
            assert_eq!(
                i,
                self.closed + 1,
                "files closed out of order\n{}",
                self.show()
            );
            self.closed = i;
        }
        self.stdout_log.push(line);
    }

    /// The guest's next stdout line.
    fn next_line(&mut self) -> String {
        match self.stdout.recv_timeout(PATIENCE) {
            Ok(line) => {
                self.take(line.clone());
                line
            }
            Err(RecvTimeoutError::Timeout) => panic!("the guest went quiet\n{}", self.show()),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().unwrap();
                panic!("the guest ended early ({status})\n{}", self.show())
            }
        }
    }

    /// Takes the lines already written, without waiting.
    fn drain(&mut self) {
        while let Ok(line) = self.stdout.try_recv() {
            self.take(line);
        }
    }

    fn wait_closed(&mut self, i: u64) {
        while self.closed < i {
            self.next_line();
        }
    }

    /// Waits until the guest has closed `n` more files.
    fn keep_writing(&mut self, n: u64) {
        self.drain();
        self.wait_closed(self.closed + n);
    }

    fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let (code, body) = client::request(&self.addr, &self.token, method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e:#}\n{}", self.show()));
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    /// `valet-run policy ...` against this run.
    fn policy_cmd(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_valet-run"))
            .arg("policy")
            .args(args)
            .args(["--admin", &self.addr_text])
            .arg("--device")
            .arg(&self.dev)
            .output()
            .unwrap()
    }

    /// Runs `change` (which makes `stream` the placement of new files) and waits until the
    /// guest has created and closed a file after it.
    fn change(&mut self, what: &str, stream: u32, change: impl FnOnce(&Run)) {
        self.drain();
        let closed_before = self.closed;
        change(self);
        self.epoch += 1;
        let staged = self.ctl.join("epoch.new");
        std::fs::write(&staged, self.epoch.to_string()).unwrap();
        std::fs::rename(&staged, self.ctl.join("epoch")).unwrap();
        let announce = format!("epoch {} next ", self.epoch);
        let first_after = loop {
            let line = self.next_line();
            if let Some(file) = line.strip_prefix(&announce) {
                break index(file);
            }
        };
        self.wait_closed(first_after);
        self.changes.push(Change {
            what: what.to_string(),
            closed_before,
            first_after,
            stream,
        });
    }

    /// Uploads `bytes` as `name` and makes it the tenant's policy, over HTTP.
    fn upload_and_activate(&self, name: &str, bytes: &[u8]) {
        let (code, body) = self.request("PUT", &format!("/policies/{name}"), bytes);
        assert_eq!(code, 201, "upload {name}: {body}\n{}", self.show());
        self.activate(name);
    }

    fn activate(&self, name: &str) {
        let (code, body) =
            self.request("PUT", &format!("/tenants/{TENANT}/policy"), name.as_bytes());
        assert_eq!(code, 200, "activate {name}: {body}\n{}", self.show());
    }

    fn stats(&self) -> valet_vfs::Stats {
        let (code, body) = self.request("GET", "/stats", b"");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Decisions and faults of the tenant's active policy, which must be `name`.
    fn policy_counts(&self, name: &str) -> (u64, u64) {
        let stats = self.stats();
        let p = stats
            .policies
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name} not in the stats: {:?}", stats.policies));
        (p.decisions, p.faults)
    }
}

/// A module with a valid policy's sections and a custom section that makes it `size` bytes.
fn padded_module(good: &[u8], size: usize) -> Vec<u8> {
    let name = b"padding";
    let mut module = good.to_vec();
    // The section's payload: name length, name, then zeros up to `size`.
    let payload = size - module.len() - 1 - 5;
    module.push(0);
    let mut n = payload as u32;
    for k in 0..5 {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        module.push(if k < 4 { byte | 0x80 } else { byte });
    }
    module.push(name.len() as u8);
    module.extend_from_slice(name);
    module.resize(size, 0);
    module
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut x = 0x2545_f491u32;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[test]
fn hostile_modules_and_a_hot_swap_while_a_guest_writes() {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one.wat");
    std::fs::write(&one, stream_policy(1)).unwrap();
    let two = tmp.path().join("two.wat");
    std::fs::write(&two, stream_policy(2)).unwrap();
    let fallback = default_stream();
    assert!(
        fallback != 1 && fallback != 2,
        "the default must differ from both policies to tell them apart"
    );

    let mut run = Run::start(tmp.path(), &one);
    run.keep_writing(10);
    run.changes.push(Change {
        what: "start with policy one".into(),
        closed_before: 0,
        first_after: 1,
        stream: 1,
    });

    // 1. Refused at upload, with the reason, while the guest writes on.
    let good = wat::parse_str(stream_policy(3)).unwrap();
    // The padding of the 100 MB module is valid: the same module at 1 MiB loads.
    let (code, body) = run.request("PUT", "/policies/padded", &padded_module(&good, 1 << 20));
    assert_eq!(code, 201, "{body}");
    let refused: Vec<(&str, Vec<u8>, u16, &[&str])> = vec![
        (
            "spin-start",
            wat::parse_str(policy("(start $s) (func $s (loop $l (br $l)))", "", 3)).unwrap(),
            400,
            &["policy spin-start", "start failed", "fuel"],
        ),
        (
            "bad-signature",
            wat::parse_str(
                r#"(module (memory (export "memory") 1)
                    (func (export "valet_abi_version") (result i32) i32.const 1)
                    (func (export "valet_buffer") (result i32) i32.const 1024)
                    (func (export "valet_place") (param i64) (result i32) i32.const 0))"#,
            )
            .unwrap(),
            400,
            &["policy bad-signature", "valet_place", "wrong type"],
        ),
        (
            "wasi",
            wat::parse_str(
                r#"(module
                    (import "wasi_snapshot_preview1" "fd_write"
                      (func (param i32 i32 i32 i32) (result i32)))
                    (memory (export "memory") 1))"#,
            )
            .unwrap(),
            400,
            &[
                "policy wasi",
                "wasi_snapshot_preview1::fd_write",
                "import nothing",
            ],
        ),
        (
            "noise",
            random_bytes(64 << 10),
            400,
            &[
                "policy noise",
                "not a valid WebAssembly module",
                "no \\0asm header",
            ],
        ),
        (
            "huge",
            padded_module(&good, 100 << 20),
            413,
            &["policy huge", "104857600 bytes is too large", "limit"],
        ),
    ];
    for (name, bytes, status, says) in &refused {
        let (code, body) = run.request("PUT", &format!("/policies/{name}"), bytes);
        assert_eq!(code, *status, "{name}: {body}\n{}", run.show());
        let error = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("{name}: no JSON error in {body:?}"));
        for s in *says {
            assert!(error.contains(s), "{name}: {error:?} should say {s:?}");
        }
        eprintln!("hot_swap: {name}: {code} {error}");
        // The guest is not held up: it keeps closing files between uploads.
        run.keep_writing(1);
    }
    // The same refusals through the client, which must report the server's reason.
    for (name, bytes, status, says) in refused.iter().filter(|r| ["noise", "huge"].contains(&r.0)) {
        let file = tmp.path().join(format!("{name}.wasm"));
        std::fs::write(&file, bytes).unwrap();
        let out = run.policy_cmd(&["push", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("admin API answered {status}")),
            "{name}: {stderr}"
        );
        for s in *says {
            assert!(stderr.contains(s), "{name}: {stderr:?} should say {s:?}");
        }
        std::fs::remove_file(&file).unwrap();
    }
    let (code, listed) = run.request("GET", "/policies", b"");
    assert_eq!(code, 200);
    for (name, ..) in &refused {
        assert!(
            !listed.contains(&format!("\"{name}\"")),
            "{name} was refused but is listed: {listed}"
        );
    }

    // 2. Loaded, activated and contained: only valet_place misbehaves.
    let contained = [
        ("spin-place", policy("", "(loop $l (br $l))", 3)),
        ("trap-place", policy("", "unreachable", 3)),
        (
            "grow-bomb",
            // Grows a page at a time until the cap refuses, then traps.
            policy(
                "",
                "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 1)) (i32.const -1)))) unreachable",
                3,
            ),
        ),
    ];
    for (name, text) in &contained {
        let bytes = wat::parse_str(text).unwrap();
        run.change(name, fallback, |run| run.upload_and_activate(name, &bytes));
        run.keep_writing(3);
        let (decisions, faults) = run.policy_counts(name);
        // (A call may be under way while the stats are read: counted, not yet failed.)
        assert!(
            faults >= 3,
            "{name}: {faults} faults in {decisions} decisions"
        );
        assert!(
            faults + 1 >= decisions,
            "{name}: every decision must fault: {faults} of {decisions}"
        );
        run.keep_writing(2);
        let (_, later) = run.policy_counts(name);
        assert!(later > faults, "{name}: faults must keep being counted");
    }

    // 3. Back to policy one, re-uploaded and activated by the CLI; then the swap to two,
    //    uploaded first and activated alone, so that few files are in flight at the swap.
    run.change("policy one again, by the CLI", 1, |run| {
        let out = run.policy_cmd(&["push", one.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "policy push: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "policy one is now tenant default's"
        );
    });
    run.keep_writing(10);
    let (code, body) = run.request("PUT", "/policies/two", &std::fs::read(&two).unwrap());
    assert_eq!(code, 201, "{body}");
    run.keep_writing(3);
    run.change("swap to two", 2, |run| run.activate("two"));
    run.keep_writing(10);
    let list = run.policy_cmd(&["list"]);
    assert!(list.status.success());
    let list = String::from_utf8_lossy(&list.stdout);
    let row = list
        .lines()
        .find(|l| l.starts_with("two\t"))
        .unwrap_or_else(|| panic!("two not listed:\n{list}"));
    assert!(row.ends_with("\tdefault"), "{row}");
    assert_eq!(run.policy_counts("two").1, 0, "two never faults");

    // Stop, and let the guest read everything back.
    std::fs::write(run.ctl.join("stop"), b"").unwrap();
    let summary = loop {
        let line = run.next_line();
        if line.starts_with("wrote ") {
            break line;
        }
    };
    let written = run.closed;
    assert_eq!(summary, format!("wrote {written} files, all intact"));
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = run.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "valet-run did not exit\n{}",
            run.show()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    run.stderr_reader.take().unwrap().join().unwrap();
    let stderr = run.stderr_log.lock().unwrap().clone();
    assert!(status.success(), "{status}\n{}", run.show());
    assert!(!stderr.contains("steady_writer: error"), "{stderr}");
    // Each contained policy's first fault was logged once, naming the policy and the call.
    for (name, _) in &contained {
        let logged = format!("valet-run: policy {name}: valet_place failed");
        assert_eq!(
            stderr.matches(&logged).count(),
            1,
            "{logged:?} in:\n{stderr}"
        );
    }

    // The store: clean, every file intact and placed as the policy of its time decided.
    let store = DeviceSpec {
        dir: run.dev.clone(),
        zonefs: None,
        zonefs_capacity: None,
        fdp: None,
        geometry: Geometry::EMBEDDED_DEFAULT,
        io: IoMode::Auto,
        writeback: Some(valet_runtime::device::DEFAULT_WRITEBACK),
        handoff: Some(valet_runtime::device::DEFAULT_HANDOFF),
    }
    .mount_existing()
    .unwrap();
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "fsck: {}", report.findings());
    let (_, root) = store.tenant(TENANT).unwrap();
    let streams: Vec<u32> = (1..=written)
        .map(|i| {
            let ino = store.lookup(root, &steady_name(i)).unwrap();
            let meta = store.metadata(ino).unwrap();
            let f = store
                .open_file(root, &steady_name(i), OpenOptions::read())
                .unwrap();
            let mut data = vec![0u8; meta.size as usize];
            assert_eq!(f.read_at(&mut data, 0).unwrap(), data.len());
            assert!(data == steady_file(i), "{} differs", steady_name(i));
            assert_eq!(meta.hint.class, Class::Zoned, "{}", steady_name(i));
            meta.hint.stream
        })
        .collect();
    assert_eq!(store.read_dir(root).unwrap().len() as u64, written);
    let stream_of = |i: u64| streams[i as usize - 1];

    let mut in_flight = 0;
    for (k, change) in run.changes.iter().enumerate() {
        let last = run
            .changes
            .get(k + 1)
            .map_or(written, |next| next.closed_before);
        // From the first file created after the change up to the next change: its stream.
        for i in change.first_after..=last {
            assert_eq!(
                stream_of(i),
                change.stream,
                "{} (after {:?})",
                steady_name(i),
                change.what
            );
        }
        // Files in flight during the change: the old stream, then the new, switching once.
        if k > 0 {
            let old = run.changes[k - 1].stream;
            let window: Vec<u32> = (change.closed_before + 1..change.first_after)
                .map(stream_of)
                .collect();
            let switch = window
                .iter()
                .position(|&s| s != old)
                .unwrap_or(window.len());
            assert!(
                window[switch..].iter().all(|&s| s == change.stream),
                "{:?}: in-flight files {window:?} (old {old}, new {})",
                change.what,
                change.stream
            );
            in_flight += window.len();
        }
    }
    let windows: Vec<String> = run.changes[1..]
        .iter()
        .map(|c| {
            let switch = (c.closed_before + 1..c.first_after)
                .find(|&i| stream_of(i) == c.stream)
                .unwrap_or(c.first_after);
            format!(
                "{}: in flight {}..{}, first on stream {}: {}",
                c.what,
                steady_name(c.closed_before + 1),
                steady_name(c.first_after - 1),
                c.stream,
                steady_name(switch)
            )
        })
        .collect();
    eprintln!(
        "hot_swap: {written} files, {in_flight} in flight across {} changes, {:.1} s\n  {}",
        windows.len(),
        started.elapsed().as_secs_f64(),
        windows.join("\n  ")
    );
    let _ = std::io::stderr().flush();
}
