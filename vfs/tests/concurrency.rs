//! The write path keeps files, threads and tenants out of each other's way: a read does not
//! wait for another file's sync, concurrent syncs share device flushes, and a failed flush
//! is reported and loses nothing. A failed data write (a broken device, or a full host file
//! system under the image, which is ENOSPC and not EIO) keeps its bytes until a sync can
//! write them.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use valet_vfs::device::{DeviceError, Geometry, MemoryDevice, ZoneId, ZoneInfo, ZonedDevice};
use valet_vfs::{Hint, Ino, OpenOptions, Placement, PlacementRequest, Store, StoreConfig};

fn geometry() -> Geometry {
    Geometry {
        zone_count: 32,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 12,
        max_active: 12,
    }
}

/// A memory device whose flushes can be slowed down and whose writes can be made to fail,
/// counting flushes.
struct Faulty {
    inner: MemoryDevice,
    sync_delay_ms: AtomicU64,
    reset_delay_ms: AtomicU64,
    /// Delay of every write to a data zone.
    write_delay_ms: AtomicU64,
    /// Delay of every read of a data zone.
    read_delay_ms: AtomicU64,
    fail_writes: AtomicBool,
    /// The errno of a failed write; 0: an unnamed I/O error.
    write_errno: AtomicI32,
    fail_syncs: AtomicBool,
    syncs: AtomicU64,
}

impl Faulty {
    fn new() -> Arc<Faulty> {
        Arc::new(Faulty {
            inner: MemoryDevice::new(geometry()).unwrap(),
            sync_delay_ms: AtomicU64::new(0),
            reset_delay_ms: AtomicU64::new(0),
            write_delay_ms: AtomicU64::new(0),
            read_delay_ms: AtomicU64::new(0),
            fail_writes: AtomicBool::new(false),
            write_errno: AtomicI32::new(0),
            fail_syncs: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
        })
    }

    fn broken(what: &str) -> DeviceError {
        DeviceError::Io(std::io::Error::other(format!("injected {what} failure")))
    }
}

impl ZonedDevice for Faulty {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.inner.report_zones()
    }
    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        self.inner.zone_info(zone)
    }
    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        // Metadata zones (0 and 1) stay writable: the fault is in the data path.
        if zone > 1 && self.fail_writes.load(Ordering::SeqCst) {
            return Err(match self.write_errno.load(Ordering::SeqCst) {
                0 => Self::broken("write"),
                errno => DeviceError::Io(std::io::Error::from_raw_os_error(errno)),
            });
        }
        let delay = self.write_delay_ms.load(Ordering::SeqCst);
        if zone > 1 && delay > 0 {
            thread::sleep(Duration::from_millis(delay));
        }
        self.inner.write(zone, offset, data)
    }
    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.inner.append(zone, data)
    }
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let delay = self.read_delay_ms.load(Ordering::SeqCst);
        if zone > 1 && delay > 0 {
            thread::sleep(Duration::from_millis(delay));
        }
        self.inner.read(zone, offset, buf)
    }
    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        let delay = self.reset_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            thread::sleep(Duration::from_millis(delay));
        }
        self.inner.reset(zone)
    }
    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.inner.finish(zone)
    }
    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.inner.open(zone)
    }
    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.inner.close(zone)
    }
    fn sync(&self) -> Result<(), DeviceError> {
        let delay = self.sync_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            thread::sleep(Duration::from_millis(delay));
        }
        self.syncs.fetch_add(1, Ordering::SeqCst);
        if self.fail_syncs.load(Ordering::SeqCst) {
            return Err(Self::broken("flush"));
        }
        self.inner.sync()
    }
}

fn mount(dev: &Arc<Faulty>) -> Store {
    let config = StoreConfig {
        buffers: 16,
        buffer_size: 64 * 1024,
        ..Default::default()
    };
    Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap()
}

/// As [`mount`], with the conventional area (files a policy keeps in place) in `host`.
fn mount_with_host_files(dev: &Arc<Faulty>, host: &std::path::Path) -> Store {
    let config = StoreConfig {
        buffers: 16,
        buffer_size: 64 * 1024,
        conventional_dir: Some(host.to_path_buf()),
        ..Default::default()
    };
    Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap()
}

/// A store on a fresh device with its host files in a temporary directory (kept while the
/// returned guard lives), and the root of tenant `app`.
fn store_with_host_files() -> (tempfile::TempDir, Store, Ino) {
    let host = tempfile::tempdir().unwrap();
    let store = mount_with_host_files(&Faulty::new(), host.path());
    let (_, root) = store.tenant("app").unwrap();
    (host, store, root)
}

/// The options of an append handle, its file created if missing.
fn append_handle() -> OpenOptions {
    OpenOptions {
        append: true,
        ..OpenOptions::create()
    }
}

#[test]
fn a_read_does_not_wait_for_another_files_slow_sync() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let data = vec![7u8; 100_000];
    let reader = store
        .open_file(root, "table", OpenOptions::create())
        .unwrap();
    reader.write_at(&data, 0).unwrap();
    reader.sync_all().unwrap();
    let log = store.open_file(root, "log", OpenOptions::create()).unwrap();
    log.write_at(b"a record", 0).unwrap();

    dev.sync_delay_ms.store(200, Ordering::SeqCst);
    let syncing = thread::spawn(move || {
        log.sync_all().unwrap();
        log
    });
    // Let the sync reach the device.
    while dev.syncs.load(Ordering::SeqCst) == 0 && !syncing.is_finished() {
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(reader.read_at(&mut buf, 0).unwrap(), data.len());
    let took = started.elapsed();
    assert_eq!(buf, data);
    assert!(
        !syncing.is_finished(),
        "the slow sync ended before the read was timed"
    );
    assert!(
        took < Duration::from_millis(100),
        "the read waited {took:?} behind another file's sync"
    );
    syncing.join().unwrap();
}

#[test]
fn a_read_does_not_wait_for_a_large_write_to_a_conventional_file() {
    // Files a policy keeps in place (CURRENT here) live in host files. A write to one takes
    // as long as the host takes to copy it, and must not hold up other files meanwhile.
    const BIG: usize = 256 << 20;
    let host = tempfile::tempdir().unwrap();
    let dev = Faulty::new();
    let store = mount_with_host_files(&dev, host.path());
    let (_, root) = store.tenant("app").unwrap();
    let data = vec![7u8; 100_000];
    let table = store
        .open_file(root, "000005.ldb", OpenOptions::create())
        .unwrap();
    table.write_at(&data, 0).unwrap();
    table.sync_all().unwrap();
    let current = store
        .open_file(root, "CURRENT", OpenOptions::create())
        .unwrap();
    current.write_at(b"x", 0).unwrap();
    let host_file = std::fs::read_dir(host.path())
        .unwrap()
        .next()
        .expect("CURRENT's host file")
        .unwrap()
        .path();

    let writing = thread::spawn(move || {
        let big = vec![1u8; BIG];
        let started = Instant::now();
        current.write_at(&big, 0).unwrap();
        (current, started.elapsed())
    });
    // Wait until the host file grows: the big write is under way.
    while std::fs::metadata(&host_file).unwrap().len() <= 1 && !writing.is_finished() {
        thread::yield_now();
    }
    let started = Instant::now();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(table.read_at(&mut buf, 0).unwrap(), data.len());
    let read_took = started.elapsed();
    assert_eq!(buf, data);
    let (current, write_took) = writing.join().unwrap();
    // Behind the write, the read would take about as long as the write.
    assert!(
        read_took * 4 < write_took,
        "a read took {read_took:?} during a {write_took:?} write to a conventional file"
    );
    current.sync_all().unwrap();
    let mut head = [0u8; 4];
    current.read_at(&mut head, BIG as u64 - 4).unwrap();
    assert_eq!(head, [1; 4]);
}

#[test]
fn concurrent_syncs_share_device_flushes() {
    const SYNCERS: usize = 8;
    const ROUNDS: usize = 5;
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    // Slow flushes, so that syncers arrive while one is running (as on a real disk).
    dev.sync_delay_ms.store(20, Ordering::SeqCst);
    let before = dev.syncs.load(Ordering::SeqCst);
    let barrier = Arc::new(Barrier::new(SYNCERS));
    let threads: Vec<_> = (0..SYNCERS)
        .map(|i| {
            let store = store.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let f = store
                    .open_file(root, &format!("f{i}"), OpenOptions::create())
                    .unwrap();
                for round in 0..ROUNDS {
                    f.write_at(&[round as u8; 430], (round * 430) as u64)
                        .unwrap();
                    barrier.wait();
                    f.sync_data().unwrap();
                }
                f
            })
        })
        .collect();
    let files: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let flushes = dev.syncs.load(Ordering::SeqCst) - before;
    // One flush per sync would be 40; grouped, each round needs about two.
    assert!(
        flushes <= (ROUNDS * 3) as u64,
        "{flushes} device flushes for {} syncs",
        SYNCERS * ROUNDS
    );
    let stats = store.stats();
    assert!(stats.syncs_joined > 0, "no sync joined another's commit");
    for (i, f) in files.iter().enumerate() {
        let mut buf = vec![0u8; 430 * ROUNDS];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), buf.len(), "file {i}");
        for round in 0..ROUNDS {
            assert!(buf[round * 430..(round + 1) * 430]
                .iter()
                .all(|&b| b == round as u8));
        }
    }
}

/// `syncers` threads, each appending 430 B records to its own file with an fdatasync after
/// each, `rounds` times, in closed loops (no barrier: each goes on as soon as its sync
/// returns). Returns the device flushes they caused and the store's stats.
fn closed_loop_syncs(syncers: usize, rounds: usize, flush_ms: u64) -> (u64, valet_vfs::Stats) {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    dev.sync_delay_ms.store(flush_ms, Ordering::SeqCst);
    let before = dev.syncs.load(Ordering::SeqCst);
    let threads: Vec<_> = (0..syncers)
        .map(|i| {
            let store = store.clone();
            thread::spawn(move || {
                let f = store
                    .open_file(root, &format!("log{i}"), OpenOptions::create())
                    .unwrap();
                for round in 0..rounds {
                    f.write_at(&[round as u8; 430], (round * 430) as u64)
                        .unwrap();
                    f.sync_data().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (dev.syncs.load(Ordering::SeqCst) - before, store.stats())
}

#[test]
fn syncers_in_closed_loops_share_every_flush() {
    // Left alone, four closed loops split into two halves that take turns (one flush per
    // two syncs); a leader that waits for the syncers of the last commits puts all four
    // into each flush (one per four syncs, plus the first rounds).
    const SYNCERS: usize = 4;
    const ROUNDS: usize = 30;
    let (flushes, stats) = closed_loop_syncs(SYNCERS, ROUNDS, 10);
    let syncs = (SYNCERS * ROUNDS) as u64;
    assert!(
        flushes * 8 <= syncs * 3,
        "{flushes} device flushes for {syncs} syncs in closed loops (batch waits: {})",
        stats.commit_batch_waits
    );
    assert!(stats.commit_batch_waits > 0);
}

#[test]
fn a_lone_syncer_never_waits_for_others() {
    let (flushes, stats) = closed_loop_syncs(1, 20, 2);
    assert!(flushes >= 20, "{flushes} device flushes for 20 syncs");
    assert_eq!(
        stats.commit_batch_waits, 0,
        "a lone syncer's commits waited"
    );
}

/// Each tenant's syncs are timed from the call to durability: with flushes slowed to 30 ms,
/// every sync of the tenant that synced lands in a bucket over 25 ms, and the tenant that
/// only wrote has no syncs counted.
#[test]
fn sync_latency_is_counted_per_tenant_as_the_guest_felt_it() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, syncing) = store.tenant("syncing").unwrap();
    let (_, writing) = store.tenant("writing").unwrap();
    dev.sync_delay_ms.store(30, Ordering::SeqCst);
    let f = store
        .open_file(syncing, "log", OpenOptions::create())
        .unwrap();
    for round in 0..3u64 {
        f.write_at(&[1; 430], round * 430).unwrap();
        f.sync_data().unwrap();
    }
    let g = store
        .open_file(writing, "data", OpenOptions::create())
        .unwrap();
    g.write_at(&[2; 4096], 0).unwrap();
    let stats = store.stats();
    assert_eq!(stats.sync_latency.len(), 1, "{:?}", stats.sync_latency);
    let latency = &stats.sync_latency[0];
    assert_eq!(latency.name, "syncing");
    assert_eq!(latency.count, 3);
    assert!(latency.sum_ns >= 3 * 30_000_000, "{latency:?}");
    let at_most_25ms = valet_vfs::SYNC_LATENCY_BOUNDS_NS
        .iter()
        .take_while(|&&bound| bound <= 25_000_000)
        .count();
    assert_eq!(
        latency.buckets.len(),
        valet_vfs::SYNC_LATENCY_BOUNDS_NS.len() + 1
    );
    assert_eq!(
        latency.buckets[at_most_25ms..].iter().sum::<u64>(),
        3,
        "{latency:?}"
    );
}

/// A sync or close waits for its own file's changes only: closing a file whose data is
/// durable costs no flush while another file is dirty, and a file's sync still makes it
/// (and everything recorded before it) durable.
#[test]
fn a_close_of_a_durable_file_costs_no_flush() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let old = store.open_file(root, "old", OpenOptions::create()).unwrap();
    old.write_at(&[1u8; 200_000], 0).unwrap();
    old.sync_data().unwrap();
    let fresh = store
        .open_file(root, "fresh", OpenOptions::create())
        .unwrap();
    fresh.write_at(&[2u8; 300_000], 0).unwrap();
    let before = dev.syncs.load(Ordering::SeqCst);
    old.close().unwrap();
    assert_eq!(
        dev.syncs.load(Ordering::SeqCst),
        before,
        "closing a durable file flushed the device"
    );
    fresh.close().unwrap();
    assert!(
        dev.syncs.load(Ordering::SeqCst) > before,
        "closing a dirty file did not flush"
    );
    drop(store);
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    for (name, byte, len) in [("old", 1u8, 200_000), ("fresh", 2u8, 300_000)] {
        let r = store.open_file(root, name, OpenOptions::read()).unwrap();
        let mut buf = vec![0u8; len + 1];
        assert_eq!(r.read_at(&mut buf, 0).unwrap(), len, "{name}");
        assert!(buf[..len].iter().all(|&b| b == byte), "{name}");
    }
}

/// A directory's fsync makes its entries durable, and writes no other file's buffered data
/// (another tenant's megabytes are not its business).
#[test]
fn a_directory_sync_makes_its_entries_durable_and_nothing_else() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let other = store
        .open_file(root, "other", OpenOptions::create())
        .unwrap();
    other.write_at(&[3u8; 40_000], 0).unwrap();
    let dir = store.create_dir(root, "db").unwrap();
    let manifest = store
        .open_file(dir, "MANIFEST", OpenOptions::create())
        .unwrap();
    let (bytes, syncs) = (store.stats().device_bytes, dev.syncs.load(Ordering::SeqCst));
    store.sync_dir(dir).unwrap();
    assert_eq!(
        store.stats().device_bytes,
        bytes,
        "another file's data was written"
    );
    assert!(dev.syncs.load(Ordering::SeqCst) > syncs, "no commit");
    // The power fails: the entry is there, with its directory.
    std::mem::forget((manifest, other));
    std::mem::forget(store);
    dev.inner.power_fail();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    store
        .open_file(root, "db/MANIFEST", OpenOptions::read())
        .unwrap();
}

/// A guest's sync asks for durability only: zones whose data died are reset by the store's
/// reclaimer afterwards, not on the sync's call (a reset can take milliseconds on a host
/// file system).
#[test]
fn a_sync_does_not_wait_for_zone_resets() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    // Fill more than two zones with a file, make it durable, then delete it.
    let big = store.open_file(root, "big", OpenOptions::create()).unwrap();
    big.write_at(&vec![5u8; 2_500_000], 0).unwrap();
    big.close().unwrap();
    store.unlink(root, "big").unwrap();
    let resets = store.stats().zone_resets;
    dev.reset_delay_ms.store(300, Ordering::SeqCst);
    let log = store.open_file(root, "log", OpenOptions::create()).unwrap();
    log.write_at(&[1u8; 430], 0).unwrap();
    let started = Instant::now();
    log.sync_data().unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(150),
        "the sync took {took:?}: it waited for zone resets"
    );
    // The reclaimer resets them soon after.
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.stats().zone_resets < resets + 2 {
        assert!(Instant::now() < deadline, "the dead zones were never reset");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_failed_flush_is_reported_at_close_and_the_data_survives() {
    failed_writes_keep_the_data(0, libc_eio());
}

/// The host's file system under the image is full: nothing is lost, there is no room.
#[test]
fn a_full_host_is_enospc_and_the_data_waits_for_room() {
    failed_writes_keep_the_data(libc::ENOSPC, libc::ENOSPC);
}

/// Data writes fail (with `errno`, or an unnamed I/O error for 0) while a file is written
/// and closed: the close reports `expect`, so does every sync while the writes fail, the
/// bytes stay the file's, and the first sync after the fault clears writes them.
fn failed_writes_keep_the_data(errno: i32, expect: i32) {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let data: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
    let f = store
        .open_file(root, "precious", OpenOptions::create())
        .unwrap();
    dev.write_errno.store(errno, Ordering::SeqCst);
    dev.fail_writes.store(true, Ordering::SeqCst);
    f.write_at(&data, 0).unwrap();
    let err = f.close().expect_err("a close whose flush failed must fail");
    assert_eq!(err.errno(), expect, "{err}");
    // A sync keeps reporting the failure while the device keeps failing.
    for _ in 0..2 {
        let err = store
            .sync()
            .expect_err("a sync whose writes fail must fail");
        assert_eq!(err.errno(), expect, "{err}");
    }
    // The data is still the file's, for readers too.
    let r = store
        .open_file(root, "precious", OpenOptions::read())
        .unwrap();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(r.read_at(&mut buf, 0).unwrap(), data.len());
    assert_eq!(buf, data);
    drop(r);
    // Once the fault clears, a sync writes it, and it survives a remount.
    dev.fail_writes.store(false, Ordering::SeqCst);
    store.sync().unwrap();
    drop(store);
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let r = store
        .open_file(root, "precious", OpenOptions::read())
        .unwrap();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(r.read_at(&mut buf, 0).unwrap(), data.len());
    assert_eq!(buf, data);
    assert!(store.fsck().unwrap().problems.is_empty());
}

/// Found by review: a truncation whose block write failed stayed queued, so reads saw a
/// half-truncated file, and the next sync applied it after a write made since, losing
/// that synced write. A truncation that failed leaves the file as it was.
#[test]
fn a_failed_truncation_is_never_applied_later() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "t", OpenOptions::create()).unwrap();
    let mut data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    f.write_at(&data, 0).unwrap();
    f.sync_all().unwrap();
    dev.fail_writes.store(true, Ordering::SeqCst);
    f.set_len(5000)
        .expect_err("the truncation's block cannot be written");
    dev.fail_writes.store(false, Ordering::SeqCst);
    let read_all = |f: &valet_vfs::FileHandle| {
        let mut buf = vec![0u8; 20_000];
        let n = f.read_at(&mut buf, 0).unwrap();
        buf.truncate(n);
        buf
    };
    assert!(
        read_all(&f) == data,
        "the failed truncation changed nothing"
    );
    f.write_at(&[9u8; 100], 8000).unwrap();
    data[8000..8100].fill(9);
    f.sync_all().unwrap();
    assert!(read_all(&f) == data, "the synced write stands");
    f.close().unwrap();
    drop(store);
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "t", OpenOptions::read()).unwrap();
    assert!(read_all(&f) == data, "after a remount too");
    assert!(store.fsck().unwrap().problems.is_empty());
}

/// A failed device flush is sticky (PostgreSQL's "fsyncgate"): the host may have dropped
/// the dirty pages, so a sync after it fails even once the device flushes again, and the
/// store refuses new writes instead of taking bytes it can no longer promise.
#[test]
fn a_failed_device_flush_fails_every_later_sync_and_refuses_writes() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let log = store.open_file(root, "log", append_handle()).unwrap();
    log.write_at(&[1u8; 430], 0).unwrap();
    log.sync_data().unwrap();
    log.write_at(&[2u8; 430], 0).unwrap();
    store.health().unwrap();
    dev.fail_syncs.store(true, Ordering::SeqCst);
    let err = log
        .sync_data()
        .expect_err("a sync whose flush failed must fail");
    assert_eq!(err.errno(), libc_eio(), "{err}");
    let unhealthy = store
        .health()
        .expect_err("the store must say it refuses writes");
    assert!(
        unhealthy.to_string().contains("injected flush failure"),
        "{unhealthy}"
    );
    dev.fail_syncs.store(false, Ordering::SeqCst);
    let err = log
        .sync_data()
        .expect_err("a sync after a failed flush must fail too");
    assert_eq!(err.errno(), libc_eio(), "{err}");
    assert!(store.sync().is_err(), "a whole-store sync too");
    let err = log
        .write_at(&[3u8; 430], 0)
        .expect_err("the store must refuse writes after a failed flush");
    assert_eq!(err.errno(), libc_eio(), "{err}");
    // Both failed syncs are counted against the tenant, apart from the one that succeeded.
    let latency = &store.stats().sync_latency[0];
    assert_eq!((latency.count, latency.failures), (1, 2), "{latency:?}");
}

fn libc_eio() -> i32 {
    5
}

/// A tenant writing faster than the device takes keeps its backlog within its share of the
/// write buffers: another tenant's writes still find buffers at once instead of waiting
/// behind that backlog.
#[test]
fn a_tenants_backlog_leaves_the_other_tenants_their_write_buffers() {
    const DELAY_MS: u64 = 50;
    let dev = Faulty::new();
    let store = mount(&dev); // 16 buffers of 64 KiB
    let (_, heavy_root) = store.tenant("heavy").unwrap();
    let (_, light_root) = store.tenant("light").unwrap();
    let light = store
        .open_file(light_root, "light.log", OpenOptions::create())
        .unwrap();
    light.write_at(&[1u8; 100], 0).unwrap();
    dev.write_delay_ms.store(DELAY_MS, Ordering::SeqCst);
    let heavy = store
        .open_file(heavy_root, "heavy.dat", OpenOptions::create())
        .unwrap();
    let chunk = vec![2u8; 64 * 1024];
    let writer = thread::spawn(move || {
        // 40 buffers' worth: far more than the pool, each taking 50 ms to write.
        for i in 0..40u64 {
            heavy.write_at(&chunk, i * chunk.len() as u64).unwrap();
        }
        heavy
    });
    // The heavy tenant's backlog is queued (or the pool is empty without shares).
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.stats().background_flushes < 6 {
        assert!(
            Instant::now() < deadline,
            "the heavy tenant never queued writes"
        );
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(20));
    // Three buffers' worth for the light tenant: without shares each would wait for one of
    // the heavy tenant's 50 ms writes to end.
    let t = Instant::now();
    light.write_at(&vec![3u8; 3 * 64 * 1024], 100).unwrap();
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(DELAY_MS / 2),
        "the light tenant waited {took:?} behind the heavy one's backlog"
    );
    let heavy = writer.join().unwrap();
    dev.write_delay_ms.store(0, Ordering::SeqCst);
    heavy.sync_all().unwrap();
    light.sync_all().unwrap();
    let mut back = vec![0u8; 40 * 64 * 1024];
    heavy.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 2));
    let mut back = vec![0u8; 100 + 3 * 64 * 1024];
    light.read_at(&mut back, 0).unwrap();
    assert!(back[..100].iter().all(|&b| b == 1) && back[100..].iter().all(|&b| b == 3));
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn a_write_waiting_for_a_buffer_writes_a_queued_one_itself() {
    // Four buffers, every one queued behind a slow device: the background writer is busy
    // with one file's queue, so a write that needs a buffer writes the front of another
    // file's queue rather than sleep until the writer gets there.
    const DELAY_MS: u64 = 20;
    let dev = Faulty::new();
    // Buffers larger than the pool copies small windows out into (64 KiB).
    let config = StoreConfig {
        buffers: 4,
        buffer_size: 128 * 1024,
        ..Default::default()
    };
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    let open = |name: &str| store.open_file(root, name, OpenOptions::create()).unwrap();
    let (a, b, c) = (open("a"), open("b"), open("c"));
    dev.write_delay_ms.store(DELAY_MS, Ordering::SeqCst);
    // Two full buffers each for a and c: all four queued, none back yet.
    let full = vec![1u8; 2 * 128 * 1024];
    a.write_at(&full, 0).unwrap();
    c.write_at(&full, 0).unwrap();
    b.write_at(b"needs a buffer", 0).unwrap();
    assert!(
        store.stats().flushes_while_waiting >= 1,
        "the write slept instead of writing a queued buffer"
    );
    dev.write_delay_ms.store(0, Ordering::SeqCst);
    for f in [&a, &b, &c] {
        f.sync_all().unwrap();
    }
    let mut back = vec![0u8; full.len()];
    for f in [&a, &c] {
        f.read_at(&mut back, 0).unwrap();
        assert_eq!(back, full);
    }
    let mut small = [0u8; 14];
    b.read_at(&mut small, 0).unwrap();
    assert_eq!(&small, b"needs a buffer");
    assert!(store.fsck().unwrap().is_clean());
}

/// File `a` in stream 1, anything else in stream 2.
struct AApart;
impl Placement for AApart {
    fn place(&self, req: &PlacementRequest<'_>) -> Hint {
        Hint::zoned(if req.path.ends_with('a') { 1 } else { 2 })
    }
}

#[test]
fn a_deep_fsck_reads_blocks_as_they_are_mapped_when_it_reads_them() {
    // The deep fsck plans its reads, then reads one extent at a time with no lock held.
    // While it reads a's block (slowly), b is deleted and its full first zone reset: the
    // fsck must not then read that zone as if b still lived there.
    const DELAY_MS: u64 = 500;
    let dev = Faulty::new();
    let store = mount(&dev);
    let (t, root) = store.tenant("app").unwrap();
    store.set_placement(t, Arc::new(AApart));
    let a = store.open_file(root, "a", OpenOptions::create()).unwrap();
    a.write_at(&[1u8; 4096], 0).unwrap();
    a.sync_all().unwrap();
    // One zone and a half: the first fills and is retired, so it is reset once b goes.
    let b = store.open_file(root, "b", OpenOptions::create()).unwrap();
    b.write_at(&vec![2u8; 3 << 19], 0).unwrap();
    b.close().unwrap();
    store.sync().unwrap();
    assert_eq!(store.stats().zone_resets, 0);

    dev.read_delay_ms.store(DELAY_MS, Ordering::SeqCst);
    let checking = store.clone();
    let fsck = thread::spawn(move || checking.fsck_deep().unwrap());
    thread::sleep(Duration::from_millis(DELAY_MS / 5));
    store.unlink(root, "b").unwrap();
    store.sync().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.stats().zone_resets == 0 {
        assert!(Instant::now() < deadline, "b's zone was never reset");
        thread::sleep(Duration::from_millis(1));
    }
    assert!(
        !fsck.is_finished(),
        "the fsck ended before b's zone was reset: nothing was tested"
    );
    let report = fsck.join().unwrap();
    assert!(report.is_clean(), "{report:?}");
    dev.read_delay_ms.store(0, Ordering::SeqCst);
    let mut back = [0u8; 4096];
    a.read_at(&mut back, 0).unwrap();
    assert_eq!(back, [1u8; 4096]);
}

/// Appends from several threads, each through its own append handle, of records that fill
/// and start windows mid-record: each lands whole after every append before it.
#[test]
fn concurrent_appends_never_write_over_each_other() {
    let dev = Faulty::new();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let opts = append_handle();
    let (threads, rounds, len) = (3usize, 60usize, 100_003usize);
    let barrier = Arc::new(Barrier::new(threads));
    let joins: Vec<_> = (0..threads)
        .map(|t| {
            let f = store.open_file(root, "log", opts).unwrap();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                for r in 0..rounds {
                    f.write_at(&vec![(t * rounds + r) as u8; len], 0).unwrap();
                }
            })
        })
        .collect();
    for j in joins {
        j.join().unwrap();
    }
    let f = store.open_file(root, "log", OpenOptions::read()).unwrap();
    let size = f.metadata().unwrap().size;
    assert_eq!(size, (threads * rounds * len) as u64, "appends were lost");
    let mut buf = vec![0u8; size as usize];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), buf.len());
    let mut seen: Vec<u8> = buf.chunks(len).map(|record| record[0]).collect();
    for (i, record) in buf.chunks(len).enumerate() {
        assert!(record.iter().all(|&b| b == record[0]), "record {i} is torn");
    }
    seen.sort_unstable();
    let want: Vec<u8> = (0..threads * rounds).map(|i| i as u8).collect();
    assert_eq!(seen, want, "a record is missing or twice");
}

/// One thread truncates a file to nothing every 300 µs while another appends records
/// larger than a window to it, for a file in the zones (40 MB in all on a 32 MiB device) and
/// a conventional one (a host file), in phases: truncations come between the appends (a
/// writer that never paused kept `set_len`'s flush from ending, until the device filled and
/// it failed with ENOSPC), and after each phase the file is whole records and, grown by a
/// record, reads zeros there (no append that took its offset before a truncation landed
/// after it).
#[test]
fn truncating_while_another_thread_appends_neither_starves_nor_tears_records() {
    let (_host, store, root) = store_with_host_files();
    let opts = append_handle();
    // A conventional file's write is one host write: larger records widen its window.
    for (name, len, phases) in [("log", 100_003usize, 20), ("CURRENT", 1_000_003, 30)] {
        let appender = store.open_file(root, name, opts).unwrap();
        let truncator = Arc::new(store.open_file(root, name, OpenOptions::create()).unwrap());
        // Whether a truncation ever came between two appends: a starved one never does.
        let (mut truncated_between, mut last_end) = (false, 0);
        for phase in 0..phases {
            let done = Arc::new(AtomicBool::new(false));
            let (stop, t) = (done.clone(), truncator.clone());
            let truncations = thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    t.set_len(0).unwrap();
                    thread::sleep(Duration::from_micros(300));
                }
            });
            for r in 0..20 {
                let fill = (phase * 20 + r) % 250 + 1;
                let at = appender.write_at(&vec![fill as u8; len], 0).unwrap();
                truncated_between |= at < last_end;
                last_end = at + len as u64;
            }
            done.store(true, Ordering::SeqCst);
            truncations.join().unwrap();
            let size = appender.metadata().unwrap().size as usize;
            assert_eq!(size % len, 0, "{name}: a record was cut: size {size}");
            truncator.set_len((size + len) as u64).unwrap();
            let mut buf = vec![0u8; size + len];
            assert_eq!(appender.read_at(&mut buf, 0).unwrap(), size + len);
            for (i, record) in buf[..size].chunks(len).enumerate() {
                assert!(
                    record[0] != 0 && record.iter().all(|&b| b == record[0]),
                    "{name}: record {i} is torn or zeros"
                );
            }
            assert!(
                buf[size..].iter().all(|&b| b == 0),
                "{name}: an old record showed past the end"
            );
            truncator.set_len(0).unwrap();
            last_end = 0;
        }
        assert!(
            truncated_between,
            "{name}: no truncation came between appends"
        );
    }
}

/// Two threads read what a third has written, while it writes 60–360 KB at a time (copied
/// into windows with the store's lock released, the window's buffer lent out meanwhile),
/// appending or rewriting its tail and syncing now and then: every read returns every
/// acknowledged byte as written.
#[test]
fn readers_see_every_acknowledged_byte_while_large_writes_are_copied() {
    let dev = Faulty::new();
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 256 * 1024,
        ..Default::default()
    };
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let writer = store.open_file(root, "f", OpenOptions::create()).unwrap();
    let byte = |i: u64| (i.wrapping_mul(2654435761) >> 11) as u8 | 1;
    let xorshift = |x: &mut u64| {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    };
    let readers: Vec<_> = (0..2u64)
        .map(|k| {
            let reader = store.open_file(root, "f", OpenOptions::read()).unwrap();
            let (acked, done) = (acked.clone(), done.clone());
            thread::spawn(move || {
                let mut rng = 12345 + k;
                while !done.load(Ordering::SeqCst) {
                    let n = acked.load(Ordering::SeqCst);
                    if n == 0 {
                        thread::yield_now();
                        continue;
                    }
                    let r = xorshift(&mut rng);
                    // Near the end: the window and the buffers on their way to the device.
                    let at = n - 1 - r % n.min(600_000);
                    let len = ((r >> 20) % 300_000).clamp(1, n - at);
                    let mut buf = vec![0u8; len as usize];
                    let got = reader.read_at(&mut buf, at).unwrap();
                    assert_eq!(got as u64, len, "short read at {at}, {n} acknowledged");
                    if let Some(i) = (0..buf.len()).find(|&i| buf[i] != byte(at + i as u64)) {
                        panic!("byte {} wrong, {n} acknowledged", at + i as u64);
                    }
                }
            })
        })
        .collect();
    let (mut rng, mut end) = (777u64, 0u64);
    for k in 0..2000u64 {
        let len = 60_000 + xorshift(&mut rng) % 300_000;
        let at = if k % 3 == 0 && end > len {
            end - len
        } else {
            end
        };
        let data: Vec<u8> = (at..at + len).map(byte).collect();
        writer.write_at(&data, at).unwrap();
        end = end.max(at + len);
        acked.store(end, Ordering::SeqCst);
        if k % 50 == 0 {
            writer.sync_data().unwrap();
        }
        if end > 24 << 20 {
            break;
        }
    }
    done.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.join().unwrap();
    }
}

/// `allocate` (`posix_fallocate`) from one thread, asked for sizes a little past what it
/// last saw, while another appends records: it grows the file with zeros when it comes
/// first, and never cuts an append that landed after it read the size.
#[test]
fn allocating_while_another_thread_appends_never_cuts_an_append() {
    let (_host, store, root) = store_with_host_files();
    let opts = append_handle();
    for (name, len) in [("log", 100_003usize), ("CURRENT", 30_001)] {
        let appender = store.open_file(root, name, opts).unwrap();
        let allocator = store.open_file(root, name, OpenOptions::create()).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        let allocations = thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let seen = allocator.metadata().unwrap().size;
                allocator.allocate(seen + 1000).unwrap();
            }
        });
        for r in 0..200 {
            appender
                .write_at(&vec![(r % 250 + 1) as u8; len], 0)
                .unwrap();
        }
        done.store(true, Ordering::SeqCst);
        allocations.join().unwrap();
        let size = appender.metadata().unwrap().size as usize;
        let mut buf = vec![0u8; size];
        assert_eq!(appender.read_at(&mut buf, 0).unwrap(), size);
        // Whole records in order, with zeros only between them.
        let (mut at, mut next) = (0, 0usize);
        while at < size {
            if buf[at] == 0 {
                at += 1;
                continue;
            }
            let record = &buf[at..(at + len).min(size)];
            let fill = (next % 250 + 1) as u8;
            assert!(
                record.len() == len && record.iter().all(|&b| b == fill),
                "{name}: record {next} at {at} is cut or torn"
            );
            at += len;
            next += 1;
        }
        assert_eq!(next, 200, "{name}: records missing");
    }
}

/// A reader of a conventional file (a host file) while another thread appends 1 MB records
/// to it: every byte under the size it reads is written (the size used to grow before the
/// bytes reached the host file, so a reader could find zeros there).
#[test]
fn a_conventional_files_size_never_runs_ahead_of_its_bytes() {
    let (_host, store, root) = store_with_host_files();
    let opts = append_handle();
    let appender = store.open_file(root, "CURRENT", opts).unwrap();
    let reader = store
        .open_file(root, "CURRENT", OpenOptions::read())
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let reads = thread::spawn(move || {
        let mut tail = vec![0u8; 4096];
        while !stop.load(Ordering::SeqCst) {
            let size = reader.metadata().unwrap().size;
            if size == 0 {
                continue;
            }
            // The last bytes under the size: the newest record's end.
            let at = size.saturating_sub(tail.len() as u64);
            let n = reader.read_at(&mut tail, at).unwrap();
            assert!(
                tail[..n].iter().all(|&b| b != 0),
                "zeros under the size {size}"
            );
        }
    });
    for r in 0..100 {
        appender
            .write_at(&vec![(r % 250 + 1) as u8; 1_000_003], 0)
            .unwrap();
    }
    done.store(true, Ordering::SeqCst);
    reads.join().unwrap();
}
