//! A flash cache shaped like CacheLib's Navy engine, driven by a cachebench-like workload.
//!
//! - **Small objects** (at most `--small-max` bytes) live in `small/bighash.dat`, a file of
//!   4 KiB buckets (BigHash). A key hashes to one bucket; the bucket holds several objects,
//!   each with a header (key, version, length), behind a bucket header (checksum, count).
//!   A set or delete reads the bucket, edits it in memory and writes the whole bucket back
//!   in place with one pwrite. A full bucket drops its oldest objects first (FIFO).
//! - **Large objects** are appended to region files `large/region-NNNNNN` (BlockCache). An
//!   in-memory index maps a key to (region, offset, length, version). A region is filled by
//!   appends and sealed when the next object does not fit; when the region budget is
//!   exhausted, the oldest region is evicted whole (its file deleted) with all its objects.
//!
//! Every object's bytes are a function of (key, version), so every hit is checked. At a
//! clean shutdown the cache writes its index to `index.dat` (fsync'd, then renamed into
//! place); the next run loads it, and `--verify=1` reads back every object (a mismatch
//! exits with 2).
//!
//! The driver: `--ops` requests over `--keys` keys with Zipf(`--zipf`) popularity, a
//! get/set/delete mix, cache-aside (a get miss is followed by a set of that key). A key's
//! size is a function of the key: `--large-pct` % of keys are large, uniform in
//! `--large-min..=--large-max`, the rest uniform in `--small-min..=--small-max`. The run
//! prints db_bench-style lines for all requests, gets and sets, then `bytes_written N`
//! (logical bytes the cache wrote: regions, buckets and index).
//!
//! Usage: `cache [--dir /data/cache] [--flash-mib 256] [--small-pct 10] [--region-mib 16]
//! [--ops 100000] [--keys 100000] [--zipf 0.9] [--get-pct 50] [--set-pct 30] [--del-pct 20]
//! [--small-min 100] [--small-max 2048] [--large-min 16384] [--large-max 262144]
//! [--large-pct 20] [--seed 1] [--sync 0|1] [--verify 0|1]` (also `--flag=value`).

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::time::Instant;

#[allow(dead_code)]
#[path = "../content.rs"]
mod content;
#[allow(dead_code)]
#[path = "../bench.rs"]
mod bench;
#[path = "../positional.rs"]
mod positional;

use content::mix;

const BUCKET: usize = 4096;
/// Bucket header: checksum (u32) of the rest of the bucket, object count (u32).
const BUCKET_HDR: usize = 8;
/// Object header in a bucket: key (u64), version (u64), length (u32).
const ENTRY_HDR: usize = 20;
/// Object header in a region: magic (u32), length (u32), key (u64), version (u64).
const ITEM_HDR: usize = 24;
const ITEM_MAGIC: u32 = 0x4e41_5659; // "NAVY"
const INDEX_MAGIC: &str = "valet-cache-index-v1";

type Res<T> = Result<T, String>;

fn corrupt(msg: String) -> ! {
    eprintln!("cache: verify failed: {msg}");
    std::process::exit(2)
}

/// The bytes of object `key` at `version`: 8-byte words of a keyed splitmix stream.
fn fill_object(key: u64, version: u64, out: &mut [u8]) {
    let seed = mix(key ^ mix(version));
    for (w, chunk) in out.chunks_mut(8).enumerate() {
        let word = mix(seed.wrapping_add(w as u64)).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Whether `data` is object `key` at `version`.
fn object_ok(key: u64, version: u64, data: &[u8]) -> bool {
    let seed = mix(key ^ mix(version));
    data.chunks(8).enumerate().all(|(w, chunk)| {
        let word = mix(seed.wrapping_add(w as u64)).to_le_bytes();
        chunk == &word[..chunk.len()]
    })
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn pread(f: &File, buf: &mut [u8], mut at: u64) -> Res<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = positional::read_at(f, &mut buf[done..], at)
            .map_err(|e| format!("pread at {at}: {e}"))?;
        if n == 0 {
            return Err(format!("pread at {at}: unexpected end of file"));
        }
        done += n;
        at += n as u64;
    }
    Ok(())
}

fn pwrite(f: &File, buf: &[u8], mut at: u64) -> Res<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = positional::write_at(f, &buf[done..], at)
            .map_err(|e| format!("pwrite at {at}: {e}"))?;
        if n == 0 {
            return Err(format!("pwrite at {at}: wrote nothing"));
        }
        done += n;
        at += n as u64;
    }
    Ok(())
}

/// The checksum a bucket header carries: over everything after the checksum field.
fn bucket_sum(b: &[u8]) -> u32 {
    let h = b[BUCKET_HDR..]
        .chunks_exact(8)
        .fold(mix(u32_at(b, 4) as u64), |h, c| mix(h ^ u64_at(c, 0)));
    (h ^ (h >> 32)) as u32
}

/// The objects of a bucket: (offset of the entry header, key, version, length).
fn bucket_entries(b: &[u8], which: u64) -> Vec<(usize, u64, u64, usize)> {
    let (sum, count) = (u32_at(b, 0), u32_at(b, 4));
    if sum == 0 && count == 0 {
        return Vec::new();
    }
    if bucket_sum(b) != sum {
        corrupt(format!("bucket {which}: checksum mismatch"));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut at = BUCKET_HDR;
    for _ in 0..count {
        if at + ENTRY_HDR > BUCKET {
            corrupt(format!("bucket {which}: entries overrun the bucket"));
        }
        let (key, version, len) = (
            u64_at(b, at),
            u64_at(b, at + 8),
            u32_at(b, at + 16) as usize,
        );
        if at + ENTRY_HDR + len > BUCKET {
            corrupt(format!("bucket {which}: object {key} overruns the bucket"));
        }
        out.push((at, key, version, len));
        at += ENTRY_HDR + len;
    }
    out
}

/// Where a large object lives.
#[derive(Clone, Copy)]
struct Loc {
    region: u64,
    offset: u64,
    len: usize,
    version: u64,
}

struct Region {
    id: u64,
    file: File,
    used: u64,
    /// Keys appended to this region (some may since have moved or been deleted).
    keys: Vec<u64>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
struct Geometry {
    buckets: u64,
    region_bytes: u64,
    region_budget: u64,
}

struct Cache {
    dir: String,
    geo: Geometry,
    sync: bool,
    bighash: File,
    /// Oldest first; the last one is being filled. Ids are consecutive.
    regions: VecDeque<Region>,
    next_region: u64,
    index: HashMap<u64, Loc>,
    next_version: u64,
    bucket_buf: Vec<u8>,
    item_buf: Vec<u8>,
    // Counters.
    region_bytes_written: u64,
    bucket_bytes_written: u64,
    index_bytes_written: u64,
    regions_evicted: u64,
    large_evicted: u64,
    small_evicted: u64,
}

fn region_path(dir: &str, id: u64) -> String {
    format!("{dir}/large/region-{id:06}")
}

fn open_rw(path: &str, create: bool) -> Res<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .open(path)
        .map_err(|e| format!("open {path}: {e}"))
}

impl Cache {
    /// Opens the cache in `dir`: from its index if a clean shutdown left one that matches
    /// `geo`, else empty.
    fn open(dir: &str, geo: Geometry, sync: bool) -> Res<Cache> {
        for sub in ["small", "large"] {
            fs::create_dir_all(format!("{dir}/{sub}"))
                .map_err(|e| format!("mkdir {dir}/{sub}: {e}"))?;
        }
        let bighash = open_rw(&format!("{dir}/small/bighash.dat"), true)?;
        let mut cache = Cache {
            dir: dir.to_string(),
            geo,
            sync,
            bighash,
            regions: VecDeque::new(),
            next_region: 0,
            index: HashMap::new(),
            next_version: 1,
            bucket_buf: vec![0; BUCKET],
            item_buf: Vec::new(),
            region_bytes_written: 0,
            bucket_bytes_written: 0,
            index_bytes_written: 0,
            regions_evicted: 0,
            large_evicted: 0,
            small_evicted: 0,
        };
        let index_path = format!("{dir}/index.dat");
        let loaded = match fs::read_to_string(&index_path) {
            Ok(text) => {
                // Whatever happens next, this index is used at most once (as Navy does):
                // a crash before the next clean shutdown must not bring it back.
                fs::remove_file(&index_path).map_err(|e| format!("remove {index_path}: {e}"))?;
                match cache.load_index(&text) {
                    Ok(()) => true,
                    Err(why) => {
                        eprintln!("cache: index not used ({why}); starting empty");
                        cache.regions.clear();
                        cache.index.clear();
                        false
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(format!("read {index_path}: {e}")),
        };
        // Region files the index does not name are garbage.
        let large = format!("{dir}/large");
        for entry in fs::read_dir(&large).map_err(|e| format!("readdir {large}: {e}"))? {
            let entry = entry.map_err(|e| format!("readdir {large}: {e}"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let id = name
                .strip_prefix("region-")
                .and_then(|n| n.parse::<u64>().ok());
            if !id.is_some_and(|id| cache.regions.iter().any(|r| r.id == id)) {
                let path = format!("{large}/{name}");
                fs::remove_file(&path).map_err(|e| format!("remove {path}: {e}"))?;
            }
        }
        let bucket_file_bytes = geo.buckets * BUCKET as u64;
        if !loaded {
            // A fresh cache: every bucket empty.
            cache
                .bighash
                .set_len(0)
                .map_err(|e| format!("truncate bighash: {e}"))?;
        }
        cache
            .bighash
            .set_len(bucket_file_bytes)
            .map_err(|e| format!("size bighash: {e}"))?;
        if loaded {
            println!(
                "loaded index: {} large objects in {} regions",
                cache.index.len(),
                cache.regions.len()
            );
        }
        Ok(cache)
    }

    fn load_index(&mut self, text: &str) -> Res<()> {
        let mut lines = text.lines();
        let mut words = |what: &str| -> Res<Vec<u64>> {
            let line = lines.next().ok_or(format!("no {what} line"))?;
            let mut w = line.split_whitespace();
            if w.next() != Some(what) {
                return Err(format!("expected {what}"));
            }
            w.map(|x| {
                x.parse::<u64>()
                    .map_err(|_| format!("bad number {x} in {what}"))
            })
            .collect()
        };
        let head = words(INDEX_MAGIC)?;
        let [buckets, region_bytes, region_budget, next_region, next_version, objects] = head[..]
        else {
            return Err("bad header".into());
        };
        let saved = Geometry {
            buckets,
            region_bytes,
            region_budget,
        };
        if saved != self.geo {
            return Err(format!(
                "saved geometry {saved:?} differs from {:?}",
                self.geo
            ));
        }
        self.next_region = next_region;
        self.next_version = next_version;
        let regions = words("regions")?;
        for pair in regions.chunks(2) {
            let &[id, used] = pair else {
                return Err("odd regions line".into());
            };
            let file = open_rw(&region_path(&self.dir, id), false)?;
            self.regions.push_back(Region {
                id,
                file,
                used,
                keys: Vec::new(),
            });
        }
        if self
            .regions
            .iter()
            .zip(self.regions.iter().skip(1))
            .any(|(a, b)| b.id != a.id + 1)
        {
            return Err("region ids are not consecutive".into());
        }
        for _ in 0..objects {
            let [key, region, offset, len, version] = words("o")?[..] else {
                return Err("bad object line".into());
            };
            let first = self.regions.front().map_or(0, |r| r.id);
            let r = region
                .checked_sub(first)
                .and_then(|i| self.regions.get_mut(i as usize))
                .ok_or(format!("object {key} in unknown region {region}"))?;
            if offset + ITEM_HDR as u64 + len > r.used {
                return Err(format!("object {key} beyond its region's end"));
            }
            r.keys.push(key);
            let len = len as usize;
            self.index.insert(
                key,
                Loc {
                    region,
                    offset,
                    len,
                    version,
                },
            );
        }
        let sum = words("end")?;
        if sum != [self.index_sum()] {
            return Err("index checksum mismatch".into());
        }
        Ok(())
    }

    /// A checksum over the loaded index, to catch a truncated or edited index file.
    fn index_sum(&self) -> u64 {
        let mut items: Vec<_> = self.index.iter().collect();
        items.sort_by_key(|(k, _)| **k);
        let mut h = mix(self.next_region ^ mix(self.next_version));
        for r in &self.regions {
            h = mix(h ^ r.id) ^ mix(r.used);
        }
        for (k, l) in items {
            h = mix(h ^ *k) ^ mix(l.region ^ mix(l.offset ^ mix(l.len as u64 ^ mix(l.version))));
        }
        h
    }

    fn bucket_of(&self, key: u64) -> u64 {
        mix(key ^ 0x0062_6967_6861_7368) % self.geo.buckets
    }

    fn read_bucket(&mut self, b: u64) -> Res<()> {
        pread(&self.bighash, &mut self.bucket_buf, b * BUCKET as u64)
    }

    fn write_bucket(&mut self, b: u64, buf: &[u8]) -> Res<()> {
        pwrite(&self.bighash, buf, b * BUCKET as u64)?;
        self.bucket_bytes_written += BUCKET as u64;
        if self.sync {
            self.bighash
                .sync_data()
                .map_err(|e| format!("sync bighash: {e}"))?;
        }
        Ok(())
    }

    /// Rewrites bucket `b` from the current `bucket_buf` without `key` and, if given, with a
    /// new object (key, version, len) at its end, dropping the oldest objects to make room.
    fn rebuild_bucket(&mut self, b: u64, key: u64, new: Option<(u64, usize)>) -> Res<()> {
        let kept: Vec<_> = bucket_entries(&self.bucket_buf, b)
            .into_iter()
            .filter(|e| e.1 != key)
            .collect();
        let need = new.map_or(0, |(_, len)| ENTRY_HDR + len);
        let mut total: usize = kept.iter().map(|e| ENTRY_HDR + e.3).sum();
        let mut skip = 0;
        while BUCKET_HDR + total + need > BUCKET {
            total -= ENTRY_HDR + kept[skip].3;
            skip += 1;
        }
        self.small_evicted += skip as u64;
        let mut out = vec![0u8; BUCKET];
        let mut at = BUCKET_HDR;
        for &(from, ..) in &kept[skip..] {
            let len = ENTRY_HDR + u32_at(&self.bucket_buf, from + 16) as usize;
            out[at..at + len].copy_from_slice(&self.bucket_buf[from..from + len]);
            at += len;
        }
        let mut count = kept.len() - skip;
        if let Some((version, len)) = new {
            out[at..at + 8].copy_from_slice(&key.to_le_bytes());
            out[at + 8..at + 16].copy_from_slice(&version.to_le_bytes());
            out[at + 16..at + 20].copy_from_slice(&(len as u32).to_le_bytes());
            fill_object(key, version, &mut out[at + ENTRY_HDR..at + ENTRY_HDR + len]);
            count += 1;
        }
        out[4..8].copy_from_slice(&(count as u32).to_le_bytes());
        let sum = if count == 0 { 0 } else { bucket_sum(&out) };
        out[0..4].copy_from_slice(&sum.to_le_bytes());
        self.write_bucket(b, &out)
    }

    /// The position in `regions` of region `id`, if it is still cached.
    fn region(&self, id: u64) -> Option<usize> {
        let first = self.regions.front()?.id;
        let i = id.checked_sub(first)? as usize;
        (i < self.regions.len()).then_some(i)
    }

    /// Reads and checks large object `key`.
    fn read_large(&mut self, key: u64, loc: Loc) -> Res<()> {
        let r = self
            .region(loc.region)
            .ok_or(format!("object {key}: region gone"))?;
        let r = &self.regions[r];
        let b = &mut self.item_buf;
        b.resize(ITEM_HDR + loc.len, 0);
        pread(&r.file, b, loc.offset)?;
        let ok = u32_at(b, 0) == ITEM_MAGIC
            && u32_at(b, 4) as usize == loc.len
            && u64_at(b, 8) == key
            && u64_at(b, 16) == loc.version
            && object_ok(key, loc.version, &b[ITEM_HDR..]);
        if !ok {
            corrupt(format!(
                "large object {key} (region {}, offset {}, {} bytes) differs",
                loc.region, loc.offset, loc.len
            ));
        }
        Ok(())
    }

    /// Looks `key` up (a small object if `len` is at most `small_max`); true on a hit.
    fn get(&mut self, key: u64, small: bool) -> Res<bool> {
        if small {
            let b = self.bucket_of(key);
            self.read_bucket(b)?;
            let found = bucket_entries(&self.bucket_buf, b)
                .into_iter()
                .find(|e| e.1 == key);
            if let Some((at, key, version, len)) = found {
                let data = &self.bucket_buf[at + ENTRY_HDR..at + ENTRY_HDR + len];
                if !object_ok(key, version, data) {
                    corrupt(format!("small object {key} in bucket {b} differs"));
                }
                return Ok(true);
            }
            return Ok(false);
        }
        match self.index.get(&key).copied() {
            Some(loc) => self.read_large(key, loc).map(|()| true),
            None => Ok(false),
        }
    }

    fn set(&mut self, key: u64, len: usize, small: bool) -> Res<()> {
        let version = self.next_version;
        self.next_version += 1;
        if small {
            let b = self.bucket_of(key);
            self.read_bucket(b)?;
            return self.rebuild_bucket(b, key, Some((version, len)));
        }
        let need = (ITEM_HDR + len) as u64;
        if self
            .regions
            .back()
            .is_none_or(|r| r.used + need > self.geo.region_bytes)
        {
            self.roll_region()?;
        }
        let mut buf = std::mem::take(&mut self.item_buf);
        buf.resize(ITEM_HDR + len, 0);
        buf[0..4].copy_from_slice(&ITEM_MAGIC.to_le_bytes());
        buf[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        buf[8..16].copy_from_slice(&key.to_le_bytes());
        buf[16..24].copy_from_slice(&version.to_le_bytes());
        fill_object(key, version, &mut buf[ITEM_HDR..]);
        let r = self.regions.back_mut().expect("a region is open");
        pwrite(&r.file, &buf, r.used)?;
        self.item_buf = buf;
        let loc = Loc {
            region: r.id,
            offset: r.used,
            len,
            version,
        };
        r.used += need;
        r.keys.push(key);
        self.region_bytes_written += need;
        self.index.insert(key, loc);
        Ok(())
    }

    /// Seals the region being filled and opens the next, evicting the oldest regions
    /// beyond the budget.
    fn roll_region(&mut self) -> Res<()> {
        if self.sync {
            if let Some(r) = self.regions.back() {
                r.file
                    .sync_data()
                    .map_err(|e| format!("sync region {}: {e}", r.id))?;
            }
        }
        let id = self.next_region;
        self.next_region += 1;
        let path = region_path(&self.dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| format!("create {path}: {e}"))?;
        self.regions.push_back(Region {
            id,
            file,
            used: 0,
            keys: Vec::new(),
        });
        while self.regions.len() as u64 > self.geo.region_budget {
            let old = self.regions.pop_front().expect("over budget");
            for key in &old.keys {
                if self.index.get(key).is_some_and(|l| l.region == old.id) {
                    self.index.remove(key);
                    self.large_evicted += 1;
                }
            }
            drop(old.file);
            let path = region_path(&self.dir, old.id);
            fs::remove_file(&path).map_err(|e| format!("evict {path}: {e}"))?;
            self.regions_evicted += 1;
        }
        Ok(())
    }

    fn delete(&mut self, key: u64, small: bool) -> Res<bool> {
        if small {
            let b = self.bucket_of(key);
            self.read_bucket(b)?;
            if !bucket_entries(&self.bucket_buf, b)
                .iter()
                .any(|e| e.1 == key)
            {
                return Ok(false);
            }
            self.rebuild_bucket(b, key, None)?;
            return Ok(true);
        }
        Ok(self.index.remove(&key).is_some())
    }

    /// Reads back every object: each indexed large object and each object in each bucket.
    fn verify(&mut self) -> Res<u64> {
        let mut items: Vec<(u64, Loc)> = self.index.iter().map(|(k, l)| (*k, *l)).collect();
        items.sort_by_key(|(_, l)| (l.region, l.offset));
        for &(key, loc) in &items {
            self.read_large(key, loc)?;
        }
        let mut small = 0u64;
        for b in 0..self.geo.buckets {
            self.read_bucket(b)?;
            for (at, key, version, len) in bucket_entries(&self.bucket_buf, b) {
                if self.bucket_of(key) != b {
                    corrupt(format!("small object {key} found in bucket {b}"));
                }
                if !object_ok(
                    key,
                    version,
                    &self.bucket_buf[at + ENTRY_HDR..at + ENTRY_HDR + len],
                ) {
                    corrupt(format!("small object {key} in bucket {b} differs"));
                }
                small += 1;
            }
        }
        Ok(items.len() as u64 + small)
    }

    /// A clean shutdown: everything durable, then the index, fsync'd and renamed into place.
    fn close(&mut self) -> Res<()> {
        for r in &self.regions {
            r.file
                .sync_all()
                .map_err(|e| format!("sync region {}: {e}", r.id))?;
        }
        self.bighash
            .sync_all()
            .map_err(|e| format!("sync bighash: {e}"))?;
        let mut text = format!(
            "{INDEX_MAGIC} {} {} {} {} {} {}\nregions",
            self.geo.buckets,
            self.geo.region_bytes,
            self.geo.region_budget,
            self.next_region,
            self.next_version,
            self.index.len()
        );
        for r in &self.regions {
            text.push_str(&format!(" {} {}", r.id, r.used));
        }
        text.push('\n');
        let mut items: Vec<_> = self.index.iter().collect();
        items.sort_by_key(|(k, _)| **k);
        for (k, l) in items {
            text.push_str(&format!(
                "o {k} {} {} {} {}\n",
                l.region, l.offset, l.len, l.version
            ));
        }
        text.push_str(&format!("end {}\n", self.index_sum()));
        let tmp = format!("{}/index.tmp", self.dir);
        let done = format!("{}/index.dat", self.dir);
        let mut f = File::create(&tmp).map_err(|e| format!("create {tmp}: {e}"))?;
        std::io::Write::write_all(&mut f, text.as_bytes())
            .map_err(|e| format!("write {tmp}: {e}"))?;
        f.sync_all().map_err(|e| format!("sync {tmp}: {e}"))?;
        drop(f);
        fs::rename(&tmp, &done).map_err(|e| format!("rename {tmp} to {done}: {e}"))?;
        // The rename is durable once the directory is synced. Stock wasmtime refuses a
        // directory fsync (EBADF); there the rename is as durable as the host makes it.
        if let Ok(dir) = File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        self.index_bytes_written += text.len() as u64;
        Ok(())
    }
}

/// splitmix64 over a counter.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf(s) over ranks 0..n by inverse CDF (s = 0 is uniform).
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|i| {
                acc += (i as f64).powf(-s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        (self.cdf.partition_point(|&c| c <= u) as u64).min(self.cdf.len() as u64 - 1)
    }
}

struct Args {
    dir: String,
    flash_mib: u64,
    small_pct: u64,
    region_mib: u64,
    ops: u64,
    keys: u64,
    zipf: f64,
    get_pct: u64,
    set_pct: u64,
    del_pct: u64,
    small_min: usize,
    small_max: usize,
    large_min: usize,
    large_max: usize,
    large_pct: u64,
    seed: u64,
    sync: bool,
    verify: bool,
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Res<T> {
    v.parse().map_err(|_| format!("{flag}: bad value {v:?}"))
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        dir: "/data/cache".into(),
        flash_mib: 256,
        small_pct: 10,
        region_mib: 16,
        ops: 100_000,
        keys: 100_000,
        zipf: 0.9,
        get_pct: 50,
        set_pct: 30,
        del_pct: 20,
        small_min: 100,
        small_max: 2048,
        large_min: 16 << 10,
        large_max: 256 << 10,
        large_pct: 20,
        seed: 1,
        sync: false,
        verify: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let v = match inline {
            Some(v) => v,
            None => it.next().ok_or(format!("{flag} needs a value"))?,
        };
        let flag_bool = |v: &str| match v {
            "0" | "false" => Ok(false),
            "1" | "true" => Ok(true),
            _ => Err(format!("{flag}: expected 0 or 1, got {v:?}")),
        };
        match flag.as_str() {
            "--dir" => a.dir = v,
            "--flash-mib" => a.flash_mib = num(&flag, &v)?,
            "--small-pct" => a.small_pct = num(&flag, &v)?,
            "--region-mib" => a.region_mib = num(&flag, &v)?,
            "--ops" => a.ops = num(&flag, &v)?,
            "--keys" => a.keys = num(&flag, &v)?,
            "--zipf" => a.zipf = num(&flag, &v)?,
            "--get-pct" => a.get_pct = num(&flag, &v)?,
            "--set-pct" => a.set_pct = num(&flag, &v)?,
            "--del-pct" => a.del_pct = num(&flag, &v)?,
            "--small-min" => a.small_min = num(&flag, &v)?,
            "--small-max" => a.small_max = num(&flag, &v)?,
            "--large-min" => a.large_min = num(&flag, &v)?,
            "--large-max" => a.large_max = num(&flag, &v)?,
            "--large-pct" => a.large_pct = num(&flag, &v)?,
            "--seed" => a.seed = num(&flag, &v)?,
            "--sync" => a.sync = flag_bool(&v)?,
            "--verify" => a.verify = flag_bool(&v)?,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if a.get_pct + a.set_pct + a.del_pct != 100 {
        return Err("--get-pct, --set-pct and --del-pct must add up to 100".into());
    }
    if a.large_pct > 100 || a.small_pct > 100 {
        return Err("--large-pct and --small-pct are percentages".into());
    }
    if a.small_min == 0
        || a.small_min > a.small_max
        || a.small_max > BUCKET - BUCKET_HDR - ENTRY_HDR
    {
        return Err(format!(
            "need 0 < --small-min <= --small-max <= {}",
            BUCKET - BUCKET_HDR - ENTRY_HDR
        ));
    }
    if a.large_min <= a.small_max || a.large_min > a.large_max {
        return Err("need --small-max < --large-min <= --large-max".into());
    }
    if a.keys == 0 || !a.zipf.is_finite() || a.zipf < 0.0 {
        return Err("need --keys > 0 and --zipf >= 0".into());
    }
    if (a.region_mib << 20) < (ITEM_HDR + a.large_max) as u64 {
        return Err("a region must hold the largest object".into());
    }
    Ok(a)
}

/// The size of key `k`'s object: a function of the key alone, so runs agree.
fn object_len(a: &Args, key: u64) -> usize {
    let h = mix(key ^ 0x7369_7a65);
    let pick = |lo: usize, hi: usize| lo + (mix(h) % (hi - lo + 1) as u64) as usize;
    if h % 100 < a.large_pct {
        pick(a.large_min, a.large_max)
    } else {
        pick(a.small_min, a.small_max)
    }
}

/// One db_bench-style pair of lines; `secs` is the wall time of the whole run, else the
/// operations' own time.
fn report(name: &str, ns: &mut [u64], secs: Option<f64>, extra: &str) {
    let secs = secs.unwrap_or_else(|| ns.iter().sum::<u64>() as f64 / 1e9);
    bench::print_report(name, secs, ns, extra);
}

fn run() -> Res<()> {
    let a = parse_args()?;
    let flash = a.flash_mib << 20;
    let region_bytes = a.region_mib << 20;
    let geo = Geometry {
        buckets: flash * a.small_pct / 100 / BUCKET as u64,
        region_bytes,
        region_budget: (flash - flash * a.small_pct / 100) / region_bytes,
    };
    if geo.buckets == 0 || geo.region_budget == 0 {
        return Err(format!(
            "--flash-mib {} with --small-pct {} leaves {} buckets and {} regions of {} MiB; need at least one of each",
            a.flash_mib, a.small_pct, geo.buckets, geo.region_budget, a.region_mib
        ));
    }
    let mut cache = Cache::open(&a.dir, geo, a.sync)?;
    let zipf = Zipf::new(a.keys, a.zipf);
    let mut rng = Rng(mix(a.seed));
    let (mut all, mut gets, mut sets) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hits, mut fills, mut deletes) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    for _ in 0..a.ops {
        let key = zipf.sample(&mut rng);
        let roll = rng.next() % 100;
        let len = object_len(&a, key);
        let small = len <= a.small_max;
        let t0 = Instant::now();
        if roll < a.get_pct {
            let hit = cache.get(key, small)?;
            let t1 = Instant::now();
            gets.push((t1 - t0).as_nanos() as u64);
            if hit {
                hits += 1;
            } else {
                // Cache-aside: the caller fetched it from the backing store; put it back.
                cache.set(key, len, small)?;
                sets.push(t1.elapsed().as_nanos() as u64);
                fills += 1;
            }
        } else if roll < a.get_pct + a.set_pct {
            cache.set(key, len, small)?;
            sets.push(t0.elapsed().as_nanos() as u64);
        } else {
            cache.delete(key, small)?;
            deletes += 1;
        }
        all.push(t0.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    let hit_ratio = if gets.is_empty() {
        0.0
    } else {
        hits as f64 / gets.len() as f64
    };
    if a.ops > 0 {
        report(
            "cache",
            &mut all,
            Some(secs),
            &format!(" hit_ratio {hit_ratio:.4}"),
        );
        report(
            "get",
            &mut gets,
            None,
            &format!(" hit_ratio {hit_ratio:.4}"),
        );
        report("set", &mut sets, None, &format!(" fills {fills}"));
    }
    if a.verify {
        let n = cache.verify()?;
        println!("verify: {n} objects ok");
    }
    cache.close()?;
    println!(
        "layout: {} buckets, {} regions of {} MiB ({} live), {} large objects indexed; evicted {} regions, {} large and {} small objects; {} deletes",
        geo.buckets,
        geo.region_budget,
        a.region_mib,
        cache.regions.len(),
        cache.index.len(),
        cache.regions_evicted,
        cache.large_evicted,
        cache.small_evicted,
        deletes
    );
    println!(
        "written: regions {} buckets {} index {}",
        cache.region_bytes_written, cache.bucket_bytes_written, cache.index_bytes_written
    );
    println!(
        "bytes_written {}",
        cache.region_bytes_written + cache.bucket_bytes_written + cache.index_bytes_written
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("cache: {e}");
        std::process::exit(1);
    }
}
