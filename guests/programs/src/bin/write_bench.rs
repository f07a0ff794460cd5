//! The guest half of `benches/benches/wasi_write.rs`: a tight loop of file operations that
//! times itself with the WASI monotonic clock, so that the host can leave instance start-up,
//! opening and the final close out of the measurement.
//!
//! Usage: write_bench MODE SIZE COUNT DIR [OUT]
//!
//! - `write`: opens `DIR/write.dat` (created, truncated) and does COUNT `fd_write`s of SIZE
//!   bytes. Every 8 MiB it seeks back to 0, so the file stays small and both hosts overwrite
//!   the same range (the seek is in the loop, one per 8 MiB: a few ns per write at most).
//! - `files`: COUNT times creates `DIR/files/N` (new names each time), writes SIZE bytes,
//!   `fsync`s and closes it. The files are removed after the timed loop.
//! - `statmiss`: recurses SIZE calls deep, then stats COUNT files of DIR that do not exist
//!   (each an ENOENT from the host): what an errno costs a guest with a deep stack.
//!
//! Prints the loop's duration in nanoseconds, a bare number and a newline, to OUT (a file
//! path, written after the loop) or, without OUT, to stdout.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::time::Instant;

/// Where `write` mode wraps around.
const WRAP: u64 = 8 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: write_bench write|files|statmiss SIZE COUNT DIR [OUT]");
        std::process::exit(2);
    }
    let mode = args[1].as_str();
    let size: usize = args[2].parse().expect("SIZE");
    let count: u64 = args[3].parse().expect("COUNT");
    let dir = &args[4];
    let buf: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();

    let elapsed = match mode {
        "write" => {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(format!("{dir}/write.dat"))
                .expect("open write.dat");
            let per_wrap = (WRAP / size.max(1) as u64).max(1);
            let start = Instant::now();
            let mut in_wrap = 0;
            for _ in 0..count {
                f.write_all(&buf).expect("write");
                in_wrap += 1;
                if in_wrap == per_wrap {
                    f.seek(SeekFrom::Start(0)).expect("seek");
                    in_wrap = 0;
                }
            }
            let elapsed = start.elapsed();
            drop(f);
            elapsed
        }
        "files" => {
            let files = format!("{dir}/files");
            fs::create_dir_all(&files).expect("mkdir files");
            let start = Instant::now();
            for i in 0..count {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(format!("{files}/{i}"))
                    .expect("create");
                f.write_all(&buf).expect("write");
                f.sync_all().expect("fsync");
                drop(f);
            }
            let elapsed = start.elapsed();
            fs::remove_dir_all(&files).expect("remove the files");
            elapsed
        }
        "statmiss" => stat_missing_at_depth(size, count, dir),
        other => {
            eprintln!("write_bench: unknown mode {other}");
            std::process::exit(2);
        }
    };
    let line = format!("{}\n", elapsed.as_nanos());
    match args.get(5) {
        Some(out) => File::create(out)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .expect("writing the result"),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(line.as_bytes()).expect("stdout");
            out.flush().expect("stdout");
        }
    }
}

/// `depth` frames down, times `count` stats of missing files.
#[inline(never)]
fn stat_missing_at_depth(depth: usize, count: u64, dir: &str) -> std::time::Duration {
    if depth > 0 {
        let d = stat_missing_at_depth(std::hint::black_box(depth - 1), count, dir);
        return std::hint::black_box(d);
    }
    let names: Vec<String> = (0..16).map(|i| format!("{dir}/missing-{i}")).collect();
    let start = Instant::now();
    for i in 0..count {
        let r = fs::metadata(&names[(i % 16) as usize]);
        assert!(r.is_err(), "{} exists", names[(i % 16) as usize]);
    }
    start.elapsed()
}
