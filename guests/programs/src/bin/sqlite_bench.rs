//! SQLite (rusqlite with the bundled amalgamation) under a small speedtest-like driver. It
//! knows nothing of Valet: SQLite's unix VFS over std's files, built for WASI or the host.
//!
//! Usage: `sqlite_bench [--db /data/sqlite/bench.db] [--journal delete|wal]
//!         [--synchronous full|normal] [--locking normal|exclusive] [--num 10000]
//!         [--batch 1000] [--single 200] [--reads N] [--scans N] [--scan-len 100]
//!         [--value-size 100] [--benchmarks insert_txn,insert_single,update,lookup,scan,delete]
//!         [--verify 1] [--verify-only 1]`
//!
//! Table `kv(id INTEGER PRIMARY KEY, k2 INTEGER, val BLOB)` with an index on `k2`. Workloads,
//! in this order when listed:
//! - `insert_txn`: ids `0..num`, `--batch` rows per transaction;
//! - `insert_single`: ids `num..num+single`, one autocommit transaction (one sync) each;
//! - `update`: every id ≡ 1 (mod 4), in shuffled order, `--batch` per transaction;
//! - `lookup`: `--reads` (default `num`) lookups through the `k2` index, in one transaction;
//! - `scan`: `--scans` (default `num/100`) range scans of `--scan-len` rows by id;
//! - `delete`: every id ≡ 3 (mod 4), shuffled, `--batch` per transaction.
//!
//! Every row's contents are a function of its id and whether `update` ran, so `--verify 1`
//! closes the database, reopens it and checks every row and the count (`verify: N rows ok`,
//! exit 2 on a mismatch). `--verify-only 1` runs no workload: it checks that an existing
//! database holds what a run with the same flags left, e.g. from a second process.
//!
//! WASI has no file locks, mmap or shared memory: SQLite's WASI build uses the `unix-dotfile`
//! VFS (a lock directory), and WAL mode runs with `locking_mode=EXCLUSIVE`, which keeps the
//! WAL index in heap memory. The host build is told to use the same VFS and modes.

#[allow(dead_code)]
#[path = "../content.rs"]
mod content;

#[allow(dead_code)]
#[path = "../bench.rs"]
mod bench;

use std::path::Path;

use bench::{check, die, mismatch, shuffled, value, Flags, Workload};
use rusqlite::{params, Connection, OpenFlags};

const WORKLOADS: &[&str] = &[
    "insert_txn",
    "insert_single",
    "update",
    "lookup",
    "scan",
    "delete",
];
const VFS: &str = "unix-dotfile";

struct Args {
    db: String,
    journal: String,
    synchronous: String,
    locking: String,
    num: u64,
    batch: u64,
    single: u64,
    reads: u64,
    scans: u64,
    scan_len: u64,
    value_size: usize,
    benchmarks: Vec<String>,
    verify: bool,
    verify_only: bool,
}

fn parse_args() -> Args {
    let mut f = Flags::from_env();
    let num = f.number("num", 10_000u64);
    let journal = f.string("journal", "delete");
    if !matches!(journal.as_str(), "delete" | "wal") {
        die(format!("--journal: delete or wal, not {journal}"));
    }
    let synchronous = f.string("synchronous", "full");
    if !matches!(synchronous.as_str(), "full" | "normal") {
        die(format!("--synchronous: full or normal, not {synchronous}"));
    }
    // WAL without shared memory needs the exclusive locking mode.
    let default_locking = if journal == "wal" {
        "exclusive"
    } else {
        "normal"
    };
    let locking = f.string("locking", default_locking);
    if !matches!(locking.as_str(), "normal" | "exclusive") {
        die(format!("--locking: normal or exclusive, not {locking}"));
    }
    let args = Args {
        db: f.string("db", "/data/sqlite/bench.db"),
        batch: f.number("batch", 1000u64).max(1),
        single: f.number("single", 200),
        reads: f.number("reads", num),
        scans: f.number("scans", (num / 100).max(1)),
        scan_len: f.number("scan-len", 100),
        value_size: f.number("value-size", 100),
        benchmarks: f.list("benchmarks", WORKLOADS, WORKLOADS),
        verify: f.boolean("verify"),
        verify_only: f.boolean("verify-only"),
        journal,
        synchronous,
        locking,
        num,
    };
    f.finish();
    args
}

/// The secondary key of row `id` (not unique in principle; the index is not declared so).
fn k2(id: u64) -> i64 {
    (content::mix(id) >> 1) as i64
}

/// What the workloads run so far have left in the table.
#[derive(Default)]
struct State {
    num: u64,
    single: u64,
    inserted_txn: bool,
    inserted_single: bool,
    updated: bool,
    deleted: bool,
}

impl State {
    /// Every id any workload touches.
    fn total(&self) -> u64 {
        self.num + self.single
    }

    /// The version of row `id`'s value, or None if the row should not exist.
    fn expected(&self, id: u64) -> Option<u64> {
        let inserted = if id < self.num {
            self.inserted_txn
        } else {
            self.inserted_single && id < self.total()
        };
        if !inserted || (self.deleted && id % 4 == 3) {
            return None;
        }
        Some(u64::from(self.updated && id % 4 == 1))
    }

    /// Marks `workload` as run.
    fn ran(&mut self, workload: &str) {
        match workload {
            "insert_txn" => self.inserted_txn = true,
            "insert_single" => self.inserted_single = true,
            "update" => self.updated = true,
            "delete" => self.deleted = true,
            _ => {}
        }
    }
}

/// Opens the database with the run's pragmas and prints what SQLite agreed to.
fn open(args: &Args, quiet: bool) -> Connection {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = check(
        Connection::open_with_flags_and_vfs(&args.db, flags, VFS),
        "open",
    );
    // The locking mode must be set before the first access for WAL without shared memory.
    let pragma = |sql: &str| -> String { check(conn.query_row(sql, [], |row| row.get(0)), sql) };
    let locking = pragma(&format!("PRAGMA locking_mode={}", args.locking));
    let journal = pragma(&format!("PRAGMA journal_mode={}", args.journal));
    check(
        conn.execute_batch(&format!(
            "PRAGMA synchronous={}; PRAGMA temp_store=MEMORY;",
            args.synchronous
        )),
        "pragmas",
    );
    if journal != args.journal {
        die(format!(
            "journal_mode {} refused: SQLite kept {journal}",
            args.journal
        ));
    }
    if !quiet {
        println!("journal_mode: {journal}");
        println!("locking_mode: {locking}");
    }
    conn
}

/// Removes the database and its journals, for a fresh run.
fn remove_db(db: &str) {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let path = format!("{db}{suffix}");
        if Path::new(&path).exists() {
            check(std::fs::remove_file(&path), &format!("removing {path}"));
        }
    }
    let lock = format!("{db}.lock");
    if Path::new(&lock).is_dir() {
        check(std::fs::remove_dir(&lock), &format!("removing {lock}"));
    }
}

fn exec(conn: &Connection, sql: &str) {
    check(conn.execute_batch(sql), sql);
}

/// Runs `op` on each of `ids` inside transactions of `batch` operations, timing each
/// operation (the commit counts towards the batch's last one).
fn batched(conn: &Connection, w: &mut Workload, ids: &[u64], batch: u64, mut op: impl FnMut(u64)) {
    for (n, &id) in ids.iter().enumerate() {
        let n = n as u64;
        w.op(|| {
            if n.is_multiple_of(batch) {
                exec(conn, "BEGIN");
            }
            op(id);
            if (n + 1).is_multiple_of(batch) || n + 1 == ids.len() as u64 {
                exec(conn, "COMMIT");
            }
        });
    }
}

fn run_workload(conn: &Connection, args: &Args, state: &State, name: &'static str) {
    let mut w = Workload::start(name);
    let total = state.total();
    match name {
        "insert_txn" | "insert_single" => {
            let mut stmt = check(
                conn.prepare("INSERT INTO kv(id, k2, val) VALUES (?1, ?2, ?3)"),
                "prepare insert",
            );
            let mut insert = |id: u64| {
                let v = value(id, 0, args.value_size);
                check(stmt.execute(params![id as i64, k2(id), v]), "insert");
            };
            if name == "insert_txn" {
                let ids: Vec<u64> = (0..args.num).collect();
                batched(conn, &mut w, &ids, args.batch, insert);
            } else {
                for id in args.num..total {
                    w.op(|| insert(id));
                }
            }
        }
        "update" | "delete" => {
            let sql = if name == "update" {
                "UPDATE kv SET val = ?2 WHERE id = ?1"
            } else {
                "DELETE FROM kv WHERE id = ?1"
            };
            let mut stmt = check(conn.prepare(sql), sql);
            let residue = if name == "update" { 1 } else { 3 };
            let ids: Vec<u64> = shuffled(total, 7)
                .into_iter()
                .filter(|id| id % 4 == residue && state.expected(*id).is_some())
                .collect();
            batched(conn, &mut w, &ids, args.batch, |id| {
                let changed = if name == "update" {
                    stmt.execute(params![id as i64, value(id, 1, args.value_size)])
                } else {
                    stmt.execute(params![id as i64])
                };
                if check(changed, name) != 1 {
                    mismatch(format!("{name} of row {id} changed no row"));
                }
            });
        }
        "lookup" => {
            let mut stmt = check(
                conn.prepare("SELECT id, val FROM kv WHERE k2 = ?1"),
                "prepare lookup",
            );
            let order = shuffled(total.max(1), 11);
            exec(conn, "BEGIN");
            for n in 0..args.reads {
                let id = order[(n % order.len() as u64) as usize];
                let rows: Vec<(i64, Vec<u8>)> = w.op(|| {
                    let rows = check(
                        stmt.query_map([k2(id)], |r| Ok((r.get(0)?, r.get(1)?))),
                        "lookup",
                    );
                    check(rows.collect(), "lookup row")
                });
                let found = rows.iter().find(|(i, _)| *i == id as i64);
                match (state.expected(id), found) {
                    (Some(version), Some((_, v))) if *v == value(id, version, args.value_size) => {}
                    (None, None) => {}
                    (want, got) => mismatch(format!(
                        "lookup of row {id}: expected version {want:?}, found {}",
                        if got.is_some() {
                            "other contents"
                        } else {
                            "nothing"
                        }
                    )),
                }
            }
            exec(conn, "COMMIT");
        }
        "scan" => {
            let mut stmt = check(
                conn.prepare("SELECT id, val FROM kv WHERE id >= ?1 ORDER BY id LIMIT ?2"),
                "prepare scan",
            );
            let order = shuffled(total.max(1), 13);
            exec(conn, "BEGIN");
            for n in 0..args.scans {
                let start = order[(n % order.len() as u64) as usize];
                let (rows, bytes) = w.op(|| {
                    let mut rows = check(
                        stmt.query(params![start as i64, args.scan_len as i64]),
                        "scan",
                    );
                    let (mut count, mut bytes) = (0u64, 0usize);
                    while let Some(row) = check(rows.next(), "scan row") {
                        let v: Vec<u8> = check(row.get(1), "scan value");
                        count += 1;
                        bytes += v.len();
                    }
                    (count, bytes)
                });
                let want = (start..total)
                    .filter(|&id| state.expected(id).is_some())
                    .take(args.scan_len as usize)
                    .count() as u64;
                if rows != want || bytes != rows as usize * args.value_size {
                    mismatch(format!(
                        "scan from {start}: {rows} rows ({bytes} bytes), expected {want}"
                    ));
                }
            }
            exec(conn, "COMMIT");
        }
        _ => unreachable!("unknown workload {name}"),
    }
    w.report();
}

/// Checks every row and the count against `state`, and the database's integrity.
fn verify(conn: &Connection, args: &Args, state: &State) -> u64 {
    let integrity: String = check(
        conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)),
        "integrity_check",
    );
    if integrity != "ok" {
        mismatch(format!("integrity_check: {integrity}"));
    }
    let mut stmt = check(
        conn.prepare("SELECT id, k2, val FROM kv ORDER BY id"),
        "prepare verify",
    );
    let mut rows = check(stmt.query([]), "verify query");
    let mut want = (0..state.total()).filter_map(|id| Some((id, state.expected(id)?)));
    let mut count = 0u64;
    while let Some(row) = check(rows.next(), "verify row") {
        let columns = || -> rusqlite::Result<(i64, i64, Vec<u8>)> {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        };
        let (id, key2, val) = check(columns(), "verify columns");
        let Some((want_id, version)) = want.next() else {
            mismatch(format!("unexpected row {id} after the last expected one"));
        };
        if id != want_id as i64 {
            mismatch(format!("found row {id}, expected row {want_id}"));
        }
        if key2 != k2(want_id) || val != value(want_id, version, args.value_size) {
            mismatch(format!(
                "row {id}: wrong contents (expected version {version})"
            ));
        }
        count += 1;
    }
    if let Some((id, _)) = want.next() {
        mismatch(format!("row {id} is missing ({count} rows found)"));
    }
    count
}

fn close(conn: Connection) {
    if let Err((_, e)) = conn.close() {
        die(format!("close: {e}"));
    }
}

fn main() {
    let args = parse_args();
    let mut state = State {
        num: args.num,
        single: args.single,
        ..State::default()
    };
    for name in &args.benchmarks {
        state.ran(name);
    }
    if let Some(dir) = Path::new(&args.db).parent() {
        check(
            std::fs::create_dir_all(dir),
            "creating the database directory",
        );
    }
    if !args.verify_only {
        println!(
            "sqlite_bench: SQLite {}, vfs {VFS}, journal {}, synchronous {}, locking {}, \
             {} rows + {} single, {}-byte values",
            rusqlite::version(),
            args.journal,
            args.synchronous,
            args.locking,
            args.num,
            args.single,
            args.value_size
        );
        remove_db(&args.db);
        let conn = open(&args, false);
        exec(
            &conn,
            "CREATE TABLE kv(id INTEGER PRIMARY KEY, k2 INTEGER NOT NULL, val BLOB NOT NULL);
             CREATE INDEX kv_k2 ON kv(k2);",
        );
        let mut so_far = State {
            num: args.num,
            single: args.single,
            ..State::default()
        };
        for &name in WORKLOADS {
            if args.benchmarks.iter().any(|b| b == name) {
                run_workload(&conn, &args, &so_far, name);
                so_far.ran(name);
            }
        }
        if args.journal == "wal" {
            let wal = format!("{}-wal", args.db);
            let len = std::fs::metadata(&wal).map(|m| m.len());
            match len {
                Ok(len) => println!("wal file: {wal} {len} bytes"),
                Err(e) => die(format!("WAL mode but no {wal}: {e}")),
            }
        }
        close(conn);
    }
    if args.verify || args.verify_only {
        let conn = open(&args, !args.verify_only);
        let rows = verify(&conn, &args, &state);
        close(conn);
        println!("verify: {rows} rows ok");
    }
}
