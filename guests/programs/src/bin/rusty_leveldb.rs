//! rusty-leveldb (a pure-Rust LevelDB) under db_bench-like workloads, over an `Env` of ours
//! on std::fs: the crate's own disk Env takes `flock` locks, which WASI lacks. Built for WASI
//! and for the host.
//!
//! Usage: `rusty_leveldb [--db /data/rusty_leveldb] [--num 10000] [--value-size 100]
//!         [--benchmarks fillseq,fillrandom,readrandom] [--sync 0|1] [--verify 1]
//!         [--verify-only 1]`
//!
//! - `fillseq`: keys `0..num` in order, first version of each value;
//! - `fillrandom`: the same keys in a shuffled order, second version;
//! - `readrandom`: `num` gets in another shuffled order, each checked.
//!
//! Keys are 16 decimal digits. `--verify 1` closes the database, reopens it and checks every
//! key and value and the count (`verify: N keys ok`, exit 2 on a mismatch); `--verify-only 1`
//! runs no workload and checks what a run with the same flags left.

#[allow(dead_code)]
#[path = "../content.rs"]
mod content;

#[allow(dead_code)]
#[path = "../bench.rs"]
mod bench;
#[path = "../positional.rs"]
mod positional;

use std::cell::RefCell;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bench::{check, mismatch, shuffled, value, Flags, Workload};
use rusty_leveldb::env::{Env, FileLock, Logger, RandomAccess};
use rusty_leveldb::{LdbIterator, Options, Status, StatusCode, WriteBatch, DB};

const WORKLOADS: &[&str] = &["fillseq", "fillrandom", "readrandom"];

/// rusty-leveldb's `Env` over std::fs. Locks are bookkeeping within this process (a second
/// process could open the same database; the guests never do). `flush()` on a writable file
/// is LevelDB's sync: it reaches the device with `fdatasync`.
struct StdEnv {
    locks: RefCell<HashSet<PathBuf>>,
    start: Instant,
}

fn status(what: &str, path: &Path, e: io::Error) -> Status {
    let mut s = Status::from(e);
    s.err = format!("{what} {}: {}", path.display(), s.err);
    s
}

/// A file read with positioned reads.
struct PreadFile(File);

impl PreadFile {
    fn pread(&self, off: u64, dst: &mut [u8]) -> io::Result<usize> {
        positional::read_at(&self.0, dst, off)
    }
}

impl RandomAccess for PreadFile {
    fn read_at(&self, off: usize, dst: &mut [u8]) -> rusty_leveldb::Result<usize> {
        Ok(read_full(dst, |buf, done| {
            self.pread((off + done) as u64, buf)
        })?)
    }
}

/// Fills `buf` with `read(rest of buf, bytes so far)` until full or at the end of the file.
fn read_full(
    buf: &mut [u8],
    mut read: impl FnMut(&mut [u8], usize) -> io::Result<usize>,
) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match read(&mut buf[done..], done) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A file read front to back whose reads return all that was asked unless at the end: the
/// log reader takes a short read for the end of the file.
struct FullRead(File);

impl Read for FullRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read_full(buf, |rest, _| self.0.read(rest))
    }
}

/// A file written by LevelDB, whose `flush()` is a sync.
struct SyncFile(File);

impl Write for SyncFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl StdEnv {
    fn new() -> StdEnv {
        StdEnv {
            locks: RefCell::new(HashSet::new()),
            start: Instant::now(),
        }
    }

    fn open(&self, path: &Path, options: &OpenOptions, what: &str) -> rusty_leveldb::Result<File> {
        options.open(path).map_err(|e| status(what, path, e))
    }

    fn writer(&self, path: &Path, append: bool) -> rusty_leveldb::Result<Box<dyn Write>> {
        let mut options = OpenOptions::new();
        options.create(true);
        if append {
            options.append(true);
        } else {
            options.write(true).truncate(true);
        }
        Ok(Box::new(SyncFile(self.open(
            path,
            &options,
            "open for writing",
        )?)))
    }
}

impl Env for StdEnv {
    fn open_sequential_file(&self, path: &Path) -> rusty_leveldb::Result<Box<dyn Read>> {
        let file = self.open(path, OpenOptions::new().read(true), "open")?;
        Ok(Box::new(FullRead(file)))
    }

    fn open_random_access_file(&self, path: &Path) -> rusty_leveldb::Result<Box<dyn RandomAccess>> {
        let file = self.open(path, OpenOptions::new().read(true), "open")?;
        Ok(Box::new(PreadFile(file)))
    }

    fn open_writable_file(&self, path: &Path) -> rusty_leveldb::Result<Box<dyn Write>> {
        self.writer(path, false)
    }

    fn open_appendable_file(&self, path: &Path) -> rusty_leveldb::Result<Box<dyn Write>> {
        self.writer(path, true)
    }

    fn exists(&self, path: &Path) -> rusty_leveldb::Result<bool> {
        path.try_exists().map_err(|e| status("stat", path, e))
    }

    fn children(&self, path: &Path) -> rusty_leveldb::Result<Vec<PathBuf>> {
        let entries = fs::read_dir(path).map_err(|e| status("readdir", path, e))?;
        entries
            .map(|e| {
                Ok(PathBuf::from(
                    e.map_err(|e| status("readdir", path, e))?.file_name(),
                ))
            })
            .collect()
    }

    fn size_of(&self, path: &Path) -> rusty_leveldb::Result<usize> {
        let meta = fs::metadata(path).map_err(|e| status("stat", path, e))?;
        Ok(meta.len() as usize)
    }

    fn delete(&self, path: &Path) -> rusty_leveldb::Result<()> {
        fs::remove_file(path).map_err(|e| status("unlink", path, e))
    }

    fn mkdir(&self, path: &Path) -> rusty_leveldb::Result<()> {
        fs::create_dir_all(path).map_err(|e| status("mkdir", path, e))
    }

    fn rmdir(&self, path: &Path) -> rusty_leveldb::Result<()> {
        fs::remove_dir_all(path).map_err(|e| status("rmdir", path, e))
    }

    fn rename(&self, from: &Path, to: &Path) -> rusty_leveldb::Result<()> {
        fs::rename(from, to).map_err(|e| status("rename", from, e))
    }

    fn lock(&self, path: &Path) -> rusty_leveldb::Result<FileLock> {
        if !self.locks.borrow_mut().insert(path.to_path_buf()) {
            return Err(Status::new(
                StatusCode::LockError,
                &format!("{} is already locked", path.display()),
            ));
        }
        // LevelDB keeps a LOCK file in the database; create it as it would.
        let created = self.open(
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
            "lock",
        );
        if let Err(e) = created {
            self.locks.borrow_mut().remove(path);
            return Err(e);
        }
        Ok(FileLock {
            id: path.to_string_lossy().into_owned(),
        })
    }

    fn unlock(&self, lock: FileLock) -> rusty_leveldb::Result<()> {
        if self.locks.borrow_mut().remove(Path::new(&lock.id)) {
            Ok(())
        } else {
            Err(Status::new(
                StatusCode::LockError,
                &format!("{} is not locked", lock.id),
            ))
        }
    }

    fn new_logger(&self, path: &Path) -> rusty_leveldb::Result<Logger> {
        Ok(Logger::new(self.writer(path, true)?))
    }

    fn micros(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn sleep_for(&self, micros: u32) {
        std::thread::sleep(Duration::from_micros(micros.into()));
    }
}

struct Args {
    db: String,
    num: u64,
    value_size: usize,
    benchmarks: Vec<String>,
    sync: bool,
    verify: bool,
    verify_only: bool,
}

fn parse_args() -> Args {
    let mut f = Flags::from_env();
    let args = Args {
        db: f.string("db", "/data/rusty_leveldb"),
        num: f.number("num", 10_000),
        value_size: f.number("value-size", 100),
        benchmarks: f.list("benchmarks", WORKLOADS, WORKLOADS),
        sync: f.boolean("sync"),
        verify: f.boolean("verify"),
        verify_only: f.boolean("verify-only"),
    };
    f.finish();
    args
}

fn key(i: u64) -> Vec<u8> {
    format!("{i:016}").into_bytes()
}

fn open(args: &Args, env: &Rc<Box<dyn Env>>, create: bool) -> DB {
    let options = Options {
        env: Rc::clone(env),
        create_if_missing: create,
        ..Options::default()
    };
    check(DB::open(&args.db, options), "open")
}

/// The version of every key's value once `ran` have run, or None if nothing wrote any.
fn version(ran: &[&str]) -> Option<u64> {
    if ran.contains(&"fillrandom") {
        Some(1)
    } else if ran.contains(&"fillseq") {
        Some(0)
    } else {
        None
    }
}

fn run_workload(db: &mut DB, args: &Args, ran: &[&str], name: &'static str) {
    let mut w = Workload::start(name);
    let mut put = |w: &mut Workload, i: u64, version: u64| {
        let (k, v) = (key(i), value(i, version, args.value_size));
        w.op(|| {
            if args.sync {
                let mut batch = WriteBatch::default();
                batch.put(&k, &v);
                check(db.write(batch, true), "write");
            } else {
                check(db.put(&k, &v), "put");
            }
        });
    };
    match name {
        "fillseq" => (0..args.num).for_each(|i| put(&mut w, i, 0)),
        "fillrandom" => shuffled(args.num, 3)
            .into_iter()
            .for_each(|i| put(&mut w, i, 1)),
        "readrandom" => {
            let want = version(ran);
            for i in shuffled(args.num, 5) {
                let k = key(i);
                let got = w.op(|| db.get(&k));
                let ok = match (want, &got) {
                    (Some(v), Some(got)) => **got == *value(i, v, args.value_size),
                    (None, None) => true,
                    _ => false,
                };
                if !ok {
                    mismatch(format!("get of key {i}: expected version {want:?}"));
                }
            }
        }
        _ => unreachable!("unknown workload {name}"),
    }
    check(db.flush(), "flush");
    w.report();
}

/// Checks every key, value and the count; returns the count.
fn verify(db: &mut DB, args: &Args, version: Option<u64>) -> u64 {
    let mut it = check(db.new_iter(), "iterator");
    let mut count = 0u64;
    while let Some((k, v)) = LdbIterator::next(&mut it) {
        let want = version.filter(|_| count < args.num);
        let Some(ver) = want else {
            mismatch(format!("unexpected key {}", String::from_utf8_lossy(&k)));
        };
        if k != key(count) {
            mismatch(format!(
                "found key {}, expected {count}",
                String::from_utf8_lossy(&k)
            ));
        }
        if v != value(count, ver, args.value_size) {
            mismatch(format!("key {count}: wrong value (expected version {ver})"));
        }
        count += 1;
    }
    let want = if version.is_some() { args.num } else { 0 };
    if count != want {
        mismatch(format!("{count} keys found, expected {want}"));
    }
    count
}

fn main() {
    let args = parse_args();
    let env: Rc<Box<dyn Env>> = Rc::new(Box::new(StdEnv::new()));
    let all: Vec<&str> = args.benchmarks.iter().map(String::as_str).collect();
    if !args.verify_only {
        println!(
            "rusty_leveldb: {} keys, {}-byte values, sync {}",
            args.num, args.value_size, args.sync
        );
        if Path::new(&args.db).exists() {
            check(fs::remove_dir_all(&args.db), "removing the old database");
        }
        let mut db = open(&args, &env, true);
        let mut ran = Vec::new();
        for &name in WORKLOADS {
            if all.contains(&name) {
                run_workload(&mut db, &args, &ran, name);
                ran.push(name);
            }
        }
        check(db.close(), "close");
    }
    if args.verify || args.verify_only {
        let mut db = open(&args, &env, false);
        let rows = verify(&mut db, &args, version(&all));
        check(db.close(), "close");
        println!("verify: {rows} keys ok");
    }
}
