//! LevelDB 1.22 (C++, with our single-threaded port and POSIX `Env`) end to end: under
//! `valet-run` with the `rocks` policy, under stock wasmtime WASI, and compiled natively.
//! Every run ends with the driver's `--verify=1`: the database is reopened and every key
//! the benchmarks wrote must read back with its exact value.

use std::path::Path;
use std::process::Command;

mod dbbench;

use dbbench::assert_workload as bench_line;

const NUM: &str = "20000";

fn assert_all_found(stdout: &str, name: &str) {
    let line = bench_line(stdout, name);
    assert!(line.ends_with(&format!("({NUM} of {NUM} found)")), "{line}");
}

fn assert_verified(stdout: &str) {
    assert!(
        stdout.contains(&format!("\nverify: {NUM} keys ok\n")),
        "no verification of {NUM} keys in:\n{stdout}"
    );
}

/// `host_bytes` of each stream in a `--stats-json` file.
fn stream_bytes(stats_json: &str) -> Vec<u64> {
    let streams = stats_json
        .split_once("\"streams\"")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(streams, _)| streams)
        .expect("a streams list in the stats");
    streams
        .split("\"host_bytes\":")
        .skip(1)
        .map(|s| {
            let digits: String = s
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().expect("host_bytes is a number")
        })
        .collect()
}

#[test]
fn leveldb_under_valet_run_keeps_logs_and_tables_apart_and_reopens() {
    let Some(wasm) = valet_guests::require("leveldb") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device");
    let stats = dir.path().join("stats.json");
    let stats_arg = stats.to_str().unwrap();
    let out = valet_tests::run_ok(
        &device,
        wasm,
        &["--policy", "rocks", "--stats-json", stats_arg],
        &[
            "--benchmarks=fillrandom,overwrite,readrandom,readwhilewriting",
            "--num",
            NUM,
            "--verify=1",
        ],
    );
    for name in ["fillrandom", "overwrite"] {
        assert!(bench_line(&out, name).ends_with(" MB/s"), "{out}");
    }
    assert_all_found(&out, "readrandom");
    assert_all_found(&out, "readwhilewriting");
    assert_verified(&out);

    // rocks puts write-ahead logs and tables in different streams: 20,000 keys of 420
    // bytes, written twice, give each of them megabytes.
    let bytes = stream_bytes(&std::fs::read_to_string(&stats).unwrap());
    let big = bytes.iter().filter(|&&b| b > 4 << 20).count();
    assert!(
        big >= 2,
        "expected logs and tables in separate streams, got {bytes:?}"
    );

    // A second run on the same store finds everything the first one wrote.
    let out = valet_tests::run_ok(
        &device,
        wasm,
        &["--policy", "rocks"],
        &[
            "--benchmarks=fillseq,readrandom",
            "--use_existing_db=1",
            "--num",
            NUM,
        ],
    );
    assert!(
        out.contains("fillseq      : skipped (--use_existing_db is true)"),
        "{out}"
    );
    assert_all_found(&out, "readrandom");
}

#[test]
fn leveldb_under_stock_wasmtime() {
    let Some(wasm) = valet_guests::require("leveldb") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Stock wasmtime refuses fsync on a directory (EBADF), which the Env must tolerate
    // when it syncs the MANIFEST's directory.
    let out = valet_benches::stock::run(
        wasm,
        &[
            "leveldb",
            "--benchmarks=fillseq,readseq",
            "--num",
            NUM,
            "--verify=1",
        ],
        &[(dir.path(), "/data")],
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    bench_line(&out.stdout, "fillseq");
    bench_line(&out.stdout, "readseq");
    assert_verified(&out.stdout);
    assert!(dir.path().join("leveldb/CURRENT").exists());
}

#[test]
fn leveldb_native() {
    if valet_guests::require("leveldb").is_none() {
        return;
    }
    let native: &Path = valet_guests::native("leveldb")
        .expect("leveldb is built natively too")
        .as_ref();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let out = Command::new(native)
        .arg(format!("--db={}", db.display()))
        .args([
            "--benchmarks=fillrandom,overwrite,readseq,readrandom",
            "--num",
            NUM,
            "--sync=0",
            "--verify=1",
        ])
        .output()
        .expect("starting the native leveldb");
    let stdout = valet_tests::check(&out, "native leveldb");
    bench_line(&stdout, "readseq");
    assert_all_found(&stdout, "readrandom");
    assert_verified(&stdout);
}
