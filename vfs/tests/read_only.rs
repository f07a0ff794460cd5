//! A read-only mount: a tool that inspects a store sees it as the next writable mount would
//! recover it, and changes nothing, neither on the image nor in the conventional area;
//! every change is refused with EROFS; readers share an image and exclude a writer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use valet_vfs::device::{DeviceError, Geometry, ImageDevice, ImageOptions, ZonedDevice};
use valet_vfs::{Error, Ino, OpenOptions, Store, StoreConfig};

fn geometry() -> Geometry {
    Geometry {
        zone_count: 24,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 8,
        max_active: 8,
    }
}

fn config(dir: &Path, read_only: bool) -> StoreConfig {
    StoreConfig {
        conventional_dir: Some(dir.join("conventional")),
        read_only,
        ..Default::default()
    }
}

fn image(path: &Path, read_only: bool) -> Result<Arc<ImageDevice>, DeviceError> {
    let options = ImageOptions {
        read_only,
        ..Default::default()
    };
    ImageDevice::open(path, options).map(Arc::new)
}

fn record(i: usize) -> Vec<u8> {
    (0..430).map(|j| (i * 31 + j * 7) as u8).collect()
}

fn read_all(store: &Store, root: Ino, path: &str) -> Vec<u8> {
    let f = store.open_file(root, path, OpenOptions::read()).unwrap();
    let size = f.metadata().unwrap().size as usize;
    let mut buf = vec![0u8; size + 10];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), size);
    buf.truncate(size);
    buf
}

/// Every byte of every file under `dir` (the image and the conventional area), with its
/// modification time.
fn everything(dir: &Path) -> Vec<(PathBuf, Vec<u8>, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
            } else {
                out.push((
                    path.clone(),
                    std::fs::read(&path).unwrap(),
                    meta.modified().unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// A store left by a process that died: a log synced record by record (its tail only in
/// the journal), a large synced file, a conventional file, a file whose unlink was durable
/// while it was still open (an orphan) and a deleted file (a zone of dead data). Returns
/// the directory holding `store.img` and `conventional/`, and the files' contents.
fn crashed_store() -> (tempfile::TempDir, Vec<(&'static str, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let dev = Arc::new(ImageDevice::create(&path, geometry(), ImageOptions::default()).unwrap());
    let store = Store::open(dev, config(dir.path(), false)).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    let mut log = Vec::new();
    let f = store
        .open_file(root, "000001.log", OpenOptions::create())
        .unwrap();
    for i in 0..40 {
        f.write_at(&record(i), log.len() as u64).unwrap();
        log.extend(record(i));
        f.sync_data().unwrap();
    }
    let table: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
    let t = store
        .open_file(root, "000002.sst", OpenOptions::create())
        .unwrap();
    t.write_at(&table, 0).unwrap();
    t.sync_all().unwrap();
    t.close().unwrap();
    let current = b"MANIFEST-000003\n".to_vec();
    let c = store
        .open_file(root, "CURRENT", OpenOptions::create())
        .unwrap();
    c.write_at(&current, 0).unwrap();
    c.close().unwrap();
    let gone = store
        .open_file(root, "gone.sst", OpenOptions::create())
        .unwrap();
    gone.write_at(&vec![9u8; 300_000], 0).unwrap();
    gone.close().unwrap();
    store.unlink(root, "gone.sst").unwrap();
    let orphan = store
        .open_file(root, "orphan", OpenOptions::create())
        .unwrap();
    orphan.write_at(&vec![7u8; 50_000], 0).unwrap();
    orphan.sync_all().unwrap();
    store.unlink(root, "orphan").unwrap();
    store.sync_dir(root).unwrap();
    // The process dies: no close, no clean unmount (the image's lock goes with it; here
    // the leaked device keeps it, so the test works on a copy, as a crash leaves it).
    std::mem::forget((f, orphan));
    std::mem::forget(store);
    let after = tempfile::tempdir().unwrap();
    std::fs::copy(&path, after.path().join("store.img")).unwrap();
    let conventional = after.path().join("conventional");
    std::fs::create_dir(&conventional).unwrap();
    for e in std::fs::read_dir(dir.path().join("conventional")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), conventional.join(e.file_name())).unwrap();
    }
    let files = vec![
        ("000001.log", log),
        ("000002.sst", table),
        ("CURRENT", current),
    ];
    (after, files)
}

#[test]
fn a_read_only_mount_after_a_crash_reads_every_synced_byte_and_changes_nothing() {
    let (dir, files) = crashed_store();
    let path = dir.path().join("store.img");
    let before = everything(dir.path());
    {
        let store = Store::open(image(&path, true).unwrap(), config(dir.path(), true)).unwrap();
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "{}", report.findings());
        assert!(store.fsck_deep().unwrap().is_clean());
        let (_, root) = store
            .tenants()
            .into_iter()
            .find(|(_, name, _)| name == "app")
            .map(|(id, _, root)| (id, root))
            .unwrap();
        let mut names: Vec<String> = store
            .read_dir(root)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        assert_eq!(names, ["000001.log", "000002.sst", "CURRENT"]);
        for (name, data) in &files {
            assert_eq!(&read_all(&store, root, name), data, "{name}");
        }
        // Reads that start inside the log's journaled tail and cross its pieces.
        let f = store
            .open_file(root, "000001.log", OpenOptions::read())
            .unwrap();
        let mut buf = vec![0u8; 1000];
        assert_eq!(f.read_at(&mut buf, 10_000).unwrap(), 1000);
        assert_eq!(buf, files[0].1[10_000..11_000]);
        drop(f);

        // Every change is refused, whatever asks for it.
        let refused = |r: Result<(), Error>| {
            let e = r.expect_err("a read-only store changed");
            assert!(matches!(e, Error::ReadOnly), "{e}");
            assert_eq!(e.errno(), libc::EROFS);
        };
        refused(
            store
                .open_file(root, "new", OpenOptions::create())
                .map(drop),
        );
        let write = OpenOptions {
            write: true,
            ..Default::default()
        };
        refused(store.open_file(root, "000001.log", write).map(drop));
        refused(store.tenant("another").map(drop));
        refused(store.create_dir(root, "d").map(drop));
        refused(store.unlink(root, "CURRENT"));
        refused(store.rename(root, "CURRENT", root, "OLD"));
        refused(store.symlink(root, "CURRENT", "link").map(drop));
        let log = store.lookup(root, "000001.log").unwrap();
        refused(store.set_times(log, Some(1), Some(1)));
        // Nothing to make durable: a sync and an unmount succeed and write nothing.
        store.sync().unwrap();
        store.unmount().unwrap();
    }
    assert!(
        before == everything(dir.path()),
        "a read-only mount changed the store's files"
    );

    // The writable mount after it recovers the same files.
    let store = Store::open(image(&path, false).unwrap(), config(dir.path(), false)).unwrap();
    let (_, root) = store.tenant("app").unwrap();
    for (name, data) in &files {
        assert_eq!(&read_all(&store, root, name), data, "{name}");
    }
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn readers_share_an_image_and_exclude_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let writer = ImageDevice::create(&path, geometry(), ImageOptions::default()).unwrap();
    let in_use = |r: Result<Arc<ImageDevice>, DeviceError>| {
        let e = r.err().expect("opened an image in use");
        assert!(e.to_string().contains("in use by another process"), "{e}");
    };
    in_use(image(&path, true));
    drop(writer);

    let first = image(&path, true).unwrap();
    let second = image(&path, true).unwrap();
    in_use(image(&path, false));
    // A read-only device refuses every write, and its sync writes nothing.
    let refused = |r: Result<(), DeviceError>| {
        assert!(matches!(r, Err(DeviceError::ReadOnly(_))), "{r:?}");
    };
    refused(first.write(2, 0, &[1u8; 4096]));
    refused(first.append(2, &[1u8; 4096]).map(drop));
    refused(first.reset(2));
    refused(first.finish(2));
    first.sync().unwrap();
    drop((first, second));
    image(&path, false).unwrap();

    // A read-only open creates nothing.
    let missing = dir.path().join("missing.img");
    let options = ImageOptions {
        read_only: true,
        ..Default::default()
    };
    assert!(ImageDevice::open_or_create(&missing, geometry(), options).is_err());
    assert!(!missing.exists());
}

#[test]
fn a_blank_device_is_not_formatted_by_a_read_only_mount() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    drop(ImageDevice::create(&path, geometry(), ImageOptions::default()).unwrap());
    let before = std::fs::read(&path).unwrap();
    let e = Store::open(image(&path, true).unwrap(), config(dir.path(), true))
        .err()
        .expect("a blank device mounted read-only");
    assert!(e.to_string().contains("not a store"), "{e}");
    assert!(std::fs::read(&path).unwrap() == before);
    assert!(!dir.path().join("conventional").exists());
}
