//! One page per small sync: a small synced tail travels inside the journal record instead of
//! a data block, and is never lost — across power cuts, checkpoints, overwrites, truncation
//! and the image device's lazily written zone table. And hand-offs, which write unsynced
//! bytes the same way with no flush: a killed process keeps them, and a power cut that
//! keeps their journal records but not the data those name keeps what was synced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use valet_vfs::device::{
    DeviceError, Geometry, ImageDevice, ImageOptions, MemoryDevice, ZoneId, ZoneInfo, ZonedDevice,
};
use valet_vfs::{FileHandle, Ino, OpenOptions, Store, StoreConfig};

fn geometry(zone_capacity: u64) -> Geometry {
    Geometry {
        zone_count: 24,
        zone_size: zone_capacity,
        zone_capacity,
        block_size: 4096,
        max_open: 8,
        max_active: 8,
    }
}

/// A memory device that counts writes and flushes, and can be cut off from a store that a
/// power cut abandoned (its background threads must not reach the device any more).
struct Counted {
    dev: Arc<MemoryDevice>,
    writes: AtomicU64,
    data_writes: AtomicU64,
    syncs: AtomicU64,
    /// Set by a power cut; held for reading through each command, so that no command of
    /// the dead process lands after the cut.
    dead: RwLock<bool>,
    /// Slows data-zone writes down (ms), so background writes overlap later syncs.
    data_delay_ms: AtomicU64,
}

impl Counted {
    fn new(dev: Arc<MemoryDevice>) -> Arc<Counted> {
        Arc::new(Counted {
            dev,
            writes: AtomicU64::new(0),
            data_writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            dead: RwLock::new(false),
            data_delay_ms: AtomicU64::new(0),
        })
    }

    fn run<T>(&self, op: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
        let dead = self.dead.read().unwrap();
        if *dead {
            return Err(DeviceError::Io(std::io::Error::other(
                "the process is gone",
            )));
        }
        op()
    }

    fn counts(&self) -> (u64, u64, u64) {
        (
            self.writes.load(Ordering::SeqCst),
            self.data_writes.load(Ordering::SeqCst),
            self.syncs.load(Ordering::SeqCst),
        )
    }
}

impl ZonedDevice for Counted {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.dev.report_zones()
    }
    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        self.dev.zone_info(zone)
    }
    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.run(|| {
            self.writes.fetch_add(1, Ordering::SeqCst);
            if zone > 1 {
                self.data_writes.fetch_add(1, Ordering::SeqCst);
                let delay = self.data_delay_ms.load(Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(delay));
            }
            self.dev.write(zone, offset, data)
        })
    }
    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.run(|| self.dev.append(zone, data))
    }
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.run(|| self.dev.read(zone, offset, buf))
    }
    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.run(|| self.dev.reset(zone))
    }
    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.run(|| self.dev.finish(zone))
    }
    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.run(|| self.dev.open(zone))
    }
    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.run(|| self.dev.close(zone))
    }
    fn sync(&self) -> Result<(), DeviceError> {
        self.run(|| {
            self.syncs.fetch_add(1, Ordering::SeqCst);
            self.dev.sync()
        })
    }
}

/// A store on a memory device that survives power cuts.
struct Machine {
    dev: Arc<MemoryDevice>,
    current: Option<Arc<Counted>>,
}

impl Machine {
    fn new(zone_capacity: u64) -> Machine {
        Machine {
            dev: Arc::new(MemoryDevice::new(geometry(zone_capacity)).unwrap()),
            current: None,
        }
    }

    fn mount(&mut self) -> (Store, Arc<Counted>) {
        self.mount_with(StoreConfig::default())
    }

    fn mount_with(&mut self, config: StoreConfig) -> (Store, Arc<Counted>) {
        let counted = Counted::new(self.dev.clone());
        self.current = Some(counted.clone());
        let store = Store::open(counted.clone(), config).unwrap();
        (store, counted)
    }

    /// Cuts the power: what was not synced is gone, and the old store can no longer reach
    /// the device (it is leaked, as a process that died would not run its destructors).
    fn power_cut(&mut self, store: Store, files: Vec<FileHandle>) {
        self.power_cut_keeping(store, files, |_| false);
    }

    /// [`Machine::power_cut`], except that the zones `keep` picks keep their unsynced
    /// writes.
    fn power_cut_keeping(&mut self, store: Store, files: Vec<FileHandle>, keep: fn(u32) -> bool) {
        if let Some(c) = self.current.take() {
            *c.dead.write().unwrap() = true;
        }
        std::mem::forget(files);
        std::mem::forget(store);
        self.dev.power_fail_keeping(keep);
    }
}

fn record(i: usize) -> Vec<u8> {
    (0..430).map(|j| (i * 31 + j * 7) as u8).collect()
}

fn read_all(store: &Store, root: Ino, path: &str) -> Vec<u8> {
    let f = store.open_file(root, path, OpenOptions::read()).unwrap();
    let size = f.metadata().unwrap().size as usize;
    let mut buf = vec![0u8; size];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), size);
    buf
}

/// Mounts a copy of the image at `path` whose store was leaked, not unmounted (a process
/// that died): the leaked device still holds the image's lock, which a dead process's would
/// not. Returns the store and tenant `app`'s root.
fn mount_after_death(path: &std::path::Path) -> (Store, Ino) {
    let copy = path.with_extension("after-death.img");
    std::fs::copy(path, &copy).unwrap();
    let dev = Arc::new(ImageDevice::open(&copy, ImageOptions::default()).unwrap());
    let store = Store::open(dev, StoreConfig::default()).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    (store, root)
}

#[test]
fn a_small_sync_writes_one_page_and_flushes_once() {
    let mut m = Machine::new(1 << 20);
    let (store, dev) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let f = store
        .open_file(root, "000003.log", OpenOptions::create())
        .unwrap();
    let mut at = 0;
    f.write_at(&record(0), at).unwrap();
    at += 430;
    f.sync_data().unwrap();
    let before = dev.counts();
    for i in 1..=50 {
        f.write_at(&record(i), at).unwrap();
        at += 430;
        f.sync_data().unwrap();
    }
    let (writes, data_writes, syncs) = dev.counts();
    assert_eq!(writes - before.0, 50, "one device write per sync");
    assert_eq!(data_writes - before.1, 0, "no data block per small sync");
    assert_eq!(syncs - before.2, 50, "one flush per sync");
    assert!(store.stats().inline_syncs >= 50);
    // A large tail is not inlined: it goes to a data zone.
    f.write_at(&vec![7u8; 20_000], at).unwrap();
    f.sync_data().unwrap();
    assert!(dev.counts().1 > before.1);
    f.close().unwrap();
}

#[test]
fn inline_syncs_survive_a_power_cut() {
    let mut m = Machine::new(1 << 20);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "wal", OpenOptions::create()).unwrap();
    let mut expect = Vec::new();
    for i in 0..40 {
        f.write_at(&record(i), expect.len() as u64).unwrap();
        expect.extend(record(i));
        f.sync_all().unwrap();
    }
    // Overwrite inside the synced tail, then grow again: the newest bytes win.
    let at = expect.len() - 200;
    f.write_at(b"overwritten", at as u64).unwrap();
    expect[at..at + 11].copy_from_slice(b"overwritten");
    f.write_at(&record(99), expect.len() as u64).unwrap();
    expect.extend(record(99));
    f.sync_data().unwrap();
    // Written but not synced: may or may not survive; the synced prefix must.
    f.write_at(&record(100), expect.len() as u64).unwrap();
    assert!(store.stats().inline_syncs > 0);
    m.power_cut(store, vec![f]);

    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let got = read_all(&store, root, "wal");
    assert!(
        got.len() >= expect.len(),
        "{} < {}",
        got.len(),
        expect.len()
    );
    assert_eq!(&got[..expect.len()], &expect[..]);
    assert!(store.fsck().unwrap().is_clean());
    // The written-back bytes are in data zones now: a second cut keeps them too.
    let f = store.open_file(root, "wal", OpenOptions::create()).unwrap();
    m.power_cut(store, vec![f]);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(&read_all(&store, root, "wal")[..expect.len()], &expect[..]);
}

/// Closing a log whose records were all synced inline moves its tail to a data zone with no
/// flush of its own (the bytes are durable in the journal already), and a power cut right
/// after the close keeps every byte.
#[test]
fn a_close_after_inline_syncs_needs_no_flush() {
    let mut m = Machine::new(1 << 20);
    let (store, dev) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "wal", OpenOptions::create()).unwrap();
    let mut expect = Vec::new();
    for i in 0..5 {
        f.write_at(&record(i), expect.len() as u64).unwrap();
        expect.extend(record(i));
        f.sync_data().unwrap();
    }
    let before = dev.counts();
    f.close().unwrap();
    let after = dev.counts();
    assert!(after.1 > before.1, "the tail did not reach a data zone");
    assert_eq!(after.2, before.2, "the close flushed the device");
    m.power_cut(store, vec![]);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(read_all(&store, root, "wal"), expect);
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn a_truncation_drops_inline_bytes_past_the_new_end() {
    let mut m = Machine::new(1 << 20);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "f", OpenOptions::create()).unwrap();
    f.write_at(&record(1), 0).unwrap();
    f.sync_data().unwrap();
    f.write_at(&record(2), 430).unwrap();
    f.sync_data().unwrap();
    f.set_len(200).unwrap();
    f.sync_all().unwrap();
    f.write_at(&[9u8; 10], 300).unwrap(); // a hole of zeros from 200 to 300
    f.sync_data().unwrap();
    m.power_cut(store, vec![f]);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let got = read_all(&store, root, "f");
    let mut expect = record(1)[..200].to_vec();
    expect.resize(300, 0);
    expect.extend([9u8; 10]);
    assert_eq!(got, expect);
}

#[test]
fn checkpoints_carry_inline_bytes() {
    // Small zones: the journal checkpoints every few dozen syncs.
    let mut m = Machine::new(128 << 10);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let log = store.open_file(root, "log", OpenOptions::create()).unwrap();
    let other = store
        .open_file(root, "other", OpenOptions::create())
        .unwrap();
    let mut expect = Vec::new();
    for i in 0..100 {
        log.write_at(&record(i), expect.len() as u64).unwrap();
        expect.extend(record(i));
        log.sync_data().unwrap();
        // Syncs of another file move the journal on while the log's tail stays inline.
        other.write_at(&record(i)[..64], (i * 64) as u64).unwrap();
        other.sync_data().unwrap();
    }
    m.power_cut(store, vec![log, other]);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(read_all(&store, root, "log"), expect);
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn inline_syncs_on_an_image_survive_a_crash_of_the_process() {
    // The image writes its zone table only on resets and fills: after a crash (the device
    // dropped without its clean close) the journal tells where the zones end.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valet.img");
    let g = geometry(1 << 20);
    let mut expect = Vec::new();
    {
        let dev = Arc::new(ImageDevice::create(&path, g, ImageOptions::default()).unwrap());
        let store = Store::open(dev, StoreConfig::default()).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let f = store.open_file(root, "log", OpenOptions::create()).unwrap();
        for i in 0..30 {
            f.write_at(&record(i), expect.len() as u64).unwrap();
            expect.extend(record(i));
            f.sync_data().unwrap();
        }
        let big = vec![5u8; 300_000];
        f.write_at(&big, expect.len() as u64).unwrap();
        expect.extend(&big);
        f.sync_data().unwrap();
        for i in 30..40 {
            f.write_at(&record(i), expect.len() as u64).unwrap();
            expect.extend(record(i));
            f.sync_data().unwrap();
        }
        // No clean close: the process "dies" here (the page cache keeps what it wrote, as
        // after a SIGKILL; the zone table is the one the last reset or fill left).
        std::mem::forget(f);
        std::mem::forget(store);
    }
    let (store, root) = mount_after_death(&path);
    assert_eq!(read_all(&store, root, "log"), expect);
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn full_windows_flush_in_the_background_while_syncs_go_on_inline() {
    // Small buffers: windows fill every ~38 records, and a header rewrite every 7th record
    // sends the tail's window to the background writer while syncs go on inline.
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 16 * 1024,
        ..StoreConfig::default()
    };
    for cut_after in [39, 45, 80, 85, 153, 160] {
        let mut m = Machine::new(1 << 20);
        let (store, dev) = m.mount_with(config.clone());
        let (_, root) = store.tenant("app").unwrap();
        let f = store.open_file(root, "log", OpenOptions::create()).unwrap();
        dev.data_delay_ms.store(3, Ordering::SeqCst);
        let mut expect: Vec<u8> = Vec::new();
        for i in 0..cut_after {
            if i % 5 == 4 {
                // Rewrite the last 100 bytes, then append.
                let at = expect.len() - 100;
                let patch = vec![i as u8; 100];
                f.write_at(&patch, at as u64).unwrap();
                expect[at..].copy_from_slice(&patch);
            }
            if i % 7 == 6 {
                // A header update far from the tail moves the window there and back: the
                // tail's window, all of it synced inline, goes to the background writer
                // while the header syncs inline in a newer window.
                let header = [i as u8; 16];
                f.write_at(&header, 0).unwrap();
                expect[..16].copy_from_slice(&header);
                f.sync_data().unwrap();
            }
            f.write_at(&record(i), expect.len() as u64).unwrap();
            expect.extend(record(i));
            f.sync_data().unwrap();
            if i % 10 == 9 {
                // Let a background write finish, so later syncs commit its record.
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let stats = store.stats();
        assert!(
            stats.inline_syncs > 0 && stats.background_flushes > 0,
            "{stats:?}"
        );
        m.power_cut(store, vec![f]);
        let (store, _) = m.mount_with(config.clone());
        let (_, root) = store.tenant("app").unwrap();
        assert_eq!(
            read_all(&store, root, "log"),
            expect,
            "cut after {cut_after}"
        );
        assert!(store.fsck().unwrap().is_clean());
    }
}

#[test]
fn a_checkpoint_during_a_truncation_stays_consistent() {
    // Small zones: the journal checkpoints every few dozen commits, so one lands while the
    // truncation's zeroed last block is on its (slowed) way to the device.
    let mut m = Machine::new(128 << 10);
    let (store, dev) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let big = store.open_file(root, "big", OpenOptions::create()).unwrap();
    let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8 + 1).collect();
    big.write_at(&content, 0).unwrap();
    big.sync_all().unwrap();
    dev.data_delay_ms.store(100, Ordering::SeqCst);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let committer = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let f = store
                .open_file(root, "other", OpenOptions::create())
                .unwrap();
            let mut at = 0;
            while !stop.load(Ordering::SeqCst) {
                if f.write_at(&[7u8; 16], at).is_err() || f.sync_data().is_err() {
                    break; // the power is gone
                }
                at += 16;
            }
            std::mem::forget(f);
        })
    };
    let truncate = {
        let big = store.open_file(root, "big", OpenOptions::create()).unwrap();
        std::thread::spawn(move || {
            let _ = big.set_len(5_000);
            std::mem::forget(big);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    m.power_cut(store, vec![big]);
    stop.store(true, Ordering::SeqCst);
    committer.join().unwrap();
    truncate.join().unwrap();

    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{report:?}");
    let got = read_all(&store, root, "big");
    assert!(
        got == content || got == content[..5_000],
        "big has {} bytes, neither before nor after the truncation",
        got.len()
    );
}

/// A B-tree's checkpoint rewrites scattered pages in place: each is a window of one block,
/// and the queued ones go to the device together, one write carrying many extents. What a
/// sync acknowledged survives a power cut, and every extent checks out.
#[test]
fn scattered_page_rewrites_share_a_device_write() {
    const PAGE: usize = 4096;
    const PAGES: usize = 64;
    let mut m = Machine::new(1 << 20);
    let (store, dev) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    let f = store
        .open_file(root, "bench.db", OpenOptions::create())
        .unwrap();
    let mut expect: Vec<u8> = (0..PAGES * PAGE).map(|i| (i % 251) as u8).collect();
    f.write_at(&expect, 0).unwrap();
    f.sync_data().unwrap();

    // The first page's write takes a while, so the rest queue up behind it.
    dev.data_delay_ms.store(20, Ordering::SeqCst);
    let (_, data_before, _) = dev.counts();
    for page in (1..PAGES).step_by(2) {
        let bytes = vec![page as u8; PAGE];
        expect[page * PAGE..(page + 1) * PAGE].copy_from_slice(&bytes);
        f.write_at(&bytes, (page * PAGE) as u64).unwrap();
    }
    f.sync_data().unwrap();
    let (_, data_after, _) = dev.counts();
    let writes = data_after - data_before;
    assert!(
        writes <= 4,
        "32 scattered pages took {writes} device writes"
    );
    assert_eq!(read_all(&store, root, "bench.db"), expect);
    assert!(store.fsck_deep().unwrap().is_clean());

    m.power_cut(store, vec![f]);
    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(read_all(&store, root, "bench.db"), expect);
    assert!(store.fsck_deep().unwrap().is_clean());
}

/// Deterministic bytes for file `seed`, never 0.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 2_654_435_761 + seed as u64 * 97) >> 7) as u8 | 1)
        .collect()
}

/// Waits until two hand-off rounds have ended since now: the first finds the files just
/// written busy, the second hands them off (the third's start says the second ended).
fn wait_for_handoffs(store: &Store) {
    let from = store.stats().handoff_rounds;
    wait_until("hand-offs", || store.stats().handoff_rounds >= from + 3);
}

/// Polls `done` until it holds; fails after 10 s, naming `what` it waited for.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "no {what} in 10 s");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A process killed after a hand-off (SIGKILL: no destructor runs, the page cache keeps
/// what it wrote) loses nothing it wrote before it, synced or not: files of several buffers,
/// a tail in a window, a new directory. Without hand-offs the same kill loses all of it.
#[test]
fn a_killed_process_keeps_what_a_handoff_wrote() {
    for handoff in [Some(std::time::Duration::from_millis(5)), None] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("valet.img");
        let (big, small, tiny) = (pattern(1, 1_200_000), pattern(2, 3_000), pattern(3, 10));
        {
            let dev = ImageDevice::create(&path, geometry(1 << 20), ImageOptions::default());
            let config = StoreConfig {
                handoff,
                ..StoreConfig::default()
            };
            let store = Store::open(Arc::new(dev.unwrap()), config).unwrap();
            let (_, root) = store.tenant("app").unwrap();
            let a = store.open_file(root, "a", OpenOptions::create()).unwrap();
            for (i, piece) in big.chunks(100_000).enumerate() {
                a.write_at(piece, i as u64 * 100_000).unwrap();
            }
            let b = store.open_file(root, "b", OpenOptions::create()).unwrap();
            b.write_at(&small, 0).unwrap();
            store.create_dir(root, "d").unwrap();
            let c = store.open_file(root, "d/c", OpenOptions::create()).unwrap();
            c.write_at(&tiny, 0).unwrap();
            match handoff {
                Some(_) => {
                    // A file with buffers on their way to the device is not handed off: on
                    // a loaded machine a's two full buffers may take several rounds.
                    let full = 2 * StoreConfig::default().buffer_size as u64;
                    wait_until("write of a's full buffers", || {
                        store.stats().device_bytes >= full
                    });
                    wait_for_handoffs(&store)
                }
                None => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
            std::mem::forget((a, b, c));
            std::mem::forget(store);
        }
        let (store, root) = mount_after_death(&path);
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "{}", report.findings());
        if handoff.is_none() {
            assert!(store.lookup(root, "a").is_err(), "kept without hand-offs");
            continue;
        }
        assert!(read_all(&store, root, "a") == big, "a differs");
        assert_eq!(read_all(&store, root, "b"), small);
        assert_eq!(read_all(&store, root, "d/c"), tiny);
    }
}

/// A power cut after hand-offs that keeps their journal records but loses the data they
/// name (a drive's cache writes out what it likes): the mount drops the first record whose
/// data is not there and every one after it (here the newest names no data: checking only
/// the newest, as before hand-offs, mounted a store whose extents lie past the write
/// pointers), keeps what was synced, and is clean. What was not synced is gone, or zeros,
/// or what was written.
#[test]
fn a_power_cut_that_keeps_handed_off_records_but_not_their_data_keeps_what_was_synced() {
    let mut m = Machine::new(1 << 20);
    let config = StoreConfig {
        handoff: Some(std::time::Duration::from_millis(5)),
        ..StoreConfig::default()
    };
    let (store, _) = m.mount_with(config);
    let (_, root) = store.tenant("app").unwrap();
    let synced = pattern(4, 50_000);
    let s = store.open_file(root, "s", OpenOptions::create()).unwrap();
    s.write_at(&synced, 0).unwrap();
    s.sync_all().unwrap();
    let unsynced = pattern(5, 1_200_000);
    let u = store.open_file(root, "u", OpenOptions::create()).unwrap();
    for (i, piece) in unsynced.chunks(100_000).enumerate() {
        u.write_at(piece, i as u64 * 100_000).unwrap();
    }
    wait_for_handoffs(&store);
    // A later hand-off whose record names no data: the newest record checks out, the one
    // before it does not.
    let v = store.open_file(root, "v", OpenOptions::create()).unwrap();
    v.write_at(b"later", 0).unwrap();
    wait_for_handoffs(&store);
    let journal_zones = |zone: u32| zone < 2;
    m.power_cut_keeping(store, vec![s, u, v], journal_zones);

    let (store, _) = m.mount();
    let (_, root) = store.tenant("app").unwrap();
    assert!(store.fsck().unwrap().is_clean());
    assert_eq!(read_all(&store, root, "s"), synced);
    if store.lookup(root, "u").is_ok() {
        let got = read_all(&store, root, "u");
        assert!(got.len() <= unsynced.len());
        let bad = got
            .iter()
            .zip(&unsynced)
            .position(|(g, w)| *g != 0 && g != w);
        assert_eq!(bad, None, "u holds bytes never written");
        assert!(
            got != unsynced,
            "the data of u was lost, yet u reads back whole"
        );
    }
}
