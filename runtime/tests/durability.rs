//! Durability through the guest: `valet-run` running `durable_writer` is killed with SIGKILL
//! at a random moment, and everything the guest saw acknowledged must read back exactly.
//!
//! Each cycle starts `valet-run` on the same device directory (`zones.img` + `conventional/`,
//! 16 MiB zones, 24 of them), so every run recovers what the previous kill left and extends
//! it. The guest (`guests/programs/src/bin/durable_writer.rs`) prints `begin SEQ OP ARGS`
//! before an operation touches anything and `ack SEQ` after its last fsync/fdatasync
//! returned; stdout is read concurrently, and only complete lines count (the last one may be
//! cut by the kill). After the kill the test mounts the device with valet-vfs itself, runs
//! fsck (it must be clean) and reads the six files back:
//!
//! - acknowledged: the state the previous check read back with every acknowledged operation
//!   of this run applied to it must be what is on the device, byte for byte and size for size;
//! - in flight (a `begin` without its `ack`; at most one): the file it touches may hold the
//!   state before or after it, or, for data writes, any mix of the two per byte with a size in
//!   between (a `replace` is a rename, so all old or all new);
//! - the state read back becomes the base of the next cycle.
//!
//! The content of operation SEQ is `durable_record(seed, SEQ, len)`, which both sides compute.
//! Sequence numbers never repeat across cycles, so stale data cannot pass for new.
//!
//! The kill comes after a seeded random delay (0–250 ms) counted from the guest's `ready`
//! line, so that compiling the module does not eat the window; one cycle in eight kills
//! instead in the last 15 % of the previous run's spawn-to-`ready` time, which can hit the
//! mount, recovery or instantiation. Timing makes runs differ in what they cover, not in
//! what they require. A dead run's image lock can outlive its process for a moment (io_uring
//! requests it had in flight still hold the file), so the check's mount retries "in use".
//!
//! About 50 s in a debug build, most of it `valet-run` compiling the guest once per cycle.
//!
//! Environment: `VALET_DURABILITY_CYCLES` (default 20) for long runs,
//! `VALET_DURABILITY_SEED` to vary or replay the schedule.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use valet_guests::content::{durable_record, mix};
use valet_runtime::device::DeviceSpec;
use valet_vfs::device::{Geometry, IoMode};
use valet_vfs::{OpenOptions, Store};

/// The files `durable_writer` works on, under `/data/dw/`.
const NAMES: [&str; 6] = ["f0.log", "f1.sst", "f2.dat", "f3.dat", "CURRENT", "f5.txt"];

/// File name → contents (absent: no such file).
type Files = BTreeMap<String, Vec<u8>>;

#[derive(Debug, Clone)]
enum Op {
    /// Append or overwrite: bytes at an offset.
    Write {
        name: String,
        offset: u64,
        len: u64,
        append: bool,
    },
    Create {
        name: String,
        len: u64,
    },
    Replace {
        name: String,
        len: u64,
    },
    Truncate {
        name: String,
        len: u64,
    },
    Delete {
        name: String,
    },
}

impl Op {
    fn parse(words: &[&str]) -> Op {
        let num = |i: usize| -> u64 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("bad begin line: {words:?}"))
        };
        let name = words[1].to_string();
        match words[0] {
            "append" | "write" => Op::Write {
                name,
                offset: num(2),
                len: num(3),
                append: words[0] == "append",
            },
            "create" => Op::Create { name, len: num(2) },
            "replace" => Op::Replace { name, len: num(2) },
            "truncate" => Op::Truncate { name, len: num(2) },
            "delete" => Op::Delete { name },
            other => panic!("unknown operation {other:?}"),
        }
    }

    fn name(&self) -> &str {
        match self {
            Op::Write { name, .. }
            | Op::Create { name, .. }
            | Op::Replace { name, .. }
            | Op::Truncate { name, .. }
            | Op::Delete { name } => name,
        }
    }

    /// The files after the operation, checking that the guest saw the state we expect.
    fn apply(&self, seed: u64, seq: u64, files: &mut Files) {
        let name = self.name().to_string();
        match self {
            Op::Write {
                offset,
                len,
                append,
                ..
            } => {
                let data = files
                    .get_mut(&name)
                    .unwrap_or_else(|| panic!("op {seq}: {name} should exist"));
                if *append {
                    assert_eq!(*offset, data.len() as u64, "op {seq}: append offset");
                }
                assert!(*offset <= data.len() as u64, "op {seq}: write past the end");
                let bytes = durable_record(seed, seq, *len as usize);
                let (at, end) = (*offset as usize, (*offset + *len) as usize);
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[at..end].copy_from_slice(&bytes);
            }
            Op::Create { len, .. } => {
                assert!(!files.contains_key(&name), "op {seq}: {name} exists");
                files.insert(name, durable_record(seed, seq, *len as usize));
            }
            Op::Replace { len, .. } => {
                assert!(files.contains_key(&name), "op {seq}: {name} missing");
                files.insert(name, durable_record(seed, seq, *len as usize));
            }
            Op::Truncate { len, .. } => {
                let data = files
                    .get_mut(&name)
                    .unwrap_or_else(|| panic!("op {seq}: {name} should exist"));
                assert!(*len <= data.len() as u64, "op {seq}: truncate grows");
                data.truncate(*len as usize);
            }
            Op::Delete { .. } => {
                assert!(
                    files.remove(&name).is_some(),
                    "op {seq}: {name} should exist"
                );
            }
        }
    }
}

/// What one run printed, complete lines only.
struct Transcript {
    ready: bool,
    /// Operations in order, with whether they were acknowledged.
    ops: Vec<(u64, Op, bool)>,
}

fn parse_transcript(out: &[u8]) -> Transcript {
    let text = String::from_utf8_lossy(out);
    // A line without its newline was cut by the kill: it does not count.
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    let mut t = Transcript {
        ready: false,
        ops: Vec::new(),
    };
    for line in complete.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ready"] => t.ready = true,
            ["begin", seq, rest @ ..] => {
                assert!(t.ready, "begin before ready: {line}");
                if let Some((_, _, acked)) = t.ops.last() {
                    assert!(acked, "a new op began before the last was acknowledged");
                }
                t.ops.push((seq.parse().unwrap(), Op::parse(rest), false));
            }
            ["ack", seq] => {
                let seq: u64 = seq.parse().unwrap();
                let last = t.ops.last_mut().expect("ack without begin");
                assert_eq!(last.0, seq, "ack of an op that did not begin last");
                assert!(!last.2, "op {seq} acknowledged twice");
                last.2 = true;
            }
            _ => panic!("unexpected guest output line: {line:?}"),
        }
    }
    t
}

/// Every file of the work directory, as the store holds it after recovery; fsck must be clean.
fn read_back(device: &Path, lock_wait: &mut Duration) -> Files {
    let spec = DeviceSpec {
        dir: device.to_path_buf(),
        zonefs: None,
        zonefs_capacity: None,
        fdp: None,
        geometry: Geometry::EMBEDDED_DEFAULT,
        io: IoMode::Auto,
        writeback: Some(valet_runtime::device::DEFAULT_WRITEBACK),
        handoff: Some(valet_runtime::device::DEFAULT_HANDOFF),
    };
    if !spec.image_path().exists() {
        // Killed before valet-run created the device: nothing was written.
        return Files::new();
    }
    // The dead process's image lock can outlive it for a moment: io_uring requests it had in
    // flight hold the file until they complete, after the process is gone.
    let since = Instant::now();
    let deadline = since + Duration::from_secs(10);
    let store: Store = loop {
        match spec.mount() {
            Ok(store) => {
                *lock_wait = (*lock_wait).max(since.elapsed());
                break store;
            }
            Err(e) if format!("{e:#}").contains("in use") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("mount after the kill: {e:#}"),
        }
    };
    let report = store.fsck().expect("fsck");
    assert!(
        report.is_clean(),
        "fsck after the kill: {}",
        report.findings()
    );
    let (_, root) = store.tenant("default").expect("tenant");
    let mut files = Files::new();
    for name in NAMES {
        let Ok(ino) = store.lookup(root, &format!("dw/{name}")) else {
            continue;
        };
        let size = store.metadata(ino).expect("stat").size as usize;
        let f = store
            .open_file(root, &format!("dw/{name}"), OpenOptions::read())
            .expect("open");
        let mut data = vec![0u8; size];
        let mut at = 0;
        while at < size {
            let n = f.read_at(&mut data[at..], at as u64).expect("read");
            assert!(n > 0, "{name}: short read at {at} of {size}");
            at += n;
        }
        f.close().expect("close");
        files.insert(name.to_string(), data);
    }
    files
}

/// Where `actual` and `expected` first differ, for messages.
fn first_difference(actual: &[u8], expected: &[u8]) -> String {
    match actual.iter().zip(expected).position(|(a, b)| a != b) {
        Some(i) => {
            let zeros = actual[i..].iter().take_while(|&&b| b == 0).count();
            format!(
                "first differing byte at {i} of {} (expected {}), {zeros} zero bytes from there",
                actual.len(),
                expected.len()
            )
        }
        None => format!("sizes {} vs {}", actual.len(), expected.len()),
    }
}

/// Checks the device against the acknowledged state and the operation in flight.
fn check(
    cycle: u32,
    seed: u64,
    acked: &Files,
    in_flight: Option<&(u64, Op, bool)>,
    actual: &Files,
) {
    let ctx = |name: &str| format!("cycle {cycle} (seed {seed}), file {name}");
    let touched = in_flight.map(|(_, op, _)| op.name().to_string());
    for name in NAMES {
        if Some(name) == touched.as_deref() {
            continue;
        }
        match (acked.get(name), actual.get(name)) {
            (None, None) => {}
            (Some(want), Some(got)) => assert!(
                want == got,
                "{}: acknowledged data lost ({})",
                ctx(name),
                first_difference(got, want)
            ),
            (want, got) => panic!(
                "{}: exists after the kill: {}, acknowledged: {}",
                ctx(name),
                got.is_some(),
                want.is_some()
            ),
        }
    }
    let Some((seq, op, _)) = in_flight else {
        return;
    };
    let name = op.name();
    let mut after = acked.clone();
    op.apply(seed, *seq, &mut after);
    let (old, new, got) = (acked.get(name), after.get(name), actual.get(name));
    let whole = got == old || got == new;
    let ok = whole
        || match (op, old, new, got) {
            // A data write that did not finish: each byte old or new, size in between.
            (Op::Write { .. }, Some(old), Some(new), Some(got)) => {
                let (lo, hi) = (old.len().min(new.len()), old.len().max(new.len()));
                (lo..=hi).contains(&got.len())
                    && got
                        .iter()
                        .enumerate()
                        .all(|(i, b)| old.get(i) == Some(b) || new.get(i) == Some(b))
            }
            // A create that did not finish: the file exists with a prefix of its data.
            (Op::Create { .. }, None, Some(new), Some(got)) => new.starts_with(got),
            // A shrink that did not finish: the old bytes, cut anywhere in between.
            (Op::Truncate { .. }, Some(old), Some(new), Some(got))
                if got.len() >= new.len() && old.starts_with(got) =>
            {
                true
            }
            _ => false,
        };
    assert!(
        ok,
        "{}: op {seq} {op:?} was in flight; the file is neither before nor after it \
         (exists: {}, size {:?}; before: {:?}, after: {:?}; against before: {}; against \
         after: {})",
        ctx(name),
        got.is_some(),
        got.map(Vec::len),
        old.map(Vec::len),
        new.map(Vec::len),
        compare(got, old),
        compare(got, new)
    );
}

fn compare(got: Option<&Vec<u8>>, want: Option<&Vec<u8>>) -> String {
    match (got, want) {
        (Some(got), Some(want)) => first_difference(got, want),
        _ => "-".into(),
    }
}

/// A small deterministic generator for the kill schedule.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0) % n
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        Err(_) => default,
    }
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let cycles = env_u64("VALET_DURABILITY_CYCLES", 20) as u32;
    let master = env_u64("VALET_DURABILITY_SEED", 0x5eed_d00d);
    let device = tempfile::tempdir().unwrap();
    let mut schedule = Rng(master);
    let mut state = Files::new();
    let mut next_seq = 1u64;
    let (mut acked_total, mut in_flight_total, mut early_kills) = (0, 0, 0);
    let started = Instant::now();
    // How long the last run took from spawn to `ready` (a guess before the first).
    let mut ready_after = Duration::from_secs(2);
    let mut lock_wait = Duration::ZERO;

    for cycle in 0..cycles {
        let seed = mix(master ^ u64::from(cycle));
        let mut child = Command::new(env!("CARGO_BIN_EXE_valet-run"))
            .arg("--device")
            .arg(device.path())
            .args(["--zone-size", "16", "--zones", "24"])
            .arg(valet_guests::DURABLE_WRITER)
            .args(["--", &seed.to_string(), &next_seq.to_string(), "/data"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn valet-run");
        let spawned = Instant::now();

        // stdout is read as it comes: the kill must find the guest mid-flight, not blocked
        // on a full pipe. Each chunk is also passed on, so that we can wait for `ready`.
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        all.extend_from_slice(&buf[..n]);
                        let _ = tx.send(buf[..n].to_vec());
                    }
                }
            }
            all
        });
        let mut stderr = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });

        if schedule.below(8) == 0 {
            // Shortly before the guest would start: most of the time goes into compiling the
            // module, so aim at the last 15 % of the previous spawn-to-ready time, where
            // mounting and recovery happen.
            early_kills += 1;
            let aim = ready_after.mul_f64(0.85 + 0.15 * schedule.below(1000) as f64 / 1000.0);
            std::thread::sleep(aim.saturating_sub(spawned.elapsed()));
        } else {
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut seen = Vec::new();
            loop {
                if seen.windows(6).any(|w| w == b"ready\n") {
                    ready_after = spawned.elapsed();
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(chunk) => seen.extend_from_slice(&chunk),
                    Err(_) => break, // the guest died or hung: the checks below will say
                }
            }
            std::thread::sleep(Duration::from_millis(schedule.below(250)));
        }
        let exited_early = child.try_wait().unwrap();
        child.kill().expect("SIGKILL");
        let status = child.wait().unwrap();
        let out = reader.join().unwrap();
        let err = err_reader.join().unwrap();
        if let Some(status) = exited_early {
            panic!("cycle {cycle}: valet-run exited by itself ({status}) before the kill:\n{err}");
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}\n{err}");

        let transcript = parse_transcript(&out);
        let mut acked = state.clone();
        let mut in_flight = None;
        for entry in &transcript.ops {
            let (seq, op, ok) = entry;
            if *ok {
                op.apply(seed, *seq, &mut acked);
                acked_total += 1;
            } else {
                in_flight = Some(entry);
                in_flight_total += 1;
            }
        }
        if let Some((last, _, _)) = transcript.ops.last() {
            next_seq = last + 1;
        }
        let actual = read_back(device.path(), &mut lock_wait);
        check(cycle, seed, &acked, in_flight, &actual);
        state = actual;
    }
    eprintln!(
        "{cycles} kills ({early_kills} before `ready`): {acked_total} acknowledged ops \
         checked, {in_flight_total} in flight, {} files of {} bytes at the end, {:.1} s \
         (longest wait for a dead run's image lock: {lock_wait:?})",
        state.len(),
        state.values().map(Vec::len).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        acked_total > 0,
        "no operation was ever acknowledged: the kill window is too short"
    );
}

/// `--timeout` stops the same guest mid-run instead of a kill: valet-run exits with 124 and
/// one line, and the store holds every acknowledged operation (and the one in flight whole
/// or as a mix, as after a kill, since the guest stops at its next WASI call).
#[test]
fn a_guest_stopped_by_timeout_keeps_every_acknowledged_op() {
    let device = tempfile::tempdir().unwrap();
    let seed = mix(0x7173_0ff5);
    let out = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(device.path())
        .args(["--zone-size", "16", "--zones", "24", "--timeout", "1500ms"])
        .arg(valet_guests::DURABLE_WRITER)
        .args(["--", &seed.to_string(), "1", "/data"])
        .stdin(Stdio::null())
        .output()
        .expect("run valet-run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(
        stderr.contains("the guest ran past --timeout 1.5s and was stopped"),
        "{stderr}"
    );
    let transcript = parse_transcript(&out.stdout);
    let mut acked = Files::new();
    let mut in_flight = None;
    for entry in &transcript.ops {
        let (seq, op, ok) = entry;
        if *ok {
            op.apply(seed, *seq, &mut acked);
        } else {
            in_flight = Some(entry);
        }
    }
    assert!(
        transcript.ops.iter().filter(|op| op.2).count() > 10,
        "the guest acknowledged too little in 1.5 s to check anything"
    );
    let mut lock_wait = Duration::ZERO;
    let actual = read_back(device.path(), &mut lock_wait);
    check(0, seed, &acked, in_flight, &actual);
}
