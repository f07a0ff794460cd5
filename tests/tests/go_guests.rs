//! Go programs compiled with `GOOS=wasip1`, unmodified, under `valet-run`: buntdb (an
//! append-only file fsynced per commit, rewritten and renamed over by Shrink) and tidwall/wal
//! (segment files, front truncation deletes them). Each runs its workloads in one process and
//! is checked by a second `valet-run` on the same device. A Go module takes a few seconds to
//! compile in a debug `valet-run`, so there are few runs and small sizes.

use std::path::Path;
use std::process::Command;

use valet_tests::{check, run_ok, valet_run_path};

const BUNT_NUM: &str = "400";
/// Keys left after the default workloads: multiples of 4 are deleted.
const BUNT_LEFT: usize = 300;

/// The `name : X micros/op; ...` line of workload `name`, with its percentiles line after it.
fn workload_line<'a>(out: &'a str, name: &str) -> &'a str {
    let mut lines = out.lines();
    while let Some(line) = lines.next() {
        if line.split(" : ").next().map(str::trim) == Some(name) {
            let micros: f64 = line
                .split(" : ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|m| m.parse().ok())
                .unwrap_or_else(|| panic!("no micros/op in {line:?}"));
            assert!(micros > 0.0, "{line}");
            assert!(line.contains(" ops/sec;"), "{line}");
            let next = lines.next().unwrap_or_default();
            assert!(
                next.starts_with("Percentiles (micros): P50: ") && next.contains(" P99.99: "),
                "no percentiles after {line:?}: {next:?}"
            );
            return line;
        }
    }
    panic!("no {name} line in:\n{out}");
}

/// The two numbers of "... A -> B ..." in `line`.
fn before_after(line: &str) -> (u64, u64) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let arrow = words.iter().position(|w| *w == "->").expect("an arrow");
    let parse = |w: &str| w.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
    (parse(words[arrow - 1]), parse(words[arrow + 1]))
}

/// `valet-run fs ls` of a store directory: (size, name) per file.
fn store_ls(device: &Path, dir: &str) -> Vec<(u64, String)> {
    let out = Command::new(valet_run_path())
        .args(["fs", "ls", "--device"])
        .arg(device)
        .arg(dir)
        .output()
        .expect("starting valet-run fs ls");
    check(&out, "valet-run fs ls")
        .lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words.len(), 3, "{line}");
            assert_eq!(words[0], "-", "not a plain file: {line}");
            (words[1].parse().unwrap(), words[2].to_string())
        })
        .collect()
}

/// Every buntdb workload runs under valet-run with a fsync per commit, shrink replaces the
/// file, and a second valet-run on the same device finds every key.
#[test]
fn buntdb_runs_and_survives_a_second_process() {
    let Some(wasm) = valet_guests::require("buntdb_bench") else {
        return;
    };
    let device = tempfile::tempdir().unwrap();
    let out = run_ok(
        device.path(),
        wasm,
        &[],
        &["--num", BUNT_NUM, "--sync", "always", "--verify=1"],
    );
    for name in ["set", "update", "delete"] {
        workload_line(&out, name);
    }
    let get = workload_line(&out, "get");
    assert!(
        get.contains(&format!("({BUNT_NUM} of {BUNT_NUM} found)")),
        "{get}"
    );
    let (before, after) = before_after(workload_line(&out, "shrink"));
    assert!(after < before / 2, "shrink kept {after} of {before} bytes");
    assert!(
        out.contains(&format!("verify: {BUNT_LEFT} keys ok")),
        "{out}"
    );

    // The rewritten file replaced the old one in the store; no temporary file is left.
    assert_eq!(
        store_ls(device.path(), "/buntdb"),
        vec![(after, "data.db".to_string())]
    );

    let again = run_ok(
        device.path(),
        wasm,
        &[],
        &["--num", BUNT_NUM, "--verify_only=1"],
    );
    assert_eq!(again.trim(), format!("verify: {BUNT_LEFT} keys ok"));
}

/// tidwall/wal appends with a fsync per entry, reads back, truncates the front half (whole
/// segment files deleted, the first kept one rewritten and renamed), and a second valet-run
/// finds exactly the second half.
#[test]
fn wal_runs_truncates_and_survives_a_second_process() {
    let Some(wasm) = valet_guests::require("wal_bench") else {
        return;
    };
    let device = tempfile::tempdir().unwrap();
    let args = [
        "--num",
        "1000",
        "--entry_size",
        "100",
        "--segment_size",
        "8192",
    ];
    let out = run_ok(
        device.path(),
        wasm,
        &[],
        &[&args[..], &["--verify=1"]].concat(),
    );
    workload_line(&out, "append");
    workload_line(&out, "read");
    let (before, after) = before_after(workload_line(&out, "truncate_front"));
    assert!(
        before >= 10 && after < before,
        "segment files {before} -> {after}"
    );
    assert!(out.contains("verify: 500 entries ok (501..1000)"), "{out}");

    let files = store_ls(device.path(), "/wal");
    assert_eq!(files.len() as u64, after, "{files:?}");
    assert!(files
        .iter()
        .all(|(size, name)| *size > 0 && name.len() == 20));

    let again = run_ok(
        device.path(),
        wasm,
        &[],
        &[&args[..], &["--verify_only=1"]].concat(),
    );
    assert_eq!(again.trim(), "verify: 500 entries ok (501..1000)");
}

/// The host build of buntdb_bench (the comparison report's native baseline) runs and
/// verifies, and its check does catch a wrong expectation (exit 2).
#[test]
fn buntdb_native_runs_and_its_check_catches_a_mismatch() {
    let Some(native) = valet_guests::native("buntdb_bench") else {
        valet_guests::require("buntdb_bench");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("buntdb");
    let run = |extra: &[&str]| {
        Command::new(native)
            .arg("--dir")
            .arg(&db)
            .args(["--num", BUNT_NUM])
            .args(extra)
            .output()
            .expect("starting the native buntdb_bench")
    };
    let out = check(&run(&["--verify=1"]), "native buntdb_bench");
    for name in ["set", "update", "get", "delete", "shrink"] {
        workload_line(&out, name);
    }
    assert!(
        out.contains(&format!("verify: {BUNT_LEFT} keys ok")),
        "{out}"
    );
    let again = check(&run(&["--verify_only=1"]), "native buntdb_bench reopen");
    assert_eq!(again.trim(), format!("verify: {BUNT_LEFT} keys ok"));

    // Expecting the state after "set" alone (generation 0, nothing deleted) must fail.
    let wrong = run(&["--verify_only=1", "--benchmarks=set"]);
    assert_eq!(wrong.status.code(), Some(2), "{wrong:?}");
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("verify failed"));
}

/// The same module under stock wasmtime WASI (a plain host directory at /data) reaches the
/// same state, so a difference under valet-run would be ours, not the guest's.
#[test]
fn buntdb_under_stock_wasmtime_matches() {
    let Some(wasm) = valet_guests::require("buntdb_bench") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = valet_benches::stock::run(
        wasm,
        &["buntdb_bench", "--num", BUNT_NUM, "--verify=1"],
        &[(dir.path(), "/data")],
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    for name in ["set", "update", "get", "delete", "shrink"] {
        workload_line(&out.stdout, name);
    }
    assert!(
        out.stdout.contains(&format!("verify: {BUNT_LEFT} keys ok")),
        "{}",
        out.stdout
    );
    let file = dir.path().join("buntdb/data.db");
    let (_, after) = before_after(workload_line(&out.stdout, "shrink"));
    assert_eq!(std::fs::metadata(file).unwrap().len(), after);
}
