//! rusty-leveldb (pure-Rust LevelDB) over the guest's own std::fs `Env`, end to end under
//! `valet-run` and as a host build. Each run reopens the database and checks every key; a
//! second `valet-run` on the same device checks it again from a new process.

mod dbbench;

use dbbench::{assert_line, assert_workload, ls, run_native};

/// Enough keys for two 4 MiB memtables, so tables are written, compacted and reopened.
const NUM: &str = "20000";

#[test]
fn rusty_leveldb_under_valet_run_survives_reopen() {
    let Some(wasm) = valet_guests::require("rusty_leveldb") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device");
    let verified = format!("verify: {NUM} keys ok");

    let first = valet_tests::run_ok(&device, wasm, &[], &["--num", NUM, "--verify", "1"]);
    for name in ["fillseq", "fillrandom", "readrandom"] {
        assert_workload(&first, name);
    }
    assert_line(&first, &verified);

    let second = valet_tests::run_ok(&device, wasm, &[], &["--num", NUM, "--verify-only", "1"]);
    assert_line(&second, &verified);

    let listing = ls(&device, "/rusty_leveldb");
    for file in [".ldb", ".log", "MANIFEST-", "CURRENT"] {
        assert!(listing.contains(file), "no {file} in:\n{listing}");
    }
}

#[test]
fn rusty_leveldb_synced_writes_under_valet_run() {
    let Some(wasm) = valet_guests::require("rusty_leveldb") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--num",
        "300",
        "--sync",
        "1",
        "--benchmarks",
        "fillrandom",
        "--verify",
        "1",
    ];
    let out = valet_tests::run_ok(&dir.path().join("device"), wasm, &[], &args);
    assert_workload(&out, "fillrandom");
    assert_line(&out, "verify: 300 keys ok");
}

#[test]
fn rusty_leveldb_native_build_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let args = ["--db", db.to_str().unwrap(), "--num", NUM, "--verify", "1"];
    let Some(out) = run_native("rusty_leveldb", &args) else {
        return;
    };
    for name in ["fillseq", "fillrandom", "readrandom"] {
        assert_workload(&out, name);
    }
    assert_line(&out, &format!("verify: {NUM} keys ok"));
}
