//! The store's POSIX-shaped behaviour on the memory device: namespace, data, remount.

use std::sync::Arc;

use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{
    Class, Error, FileKind, Hint, OpenOptions, OpenReason, Placement, PlacementRequest, Store,
    StoreConfig,
};

fn geometry() -> Geometry {
    Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 960 * 1024,
        block_size: 4096,
        max_open: 6,
        max_active: 8,
    }
}

fn mount(dev: &Arc<MemoryDevice>) -> Store {
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 64 * 1024,
        ..Default::default()
    };
    Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap()
}

fn read_all(store: &Store, root: u64, path: &str) -> Vec<u8> {
    let f = store.open_file(root, path, OpenOptions::read()).unwrap();
    let size = f.metadata().unwrap().size as usize;
    let mut buf = vec![0u8; size + 10];
    let n = f.read_at(&mut buf, 0).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn write_read_remount() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    store.create_dir(root, "db").unwrap();
    let f = store
        .open_file(root, "db/000001.log", OpenOptions::create())
        .unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    for chunk in data.chunks(1000) {
        let at = f.metadata().unwrap().size;
        f.write_at(chunk, at).unwrap();
    }
    // Overwrite in the middle, unaligned.
    f.write_at(b"hello world", 70_001).unwrap();
    f.sync_all().unwrap();
    f.close().unwrap();
    let mut expect = data.clone();
    expect[70_001..70_012].copy_from_slice(b"hello world");
    assert_eq!(read_all(&store, root, "db/000001.log"), expect);
    assert!(store.fsck().unwrap().is_clean(), "{:?}", store.fsck());
    drop(store);

    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(read_all(&store, root, "db/000001.log"), expect);
    assert!(store.fsck().unwrap().is_clean());
}

/// A read of no bytes inside a file reads nothing and returns 0, at a block boundary too
/// (found by `runtime/tests/hostile_calls.rs`: it panicked with the store locked).
#[test]
fn an_empty_read_inside_a_file_returns_zero() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "f", OpenOptions::create()).unwrap();
    f.write_at(&[7u8; 3 * 4096], 0).unwrap();
    f.close().unwrap();
    let f = store.open_file(root, "f", OpenOptions::read()).unwrap();
    for offset in [0, 4096, 5000, 3 * 4096 - 1] {
        assert_eq!(f.read_at(&mut [], offset).unwrap(), 0, "at {offset}");
    }
    let mut one = [0u8];
    assert_eq!(f.read_at(&mut one, 4096).unwrap(), 1);
    assert_eq!(one, [7]);
}

#[test]
fn unsynced_data_is_lost_but_synced_data_survives_power_failure() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, "a", OpenOptions::create()).unwrap();
    f.write_at(&[1u8; 10_000], 0).unwrap();
    f.sync_data().unwrap();
    f.write_at(&[2u8; 10_000], 10_000).unwrap();
    std::mem::forget(f);
    std::mem::forget(store);
    dev.power_fail();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let got = read_all(&store, root, "a");
    assert_eq!(got, vec![1u8; 10_000]);
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn namespace_rules() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    store.create_dir(root, "d").unwrap();
    assert!(matches!(store.create_dir(root, "d"), Err(Error::Exists)));
    store
        .open_file(root, "d/f", OpenOptions::create())
        .unwrap()
        .close()
        .unwrap();
    assert!(matches!(store.remove_dir(root, "d"), Err(Error::NotEmpty)));
    assert!(matches!(store.lookup(root, "../x"), Err(Error::Escape)));
    assert!(matches!(store.lookup(root, "/d"), Err(Error::Escape)));
    assert!(matches!(store.lookup(root, "d/f/"), Err(Error::NotDir)));
    // A new name with a trailing slash asks for a directory: ENOENT, and nothing made
    // (as Linux's linkat); one that exists is EEXIST first.
    assert!(matches!(
        store.link(root, "d/f", root, "new/"),
        Err(Error::NotFound)
    ));
    assert!(matches!(store.lookup(root, "new"), Err(Error::NotFound)));
    assert!(matches!(
        store.link(root, "d/f", root, "d/"),
        Err(Error::Exists)
    ));
    store.link(root, "d/f", root, "g").unwrap();
    assert_eq!(
        store
            .metadata(store.lookup(root, "g").unwrap())
            .unwrap()
            .nlink,
        2
    );
    store.rename(root, "g", root, "d/f").unwrap(); // same inode: no-op
    store.unlink(root, "d/f").unwrap();
    assert_eq!(store.read_dir(root).unwrap().len(), 2);
    assert!(matches!(
        store.rename(root, "d", root, "d/sub"),
        Err(Error::Invalid(_))
    ));
    store.rename(root, "g", root, "d/h").unwrap();
    let names: Vec<_> = store.read_dir(store.lookup(root, "d").unwrap()).unwrap();
    assert_eq!(names.len(), 1);
    assert_eq!(names[0].name, "h");
    assert_eq!(names[0].kind, FileKind::File);
    assert!(store.fsck().unwrap().is_clean());
}

/// `..` never climbs above the directory a path is relative to (WASI's rule for a
/// directory descriptor), and a final `.` or `..` gets the errno POSIX gives.
#[test]
fn dot_dot_stays_below_the_starting_directory() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    store.create_dir(root, "a").unwrap();
    store.create_dir(root, "a/b").unwrap();
    let a = store.lookup(root, "a").unwrap();
    assert_eq!(store.lookup(root, "a/b/../..").unwrap(), root);
    assert_eq!(store.lookup(a, "b/..").unwrap(), a);
    assert!(matches!(store.lookup(a, ".."), Err(Error::Escape)));
    assert!(matches!(store.lookup(a, "b/../../a"), Err(Error::Escape)));
    assert!(matches!(
        store.open_file(a, "../x", OpenOptions::create()),
        Err(Error::Escape)
    ));
    assert!(matches!(store.remove_dir(a, ".."), Err(Error::Escape)));
    assert!(matches!(store.create_dir(root, "."), Err(Error::Exists)));
    assert!(matches!(store.create_dir(root, "a/.."), Err(Error::Exists)));
    assert!(matches!(
        store.create_dir(root, "x/.."),
        Err(Error::NotFound)
    ));
    assert!(matches!(store.unlink(root, "a/."), Err(Error::IsDir)));
    assert!(matches!(
        store.remove_dir(root, "a/."),
        Err(Error::Invalid(_))
    ));
    assert!(store.fsck().unwrap().is_clean());
}

struct Fixed(Hint);
impl Placement for Fixed {
    fn place(&self, _: &PlacementRequest<'_>) -> Hint {
        self.0
    }
}

/// A stream of short-lived files (a rollback journal created, synced and deleted per
/// transaction) keeps appending to its head zone instead of resetting and rewriting it for
/// every file; the zone is reset once it is full and still dead.
#[test]
fn short_lived_files_do_not_reset_their_head_zone_each_time() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (t, root) = store.tenant("app").unwrap();
    store.set_placement(t, Arc::new(Fixed(Hint::zoned(1))));
    let record = vec![5u8; 8192];
    let per_zone = geometry().zone_capacity / record.len() as u64;
    let transaction = || {
        let f = store
            .open_file(root, "db-journal", OpenOptions::create())
            .unwrap();
        f.write_at(&record, 0).unwrap();
        f.sync_all().unwrap();
        f.close().unwrap();
        store.unlink(root, "db-journal").unwrap();
    };
    for n in 0..per_zone / 2 {
        transaction();
        store.sync().unwrap();
        assert_eq!(store.stats().zone_resets, 0, "after file {n}");
    }
    // Filling the zone with more of them retires it, and then it is reset: by this sync,
    // or by the reclaimer if a transaction's sync woke it first.
    for _ in 0..per_zone {
        transaction();
    }
    store.sync().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.stats().zone_resets == 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", store.stats());
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn deleted_data_frees_zones_without_moving_anything() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (t, root) = store.tenant("app").unwrap();
    store.set_placement(t, Arc::new(Fixed(Hint::zoned(1))));
    let chunk = vec![9u8; 64 * 1024];
    // Write and delete 5x the device: only works if dead zones are reset.
    for round in 0..80 {
        let name = format!("f{round}");
        let f = store.open_file(root, &name, OpenOptions::create()).unwrap();
        for i in 0..16 {
            f.write_at(&chunk, i * chunk.len() as u64).unwrap();
        }
        f.close().unwrap();
        if round >= 2 {
            store.unlink(root, &format!("f{}", round - 2)).unwrap();
        }
    }
    let stats = store.stats();
    assert_eq!(stats.gc_bytes_moved, 0);
    assert!(stats.zone_resets > 0);
    assert!((stats.waf - 1.0).abs() < 1e-9, "{stats:?}");
    assert!(store.fsck().unwrap().is_clean());
    let _ = OpenReason::Create;
    let _ = Class::Zoned;
}

/// SQLite's WAL at a commit rewrites the 24-byte header of each frame (4,120 bytes apart)
/// in file order. A rewrite that starts just past the file's window joins it (the bytes in
/// between are read back into it) instead of opening a window and a flush of its own; a
/// sparse write a little past the end of file joins it with zeros.
#[test]
fn short_forward_gaps_join_the_window() {
    const FRAME: usize = 4120;
    const FRAMES: usize = 12;
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let f = store
        .open_file(root, "bench.db-wal", OpenOptions::create())
        .unwrap();
    let mut model: Vec<u8> = (0..FRAMES * FRAME).map(|i| (i % 253) as u8).collect();
    f.write_at(&model, 0).unwrap();
    f.sync_data().unwrap();

    let before = store.stats().background_flushes;
    for frame in 0..FRAMES {
        let at = frame * FRAME + 7;
        let header = [0xA0 + frame as u8; 24];
        model[at..at + 24].copy_from_slice(&header);
        f.write_at(&header, at as u64).unwrap();
    }
    // Past the end of file by less than a block: the hole reads as zeros.
    let end = model.len();
    model.resize(end + 1000, 0);
    model.extend_from_slice(b"tail");
    f.write_at(b"tail", end as u64 + 1000).unwrap();
    let flushes = store.stats().background_flushes - before;
    // 12 rewrites over 49,440 bytes: one 64 KiB window, where each used to be a window.
    assert_eq!(flushes, 0, "the rewrites went to {flushes} windows");
    assert_eq!(read_all(&store, root, "bench.db-wal"), model);
    f.sync_data().unwrap();
    f.close().unwrap();
    assert_eq!(read_all(&store, root, "bench.db-wal"), model);
    assert!(store.fsck_deep().unwrap().is_clean());
    drop(store);

    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(read_all(&store, root, "bench.db-wal"), model);
}
