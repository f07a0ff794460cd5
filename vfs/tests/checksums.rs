//! Extent checksums: GC and defragmentation verify what they copy and refuse a damaged
//! block, the deep fsck reads and verifies every live block, and the checksums survive
//! remounts (journal replay and checkpoints). Also: GC runs in the background, not on the
//! writer's call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use valet_vfs::device::{DeviceError, Geometry, MemoryDevice, ZoneId, ZoneInfo, ZonedDevice};
use valet_vfs::{OpenOptions, Stats, Store, StoreConfig};

const BLOCK: usize = 4096;

/// 14 zones of 32 blocks: two for metadata, twelve for data.
fn geometry() -> Geometry {
    Geometry {
        zone_count: 14,
        zone_size: 32 * BLOCK as u64,
        zone_capacity: 32 * BLOCK as u64,
        block_size: BLOCK as u32,
        max_open: 8,
        max_active: 8,
    }
}

/// A memory device whose data zones can start to return one flipped bit in every read, as
/// a medium that went bad after the data was written would.
struct Rotting {
    inner: MemoryDevice,
    rot: AtomicBool,
}

impl ZonedDevice for Rotting {
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
        self.inner.write(zone, offset, data)
    }
    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.inner.append(zone, data)
    }
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read(zone, offset, buf)?;
        // Metadata zones (0 and 1) stay sound: the damage is in file data.
        if zone > 1 && self.rot.load(Ordering::SeqCst) && !buf.is_empty() {
            let last = buf.len() - 1;
            buf[last] ^= 0x10;
        }
        Ok(())
    }
    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
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
        self.inner.sync()
    }
}

fn device() -> Arc<Rotting> {
    Arc::new(Rotting {
        inner: MemoryDevice::new(geometry()).unwrap(),
        rot: AtomicBool::new(false),
    })
}

fn mount(dev: &Arc<Rotting>) -> Store {
    mount_with(dev, 4)
}

/// A mount whose reclaimer wakes below `low` free zones (never, with 0).
fn mount_with(dev: &Arc<Rotting>, low: u32) -> Store {
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 16 * BLOCK,
        gc_low_zones: low,
        gc_high_zones: 6,
        ..Default::default()
    };
    Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap()
}

fn pattern(file: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| file ^ (i / 7) as u8).collect()
}

/// Writes `keep` and `doomed` in alternating 32 KiB pieces of one stream, so that every
/// data zone holds both, then removes `doomed`: each zone is half dead, worth collecting.
fn half_dead_zones(store: &Store, root: u64) -> Vec<u8> {
    let keep = store
        .open_file(root, "keep", OpenOptions::create())
        .unwrap();
    let doomed = store
        .open_file(root, "doomed", OpenOptions::create())
        .unwrap();
    // 9 of the 12 data zones: below the low watermark of free zones.
    let piece = 8 * BLOCK;
    let kept = pattern(1, 18 * piece);
    for (i, chunk) in kept.chunks(piece).enumerate() {
        keep.write_at(chunk, (i * piece) as u64).unwrap();
        keep.sync_data().unwrap();
        doomed
            .write_at(&pattern(2, piece), (i * piece) as u64)
            .unwrap();
        doomed.sync_data().unwrap();
    }
    keep.close().unwrap();
    doomed.close().unwrap();
    store.unlink(root, "doomed").unwrap();
    store.sync().unwrap();
    kept
}

/// Writes a little more, so that allocations find free zones below the low watermark and
/// wake the reclaimer, then waits (bounded) for `done` to hold of the stats.
fn nudge_until(store: &Store, root: u64, done: impl Fn(&Stats) -> bool) -> Stats {
    let f = store
        .open_file(root, "nudge", OpenOptions::create())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut at = 0u64;
    loop {
        let stats = store.stats();
        if done(&stats) || Instant::now() > deadline {
            f.close().unwrap();
            return stats;
        }
        f.write_at(&[9u8; BLOCK], at % (8 * BLOCK as u64)).unwrap();
        f.sync_data().unwrap();
        at += BLOCK as u64;
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_all(store: &Store, root: u64, path: &str) -> Vec<u8> {
    let f = store.open_file(root, path, OpenOptions::read()).unwrap();
    let size = f.metadata().unwrap().size as usize;
    let mut buf = vec![0u8; size];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), size);
    f.close().unwrap();
    buf
}

#[test]
fn the_reclaimer_collects_and_every_live_block_verifies_across_remounts() {
    let dev = device();
    let store = mount(&dev);
    let (app, root) = store.tenant("app").unwrap();
    let kept = half_dead_zones(&store, root);
    // Every write so far was synced on this thread, as the nudges are: what the store's
    // threads do for the tenant from here on is the reclaimer's copying.
    let work_before = store.tenant_work(app).cpu();
    let stats = nudge_until(&store, root, |s| s.gc_background_passes > 0);
    assert!(
        stats.gc_background_passes > 0,
        "the reclaimer never ran: {stats:?}"
    );
    assert!(stats.gc_bytes_moved > 0, "nothing moved: {stats:?}");
    assert!(
        store.tenant_work(app).cpu() > work_before,
        "the reclaimer's copies were not counted for their tenant"
    );
    assert_eq!(stats.checksum_failures, 0, "{stats:?}");
    assert_eq!(read_all(&store, root, "keep"), kept);

    let report = store.fsck_deep().unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.verified_blocks, report.valid_blocks, "{report:?}");
    assert_eq!(report.unverified_blocks, 0);

    // A remount replays the journal and writes a checkpoint; the next one reads the
    // checkpoint back: the checksums must come through both.
    store.unmount().unwrap();
    for round in 0..2 {
        let store = mount(&dev);
        let (_, root) = store.tenant("app").unwrap();
        let report = store.fsck_deep().unwrap();
        assert!(report.is_clean(), "remount {round}: {report:?}");
        assert_eq!(report.verified_blocks, report.valid_blocks, "{report:?}");
        assert_eq!(read_all(&store, root, "keep"), kept);
        store.unmount().unwrap();
    }
}

#[test]
fn gc_refuses_to_copy_a_damaged_block_and_deep_fsck_reports_it() {
    let dev = device();
    // Set up with the reclaimer asleep, so that nothing moves before the damage.
    let store = mount_with(&dev, 0);
    let (_, root) = store.tenant("app").unwrap();
    let kept = half_dead_zones(&store, root);
    assert_eq!(store.stats().gc_bytes_moved, 0);
    store.unmount().unwrap();
    let store = mount(&dev);
    let clean = store.fsck_deep().unwrap();
    assert!(clean.is_clean(), "{clean:?}");

    dev.rot.store(true, Ordering::SeqCst);
    let stats = nudge_until(&store, root, |s| s.checksum_failures > 0);
    assert!(
        stats.checksum_failures > 0,
        "GC never met the damage: {stats:?}"
    );
    let why = stats.last_checksum_failure.clone().unwrap();
    assert!(why.contains("crc32c"), "{why}");
    // Nothing was laundered: no GC copy of the damaged data was made under a new checksum.
    assert_eq!(stats.gc_bytes_moved, 0, "{stats:?}");

    // The shallow check sees nothing wrong; the deep one reads the data and does.
    assert!(store.fsck().unwrap().is_clean());
    let deep = store.fsck_deep().unwrap();
    assert!(!deep.is_clean(), "{deep:?}");
    assert!(
        deep.damaged
            .iter()
            .any(|p| p.contains("does not match its checksum")),
        "{deep:?}"
    );

    // The damaged zones were left alone: once the medium reads right again, every byte is
    // there and verifies.
    dev.rot.store(false, Ordering::SeqCst);
    assert_eq!(read_all(&store, root, "keep"), kept);
    let healed = store.fsck_deep().unwrap();
    assert!(healed.is_clean(), "{healed:?}");
    assert_eq!(healed.verified_blocks, healed.valid_blocks);
}

#[test]
fn defragmentation_refuses_to_copy_a_damaged_block() {
    let dev = device();
    // One block at a time, taking turns with another file: every block of `pages` is an
    // extent of its own (nothing joins), and no defragmentation runs yet.
    let store = mount_with(&dev, 0);
    let (_, root) = store.tenant("app").unwrap();
    let pages = store
        .open_file(root, "pages", OpenOptions::create())
        .unwrap();
    let other = store
        .open_file(root, "other", OpenOptions::create())
        .unwrap();
    let written = pattern(3, 24 * BLOCK);
    for (i, block) in written.chunks(BLOCK).enumerate() {
        pages.write_at(block, (i * BLOCK) as u64).unwrap();
        pages.sync_data().unwrap();
        other.write_at(&[4u8; BLOCK], (i * BLOCK) as u64).unwrap();
        other.sync_data().unwrap();
    }
    pages.close().unwrap();
    other.close().unwrap();
    assert_eq!(store.fsck().unwrap().extents, 48);
    store.unmount().unwrap();

    // Damage, then a store that rewrites every fragmented window on every sync and commit.
    dev.rot.store(true, Ordering::SeqCst);
    let config = StoreConfig {
        gc_low_zones: 0,
        defrag_start_bytes: Some(0),
        ..Default::default()
    };
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    let pages = store
        .open_file(root, "pages", OpenOptions::create())
        .unwrap();
    pages.write_at(&written[..BLOCK], 0).unwrap();
    pages.sync_data().unwrap();
    let stats = store.stats();
    assert!(
        stats.checksum_failures > 0,
        "never met the damage: {stats:?}"
    );
    // Nothing was laundered: no copy of the damaged data under a new checksum.
    assert_eq!(stats.defrag_bytes_moved, 0, "{stats:?}");
    pages.close().unwrap();

    // Left as it was: once the medium reads right again, every byte is there and verifies.
    dev.rot.store(false, Ordering::SeqCst);
    assert_eq!(read_all(&store, root, "pages"), written);
    let healed = store.fsck_deep().unwrap();
    assert!(healed.is_clean(), "{healed:?}");
    assert_eq!(healed.verified_blocks, healed.valid_blocks);
}

/// The next mount checks the newest commit's data against its checksums and drops the
/// commit on a mismatch (its flush may not have completed). After a clean unmount that
/// commit is sealed: damage found later in its data is reported by the deep fsck, and the
/// commit's files stay.
#[test]
fn damage_to_the_last_commit_after_a_clean_unmount_is_reported_not_rolled_back() {
    let write_and_stop = |seal: bool| {
        let dev = device();
        let store = mount_with(&dev, 0);
        let (_, root) = store.tenant("app").unwrap();
        let f = store
            .open_file(root, "table", OpenOptions::create())
            .unwrap();
        f.write_at(&pattern(3, 12 * BLOCK), 0).unwrap();
        f.close().unwrap();
        match seal {
            true => store.unmount().unwrap(),
            false => {
                store.sync().unwrap();
                drop(store);
            }
        }
        dev.rot.store(true, Ordering::SeqCst);
        let store = mount_with(&dev, 0);
        let root = store.tenants()[0].2;
        (store, root)
    };

    let (store, root) = write_and_stop(true);
    let names: Vec<String> = store
        .read_dir(root)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["table"]);
    let deep = store.fsck_deep().unwrap();
    assert!(
        deep.damaged
            .iter()
            .any(|p| p.contains("does not match its checksum")),
        "{deep:?}"
    );

    // Unsealed (the process died after its last sync, or stopped without unmounting), the
    // mount cannot tell the damage from a flush that never completed.
    let (store, root) = write_and_stop(false);
    assert!(store.read_dir(root).unwrap().is_empty());
}
