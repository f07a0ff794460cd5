//! RocksDB 11.8.1 itself (wasm32-wasip1-threads, `guests/build/rocksdb.rs`) under `valet-run`:
//! RocksDB's own tests, `db_bench` on four threads with `readwhilewriting`, and acknowledged
//! synced writes surviving SIGKILL (read back with RocksDB's `ldb`).
//!
//! Long mode: `VALET_ROCKSDB_CRASH_CYCLES=100 cargo test -p valet-tests --test rocksdb crash`
//! (100 SIGKILL cycles), `VALET_ROCKSDB_ALL_TESTS=1` (all of each RocksDB test file).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// RocksDB's own tests, each with the gtest filter the normal suite runs (empty: the whole
/// file). Together about four minutes under a debug `valet-run` on 2 busy cores; all of
/// `db_basic_test` (286 tests) is the long mode's.
const OWN_TESTS: &[(&str, &str)] = &[
    ("rocksdb_env_test", ""),
    ("rocksdb_db_io_failure_test", ""),
    ("rocksdb_fault_injection_test", ""),
    ("rocksdb_db_basic_test", "DBBasicTest.*"),
];

/// Runs one of RocksDB's gtest programs on a fresh device and returns its output; fails the
/// test unless gtest reports that every test it ran passed.
fn run_gtest(name: &str, filter: &str) -> Option<String> {
    let wasm = valet_guests::require(name)?;
    let dir = tempfile::tempdir().unwrap();
    let mut command = valet_tests::valet_run(&dir.path().join("device"));
    command
        .args(["--policy", "rocks", "--env", "TEST_TMPDIR=/data"])
        .arg(wasm)
        .arg("--");
    let long = std::env::var_os("VALET_ROCKSDB_ALL_TESTS").is_some();
    if !filter.is_empty() && !long {
        command.arg(format!("--gtest_filter={filter}"));
    }
    let started = Instant::now();
    let out = command.output().expect("starting valet-run");
    let stdout = valet_tests::check(&out, name);
    assert!(
        stdout.contains("[  PASSED  ]") && !stdout.contains("[  FAILED  ]"),
        "{name}: not every test passed:\n{stdout}"
    );
    let ran = stdout
        .lines()
        .find(|l| l.starts_with("[==========]") && l.contains("ran."))
        .unwrap_or("?")
        .to_string();
    eprintln!(
        "{name} ({}): {ran} in {:.1} s",
        if filter.is_empty() { "all" } else { filter },
        started.elapsed().as_secs_f64()
    );
    Some(stdout)
}

#[test]
fn rocksdb_own_tests_pass_under_valet_run() {
    for (name, filter) in OWN_TESTS {
        run_gtest(name, filter);
    }
}

/// db_bench's report line for `name` (`name : X micros/op Y ops/sec ...`): its ops/s and the
/// whole line.
fn bench_line<'a>(stdout: &'a str, name: &str) -> (f64, &'a str) {
    let line = stdout
        .lines()
        .find(|l| l.split(" : ").next().map(str::trim_end) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{stdout}"));
    let ops = line
        .split_once(" micros/op ")
        .and_then(|(_, rest)| rest.split_once(" ops/sec"))
        .and_then(|(ops, _)| ops.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ops/sec in {line:?}"));
    (ops, line)
}

#[test]
fn db_bench_runs_four_threads_and_readwhilewriting_on_our_thread_spawn() {
    let Some(wasm) = valet_guests::require("rocksdb") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Four threads each fill the same 10,000 keys in order, so every later read must find
    // its key; 1 MiB memtables make the four background jobs flush and compact meanwhile.
    let out = valet_tests::run_ok(
        &dir.path().join("device"),
        wasm,
        &["--policy", "rocks"],
        &[
            "--db=/data/bench",
            "--benchmarks=fillseq,readrandom,readwhilewriting",
            "--num=10000",
            "--threads=4",
            "--max_background_jobs=4",
            "--write_buffer_size=1048576",
            "--compression_type=none",
            "--histogram=1",
        ],
    );
    for name in ["fillseq", "readrandom", "readwhilewriting"] {
        let (ops, line) = bench_line(&out, name);
        assert!(ops > 0.0, "{line}");
    }
    for name in ["readrandom", "readwhilewriting"] {
        let (_, line) = bench_line(&out, name);
        let found = line.matches("(10000 of 10000 found)").count();
        let reads = line.matches(" found)").count();
        assert!(
            reads >= 1 && found == reads,
            "{name}: a thread missed keys: {line}"
        );
    }
    assert!(
        out.matches("Percentiles: P50: ").count() >= 3,
        "no latency histograms in:\n{out}"
    );
}

/// The value `acked_writer` writes for a key (its key repeated, cut to 100 bytes).
fn value_for(key: &str) -> String {
    key.repeat(100 / key.len() + 1)[..100].to_string()
}

/// `ldb scan` of the store: key -> value (both in hex with `hex`, for binary keys).
fn scan(device: &Path, ldb: &str, db: &str, hex: bool) -> HashMap<String, String> {
    let out = valet_tests::valet_run(device)
        .args(["--policy", "rocks"])
        .arg(ldb)
        .arg("--")
        .arg(format!("--db={db}"))
        .args(if hex {
            &["--hex", "scan"][..]
        } else {
            &["scan"][..]
        })
        .output()
        .expect("starting valet-run");
    let stdout = valet_tests::check(&out, "ldb scan");
    stdout
        .lines()
        .filter_map(|l| l.split_once(" ==> "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}

/// splitmix64, for the kill schedule.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn crash_sigkill_mid_synced_fill_keeps_every_acknowledged_key() {
    let (Some(writer), Some(ldb)) = (
        valet_guests::require("rocksdb_acked_writer"),
        valet_guests::require("rocksdb_ldb"),
    ) else {
        return;
    };
    let cycles = env_u64("VALET_ROCKSDB_CRASH_CYCLES", 3);
    let mut schedule = env_u64("VALET_ROCKSDB_CRASH_SEED", 0x5eed_0c5d);
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device");
    let db = "/data/crash";
    let mut acked: Vec<String> = Vec::new();
    let started = Instant::now();
    for cycle in 0..cycles {
        let seed = next(&mut schedule);
        // Kill after 20-400 acknowledged keys, plus 0-20 ms: mid-Put, mid-flush or
        // mid-compaction (the writer's memtables are 256 KiB).
        let kill_after = 20 + next(&mut schedule) % 380;
        let extra = Duration::from_millis(next(&mut schedule) % 20);
        let mut child = valet_tests::valet_run(&device)
            .args(["--policy", "rocks"])
            .arg(writer)
            .arg("--")
            .args([db, &seed.to_string(), "100000000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting valet-run");
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<usize>();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                all.extend_from_slice(&buf[..n]);
                let _ = tx.send(all.iter().filter(|&&b| b == b'\n').count());
            }
            all
        });
        let mut stderr = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + Duration::from_secs(300);
        while let Ok(lines) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if lines as u64 >= kill_after {
                break;
            }
        }
        std::thread::sleep(extra);
        let early = child.try_wait().unwrap();
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
        let out = reader.join().unwrap();
        let err = err_reader.join().unwrap();
        assert!(
            early.is_none(),
            "cycle {cycle}: the writer exited by itself ({early:?}):\n{err}"
        );
        // A line cut by the kill (no newline) was not acknowledged.
        let text = String::from_utf8_lossy(&out);
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        let before = acked.len();
        acked.extend(complete.lines().map(|l| {
            l.strip_prefix("acked ")
                .expect("an `acked KEY` line")
                .to_string()
        }));
        assert!(
            acked.len() > before,
            "cycle {cycle}: nothing acknowledged before the kill:\n{err}"
        );

        let found = scan(&device, ldb, db, false);
        for key in &acked {
            match found.get(key) {
                Some(value) if *value == value_for(key) => {}
                Some(value) => panic!("cycle {cycle}: key {key} reads back {value:?}"),
                None => panic!(
                    "cycle {cycle}: acknowledged key {key} lost ({} of {} acknowledged keys \
                     found)",
                    acked.iter().filter(|k| found.contains_key(*k)).count(),
                    acked.len()
                ),
            }
        }
    }
    eprintln!(
        "{cycles} SIGKILLs mid synced fill: {} acknowledged keys, all read back by ldb, {:.1} s",
        acked.len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn ldb_reads_what_db_bench_wrote_in_a_second_process() {
    let (Some(bench), Some(ldb)) = (
        valet_guests::require("rocksdb"),
        valet_guests::require("rocksdb_ldb"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device");
    let out = valet_tests::run_ok(
        &device,
        bench,
        &["--policy", "rocks"],
        &[
            "--db=/data/seq",
            "--benchmarks=fillseq",
            "--num=5000",
            "--key_size=16",
            "--value_size=100",
            "--compression_type=none",
            "--sync=1",
        ],
    );
    bench_line(&out, "fillseq");
    // db_bench's keys are binary (a big-endian counter, then padding).
    let found = scan(&device, ldb, "/data/seq", true);
    assert_eq!(found.len(), 5000, "ldb scan found {} keys", found.len());
    let consistent = valet_tests::valet_run(&device)
        .args(["--policy", "rocks"])
        .arg(ldb)
        .args(["--", "--db=/data/seq", "checkconsistency"])
        .output()
        .expect("starting valet-run");
    let stdout = valet_tests::check(&consistent, "ldb checkconsistency");
    assert!(stdout.contains("OK"), "{stdout}");
}
