//! SQLite (rusqlite's bundled amalgamation, compiled for wasm32-wasip1) end to end under
//! `valet-run`, in rollback-journal (DELETE) and WAL modes, and its host build. Each run
//! ends with the guest's own check: it closes the database, reopens it and compares every
//! row; a second `valet-run` on the same device repeats that check from a new process.

mod dbbench;

use dbbench::{assert_line, assert_workload, ls, run_native};

const NUM: u64 = 2000;
const SINGLE: u64 = 40;
const WORKLOADS: &[&str] = &[
    "insert_txn",
    "insert_single",
    "update",
    "lookup",
    "scan",
    "delete",
];

/// The rows left after every workload: ids `0..NUM+SINGLE` but those ≡ 3 (mod 4), deleted.
fn rows_left() -> usize {
    (0..NUM + SINGLE).filter(|id| id % 4 != 3).count()
}

/// Runs every workload in `journal` mode on a fresh device, then verifies the database from
/// a second process. Returns the first run's output.
fn run_and_reopen(journal: &str, synchronous: &str) -> Option<String> {
    let wasm = valet_guests::require("sqlite_bench")?;
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device");
    let (num, single) = (NUM.to_string(), SINGLE.to_string());
    let mut args = vec![
        "--journal",
        journal,
        "--synchronous",
        synchronous,
        "--num",
        &num,
        "--single",
        &single,
        "--batch",
        "500",
    ];
    let verified = format!("verify: {} rows ok", rows_left());

    let first = valet_tests::run_ok(
        &device,
        wasm,
        &[],
        &[&args[..], &["--verify", "1"]].concat(),
    );
    for name in WORKLOADS {
        assert_workload(&first, name);
    }
    assert_line(&first, &format!("journal_mode: {journal}"));
    assert_line(&first, &verified);

    // A new process on the same device finds every row.
    args.extend(["--verify-only", "1"]);
    let second = valet_tests::run_ok(&device, wasm, &[], &args);
    assert_line(&second, &format!("journal_mode: {journal}"));
    assert_line(&second, &verified);
    assert!(
        !second.contains("micros/op"),
        "--verify-only ran workloads:\n{second}"
    );

    // Closed cleanly: the database file, and no hot journal left behind.
    let listing = ls(&device, "/sqlite");
    assert!(
        listing.lines().any(|l| l.ends_with(" bench.db")),
        "no bench.db in:\n{listing}"
    );
    assert!(
        !listing.contains("bench.db-journal"),
        "a rollback journal survived the close:\n{listing}"
    );
    Some(first)
}

#[test]
fn sqlite_delete_journal_under_valet_run_survives_reopen() {
    run_and_reopen("delete", "full");
}

#[test]
fn sqlite_wal_under_valet_run_uses_the_wal_and_survives_reopen() {
    let Some(out) = run_and_reopen("wal", "normal") else {
        return;
    };
    // WAL without shared memory: only in exclusive locking mode.
    assert_line(&out, "locking_mode: exclusive");
    // The -wal file existed, with frames in it, before the close checkpointed it.
    let wal_bytes: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("wal file: /data/sqlite/bench.db-wal "))
        .and_then(|rest| rest.strip_suffix(" bytes")?.parse().ok())
        .unwrap_or_else(|| panic!("no wal file line in:\n{out}"));
    assert!(wal_bytes > 32, "an empty WAL: {wal_bytes} bytes");
}

#[test]
fn sqlite_native_build_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    let num = NUM.to_string();
    for journal in ["delete", "wal"] {
        let args = [
            "--db",
            db.to_str().unwrap(),
            "--journal",
            journal,
            "--num",
            &num,
            "--single",
            "40",
            "--verify",
            "1",
        ];
        let Some(out) = run_native("sqlite_bench", &args) else {
            return;
        };
        assert_line(&out, &format!("journal_mode: {journal}"));
        assert_line(&out, &format!("verify: {} rows ok", rows_left()));
    }
}
