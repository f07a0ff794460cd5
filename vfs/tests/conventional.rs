//! The conventional area (files a policy keeps in place, one host file each) after power
//! cuts and damage: a recovered size never reaches past what the host file holds durably,
//! and a host file lost or cut on the host fails its file's reads and is named by fsck,
//! never read back as zeros. (And a zoned file's checkpointed size never reaches past
//! its data either.)

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use valet_vfs::device::{DeviceError, Geometry, MemoryDevice, ZoneId, ZoneInfo, ZonedDevice};
use valet_vfs::{Error, FileHandle, Ino, OpenOptions, Store, StoreConfig};

fn mount(dev: &Arc<MemoryDevice>, host: &Path) -> Store {
    mount_on(dev.clone(), host)
}

fn mount_on(dev: Arc<dyn ZonedDevice>, host: &Path) -> Store {
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 64 * 1024,
        conventional_dir: Some(host.to_path_buf()),
        ..Default::default()
    };
    Store::open(dev, config).unwrap()
}

fn device() -> Arc<MemoryDevice> {
    let geometry = Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 4,
        max_active: 5,
    };
    Arc::new(MemoryDevice::new(geometry).unwrap())
}

/// The host file of conventional file `name` in tenant `app`.
fn host_file(store: &Store, host: &Path, name: &str) -> std::path::PathBuf {
    let (_, root) = store.tenant("app").unwrap();
    let ino: Ino = store.lookup(root, name).unwrap();
    host.join(ino.to_string())
}

/// Opens (creating it) file `name` of tenant `app`.
fn create(store: &Store, name: &str) -> FileHandle {
    let (_, root) = store.tenant("app").unwrap();
    store.open_file(root, name, OpenOptions::create()).unwrap()
}

fn read_all(store: &Store, name: &str) -> valet_vfs::Result<Vec<u8>> {
    let (_, root) = store.tenant("app").unwrap();
    let f = store.open_file(root, name, OpenOptions::read())?;
    let mut buf = vec![0u8; f.metadata()?.size as usize];
    let n = f.read_at(&mut buf, 0)?;
    buf.truncate(n);
    Ok(buf)
}

/// Cuts a host file to `len` bytes, as a power cut may leave one whose growth was never
/// synced.
fn cut(path: &Path, len: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(len).unwrap();
}

/// The power fails with the store mounted: the store and its open handles (`abandoned`)
/// are dropped without closing, the device loses what no sync covered, and `host_cut`
/// leaves the host files as the host's power cut did. Returns the store mounted again,
/// found clean by fsck.
fn power_cut(
    dev: &Arc<MemoryDevice>,
    host: &Path,
    abandoned: impl Sized,
    host_cut: impl FnOnce(),
) -> Store {
    std::mem::forget(abandoned);
    dev.power_fail();
    host_cut();
    let store = mount(dev, host);
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{}", report.findings());
    store
}

#[test]
fn a_checkpoint_records_a_conventional_file_at_its_synced_size() {
    let host = tempfile::tempdir().unwrap();
    let dev = device();
    let store = mount(&dev, host.path());
    let current = create(&store, "CURRENT");
    current.write_at(b"MANIFEST-000001\n", 0).unwrap();
    current.sync_all().unwrap();
    current.write_at(b"MANIFEST-000002\n", 16).unwrap();
    // Synced log records fill the journal's zones over and over: the checkpoints written
    // meanwhile see CURRENT 32 bytes long, 16 of them not synced.
    let log = create(&store, "000003.log");
    for i in 0..600u64 {
        log.write_at(&[7u8; 300], i * 300).unwrap();
        log.sync_data().unwrap();
    }
    let current_host = host_file(&store, host.path(), "CURRENT");
    let store = power_cut(&dev, host.path(), (store, current, log), || {
        cut(&current_host, 16)
    });
    assert_eq!(read_all(&store, "CURRENT").unwrap(), b"MANIFEST-000001\n");
}

/// The same for a file in the zones: a checkpoint taken while its window holds bytes
/// that never reached the device records the size its data reached. It used to record the
/// size in memory, and after a power cut the unwritten tail read as zeros.
#[test]
fn a_checkpoint_records_a_zoned_file_at_the_size_its_data_reached() {
    let host = tempfile::tempdir().unwrap();
    let dev = device();
    let store = mount(&dev, host.path());
    let table = create(&store, "000005.sst");
    let bytes: Vec<u8> = (0..6000u32).map(|i| (i % 251) as u8 + 1).collect();
    table.write_at(&bytes[..100], 0).unwrap();
    table.sync_data().unwrap();
    table.write_at(&bytes[100..], 100).unwrap();
    // Another file's synced records fill the journal's zones: checkpoints meanwhile.
    let log = create(&store, "000003.log");
    for i in 0..600u64 {
        log.write_at(&[7u8; 300], i * 300).unwrap();
        log.sync_data().unwrap();
    }
    let store = power_cut(&dev, host.path(), (store, table, log), || {});
    let got = read_all(&store, "000005.sst").unwrap();
    assert!(got.len() >= 100, "{} bytes of 100 synced", got.len());
    assert!(
        got == bytes[..got.len()],
        "{} bytes recovered, not all of them written (the first wrong at {})",
        got.len(),
        got.iter()
            .zip(&bytes)
            .position(|(a, b)| a != b)
            .unwrap_or(0)
    );
}

#[test]
fn setting_times_keeps_the_bytes_not_synced_and_records_the_synced_size() {
    let host = tempfile::tempdir().unwrap();
    let dev = device();
    let store = mount(&dev, host.path());
    let log = create(&store, "LOG");
    log.write_at(b"first line\n", 0).unwrap();
    log.sync_all().unwrap();
    log.write_at(b"second line\n", 11).unwrap();
    log.set_times(Some(1), Some(2)).unwrap();
    store.sync_metadata().unwrap();
    // (Read through the same handle: a close makes the file durable.)
    let mut buf = [0u8; 23];
    assert_eq!(log.read_at(&mut buf, 0).unwrap(), 23);
    assert_eq!(&buf, b"first line\nsecond line\n");
    let log_host = host_file(&store, host.path(), "LOG");
    let store = power_cut(&dev, host.path(), (store, log), || cut(&log_host, 11));
    assert_eq!(read_all(&store, "LOG").unwrap(), b"first line\n");
    let (_, root) = store.tenant("app").unwrap();
    let ino = store.lookup(root, "LOG").unwrap();
    assert_eq!(store.metadata(ino).unwrap().mtime_ns, 2);
}

/// Writes 100 bytes to a new conventional file, truncates it to 10 and loses the power;
/// `host_cut` leaves its host file as the host's power cut did. Returns what the file
/// holds after recovery.
fn truncate_and_cut_power(host_cut: impl FnOnce(&Path)) -> Vec<u8> {
    let host = tempfile::tempdir().unwrap();
    let dev = device();
    let store = mount(&dev, host.path());
    let identity = create(&store, "IDENTITY");
    identity.write_at(&[5u8; 100], 0).unwrap();
    identity.set_len(10).unwrap();
    let identity_host = host_file(&store, host.path(), "IDENTITY");
    let store = power_cut(&dev, host.path(), (store, identity), || {
        host_cut(&identity_host)
    });
    read_all(&store, "IDENTITY").unwrap()
}

#[test]
fn a_truncation_leaves_the_file_as_it_was_after_it() {
    // The new size is committed at once (no sync asked for) and the host file synced
    // before it, so the file is as the truncation left it whether the host's own
    // truncation survived the power cut or not.
    assert_eq!(truncate_and_cut_power(|_| {}), [5u8; 10]);
    let host_truncation_lost = |path: &Path| std::fs::write(path, [5u8; 100]).unwrap();
    assert_eq!(truncate_and_cut_power(host_truncation_lost), [5u8; 10]);
}

#[test]
fn a_lost_or_cut_host_file_fails_its_reads_and_fsck_names_it() {
    let host = tempfile::tempdir().unwrap();
    let dev = device();
    let store = mount(&dev, host.path());
    let files: [(&str, &[u8]); 3] = [
        ("CURRENT", b"MANIFEST-000004\n"),
        ("IDENTITY", b"2a0c9e4e-6b1f-4d8e-9a51-1f4f0d7e3c21"),
        ("000004.log", &[9u8; 5000]),
    ];
    for (name, bytes) in files {
        let f = create(&store, name);
        f.write_at(bytes, 0).unwrap();
        f.close().unwrap();
    }
    let (current, identity) = (
        host_file(&store, host.path(), "CURRENT"),
        host_file(&store, host.path(), "IDENTITY"),
    );
    store.unmount().unwrap();
    std::fs::remove_file(&current).unwrap();
    cut(&identity, 5);

    let store = mount(&dev, host.path());
    let report = store.fsck().unwrap();
    assert!(report.is_consistent(), "{}", report.findings());
    assert_eq!(report.damaged.len(), 2, "{}", report.findings());
    assert!(report.findings().contains("host file is missing"));
    assert!(report
        .findings()
        .contains("host file holds 5 of its 36 bytes"));
    for name in ["CURRENT", "IDENTITY"] {
        match read_all(&store, name) {
            Err(Error::Corrupt(why)) => assert!(why.contains("host file"), "{why}"),
            other => panic!("{name} read as {other:?}"),
        }
    }
    // A write does not make a lost host file again (its bytes before the write would
    // read as zeros).
    let (_, root) = store.tenant("app").unwrap();
    let f = create(&store, "CURRENT");
    assert!(matches!(f.write_at(b"M", 0), Err(Error::Corrupt(_))));
    drop(f);
    assert!(!current.exists());
    assert_eq!(read_all(&store, "000004.log").unwrap(), [9u8; 5000]);
    // Removing the damaged files leaves a clean store.
    store.unlink(root, "CURRENT").unwrap();
    store.unlink(root, "IDENTITY").unwrap();
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{}", report.findings());
}

/// A sync that finds another sync of the same file in flight (a background writeback's,
/// another thread's) returns only once its own bytes are durable and journaled: it used
/// to return at once, trusting the other one, which might not be done yet, and a crash
/// then lost the acknowledged bytes. Each round looks at what a power cut right after the
/// sync returned would leave, with the other syncs still running.
#[test]
fn a_sync_does_not_trust_one_in_flight() {
    let host = tempfile::tempdir().unwrap();
    let dev = device();
    let store = mount(&dev, host.path());
    let current = create(&store, "CURRENT");
    while_running(
        || store.sync().unwrap(),
        |_| {
            let mut acked = 0u64;
            for round in 0..100u64 {
                let line = format!("MANIFEST-{round:06}\n");
                current.write_at(line.as_bytes(), acked).unwrap();
                current.sync_data().unwrap();
                acked += line.len() as u64;
                let (recovered, _host) = durable_copy(&dev, host.path());
                let got = read_all(&recovered, "CURRENT").unwrap();
                assert!(
                    got.len() as u64 >= acked,
                    "round {round}: {} of {acked} acknowledged bytes recovered",
                    got.len()
                );
            }
        },
    );
}

/// What a power cut now would leave of `dev` and the host directory `host`, mounted: the
/// host files copied as they are (their bytes were synced before the store acknowledged
/// them), then the device as its durable copy. A commit under way meanwhile removes a
/// host file only once what frees it is durable, so the device's copy, taken after,
/// never names a host file the copy missed.
fn durable_copy(dev: &MemoryDevice, host: &Path) -> (Store, tempfile::TempDir) {
    let copy_host = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(host).unwrap() {
        let entry = entry.unwrap();
        match std::fs::copy(entry.path(), copy_host.path().join(entry.file_name())) {
            // Removed meanwhile, once its free was durable.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            copied => _ = copied.unwrap(),
        }
    }
    let store = mount(&Arc::new(dev.durable_copy()), copy_host.path());
    (store, copy_host)
}

/// Runs `f` while another thread runs `background` over and over; returns what `f`
/// returned once that thread has stopped. `f` is given the count of `background`'s rounds
/// done so far (at least one).
fn while_running<T>(background: impl Fn() + Sync, f: impl FnOnce(&AtomicU64) -> T) -> T {
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                background();
                rounds.fetch_add(1, Ordering::SeqCst);
            }
        });
        // Stops the other thread however this one ends (the scope waits for it).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _stop = Stop(&stop);
        while rounds.load(Ordering::SeqCst) == 0 {
            std::hint::spin_loop();
        }
        f(&rounds)
    })
}

/// A rename over a conventional file frees the file it replaces; its host file goes only
/// with the commit that makes the rename durable. A commit that was already under way
/// when the rename came used to remove it as well, and a power cut then left the old name
/// with its host file gone (its reads failing).
#[test]
fn a_commit_removes_only_the_host_files_its_record_frees() {
    let host = tempfile::tempdir().unwrap();
    let dev = device();
    // A flush as long as a disk's, so that the rename comes while a commit is under way.
    let store = mount_on(Arc::new(SlowFlush(dev.clone())), host.path());
    let (_, root) = store.tenant("app").unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let f = create(&store, name);
        f.write_at(bytes, 0).unwrap();
        f.sync_all().unwrap();
        f.close().unwrap();
    };
    write("CURRENT", b"MANIFEST-000000\n");
    store.sync().unwrap();
    let log = create(&store, "000001.log");
    let append_and_sync = || {
        log.write_at(&[7; 100], 0).unwrap();
        log.sync_data().unwrap();
    };
    for round in 1..=150 {
        let old = format!("MANIFEST-{:06}\n", round - 1);
        let new = format!("MANIFEST-{round:06}\n");
        // Conventional files both (by their names), the one replaced by a rename as
        // LevelDB and RocksDB replace their CURRENT.
        write("LOG", new.as_bytes());
        // Another thread commits over and over (a log appended and synced, as other
        // tenants do).
        let (recovered, _host) = while_running(append_and_sync, |commits| {
            let before = commits.load(Ordering::SeqCst);
            store.rename(root, "LOG", root, "CURRENT").unwrap();
            // The commit under way as the rename came is done (the next, which may carry
            // the rename, is under way now).
            while commits.load(Ordering::SeqCst) <= before {
                std::hint::spin_loop();
            }
            durable_copy(&dev, host.path())
        });
        match read_all(&recovered, "CURRENT") {
            Ok(got) => assert!(
                got == old.as_bytes() || got == new.as_bytes(),
                "round {round}: CURRENT holds {got:?}"
            ),
            Err(e) => panic!("round {round}: CURRENT after a power cut: {e}"),
        }
        store.sync().unwrap();
    }
}

/// A memory device whose flushes take a millisecond.
struct SlowFlush(Arc<MemoryDevice>);

impl ZonedDevice for SlowFlush {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.0.report_zones()
    }
    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        self.0.zone_info(zone)
    }
    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.0.write(zone, offset, data)
    }
    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.0.append(zone, data)
    }
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.0.read(zone, offset, buf)
    }
    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.0.reset(zone)
    }
    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.0.finish(zone)
    }
    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.0.open(zone)
    }
    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.0.close(zone)
    }
    fn sync(&self) -> Result<(), DeviceError> {
        std::thread::sleep(std::time::Duration::from_millis(1));
        self.0.sync()
    }
}
