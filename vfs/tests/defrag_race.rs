//! Defragmentation racing with everything else: threads overwrite, truncate, sync and read
//! their own files at random on a tiny device, while GC and defragmentation (set to rewrite
//! every fragmented window, at every commit and sync) move the same files' blocks. Each
//! thread checks every read against its own copy of what it wrote; at the end, and after a
//! remount, every file must read back as written and fsck must be clean.

use std::sync::Arc;
use std::thread;

use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Ino, OpenOptions, Store, StoreConfig};

const THREADS: u64 = 4;
const OPS: usize = 1500;
/// No file grows past this: four of them are at most two thirds of the device.
const MAX_FILE: u64 = 256 << 10;

/// 24 zones of 16 blocks: GC has to run, and a 128-block window spans eight zones.
fn geometry() -> Geometry {
    Geometry {
        zone_count: 24,
        zone_size: 64 << 10,
        zone_capacity: 64 << 10,
        block_size: 4096,
        max_open: 12,
        max_active: 12,
    }
}

fn mount(dev: &Arc<MemoryDevice>) -> Store {
    let config = StoreConfig {
        buffers: 4,
        buffer_size: 16 << 10,
        max_pending_ops: 16,
        defrag_start_bytes: Some(0),
        ..Default::default()
    };
    Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap()
}

/// xorshift64
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random operations on file `name`, checked against a copy; returns the copy.
fn churn(store: &Store, root: Ino, t: u64) -> Vec<u8> {
    let name = format!("f{t}");
    let file = store.open_file(root, &name, OpenOptions::create()).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut copy: Vec<u8> = Vec::new();
    // (op, offset, length) of every write and (op, size) of every set_len, to tell what a
    // wrong read returned.
    let mut history: Vec<(usize, usize, usize)> = Vec::new();
    for op in 0..OPS {
        match rng.below(10) {
            0..=6 => {
                let at = rng.below(MAX_FILE - 4096) as usize;
                let len = 1 + rng.below(12 << 10).min(MAX_FILE - at as u64 - 1) as usize;
                let data: Vec<u8> = (0..len).map(|i| (op + i + t as usize) as u8).collect();
                file.write_at(&data, at as u64).unwrap();
                history.push((op, at, len));
                if copy.len() < at + len {
                    copy.resize(at + len, 0);
                }
                copy[at..at + len].copy_from_slice(&data);
            }
            7 => {
                let size = rng.below(MAX_FILE) as usize;
                file.set_len(size as u64).unwrap();
                history.push((op, size, 0));
                copy.resize(size, 0);
            }
            8 => file.sync_data().unwrap(),
            _ => {
                let at = rng.below(MAX_FILE) as usize;
                let mut buf = vec![0u8; 1 + rng.below(32 << 10) as usize];
                let n = file.read_at(&mut buf, at as u64).unwrap();
                let want = &copy[at.min(copy.len())..(at + buf.len()).min(copy.len())];
                if &buf[..n] != want {
                    let got = buf[..n].to_vec();
                    let again = file.read_at(&mut buf, at as u64).unwrap();
                    panic!(
                        "thread {t}, op {op}: read of {} at {at} got {n} bytes, {} expected; \
                         {}; read again: {}",
                        buf.len(),
                        want.len(),
                        explain(&got, want, at, t, &history),
                        match &buf[..again] == want {
                            true => "as expected".to_string(),
                            false => explain(&buf[..again], want, at, t, &history),
                        }
                    );
                }
            }
        }
    }
    file.sync_data().unwrap();
    file.close().unwrap();
    copy
}

/// What a wrong read returned, for the failure message: where it differs, and for the
/// first differing block whether it holds zeros or the bytes of an earlier write there.
fn explain(
    got: &[u8],
    want: &[u8],
    at: usize,
    t: u64,
    history: &[(usize, usize, usize)],
) -> String {
    let Some(first) = got.iter().zip(want).position(|(a, b)| a != b) else {
        return format!("{} bytes read, {} expected", got.len(), want.len());
    };
    let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let pos = at + first;
    let end = (first + 64).min(got.len());
    let bytes = &got[first..end];
    let source = if bytes.iter().all(|&b| b == 0) {
        "zeros".to_string()
    } else {
        // The latest earlier write whose bytes at `pos` are what was read.
        let matching = history.iter().rev().find(|&&(op, w_at, len)| {
            len > 0
                && w_at <= pos
                && pos + bytes.len() <= w_at + len
                && bytes
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| b == (op + pos - w_at + i + t as usize) as u8)
        });
        match matching {
            Some((op, w_at, len)) => format!("the bytes of op {op}'s write of {len} at {w_at}"),
            None => "bytes of no earlier write there".to_string(),
        }
    };
    let block_events: Vec<String> = history
        .iter()
        .filter(|&&(_, w_at, len)| match len {
            0 => w_at <= pos + 4096,
            _ => w_at <= pos && pos < w_at + len,
        })
        .map(|&(op, w_at, len)| match len {
            0 => format!("op {op} set_len {w_at}"),
            _ => format!("op {op} write {len} at {w_at}"),
        })
        .collect();
    format!(
        "first difference at file offset {pos}, {differ} bytes differ; read {source}; \
         writes covering it and set_lens near it: {}",
        block_events.join(", ")
    )
}

fn read_back(store: &Store, root: Ino, t: u64) -> Vec<u8> {
    let file = store
        .open_file(root, &format!("f{t}"), OpenOptions::read())
        .unwrap();
    let mut buf = vec![0u8; file.metadata().unwrap().size as usize];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), buf.len());
    file.close().unwrap();
    buf
}

/// Rounds of the race: one in the suite, more in the long mode
/// (`VALET_DEFRAG_RACE_ROUNDS=5000 cargo test --release -p valet-vfs --test defrag_race`).
fn rounds() -> usize {
    std::env::var("VALET_DEFRAG_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

#[test]
fn threads_gc_and_defragmentation_race_and_lose_nothing() {
    for _ in 0..rounds() {
        race_once();
    }
}

fn race_once() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("race").unwrap();
    let copies: Vec<Vec<u8>> = thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = &store;
                s.spawn(move || churn(store, root, t))
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let stats = store.stats();
    assert!(
        stats.defrag_bytes_moved > 0,
        "no window rewritten: {stats:?}"
    );
    assert!(stats.gc_bytes_moved > 0, "GC never moved: {stats:?}");
    // No allocation waited for work that was not coming (it did, one run in eight, while
    // a zone that emptied during a write waited for a reset it could not have).
    assert_eq!(stats.allocation_stalls, 0, "{stats:?}");
    for (t, copy) in copies.iter().enumerate() {
        assert!(read_back(&store, root, t as u64) == *copy, "file {t}");
    }
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{}", report.findings());
    store.unmount().unwrap();
    let store = mount(&dev);
    let (_, root) = store.tenant("race").unwrap();
    for (t, copy) in copies.iter().enumerate() {
        assert!(
            read_back(&store, root, t as u64) == *copy,
            "file {t} after a remount"
        );
    }
    assert!(store.fsck_deep().unwrap().is_clean());
}
