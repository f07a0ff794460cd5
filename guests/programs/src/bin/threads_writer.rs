//! A wasm32-wasip1-threads guest: THREADS threads (std::thread, i.e. wasi-threads) start
//! together, each writing and fsyncing its own file DIR/thread-<t>.bin of SIZE bytes in
//! 4 KiB writes; the main thread joins them and reads every file back.
//! Usage: threads_writer DIR THREADS SIZE [trap|exit|append|shared]
//!
//! With `trap` (or `exit`), once every thread has synced its file, the last thread aborts
//! (a wasm trap) or calls `exit(7)` while the main thread waits to join it: the host must
//! end the whole program with that outcome instead of hanging or aborting itself.
//!
//! With `append`, the threads instead append SIZE bytes each, in records of [`RECORD`]
//! bytes, to one file DIR/shared.log through descriptors of their own opened with
//! `O_APPEND`; the main thread then checks that every record is there once, whole, and in
//! its thread's order (appends never write over each other). With `shared`, they write
//! the same records through one descriptor opened without `O_APPEND`, at its position (as
//! a Rust program sharing an `Arc<File>` does): each write moves the position past itself
//! before the next begins, as POSIX says of `write`, so the file ends the same.
//!
//! Byte j of thread t's file is `pattern(t, j)` (the test computes the same).
//! Exit codes: 0 good, 2 usage, 3 data mismatch, 4 a thread failed, 7 `exit` mode.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::sync::{Arc, Barrier};

/// Bytes of one appended record: its thread and number (u32 little-endian each), then its
/// fill byte. Spans a store window's end now and then.
const RECORD: usize = 50_001;

/// Byte `j` of thread `t`'s file.
fn pattern(t: u64, j: u64) -> u8 {
    ((j.wrapping_mul(2654435761) >> 9) ^ (t.wrapping_mul(0x5bd1) + 1)) as u8
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 && args.len() != 5 {
        eprintln!("usage: threads_writer DIR THREADS SIZE [trap|exit|append|shared]");
        std::process::exit(2);
    }
    let end = args.get(4).cloned();
    let dir = args[1].clone();
    let threads: u64 = args[2].parse().expect("THREADS");
    let size: u64 = args[3].parse().expect("SIZE");
    if let Some(mode @ ("append" | "shared")) = end.as_deref() {
        append_records(&dir, threads, size, mode == "shared");
        return;
    }

    let start = Arc::new(Barrier::new(threads as usize));
    let synced = Arc::new(Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (dir, start, synced, end) =
                (dir.clone(), start.clone(), synced.clone(), end.clone());
            std::thread::spawn(move || {
                let path = format!("{dir}/thread-{t}.bin");
                let mut f = File::create(&path).expect("create");
                start.wait();
                let mut j = 0;
                while j < size {
                    let n = (size - j).min(4096);
                    let chunk: Vec<u8> = (j..j + n).map(|x| pattern(t, x)).collect();
                    f.write_all(&chunk).expect("write");
                    j += n;
                }
                f.sync_all().expect("fsync");
                synced.wait();
                if t == threads - 1 {
                    match end.as_deref() {
                        Some("trap") => std::process::abort(),
                        Some("exit") => std::process::exit(7),
                        _ => {}
                    }
                }
            })
        })
        .collect();
    let mut failed = false;
    for h in handles {
        failed |= h.join().is_err();
    }
    if failed {
        println!("threads_writer: a thread failed");
        std::process::exit(4);
    }
    for t in 0..threads {
        let mut data = Vec::new();
        File::open(format!("{dir}/thread-{t}.bin"))
            .and_then(|mut f| f.read_to_end(&mut data))
            .expect("read back");
        let good = data.len() as u64 == size
            && data
                .iter()
                .enumerate()
                .all(|(j, &b)| b == pattern(t, j as u64));
        if !good {
            println!("threads_writer: thread-{t}.bin is wrong");
            std::process::exit(3);
        }
    }
    println!("threads_writer: {threads} files verified");
}

/// The `append` and `shared` modes (see the module docs).
fn append_records(dir: &str, threads: u64, size: u64, shared: bool) {
    let path = format!("{dir}/shared.log");
    let records = size.div_ceil(RECORD as u64);
    let start = Arc::new(Barrier::new(threads as usize));
    let one = shared.then(|| Arc::new(File::create(&path).expect("create")));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (path, start, one) = (path.clone(), start.clone(), one.clone());
            std::thread::spawn(move || {
                let f = one.unwrap_or_else(|| {
                    let own = OpenOptions::new().append(true).create(true).open(&path);
                    Arc::new(own.expect("open for appending"))
                });
                start.wait();
                for k in 0..records {
                    let mut record = vec![pattern(t, k); RECORD];
                    record[..4].copy_from_slice(&(t as u32).to_le_bytes());
                    record[4..8].copy_from_slice(&(k as u32).to_le_bytes());
                    (&*f).write_all(&record).expect("append");
                }
                f.sync_all().expect("fsync");
            })
        })
        .collect();
    if handles.into_iter().any(|h| h.join().is_err()) {
        println!("threads_writer: a thread failed");
        std::process::exit(4);
    }
    let mut data = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .expect("read back");
    let mut next = vec![0u64; threads as usize];
    let whole = data.len() as u64 == threads * records * RECORD as u64;
    let in_order = whole
        && data.chunks(RECORD).all(|record| {
            let t = u32::from_le_bytes(record[..4].try_into().unwrap()) as u64;
            let k = u32::from_le_bytes(record[4..8].try_into().unwrap()) as u64;
            let ok = t < threads
                && k == next[t as usize]
                && record[8..].iter().all(|&b| b == pattern(t, k));
            if ok {
                next[t as usize] += 1;
            }
            ok
        });
    if !in_order {
        println!(
            "threads_writer: shared.log is wrong ({} bytes, {} expected)",
            data.len(),
            threads * records * RECORD as u64
        );
        std::process::exit(3);
    }
    println!("threads_writer: {} appended records verified", threads * records);
}
