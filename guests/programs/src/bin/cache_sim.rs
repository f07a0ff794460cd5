//! A flash cache shaped like CacheLib's Navy engine, as a WASI guest: small objects in a
//! hashed file of 4 KiB buckets rewritten in place (`small/bighash.dat`), large objects
//! appended to region files (`large/region-NNNN`) that are evicted whole, oldest first.
//! Runs a 50 % get / 30 % set / 20 % delete mix and checks every large object still cached
//! at the end.
//!
//! Usage: `cache_sim [--dir /data/cache] [--ops N] [--regions K] [--region-mib M]`

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};

const BUCKET: usize = 4096;
const BUCKETS: u64 = 256;

fn die(msg: &str) -> ! {
    eprintln!("cache_sim: {msg}");
    std::process::exit(2)
}

fn ok<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| die(&format!("{what}: {e}")))
}

fn payload(key: u64, len: usize) -> Vec<u8> {
    let mut x = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn main() {
    let mut dir = "/data/cache".to_string();
    let (mut ops, mut keep, mut region_mib) = (20_000u64, 6usize, 2u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| die(&format!("{a} needs a value")));
        match a.as_str() {
            "--dir" => dir = v(),
            "--ops" => ops = v().parse().unwrap_or_else(|_| die("--ops")),
            "--regions" => keep = v().parse().unwrap_or_else(|_| die("--regions")),
            "--region-mib" => region_mib = v().parse().unwrap_or_else(|_| die("--region-mib")),
            other => die(&format!("unknown argument {other}")),
        }
    }
    ok(fs::create_dir_all(format!("{dir}/small")), "mkdir small");
    ok(fs::create_dir_all(format!("{dir}/large")), "mkdir large");
    let mut buckets = ok(
        OpenOptions::new().read(true).write(true).create(true).open(format!("{dir}/small/bighash.dat")),
        "bighash",
    );
    ok(buckets.set_len(BUCKETS * BUCKET as u64), "bighash size");

    let region_bytes = region_mib << 20;
    let mut regions: VecDeque<u64> = VecDeque::new();
    let mut current: Option<(u64, File, u64)> = None;
    let mut next_region = 0u64;
    // Where each large object lives: key -> (region, offset, len).
    let mut index: HashMap<u64, (u64, u64, usize)> = HashMap::new();
    let (mut hits, mut gets) = (0u64, 0u64);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut bucket = vec![0u8; BUCKET];
    for op in 0..ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Popular keys are few: half the traffic goes to 1/16 of the key space.
        let key = if x.is_multiple_of(2) { x % 256 } else { x % 4096 };
        let roll = (x >> 20) % 10;
        let large = key % 4 == 0;
        if roll < 5 {
            gets += 1;
            if large {
                hits += index.contains_key(&key) as u64;
            } else {
                let at = (key % BUCKETS) * BUCKET as u64;
                ok(buckets.seek(SeekFrom::Start(at)), "seek");
                ok(buckets.read_exact(&mut bucket), "bucket read");
                hits += (bucket[0] != 0) as u64;
            }
        } else if roll < 8 {
            if large {
                let len = 16 * 1024 + (x % 48) as usize * 1024;
                if current.as_ref().is_none_or(|c| c.2 + len as u64 > region_bytes) {
                    if let Some((_, f, _)) = current.take() {
                        ok(f.sync_all(), "region sync");
                    }
                    let id = next_region;
                    next_region += 1;
                    let f = ok(File::create(format!("{dir}/large/region-{id:04}")), "region");
                    current = Some((id, f, 0));
                    regions.push_back(id);
                    // FIFO eviction: the oldest region and every object in it go.
                    while regions.len() > keep {
                        let old = regions.pop_front().unwrap();
                        ok(fs::remove_file(format!("{dir}/large/region-{old:04}")), "evict");
                        index.retain(|_, (r, _, _)| *r != old);
                    }
                }
                let (id, f, used) = current.as_mut().unwrap();
                ok(f.write_all(&payload(key ^ op, len)), "region write");
                index.insert(key, (*id, *used, len));
                *used += len as u64;
            } else {
                let at = (key % BUCKETS) * BUCKET as u64;
                bucket.fill((key as u8) | 1);
                ok(buckets.seek(SeekFrom::Start(at)), "seek");
                ok(buckets.write_all(&bucket), "bucket write");
            }
        } else if large {
            index.remove(&key);
        } else {
            let at = (key % BUCKETS) * BUCKET as u64;
            ok(buckets.seek(SeekFrom::Start(at)), "seek");
            ok(buckets.write_all(&vec![0u8; BUCKET]), "bucket clear");
        }
        if op % 1000 == 999 {
            ok(buckets.sync_data(), "bighash sync");
        }
    }
    if let Some((_, f, _)) = current.take() {
        ok(f.sync_all(), "region sync");
    }
    // Every large object still indexed reads back as written.
    let mut checked = 0;
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for op in 0..ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = if x.is_multiple_of(2) { x % 256 } else { x % 4096 };
        if key % 4 == 0 && (x >> 20) % 10 >= 5 && (x >> 20) % 10 < 8 {
            seen.insert(key, op);
        }
    }
    for (key, (region, at, len)) in &index {
        let mut f = ok(File::open(format!("{dir}/large/region-{region:04}")), "region open");
        let mut got = vec![0u8; *len];
        ok(f.seek(SeekFrom::Start(*at)), "seek");
        ok(f.read_exact(&mut got), "region read");
        if got != payload(key ^ seen[key], *len) {
            die(&format!("large object {key} is corrupt"));
        }
        checked += 1;
    }
    println!(
        "cache: {ops} ops, hit ratio {:.3}, {checked} large objects verified, {} regions",
        hits as f64 / gets.max(1) as f64,
        regions.len()
    );
}
