//! Bad input: damaged, truncated and mismatched images and a full device each give one
//! clear error, never a panic, and never cost the data that was there.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use valet_vfs::device::{Geometry, ImageDevice, ImageOptions, MemoryDevice, ZonedDevice};
use valet_vfs::{Error, Hint, OpenOptions, Placement, PlacementRequest, Store, StoreConfig};

const ZONE: u64 = 1 << 20;

fn geometry() -> Geometry {
    Geometry {
        zone_count: 10,
        zone_size: ZONE,
        zone_capacity: ZONE,
        block_size: 4096,
        max_open: 4,
        max_active: 5,
    }
}

fn config() -> StoreConfig {
    StoreConfig {
        buffers: 4,
        buffer_size: 64 * 1024,
        ..Default::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// An image holding two synced files, then closed.
fn populated_image(path: &Path) {
    let dev = ImageDevice::create(path, geometry(), ImageOptions::default()).unwrap();
    let store = Store::open(Arc::new(dev), config()).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    for (name, seed) in [("a.log", 1u8), ("b.sst", 2)] {
        let f = store.open_file(root, name, OpenOptions::create()).unwrap();
        f.write_at(&pattern(300_000, seed), 0).unwrap();
        f.close().unwrap();
    }
}

fn mount_image(path: &Path) -> Result<Store, Error> {
    let dev = ImageDevice::open(path, ImageOptions::default())?;
    Store::open(Arc::new(dev), config())
}

fn assert_intact(store: &Store) {
    let (_, root) = store.tenant("app").unwrap();
    for (name, seed) in [("a.log", 1u8), ("b.sst", 2)] {
        let f = store.open_file(root, name, OpenOptions::read()).unwrap();
        let mut buf = vec![0u8; 300_000];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 300_000);
        assert_eq!(buf, pattern(300_000, seed), "{name} changed");
    }
    assert!(store.fsck().unwrap().is_clean());
}

fn flip_byte(path: &Path, at: u64) -> u8 {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    b[0]
}

fn restore_byte(path: &Path, at: u64, value: u8) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&[value], at).unwrap();
}

/// The metadata zone that is active (holds the newest checkpoint), or with `active` false
/// the retired one.
fn metadata_zone(path: &Path, active: bool) -> u32 {
    let dev = ImageDevice::open(path, ImageOptions::default()).unwrap();
    (0..2)
        .find(|z| dev.zone_info(*z).unwrap().state.is_active() == active)
        .expect("one metadata zone is active, the other retired")
}

/// Offsets in `zone` of the blocks where a journal record starts ("VJRN").
fn record_starts(path: &Path, zone: u32) -> Vec<u64> {
    let file = std::fs::File::open(path).unwrap();
    (0..ZONE / 4096)
        .map(|b| b * 4096)
        .filter(|&at| {
            let mut magic = [0u8; 4];
            file.read_exact_at(&mut magic, zone_byte(path, zone, at))
                .unwrap();
            &magic == b"VJRN"
        })
        .collect()
}

/// Byte offset in the image of `offset` within `zone` (zones are laid out at a fixed stride
/// after the header and zone tables, which is what the image's own tests check).
fn zone_byte(path: &Path, zone: u32, offset: u64) -> u64 {
    let len = std::fs::metadata(path).unwrap().len();
    let stride = ZONE;
    let data_start = len - stride * geometry().zone_count as u64;
    data_start + zone as u64 * stride + offset
}

#[test]
fn truncated_image_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    populated_image(&path);
    let full_len = std::fs::metadata(&path).unwrap().len();
    let copy = std::fs::read(&path).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(full_len / 2).unwrap();
    let err = mount_image(&path)
        .err()
        .expect("a truncated image must not mount");
    let msg = err.to_string();
    assert!(!msg.contains('\n') && msg.contains("zones.img"), "{msg}");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        full_len / 2,
        "no repair"
    );
    // Put the missing half back: everything is there.
    std::fs::write(&path, &copy).unwrap();
    assert_intact(&mount_image(&path).unwrap());
}

#[test]
fn corrupted_header_is_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    populated_image(&path);
    let old = flip_byte(&path, 12);
    let msg = mount_image(&path)
        .err()
        .expect("corrupt header")
        .to_string();
    assert!(!msg.contains('\n'), "{msg}");
    restore_byte(&path, 12, old);
    assert_intact(&mount_image(&path).unwrap());
}

#[test]
fn damaged_newest_checkpoint_is_refused_rather_than_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    populated_image(&path);
    // Each mount writes a fresh checkpoint into the other metadata zone; find the active
    // one (the zone that is not finished) and damage its checkpoint's payload.
    let active = metadata_zone(&path, true);
    // Just past the 32-byte record header: inside even a small checkpoint's payload.
    let at = zone_byte(&path, active, 34);
    let old = flip_byte(&path, at);
    match mount_image(&path) {
        Err(Error::Corrupt(msg)) => assert!(msg.contains("checkpoint"), "{msg}"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a damaged checkpoint must not mount"),
    }
    restore_byte(&path, at, old);
    assert_intact(&mount_image(&path).unwrap());
}

/// The retired metadata zone (finished when the newer checkpoint in the other zone became
/// durable) holds only records that checkpoint already covers: a damaged record there, with
/// valid ones after it, does not stop the mount, and nothing is lost. Mounts do not scan
/// that zone past its valid records (on 128 MiB zones that was 96 MiB read per mount).
#[test]
fn damage_in_the_retired_metadata_zone_is_superseded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    populated_image(&path);
    // A mount writes its checkpoint into the other metadata zone and retires this one.
    drop(mount_image(&path).unwrap());
    let retired = metadata_zone(&path, false);
    let records = record_starts(&path, retired);
    assert!(
        records.len() >= 3,
        "checkpoint and transactions: {records:?}"
    );
    // Damage the first transaction's payload: valid records follow it.
    let at = zone_byte(&path, retired, records[1] + 34);
    flip_byte(&path, at);
    // The deep fsck reads the retired zone too, and names the damage: nothing depends on
    // those records, but the medium is failing.
    {
        let options = ImageOptions {
            read_only: true,
            ..Default::default()
        };
        let config = StoreConfig {
            read_only: true,
            ..config()
        };
        let dev = ImageDevice::open(&path, options).unwrap();
        let store = Store::open(Arc::new(dev), config).unwrap();
        assert!(store.fsck().unwrap().is_clean());
        let deep = store.fsck_deep().unwrap();
        let named = format!("metadata zone {retired} (retired");
        assert!(deep.problems.iter().any(|p| p.contains(&named)), "{deep:?}");
    }
    assert_intact(&mount_image(&path).expect("a damaged retired zone must not stop a mount"));
    // That mount's checkpoint went into the damaged zone, reset for rewrite.
    assert_intact(&mount_image(&path).unwrap());
}

#[test]
fn wrong_geometry_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    populated_image(&path);
    let other = Geometry {
        zone_count: 20,
        ..geometry()
    };
    let msg = ImageDevice::open_or_create(&path, other, ImageOptions::default())
        .err()
        .expect("geometry mismatch")
        .to_string();
    assert!(
        msg.contains("20") && msg.contains("10"),
        "names both geometries: {msg}"
    );
    assert_intact(&mount_image(&path).unwrap());
}

#[test]
fn blank_device_with_data_but_no_metadata_is_not_formatted() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    dev.write(5, 0, &[7u8; 4096]).unwrap();
    match Store::open(dev.clone() as Arc<dyn ZonedDevice>, config()) {
        Err(Error::Corrupt(msg)) => assert!(msg.contains("not a valet store"), "{msg}"),
        other => panic!("expected a refusal, got {:?}", other.err()),
    }
    assert_eq!(
        dev.zone_info(5).unwrap().write_pointer,
        4096,
        "data left alone"
    );
}

struct OneStream;
impl Placement for OneStream {
    fn place(&self, _: &PlacementRequest<'_>) -> Hint {
        Hint::zoned(0)
    }
}

#[test]
fn full_device_reports_enospc_and_keeps_what_was_written() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config()).unwrap();
    let (t, root) = store.tenant("app").unwrap();
    store.set_placement(t, Arc::new(OneStream));
    let keep = pattern(1 << 20, 9);
    let f = store
        .open_file(root, "keep", OpenOptions::create())
        .unwrap();
    f.write_at(&keep, 0).unwrap();
    f.close().unwrap();
    let f = store
        .open_file(root, "fill", OpenOptions::create())
        .unwrap();
    let chunk = vec![1u8; 64 * 1024];
    let mut at = 0u64;
    let err = loop {
        match f.write_at(&chunk, at).and_then(|_| f.sync_data()) {
            Ok(_) => at += chunk.len() as u64,
            Err(e) => break e,
        }
        assert!(at < 20 * ZONE, "the device never filled");
    };
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    assert_eq!(err.errno(), libc_enospc());
    // The data zones (8 of 1 MiB) less the GC reserve hold the live data, and no more.
    assert!(
        at + (1 << 20) >= 6 * ZONE,
        "ENOSPC too early: {at} bytes written"
    );
    drop(f);
    store.unlink(root, "fill").unwrap();
    let mut buf = vec![0u8; keep.len()];
    let g = store.open_file(root, "keep", OpenOptions::read()).unwrap();
    g.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, keep);
    // Space comes back once the filler is gone.
    let h = store
        .open_file(root, "again", OpenOptions::create())
        .unwrap();
    h.write_at(&vec![3u8; 3 << 20], 0).unwrap();
    h.close().unwrap();
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn nearly_full_device_keeps_collecting_without_enospc() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config()).unwrap();
    let (t, root) = store.tenant("app").unwrap();
    store.set_placement(t, Arc::new(OneStream));
    // Live data: 16 files of 256 KiB = 4 MiB on 8 MiB of data zones, rewritten at random
    // in 16 KiB pieces for 12 device-fulls: every zone mixes live and dead data.
    let files = 16u64;
    let size = 256 * 1024u64;
    let handles: Vec<_> = (0..files)
        .map(|i| {
            let f = store
                .open_file(root, &format!("f{i}"), OpenOptions::create())
                .unwrap();
            f.write_at(&vec![i as u8; size as usize], 0).unwrap();
            f.sync_data().unwrap();
            f
        })
        .collect();
    let mut x = 12345u64;
    let piece = 16 * 1024u64;
    for _ in 0..(12 * 8 * ZONE / piece) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let file = (x >> 33) % files;
        let at = ((x >> 13) % (size / piece)) * piece;
        let f = &handles[file as usize];
        f.write_at(&vec![(x >> 40) as u8; piece as usize], at)
            .unwrap();
        f.sync_data().unwrap();
    }
    let stats = store.stats();
    assert!(stats.gc_bytes_moved > 0, "{stats:?}");
    assert_eq!(stats.allocation_stalls, 0, "{stats:?}");
    assert!(store.fsck().unwrap().is_clean());
}

fn libc_enospc() -> i32 {
    28
}

/// An image with a journal of many kinds of operation: a checkpoint, then a second life of
/// transactions left unmounted (as a crash leaves them).
fn busy_image(path: &Path) {
    let dev = ImageDevice::create(path, geometry(), ImageOptions::default()).unwrap();
    let store = Store::open(Arc::new(dev), config()).unwrap();
    for tenant in ["app", "other"] {
        let (_, root) = store.tenant(tenant).unwrap();
        store.create_dir(root, "d").unwrap();
        for i in 0..5u8 {
            let f = store
                .open_file(root, &format!("d/f{i}"), OpenOptions::create())
                .unwrap();
            f.write_at(&pattern(20_000 * (i as usize + 1), i), 0)
                .unwrap();
            f.close().unwrap();
        }
        store.rename(root, "d/f1", root, "g1").unwrap();
        store.unlink(root, "d/f2").unwrap();
        store.symlink(root, "g1", "ln").unwrap();
    }
    store.unmount().unwrap();
    let store = mount_image(path).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    for i in 0..4u8 {
        let f = store
            .open_file(root, &format!("t{i}"), OpenOptions::create())
            .unwrap();
        f.write_at(&pattern(300 + 1000 * i as usize, i), 0).unwrap();
        f.sync_data().unwrap(); // a small synced tail: kept inline in the journal
        f.close().unwrap();
    }
    store.link(root, "t0", root, "t0b").unwrap();
    store.unlink(root, "d/f3").unwrap();
    store.sync().unwrap();
    std::mem::forget(store);
}

/// (image offset, payload length) of each record in metadata zone `zone` of `image`.
fn journal_records(image: &[u8], zone: u64) -> Vec<(usize, usize)> {
    let start = image.len() - (ZONE * geometry().zone_count as u64) as usize;
    let base = start + (zone * ZONE) as usize;
    let mut records = Vec::new();
    let mut pos = 0;
    while pos < ZONE as usize && &image[base + pos..base + pos + 4] == b"VJRN" {
        let at = base + pos;
        let len = u32::from_le_bytes(image[at + 16..at + 20].try_into().unwrap()) as usize;
        records.push((at, len));
        pos += (32 + len).div_ceil(4096) * 4096;
    }
    records
}

/// Seals a record again after its payload changed: payload crc32c, then header crc32c (the
/// journal's layout, `vfs/src/store/journal.rs`).
fn reseal(image: &mut [u8], at: usize, len: usize) {
    let payload = crc32c::crc32c(&image[at + 32..at + 32 + len]);
    image[at + 20..at + 24].copy_from_slice(&payload.to_le_bytes());
    let header = crc32c::crc32c(&image[at..at + 24]);
    image[at + 24..at + 28].copy_from_slice(&header.to_le_bytes());
}

/// Metadata damaged behind valid checksums (a controller returning wrong data, a crafted
/// image): a few bytes of one journal record changed and the record sealed again, for 200
/// seeds (`VALET_DAMAGED_SEEDS=N` for more). Each image is either refused with one line,
/// its zones left as they were, or mounts as a store fsck finds consistent, which stays so
/// through writes and a remount. Never a panic. (Found: a release of a zone past the
/// device indexed out of bounds; with 4,000 seeds, an inline piece of no bytes failed a
/// mount after its checkpoint was written.)
#[test]
fn metadata_damaged_behind_valid_checksums_is_refused_or_mounts_consistent() {
    let dir = tempfile::tempdir().unwrap();
    // The busy image's last store is never dropped (a crash): the lock on it stays taken.
    let busy = dir.path().join("busy.img");
    busy_image(&busy);
    let pristine = std::fs::read(&busy).unwrap();
    let path = dir.path().join("zones.img");
    let zones_start = pristine.len() - (ZONE * geometry().zone_count as u64) as usize;
    let (mut refused, mut mounted) = (0, 0);
    let seeds: u64 = std::env::var("VALET_DAMAGED_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    for seed in 1..=seeds {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut image = pristine.clone();
        let records = journal_records(&image, next() % 2);
        let (at, len) = records[next() as usize % records.len()];
        for _ in 0..1 + next() % 3 {
            let byte = at + 32 + next() as usize % len;
            image[byte] = match next() % 3 {
                0 => image[byte] ^ 1 << (next() % 8),
                1 => next() as u8,
                _ => 0xff,
            };
        }
        reseal(&mut image, at, len);
        std::fs::write(&path, &image).unwrap();
        let store = match mount_image(&path) {
            Err(err) => {
                let msg = err.to_string();
                assert!(matches!(err, Error::Corrupt(_)), "seed {seed}: {msg}");
                assert!(!msg.contains('\n'), "seed {seed}: {msg}");
                let now = std::fs::read(&path).unwrap();
                assert!(now[zones_start..] == image[zones_start..], "seed {seed}");
                refused += 1;
                continue;
            }
            Ok(store) => store,
        };
        mounted += 1;
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "seed {seed}: {}", report.findings());
        let (_, root) = store.tenant("app").unwrap();
        let f = store.open_file(root, "new", OpenOptions::create()).unwrap();
        f.write_at(&pattern(200_000, 5), 0).unwrap();
        f.close().unwrap();
        store.unmount().unwrap();
        let store = mount_image(&path).unwrap();
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "seed {seed}: {}", report.findings());
    }
    // Both outcomes were met (the seeds are fixed: this is not luck).
    assert!(
        refused > 0 && mounted > 0,
        "{refused} refused, {mounted} mounted"
    );
}

/// A transaction of the active metadata zone damaged after valid ones were written behind
/// it is refused, not taken for the journal's end, on the image device too, where the zone
/// table keeps write pointers lazily: the records synced since the last mount lie past the
/// pointer the table holds. Taking the damage for the end would silently drop the files
/// those records made, and the space of their data would be reused.
#[test]
fn a_damaged_transaction_with_valid_ones_after_it_is_refused_past_a_lazy_write_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    populated_image(&path);
    // A mount checkpoints into the other metadata zone; then each synced record of c.log is
    // a transaction after that checkpoint, and no zone is reset or finished meanwhile, so
    // the table on the image keeps that zone's write pointer where the checkpoint ended.
    let crashed = dir.path().join("crashed.img");
    let active = {
        let store = mount_image(&path).unwrap();
        let _log = append_synced_records(&store);
        // The image as a power cut now would leave it: every record synced.
        std::fs::copy(&path, &crashed).unwrap();
        metadata_zone(&crashed, true)
    };
    let dev = ImageDevice::open(&crashed, ImageOptions::default()).unwrap();
    assert!(
        dev.zone_info(active).unwrap().write_pointer < 3 * 4096,
        "the table holds the write pointer the checkpoint left"
    );
    drop(dev);
    let records = record_starts(&crashed, active);
    assert!(
        records.len() >= 7,
        "checkpoint and transactions: {records:?}"
    );
    // Damage the payload of the third record: at least four valid ones follow it.
    let at = zone_byte(&crashed, active, records[2] + 34);
    let old = flip_byte(&crashed, at);
    match mount_image(&crashed) {
        Err(Error::Corrupt(msg)) => {
            assert!(msg.contains("damaged and valid records follow it"), "{msg}")
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a damaged transaction with valid ones after it must not mount"),
    }
    // Nothing was changed: with the byte back, every file is there, c.log whole.
    restore_byte(&crashed, at, old);
    let store = mount_image(&crashed).unwrap();
    assert_intact(&store);
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "c.log", OpenOptions::read()).unwrap();
    let mut buf = vec![0u8; RECORDS * 400];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), buf.len());
    for (i, record) in buf.chunks(400).enumerate() {
        assert_eq!(record, pattern(400, i as u8), "record {i} of c.log");
    }
}

/// Records [`append_synced_records`] writes.
const RECORDS: usize = 6;

/// Appends [`RECORDS`] records of 400 bytes to a new file `c.log` of tenant `app`, syncing
/// each: one journal transaction each. Returns the file, open.
fn append_synced_records(store: &Store) -> valet_vfs::FileHandle {
    let (_, root) = store.tenant("app").unwrap();
    let f = store
        .open_file(root, "c.log", OpenOptions::create())
        .unwrap();
    for i in 0..RECORDS {
        f.write_at(&pattern(400, i as u8), (i * 400) as u64)
            .unwrap();
        f.sync_data().unwrap();
    }
    f
}

/// A clean stop writes the image's zone table as it is, even while another handle keeps the
/// store (and so the device) alive to the end of the process, as `valet-run`'s signal
/// handler does: tools that read the table see the journal's real end, and a mount's damage
/// checks reach it.
#[test]
fn a_clean_stop_writes_exact_write_pointers_while_the_store_is_still_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    populated_image(&path);
    let store = mount_image(&path).unwrap();
    append_synced_records(&store).close().unwrap();
    let held = store.clone();
    store.unmount().unwrap();
    let stopped = dir.path().join("stopped.img");
    std::fs::copy(&path, &stopped).unwrap();
    drop(held);
    let active = metadata_zone(&stopped, true);
    // The journal's end: the block after its last record (the seal, one block).
    let last = *record_starts(&stopped, active).last().unwrap();
    let dev = ImageDevice::open(&stopped, ImageOptions::default()).unwrap();
    assert_eq!(dev.zone_info(active).unwrap().write_pointer, last + 4096);
    drop(dev);
    assert_intact(&mount_image(&stopped).unwrap());
}
