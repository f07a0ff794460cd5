//! Writes, syncs and reports: the guest half of the crash test (`runtime/tests/durability.rs`).
//!
//! Usage: durable_writer SEED FIRST_SEQ DIR [MAX_OPS]
//!
//! Works on a few files in `DIR/dw/` (zoned ones with different streams, and `CURRENT`, which
//! the default placement keeps in the conventional area), doing one operation per sequence
//! number from FIRST_SEQ on, chosen by a generator seeded from (SEED, seq): append, overwrite
//! (possibly extending), create, replace (write `DIR/dw/tmp/NAME`, fsync it, rename it over
//! `DIR/dw/NAME` and fsync both directories), truncate, delete. Every data operation ends with
//! `fsync` or `fdatasync` of the file. The bytes op `seq` writes are `durable_record(SEED, seq, len)`,
//! which the checker recomputes.
//!
//! Protocol on stdout, one line each, written with one `fd_write` and flushed:
//!
//!     ready                                     state read, about to start
//!     begin SEQ append   NAME OFFSET LEN SYNC   before the operation touches anything
//!     begin SEQ write    NAME OFFSET LEN SYNC
//!     begin SEQ create   NAME LEN
//!     begin SEQ replace  NAME LEN
//!     begin SEQ truncate NAME LEN
//!     begin SEQ delete   NAME
//!     ack SEQ                                   after the last sync of the operation returned
//!
//! SYNC is `fsync` or `fdatasync`. The guest runs MAX_OPS operations (0 or absent: until it is
//! killed). It stats the files at start, so it continues from whatever the last run left.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};

#[allow(dead_code)]
#[path = "../content.rs"]
mod content;

use content::{durable_record, mix};

/// The files the writer works on, under `DIR/dw/`.
const NAMES: [&str; 6] = ["f0.log", "f1.sst", "f2.dat", "f3.dat", "CURRENT", "f5.txt"];
/// Files longer than this are truncated or replaced, which bounds the live data.
const MAX_SIZE: u64 = 384 << 10;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// A length: mostly small, sometimes larger than a block, now and then large.
    fn len(&mut self) -> u64 {
        match self.below(10) {
            0..=5 => 1 + self.below(600),
            6..=8 => 1 + self.below(16 << 10),
            _ => 1 + self.below(160 << 10),
        }
    }
}

/// One line on stdout, in one write, flushed before anything else happens.
fn say(line: String) {
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{line}\n").as_bytes())
        .expect("stdout");
    out.flush().expect("stdout");
}

fn sync(f: &File, fsync: bool) {
    if fsync {
        f.sync_all().expect("fsync");
    } else {
        f.sync_data().expect("fdatasync");
    }
}

fn sync_dir(path: &str) {
    File::open(path)
        .and_then(|d| d.sync_all())
        .unwrap_or_else(|e| panic!("fsync of directory {path}: {e}"));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: durable_writer SEED FIRST_SEQ DIR [MAX_OPS]");
        std::process::exit(2);
    }
    let seed: u64 = args[1].parse().expect("SEED");
    let first: u64 = args[2].parse().expect("FIRST_SEQ");
    let root = format!("{}/dw", args[3]);
    let tmp = format!("{root}/tmp");
    let max_ops: u64 = args.get(4).map_or(0, |n| n.parse().expect("MAX_OPS"));

    fs::create_dir_all(&tmp).expect("create the work directories");
    sync_dir(&root);
    let mut sizes: Vec<Option<u64>> = NAMES
        .iter()
        .map(|n| fs::metadata(format!("{root}/{n}")).ok().map(|m| m.len()))
        .collect();
    say("ready".into());

    let mut seq = first;
    while max_ops == 0 || seq - first < max_ops {
        let mut rng = Rng(mix(seed ^ mix(seq.wrapping_mul(3))));
        let k = rng.below(NAMES.len() as u64) as usize;
        let name = NAMES[k];
        let path = format!("{root}/{name}");
        let fsync = rng.below(2) == 0;
        let sync_name = if fsync { "fsync" } else { "fdatasync" };
        let Some(size) = sizes[k] else {
            let len = if rng.below(8) == 0 { 0 } else { rng.len() };
            say(format!("begin {seq} create {name} {len}"));
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .expect("create");
            f.write_all(&durable_record(seed, seq, len as usize))
                .expect("write");
            // The file's fsync alone makes its directory entry durable: the store's promise.
            f.sync_all().expect("fsync");
            drop(f);
            say(format!("ack {seq}"));
            sizes[k] = Some(len);
            seq += 1;
            continue;
        };
        let roll = rng.below(100);
        if size > MAX_SIZE || (75..85).contains(&roll) {
            let len = if size > MAX_SIZE && rng.below(2) == 0 {
                let len = rng.below(size / 2);
                say(format!("begin {seq} truncate {name} {len}"));
                let f = OpenOptions::new().write(true).open(&path).expect("open");
                f.set_len(len).expect("ftruncate");
                sync(&f, fsync);
                len
            } else {
                let len = rng.len();
                say(format!("begin {seq} replace {name} {len}"));
                let staged = format!("{tmp}/{name}");
                let mut f = File::create(&staged).expect("create the staged file");
                f.write_all(&durable_record(seed, seq, len as usize))
                    .expect("write");
                f.sync_all().expect("fsync");
                drop(f);
                fs::rename(&staged, &path).expect("rename");
                sync_dir(&tmp);
                sync_dir(&root);
                len
            };
            say(format!("ack {seq}"));
            sizes[k] = Some(len);
        } else if roll < 45 {
            let len = rng.len();
            say(format!(
                "begin {seq} append {name} {size} {len} {sync_name}"
            ));
            let mut f = OpenOptions::new().append(true).open(&path).expect("open");
            f.write_all(&durable_record(seed, seq, len as usize))
                .expect("append");
            sync(&f, fsync);
            drop(f);
            say(format!("ack {seq}"));
            sizes[k] = Some(size + len);
        } else if roll < 75 {
            let offset = rng.below(size + 1);
            let len = rng.len();
            say(format!(
                "begin {seq} write {name} {offset} {len} {sync_name}"
            ));
            let mut f = OpenOptions::new().write(true).open(&path).expect("open");
            f.seek(SeekFrom::Start(offset)).expect("seek");
            f.write_all(&durable_record(seed, seq, len as usize))
                .expect("write");
            sync(&f, fsync);
            drop(f);
            say(format!("ack {seq}"));
            sizes[k] = Some(size.max(offset + len));
        } else if roll < 93 {
            let len = rng.below(size + 1);
            say(format!("begin {seq} truncate {name} {len}"));
            let f = OpenOptions::new().write(true).open(&path).expect("open");
            f.set_len(len).expect("ftruncate");
            sync(&f, fsync);
            drop(f);
            say(format!("ack {seq}"));
            sizes[k] = Some(len);
        } else {
            say(format!("begin {seq} delete {name}"));
            fs::remove_file(&path).expect("unlink");
            sync_dir(&root);
            say(format!("ack {seq}"));
            sizes[k] = None;
        }
        seq += 1;
    }
}
