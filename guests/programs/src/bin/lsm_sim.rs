//! A small LSM key-value store, run as a WASI guest, with LevelDB's file pattern: a
//! write-ahead log `NNNNNN.log` appended on every write and dropped at each memtable flush,
//! sorted tables `NNNNNN.ldb` written once and deleted by leveled compaction, an
//! append-only `MANIFEST-000001`, `CURRENT` replaced by rename, a `LOCK` file. It knows
//! nothing of Valet: it only uses std::fs.
//!
//! Usage: `lsm_sim [--dir /data/db] [--num N] [--value-size 400] [--key-size 20] [--sync]
//!         [--benchmarks fillrandom,overwrite,readrandom] [--seed S]`
//!
//! Prints db_bench's line format, then checks every key against what it wrote (reading the
//! tables back through the filesystem) and exits non-zero if anything differs.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Instant;

const MEMTABLE_BYTES: usize = 4 << 20;
const TABLE_BYTES: usize = 2 << 20;
const L0_TRIGGER: usize = 4;
const LEVEL_BASE: u64 = 10 << 20;

struct Args {
    dir: String,
    num: u64,
    value_size: usize,
    key_size: usize,
    sync: bool,
    benchmarks: Vec<String>,
    seed: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        dir: "/data/db".into(),
        num: 50_000,
        value_size: 400,
        key_size: 20,
        sync: false,
        benchmarks: vec!["fillrandom".into(), "overwrite".into(), "readrandom".into()],
        seed: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| die(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--dir" => a.dir = val(),
            "--num" => a.num = val().parse().unwrap_or_else(|_| die("--num")),
            "--value-size" | "--value_size" => a.value_size = val().parse().unwrap_or_else(|_| die("--value-size")),
            "--key-size" | "--key_size" => a.key_size = val().parse().unwrap_or_else(|_| die("--key-size")),
            "--benchmarks" => a.benchmarks = val().split(',').map(str::to_string).collect(),
            "--seed" => a.seed = val().parse().unwrap_or_else(|_| die("--seed")),
            "--sync" => a.sync = true,
            other => die(&format!("unknown argument {other}")),
        }
    }
    a.key_size = a.key_size.max(16);
    a
}

fn die(msg: &str) -> ! {
    eprintln!("lsm_sim: {msg}");
    std::process::exit(2)
}

fn check<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| die(&format!("{what}: {e}")))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A table on disk: its file number, key range and an index of key → value offset.
struct Table {
    number: u64,
    size: u64,
    index: BTreeMap<Vec<u8>, (u64, u32)>,
}

impl Table {
    fn smallest(&self) -> &[u8] {
        self.index.keys().next().map(Vec::as_slice).unwrap_or(&[])
    }
    fn largest(&self) -> &[u8] {
        self.index.keys().next_back().map(Vec::as_slice).unwrap_or(&[])
    }
}

struct Db {
    dir: String,
    sync: bool,
    next_file: u64,
    wal: File,
    wal_number: u64,
    manifest: File,
    memtable: BTreeMap<Vec<u8>, Vec<u8>>,
    mem_bytes: usize,
    levels: Vec<Vec<Table>>,
    compact_cursor: Vec<usize>,
}

impl Db {
    fn open(dir: &str, sync: bool) -> Db {
        check(fs::create_dir_all(dir), "mkdir");
        check(File::create(format!("{dir}/LOCK")), "LOCK");
        let manifest = check(
            OpenOptions::new().create(true).append(true).open(format!("{dir}/MANIFEST-000001")),
            "MANIFEST",
        );
        let tmp = format!("{dir}/CURRENT.dbtmp");
        check(fs::write(&tmp, b"MANIFEST-000001\n"), "CURRENT");
        check(fs::rename(&tmp, format!("{dir}/CURRENT")), "rename CURRENT");
        let wal_number = 2;
        let wal = check(File::create(format!("{dir}/{wal_number:06}.log")), "WAL");
        Db {
            dir: dir.to_string(),
            sync,
            next_file: 3,
            wal,
            wal_number,
            manifest,
            memtable: BTreeMap::new(),
            mem_bytes: 0,
            levels: (0..5).map(|_| Vec::new()).collect(),
            compact_cursor: vec![0; 5],
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) {
        let mut rec = Vec::with_capacity(8 + key.len() + value.len());
        rec.extend_from_slice(&(key.len() as u32).to_le_bytes());
        rec.extend_from_slice(&(value.len() as u32).to_le_bytes());
        rec.extend_from_slice(key);
        rec.extend_from_slice(value);
        check(self.wal.write_all(&rec), "WAL write");
        if self.sync {
            check(self.wal.sync_data(), "WAL sync");
        }
        self.mem_bytes += rec.len();
        self.memtable.insert(key.to_vec(), value.to_vec());
        if self.mem_bytes >= MEMTABLE_BYTES {
            self.flush_memtable();
        }
    }

    fn log_manifest(&mut self, line: String) {
        check(self.manifest.write_all(line.as_bytes()), "MANIFEST write");
        check(self.manifest.sync_data(), "MANIFEST sync");
    }

    /// Writes sorted entries as tables of about TABLE_BYTES at `level`.
    fn write_tables(&mut self, entries: impl Iterator<Item = (Vec<u8>, Vec<u8>)>, level: usize) -> Vec<Table> {
        let mut out = Vec::new();
        let mut current: Option<(File, Table, Vec<u8>)> = None;
        for (k, v) in entries {
            if current.is_none() {
                let number = self.next_file;
                self.next_file += 1;
                let f = check(File::create(format!("{}/{number:06}.ldb", self.dir)), "table create");
                current = Some((f, Table { number, size: 0, index: BTreeMap::new() }, Vec::new()));
            }
            let (_, table, buf) = current.as_mut().unwrap();
            buf.extend_from_slice(&(k.len() as u32).to_le_bytes());
            buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
            buf.extend_from_slice(&k);
            // Tables are written whole at close, so a value's file offset is its place in buf.
            let at = buf.len() as u64;
            buf.extend_from_slice(&v);
            table.index.insert(k, (at, v.len() as u32));
            if buf.len() >= TABLE_BYTES {
                out.push(finish_table(current.take().unwrap(), self.sync));
            }
        }
        if let Some(c) = current.take() {
            out.push(finish_table(c, self.sync));
        }
        for t in &out {
            self.log_manifest(format!("add {level} {:06} {}\n", t.number, t.size));
        }
        out
    }

    fn flush_memtable(&mut self) {
        let mem = std::mem::take(&mut self.memtable);
        self.mem_bytes = 0;
        let tables = self.write_tables(mem.into_iter(), 0);
        self.levels[0].extend(tables);
        // The memtable is durable in its tables: its log goes, a new one starts.
        let old = self.wal_number;
        self.wal_number = self.next_file;
        self.next_file += 1;
        self.wal = check(File::create(format!("{}/{:06}.log", self.dir, self.wal_number)), "WAL");
        check(fs::remove_file(format!("{}/{old:06}.log", self.dir)), "WAL remove");
        self.maybe_compact();
    }

    fn level_bytes(&self, level: usize) -> u64 {
        self.levels[level].iter().map(|t| t.size).sum()
    }

    fn maybe_compact(&mut self) {
        loop {
            if self.levels[0].len() >= L0_TRIGGER {
                let inputs: Vec<usize> = (0..self.levels[0].len()).collect();
                self.compact(0, inputs);
                continue;
            }
            let Some(level) = (1..self.levels.len() - 1)
                .find(|&l| self.level_bytes(l) > LEVEL_BASE * 10u64.pow(l as u32 - 1))
            else {
                return;
            };
            let pick = self.compact_cursor[level] % self.levels[level].len();
            self.compact_cursor[level] += 1;
            self.compact(level, vec![pick]);
        }
    }

    /// Merges `inputs` of `level` with the overlapping tables of the next level.
    fn compact(&mut self, level: usize, inputs: Vec<usize>) {
        let mut upper: Vec<Table> = Vec::new();
        for i in inputs.into_iter().rev() {
            upper.push(self.levels[level].remove(i));
        }
        let lo = upper.iter().map(|t| t.smallest().to_vec()).min().unwrap_or_default();
        let hi = upper.iter().map(|t| t.largest().to_vec()).max().unwrap_or_default();
        let (lower, keep): (Vec<Table>, Vec<Table>) = std::mem::take(&mut self.levels[level + 1])
            .into_iter()
            .partition(|t| t.largest() >= lo.as_slice() && t.smallest() <= hi.as_slice());
        self.levels[level + 1] = keep;
        // Older data first, newer overwrites: lower level, then upper tables oldest first.
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut upper_sorted: Vec<&Table> = upper.iter().collect();
        upper_sorted.sort_by_key(|t| t.number);
        for t in lower.iter().chain(upper_sorted) {
            for (k, v) in self.read_table(t) {
                merged.insert(k, v);
            }
        }
        let out = self.write_tables(merged.into_iter(), level + 1);
        self.levels[level + 1].extend(out);
        self.levels[level + 1].sort_by(|a, b| a.smallest().cmp(b.smallest()));
        for t in upper.iter().chain(lower.iter()) {
            self.log_manifest(format!("del {:06}\n", t.number));
            check(fs::remove_file(format!("{}/{:06}.ldb", self.dir, t.number)), "table remove");
        }
    }

    fn read_table(&self, t: &Table) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut buf = Vec::new();
        check(
            File::open(format!("{}/{:06}.ldb", self.dir, t.number)).and_then(|mut f| f.read_to_end(&mut buf)),
            "table read",
        );
        let mut out = Vec::new();
        let mut at = 0;
        while at + 8 <= buf.len() {
            let kl = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            let vl = u32::from_le_bytes(buf[at + 4..at + 8].try_into().unwrap()) as usize;
            let k = buf[at + 8..at + 8 + kl].to_vec();
            let v = buf[at + 8 + kl..at + 8 + kl + vl].to_vec();
            out.push((k, v));
            at += 8 + kl + vl;
        }
        out
    }

    /// Point lookup: memtable, then L0 newest first, then each level.
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        if let Some(v) = self.memtable.get(key) {
            return Some(v.clone());
        }
        let mut l0: Vec<&Table> = self.levels[0].iter().collect();
        l0.sort_by_key(|t| std::cmp::Reverse(t.number));
        let deeper = self.levels[1..].iter().flatten();
        for t in l0.into_iter().chain(deeper) {
            if let Some(&(at, len)) = t.index.get(key) {
                let mut f = check(File::open(format!("{}/{:06}.ldb", self.dir, t.number)), "table open");
                let mut v = vec![0u8; len as usize];
                check(f.seek(SeekFrom::Start(at)), "table seek");
                check(f.read_exact(&mut v), "table read");
                return Some(v);
            }
        }
        None
    }
}

fn finish_table((mut f, mut table, buf): (File, Table, Vec<u8>), sync: bool) -> Table {
    check(f.write_all(&buf), "table write");
    if sync {
        check(f.sync_all(), "table sync");
    }
    table.size = buf.len() as u64;
    table
}

fn key(i: u64, size: usize) -> Vec<u8> {
    let mut k = format!("{i:016}").into_bytes();
    k.resize(size, b'k');
    k
}

fn value(i: u64, version: u64, size: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect()
}

fn report(name: &str, ops: u64, bytes: u64, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{name:<12} : {:>11.3} micros/op; {:>6.1} MB/s",
        secs * 1e6 / ops.max(1) as f64,
        bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
    );
}

fn main() {
    let args = parse_args();
    let mut db = Db::open(&args.dir, args.sync);
    let mut rng = Rng(args.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let mut expected: HashMap<u64, u64> = HashMap::new();
    let mut version = 0u64;
    let entry = (args.key_size + args.value_size) as u64;
    for bench in &args.benchmarks {
        let start = Instant::now();
        match bench.as_str() {
            "fillseq" | "fillrandom" | "overwrite" => {
                for n in 0..args.num {
                    let i = if bench == "fillseq" { n } else { rng.next() % args.num };
                    version += 1;
                    db.put(&key(i, args.key_size), &value(i, version, args.value_size));
                    expected.insert(i, version);
                }
                report(bench, args.num, args.num * entry, start);
            }
            "readrandom" => {
                let mut found = 0;
                for _ in 0..args.num {
                    let i = rng.next() % args.num;
                    if let Some(v) = db.get(&key(i, args.key_size)) {
                        found += 1;
                        let want = expected.get(&i).map(|&ver| value(i, ver, args.value_size));
                        if Some(&v) != want.as_ref() {
                            die(&format!("readrandom: key {i} has the wrong value"));
                        }
                    }
                }
                report(bench, args.num, found * entry, start);
                println!("readrandom   : ({found} of {} found)", args.num);
            }
            other => die(&format!("unknown benchmark {other}")),
        }
    }
    // Every key written reads back with its newest value.
    for (&i, &ver) in &expected {
        match db.get(&key(i, args.key_size)) {
            Some(v) if v == value(i, ver, args.value_size) => {}
            _ => die(&format!("verify: key {i} is missing or wrong")),
        }
    }
    let tables: usize = db.levels.iter().map(Vec::len).sum();
    println!("verified {} keys; {tables} tables", expected.len());
}
