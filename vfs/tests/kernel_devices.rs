//! The device backends on the kernel's real interfaces. Every test here is ignored: each needs
//! a device only the VM tests (`tests/tests/vm_*.rs`) provide, named by an environment
//! variable, and they run it inside QEMU:
//!
//! - `VALET_ZONEFS_MOUNT`: a zonefs mount (`mount -t zonefs -o errors=repair`) of an NVMe ZNS
//!   namespace with at least 8 zones and 4 active zones; the tests reset its zones.
//! - `VALET_FDP_DEVICE`: an NVMe namespace with FDP (`/dev/ngXnY`) of at least 128 MiB, with
//!   `nvme` (nvme-cli) on `PATH` to read the drive's FDP logs; the tests format it.
//! - `VALET_POWER_PHASE=write|verify` with `VALET_FDP_DEVICE`: the two halves of the power
//!   cut test (`tests/tests/vm_fdp.rs` kills QEMU during `write`, then boots `verify`).

use std::fs::OpenOptions as FsOpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use valet_vfs::device::sysfs::BlockDev;
use valet_vfs::device::{
    DeviceError, FdpDevice, FdpOptions, ZoneInfo, ZonePlacement, ZoneState, ZonedDevice,
    ZonefsDevice, ZonefsOptions,
};
use valet_vfs::{OpenOptions, Store, StoreConfig};

fn zonefs_mount() -> PathBuf {
    std::env::var_os("VALET_ZONEFS_MOUNT")
        .map(PathBuf::from)
        .expect("VALET_ZONEFS_MOUNT must name a zonefs mount (the VM tests set it)")
}

/// The zonefs device with every zone reset.
fn fresh_zonefs() -> ZonefsDevice {
    let dev = ZonefsDevice::open(zonefs_mount(), ZonefsOptions::default()).unwrap();
    assert!(dev.is_kernel_zonefs(), "not a real zonefs mount");
    for zone in 0..dev.geometry().zone_count {
        dev.reset(zone).unwrap();
    }
    dev.sync().unwrap();
    dev
}

/// The kernel's report and ours agree on every zone's write pointer, and on which zones
/// are empty, full or hold a partial write pointer.
fn assert_kernel_agrees(dev: &ZonefsDevice) {
    let kernel = dev.kernel_report().unwrap().expect("a real mount");
    let ours = dev.report_zones();
    assert_eq!(kernel.len(), ours.len());
    let class = |z: &ZoneInfo| match z.state {
        ZoneState::Empty => "empty",
        ZoneState::Full => "full",
        s if s.is_active() => "active",
        _ => "fault",
    };
    for (k, o) in kernel.iter().zip(&ours) {
        assert_eq!(
            (k.write_pointer, class(k)),
            (o.write_pointer, class(o)),
            "zone {}: kernel {k:?}, store {o:?}",
            o.id
        );
    }
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[1])
        .collect()
}

/// Every file of `files` (name, length; file `i` holds `pattern(i, length)`) reads back
/// whole from the store's first tenant, and fsck is clean.
fn assert_files_read_back(store: &Store, files: &[(&str, usize)]) {
    let (_, _, root) = store.tenants().into_iter().next().unwrap();
    for (i, (name, len)) in files.iter().enumerate() {
        let f = store.open_file(root, name, OpenOptions::read()).unwrap();
        let mut buf = vec![0; len + 1];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), *len, "{name}");
        assert!(buf[..*len] == pattern(i as u32, *len)[..], "{name} differs");
    }
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
#[ignore = "needs VALET_ZONEFS_MOUNT; run by tests/tests/vm_zns.rs"]
fn zonefs_geometry_comes_from_the_kernel() {
    let dev = fresh_zonefs();
    let g = dev.geometry();
    let blk = BlockDev::mounted_at(&zonefs_mount()).unwrap();
    assert_eq!(g.zone_size, blk.zone_size().unwrap());
    assert_eq!(g.block_size, blk.logical_block_size().unwrap());
    let (open, active) = (
        blk.max_open_zones().unwrap(),
        blk.max_active_zones().unwrap(),
    );
    assert!(open == 0 || g.max_open <= open);
    assert!(active == 0 || g.max_active <= active);
    // Capacity below zone size, as QEMU was told (and ZN540-class drives have).
    assert!(g.zone_capacity < g.zone_size, "{g:?}");
    let kernel = dev.kernel_report().unwrap().unwrap();
    assert_eq!(kernel.len() as u32, g.zone_count);
    assert!(kernel.iter().all(|z| z.capacity == g.zone_capacity));
    println!("zonefs geometry: {g:?} (sysfs max_open {open}, max_active {active})");
}

#[test]
#[ignore = "needs VALET_ZONEFS_MOUNT; run by tests/tests/vm_zns.rs"]
fn zonefs_writes_finishes_and_resets_reach_the_drive() {
    let dev = fresh_zonefs();
    let g = dev.geometry();
    let bs = g.block_size as usize;
    // Data from an unaligned place in memory: the backend copies it to an aligned buffer.
    let backing = pattern(1, 3 * bs + 1);
    let data = &backing[1..];
    dev.write(0, 0, data).unwrap();
    assert_eq!(dev.append(0, &pattern(2, bs)).unwrap(), 3 * bs as u64);
    let mut back = vec![0; 3 * bs];
    dev.read(0, 0, &mut back).unwrap();
    assert_eq!(back, data);
    // Unaligned reads are the store's everyday reads.
    let mut piece = vec![0; 100];
    dev.read(0, 4097, &mut piece).unwrap();
    assert_eq!(piece, data[4097..4197]);
    // A write of the whole capacity in large pieces fills the zone.
    let chunk = pattern(3, 256 * 1024);
    let mut wp = 0;
    while wp < g.zone_capacity {
        let n = chunk.len().min((g.zone_capacity - wp) as usize);
        dev.write(1, wp, &chunk[..n]).unwrap();
        wp += n as u64;
    }
    assert_eq!(dev.zone_info(1).unwrap().state, ZoneState::Full);
    dev.write(2, 0, &pattern(4, bs)).unwrap();
    dev.finish(2).unwrap();
    dev.write(3, 0, &pattern(5, bs)).unwrap();
    dev.sync().unwrap();
    assert_kernel_agrees(&dev);
    dev.reset(0).unwrap();
    dev.reset(1).unwrap();
    assert_kernel_agrees(&dev);
    // Writing away from the write pointer is refused before it reaches the drive.
    assert!(matches!(
        dev.write(3, 0, &pattern(6, bs)),
        Err(DeviceError::NotAtWritePointer { .. })
    ));
    // Reopening (a remount of the backend) reads the same pointers back.
    drop(dev);
    let dev = ZonefsDevice::open(zonefs_mount(), ZonefsOptions::default()).unwrap();
    assert_eq!(dev.zone_info(3).unwrap().write_pointer, bs as u64);
    assert_eq!(dev.zone_info(2).unwrap().state, ZoneState::Full);
    assert_kernel_agrees(&dev);
}

/// The drive's active-zone limit, hit for real: zones written behind the backend's back
/// use up the drive's active resources, so a write the backend's own table allows fails in
/// the kernel (EOVERFLOW) and comes back as `TooManyActive`; the mount stays writable
/// (`errors=repair`) and the write succeeds once a zone is released.
#[test]
#[ignore = "needs VALET_ZONEFS_MOUNT; run by tests/tests/vm_zns.rs"]
fn zonefs_reports_the_drives_own_limit_errors() {
    let dev = fresh_zonefs();
    let g = dev.geometry();
    let bs = g.block_size as usize;
    let active = BlockDev::mounted_at(&zonefs_mount())
        .unwrap()
        .max_active_zones()
        .unwrap();
    assert!(
        active > 0 && active < g.zone_count - 1,
        "need a drive with an active limit"
    );
    let block = pattern(7, bs);
    // Fill the drive's active resources from the last zones, through zonefs directly.
    let mut outside = Vec::new();
    for i in 0..active {
        let zone = g.zone_count - 1 - i;
        let path = zonefs_mount().join("seq").join(zone.to_string());
        let f = FsOpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let aligned = AlignedBlock::new(&block);
        f.write_all_at(aligned.as_slice(), 0).unwrap();
        outside.push(f);
    }
    let err = dev.write(0, 0, &block).unwrap_err();
    assert!(
        matches!(err, DeviceError::TooManyActive(_)),
        "expected the kernel's active-zone error, got {err}"
    );
    assert_eq!(dev.zone_info(0).unwrap().write_pointer, 0);
    // Release one zone (a reset, as zonefs does for truncate to 0) and try again.
    outside[0].set_len(0).unwrap();
    dev.write(0, 0, &block).unwrap();
    let mut back = vec![0; bs];
    dev.read(0, 0, &mut back).unwrap();
    assert_eq!(back, block);
    for f in &outside {
        f.set_len(0).unwrap();
    }
}

/// The store on zonefs: files in two streams, synced, remounted; every byte back, streams in
/// different zones, and the drive's write pointers where the store's zone map says. Then a
/// read-only mount: it reads every byte, changes no write pointer on the drive, shares the
/// mount with another reader and keeps a writer out.
#[test]
#[ignore = "needs VALET_ZONEFS_MOUNT; run by tests/tests/vm_zns.rs"]
fn store_on_zonefs_remounts_with_every_byte() {
    let dev = fresh_zonefs();
    drop(dev);
    let conventional = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 128 * 1024,
        conventional_dir: Some(conventional.path().to_path_buf()),
        ..Default::default()
    };
    let open = |read_only: bool| {
        let options = ZonefsOptions {
            read_only,
            ..ZonefsOptions::default()
        };
        let dev = Arc::new(ZonefsDevice::open(zonefs_mount(), options).unwrap());
        let config = StoreConfig {
            read_only,
            ..config.clone()
        };
        let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap();
        (dev, store)
    };
    let (dev, store) = open(false);
    let (_, root) = store.tenant("db").unwrap();
    let files = [("000001.log", 700_001usize), ("000002.ldb", 1_300_000)];
    for (i, (name, len)) in files.iter().enumerate() {
        let f = store.open_file(root, name, OpenOptions::create()).unwrap();
        let data = pattern(i as u32, *len);
        for (n, chunk) in data.chunks(4000).enumerate() {
            f.write_at(chunk, (n * 4000) as u64).unwrap();
        }
        f.sync_all().unwrap();
        f.close().unwrap();
    }
    check_zone_map(&store, &dev);
    drop((store, dev));
    let (dev, store) = open(false);
    assert_files_read_back(&store, &files);
    check_zone_map(&store, &dev);
    let in_use = ZonefsDevice::open(zonefs_mount(), ZonefsOptions::default());
    assert!(in_use.is_err(), "a second writer opened the mount");
    let written = dev.kernel_report().unwrap().unwrap();
    drop((store, dev));

    let (reader, store) = open(true);
    assert_files_read_back(&store, &files);
    let (_other, _) = open(true);
    let in_use = ZonefsDevice::open(zonefs_mount(), ZonefsOptions::default());
    assert!(in_use.is_err(), "a writer opened the mount beside a reader");
    assert!(
        store.tenant("another").is_err(),
        "the read-only store changed"
    );
    assert_eq!(reader.kernel_report().unwrap().unwrap(), written);
}

/// Streams own different zones, and every zone a stream owns has the write pointer on the
/// drive that the store's device table has.
fn check_zone_map(store: &Store, dev: &ZonefsDevice) {
    let owners = store.zone_owners();
    let streams: std::collections::BTreeSet<u32> = owners.iter().map(|o| o.2).collect();
    assert!(
        streams.len() >= 2,
        "logs and tables share zones: {owners:?}"
    );
    let ours = store.device().report_zones();
    let kernel = dev.kernel_report().unwrap().unwrap();
    for (zone, _, stream) in &owners {
        let z = *zone as usize;
        assert_eq!(
            kernel[z].write_pointer, ours[z].write_pointer,
            "zone {zone} (stream {stream})"
        );
        assert!(ours[z].write_pointer > 0, "zone {zone} owned but empty");
        println!(
            "zone {zone}: stream {stream}, write pointer {} on the drive",
            kernel[z].write_pointer
        );
    }
}

/// One block in memory aligned for `O_DIRECT`.
struct AlignedBlock {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBlock {
    fn new(data: &[u8]) -> Self {
        let mut buf = vec![0u8; data.len() + 4096];
        let start = buf.as_ptr().align_offset(4096);
        buf[start..start + data.len()].copy_from_slice(data);
        AlignedBlock {
            buf,
            start,
            len: data.len(),
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

// ---------------------------------------------------------------------------------------
// FDP

fn fdp_device() -> PathBuf {
    std::env::var_os("VALET_FDP_DEVICE")
        .map(PathBuf::from)
        .expect("VALET_FDP_DEVICE must name an NVMe FDP namespace (the VM tests set it)")
}

/// The block device of the namespace, for nvme-cli.
fn fdp_block_node() -> String {
    let dev = BlockDev::of_node(&fdp_device()).unwrap();
    dev.node().display().to_string()
}

fn nvme_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new("nvme")
        .args(args)
        .args(["-o", "json"])
        .output()
        .expect("running nvme (nvme-cli)");
    assert!(
        out.status.success(),
        "nvme {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Reclaim unit available media writes (blocks) per placement identifier: `nvme fdp status`.
fn ruamw() -> std::collections::BTreeMap<u64, u64> {
    let status = nvme_json(&["fdp", "status", &fdp_block_node()]);
    status["ruhss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["pid"].as_u64().unwrap(), r["ruamw"].as_u64().unwrap()))
        .collect()
}

/// Host bytes with metadata written, from the drive's FDP statistics log.
fn host_bytes_written() -> u64 {
    let stats = nvme_json(&["fdp", "stats", "/dev/nvme0", "-e", "1"]);
    let hbmw = &stats["hbmw"];
    hbmw.as_str()
        .map(|s| s.parse().unwrap())
        .or_else(|| hbmw.as_u64())
        .expect("hbmw in nvme fdp stats")
}

fn format_fdp(zone_size: Option<u64>) -> FdpDevice {
    let options = FdpOptions {
        zone_size,
        format: true,
        ..FdpOptions::default()
    };
    FdpDevice::open(fdp_device(), options).unwrap()
}

/// Writes of zones owned by two streams carry two placement identifiers: the drive's own
/// reclaim unit status shows the blocks under exactly those identifiers, and its host-bytes
/// counter moves by exactly what the backend wrote.
#[test]
#[ignore = "needs VALET_FDP_DEVICE; run by tests/tests/vm_fdp.rs"]
fn fdp_writes_carry_the_streams_placement_identifier() {
    // Zones of one reclaim unit (the drive's nominal size).
    let dev = format_fdp(None);
    let g = dev.geometry();
    let handles = dev.placement_handles().to_vec();
    println!(
        "fdp: {} zones of {} MiB, handles {handles:?}, writes by {}",
        g.zone_count,
        g.zone_size >> 20,
        dev.io_kind()
    );
    assert!(handles.len() >= 4, "{handles:?}");
    let place = |stream| ZonePlacement {
        tenant: 0,
        stream,
        group: 0,
    };
    dev.assign_zone(0, &place(1));
    dev.assign_zone(1, &place(2));
    let (p1, p2) = (
        dev.zone_placement(0).unwrap(),
        dev.zone_placement(1).unwrap(),
    );
    assert_ne!(p1, p2, "two streams, one placement identifier");
    let before = ruamw();
    let hbmw = host_bytes_written();
    let written = dev.bytes_written();
    let mib = pattern(9, 1 << 20);
    dev.write(0, 0, &mib).unwrap();
    dev.write(1, 0, &mib[..512 * 1024]).unwrap();
    dev.append(1, &mib[..512 * 1024]).unwrap();
    dev.write(0, 1 << 20, &mib).unwrap();
    dev.sync().unwrap();
    let after = ruamw();
    let blocks = |bytes: u64| bytes / g.block_size as u64;
    for (pid, left) in &after {
        let used = before[pid] - left;
        let expect = match *pid as u16 {
            p if p == p1 => blocks(2 << 20),
            p if p == p2 => blocks(1 << 20),
            _ => 0,
        };
        assert_eq!(used, expect, "placement id {pid}: {before:?} -> {after:?}");
    }
    assert_eq!(
        host_bytes_written() - hbmw,
        dev.bytes_written() - written,
        "the drive's host bytes against the backend's"
    );
    let mut back = vec![0; 1 << 20];
    dev.read(1, 0, &mut back).unwrap();
    assert!(back[..512 * 1024] == mib[..512 * 1024] && back[512 * 1024..] == mib[..512 * 1024]);
    println!(
        "fdp: placement ids {p1} (stream 1) and {p2} (stream 2) used {:?}",
        after
    );
}

/// Reset deallocates the range (it reads back as zeros), finish and reset survive a reopen,
/// and a reopen without a clean close still finds every zone's table state.
#[test]
#[ignore = "needs VALET_FDP_DEVICE; run by tests/tests/vm_fdp.rs"]
fn fdp_reset_deallocates_and_the_table_survives_reopen() {
    let dev = format_fdp(Some(1 << 20));
    let bs = dev.geometry().block_size as usize;
    let data = pattern(3, 8 * bs);
    dev.write(2, 0, &data).unwrap();
    dev.write(3, 0, &data).unwrap();
    dev.finish(3).unwrap();
    dev.write(4, 0, &data).unwrap();
    dev.sync().unwrap();
    dev.reset(2).unwrap();
    dev.sync().unwrap();
    let mut back = vec![1; 8 * bs];
    dev.read_unwritten(2, 0, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "a reset range must read as deallocated"
    );
    drop(dev);
    let dev = FdpDevice::open(fdp_device(), FdpOptions::default()).unwrap();
    assert_eq!(dev.zone_info(2).unwrap().state, ZoneState::Empty);
    assert_eq!(dev.zone_info(3).unwrap().state, ZoneState::Full);
    assert_eq!(dev.zone_info(4).unwrap().write_pointer, 8 * bs as u64);
    dev.read(4, 0, &mut back).unwrap();
    assert_eq!(back, data);
    // A second process cannot open it meanwhile.
    assert!(FdpDevice::open(fdp_device(), FdpOptions::default()).is_err());
}

/// The store on FDP: logs and tables in zones with different placement identifiers, every
/// byte back after a remount, and the drive's host-bytes counter against the store's own
/// accounting (data + metadata): they differ only by the backend's zone-table writes, at
/// most one block per sync.
#[test]
#[ignore = "needs VALET_FDP_DEVICE; run by tests/tests/vm_fdp.rs"]
fn store_on_fdp_separates_streams_and_remounts() {
    drop(format_fdp(Some(4 << 20)));
    let conventional = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 128 * 1024,
        conventional_dir: Some(conventional.path().to_path_buf()),
        ..Default::default()
    };
    let hbmw = host_bytes_written();
    let dev = Arc::new(FdpDevice::open(fdp_device(), FdpOptions::default()).unwrap());
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config.clone()).unwrap();
    let (_, root) = store.tenant("db").unwrap();
    let files = [("000001.log", 700_001usize), ("000002.ldb", 1_300_000)];
    for (i, (name, len)) in files.iter().enumerate() {
        let f = store.open_file(root, name, OpenOptions::create()).unwrap();
        let data = pattern(i as u32, *len);
        for (n, chunk) in data.chunks(4000).enumerate() {
            f.write_at(chunk, (n * 4000) as u64).unwrap();
            if n % 50 == 0 {
                f.sync_data().unwrap();
            }
        }
        f.sync_all().unwrap();
        f.close().unwrap();
    }
    let owners = store.zone_owners();
    let mut pid_of_stream = std::collections::BTreeMap::new();
    for (zone, _, stream) in &owners {
        let pid = dev.zone_placement(*zone).unwrap();
        pid_of_stream
            .entry(*stream)
            .or_insert_with(Vec::new)
            .push(pid);
    }
    println!("fdp: placement ids by stream {pid_of_stream:?}");
    let log_pids = &pid_of_stream[&1];
    let table_pids = &pid_of_stream[&2];
    assert!(
        log_pids.iter().all(|p| !table_pids.contains(p)),
        "{pid_of_stream:?}"
    );
    let stats = store.stats();
    let drive = host_bytes_written() - hbmw;
    let ours = stats.device_bytes + stats.meta_bytes;
    let bs = dev.geometry().block_size as u64;
    println!(
        "fdp: drive host bytes {drive}, store device+meta bytes {ours}, syncs {}, backend {}",
        dev.sync_count(),
        dev.bytes_written()
    );
    assert_eq!(drive, dev.bytes_written());
    assert!(
        drive >= ours && drive - ours <= bs * (dev.sync_count() + 1),
        "{drive} vs {ours}"
    );
    drop(store);
    drop(dev);
    let dev = Arc::new(FdpDevice::open(fdp_device(), FdpOptions::default()).unwrap());
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config.clone()).unwrap();
    assert_files_read_back(&store, &files);
    // After the remount the device was told the owners again.
    for (zone, _, stream) in store.zone_owners() {
        assert!(pid_of_stream[&stream].contains(&dev.zone_placement(zone).unwrap()));
    }
    drop((store, dev));

    // Read-only: every byte and every zone's placement, and not one byte to the drive
    // (not even the zone table at close), beside another reader and never a writer.
    let hbmw = host_bytes_written();
    let read_only = FdpOptions {
        read_only: true,
        ..FdpOptions::default()
    };
    let dev = Arc::new(FdpDevice::open(fdp_device(), read_only).unwrap());
    let other = FdpDevice::open(fdp_device(), read_only).unwrap();
    assert!(
        FdpDevice::open(fdp_device(), FdpOptions::default()).is_err(),
        "a writer opened the namespace beside a reader"
    );
    let config = StoreConfig {
        read_only: true,
        ..config
    };
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap();
    assert_files_read_back(&store, &files);
    for (zone, _, stream) in store.zone_owners() {
        assert!(pid_of_stream[&stream].contains(&dev.zone_placement(zone).unwrap()));
    }
    assert!(matches!(dev.reset(0), Err(DeviceError::ReadOnly(_))));
    drop((store, dev, other));
    assert_eq!(
        host_bytes_written(),
        hbmw,
        "a read-only mount wrote to the drive"
    );
}

/// A read-only open of a blank namespace, and a writable one that must find a store
/// (`existing`), say so and format nothing.
#[test]
#[ignore = "needs VALET_FDP_DEVICE; run by tests/tests/vm_fdp.rs"]
fn fdp_read_only_open_of_a_blank_namespace_formats_nothing() {
    drop(format_fdp(Some(1 << 20)));
    // Blank it: zeros over the header.
    let node = fdp_block_node();
    let block = FsOpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&node)
        .unwrap();
    block
        .write_all_at(AlignedBlock::new(&[0; 4096]).as_slice(), 0)
        .unwrap();
    block.sync_data().unwrap();
    let hbmw = host_bytes_written();
    let read_only = FdpOptions {
        read_only: true,
        ..FdpOptions::default()
    };
    let existing = FdpOptions {
        existing: true,
        ..FdpOptions::default()
    };
    for options in [read_only, existing] {
        assert!(matches!(
            FdpDevice::open(fdp_device(), options),
            Err(DeviceError::Blank)
        ));
    }
    assert_eq!(
        host_bytes_written(),
        hbmw,
        "an open of a blank namespace wrote to the drive"
    );
    let mut header = AlignedBlock::new(&[1; 4096]);
    let at = header.start;
    block
        .read_exact_at(&mut header.buf[at..at + 4096], 0)
        .unwrap();
    assert!(
        header.as_slice().iter().all(|&b| b == 0),
        "the header changed"
    );
}

/// One half of the power-cut test, chosen by `VALET_POWER_PHASE`:
/// - `write`: formats the namespace, then appends records to three files in turn, each
///   followed by an fdatasync, and prints `ACK <file> <bytes>` after every sync returns,
///   forever (the host kills QEMU);
/// - `verify`: mounts (recovering), runs fsck, checks every byte of every file against the
///   pattern, and prints `RECOVERED <file> <bytes>` (the host compares with the last ACKs).
#[test]
#[ignore = "needs VALET_FDP_DEVICE and VALET_POWER_PHASE; run by tests/tests/vm_fdp.rs"]
fn fdp_power_cut_phase() {
    let phase = std::env::var("VALET_POWER_PHASE").expect("VALET_POWER_PHASE");
    let conventional = PathBuf::from("/data/conventional");
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 128 * 1024,
        conventional_dir: Some(conventional),
        ..Default::default()
    };
    let names = ["a.log", "b.ldb", "c.dat"];
    if phase == "write" {
        drop(format_fdp(Some(4 << 20)));
        let dev = FdpDevice::open(fdp_device(), FdpOptions::default()).unwrap();
        let store = Store::open(Arc::new(dev), config).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let files: Vec<_> = names
            .iter()
            .map(|n| store.open_file(root, n, OpenOptions::create()).unwrap())
            .collect();
        let mut sizes = [0u64; 3];
        for round in 0u64.. {
            let i = (round % 3) as usize;
            // Records of varied length: small ones travel inline in the journal.
            let len = [430usize, 4096, 70_000, 1500][(round / 3 % 4) as usize];
            let data = pattern_at(i as u32, sizes[i], len);
            files[i].write_at(&data, sizes[i]).unwrap();
            files[i].sync_data().unwrap();
            sizes[i] += len as u64;
            println!("ACK {} {}", names[i], sizes[i]);
        }
    } else {
        let dev = FdpDevice::open(fdp_device(), FdpOptions::default()).unwrap();
        let store = Store::open(Arc::new(dev), config).unwrap();
        let report = store.fsck().expect("fsck after the power cut");
        println!("fsck: {report:?}");
        assert!(report.is_clean(), "fsck after the power cut: {report:?}");
        let (_, root) = store.tenant("app").unwrap();
        for (i, name) in names.iter().enumerate() {
            let f = store.open_file(root, name, OpenOptions::read()).unwrap();
            let size = f.metadata().unwrap().size;
            let mut buf = vec![0; size as usize];
            assert_eq!(f.read_at(&mut buf, 0).unwrap() as u64, size);
            assert!(
                buf == pattern_at(i as u32, 0, size as usize),
                "{name}: recovered bytes differ from what was written"
            );
            println!("RECOVERED {name} {size}");
        }
    }
}

/// The bytes at `offset..offset + len` of a file whose content is a fixed function of the
/// offset (so a recovered prefix can be checked without knowing the record boundaries).
fn pattern_at(seed: u32, offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64)
        .map(|o| {
            let x = (o as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(0x9E37_79B9);
            (x >> 13) as u8
        })
        .collect()
}

/// The write stream the FDP backend issued for an LSM-shaped workload, replayed on the
/// conventional-SSD model with and without its placement identifiers: the WAF a drive that
/// honours placement would have had, against the same drive ignoring it (QEMU models no
/// flash GC, so this is the only WAF figure an FDP run can give). The workload writes three
/// times the store's 48 MiB, as an LSM tree does: while a write-ahead log fills with
/// 4,000-byte records (an fdatasync every eight), the previous log's 1 MiB table is written
/// in 8 KiB pieces between the records; then the old log is deleted, and tables are deleted
/// oldest first with about 75 % of the store live. Prints one `SSD-MODEL` line.
#[test]
#[ignore = "needs VALET_FDP_DEVICE; run by tests/tests/vm_fdp.rs"]
fn fdp_write_stream_on_the_ssd_model() {
    use valet_vfs::device::replay_on_ssd;
    use valet_vfs::ftl::FtlConfig;
    let options = FdpOptions {
        zone_size: Some(1 << 20),
        max_zones: Some(48),
        format: true,
        record_writes: true,
        ..FdpOptions::default()
    };
    let dev = Arc::new(FdpDevice::open(fdp_device(), options).unwrap());
    let g = dev.geometry();
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 128 * 1024,
        ..Default::default()
    };
    let store = Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap();
    let (_, root) = store.tenant("db").unwrap();
    let record = pattern(5, 4000);
    let table = pattern(6, 1 << 20);
    let mut tables = std::collections::VecDeque::new();
    let mut written = 0u64;
    let mut previous_log: Option<String> = None;
    let mut n = 0u32;
    while written < 3 * g.capacity_bytes() {
        n += 1;
        let log_name = format!("{n:06}.log");
        let log = store
            .open_file(root, &log_name, OpenOptions::create())
            .unwrap();
        // The table of the previous log is built while this log fills.
        let building = previous_log.as_ref().map(|_| {
            let name = format!("{:06}.ldb", n - 1);
            let t = store.open_file(root, &name, OpenOptions::create()).unwrap();
            (name, t)
        });
        let (mut at, mut table_at) = (0u64, 0usize);
        for i in 0..128 {
            log.write_at(&record, at).unwrap();
            at += record.len() as u64;
            if i % 8 == 7 {
                log.sync_data().unwrap();
            }
            if let Some((_, t)) = &building {
                t.write_at(&table[table_at..table_at + 8192], table_at as u64)
                    .unwrap();
                table_at += 8192;
            }
        }
        log.close().unwrap();
        written += at + table_at as u64;
        if let Some((name, t)) = building {
            t.sync_all().unwrap();
            t.close().unwrap();
            tables.push_back(name);
            store.unlink(root, previous_log.as_ref().unwrap()).unwrap();
            if tables.len() > 34 {
                store.unlink(root, &tables.pop_front().unwrap()).unwrap();
            }
        }
        previous_log = Some(log_name);
    }
    store.sync().unwrap();
    let stats = store.stats();
    drop(store);
    let log = dev.take_write_log();
    let logical = g.zone_count as u64 * g.zone_size;
    // 1 MiB erase units (one reclaim unit), 15 % spare, four reclaim unit handles
    // (identifiers modulo 4: the store used 0 for metadata, 1 for logs, 2 for tables).
    let ssd = FtlConfig::fdp(logical, 0.15, 4);
    let with = replay_on_ssd(
        &log,
        g.block_size as u64,
        dev.data_start(),
        ssd.clone(),
        true,
    )
    .unwrap();
    let without = replay_on_ssd(&log, g.block_size as u64, dev.data_start(), ssd, false).unwrap();
    println!(
        "SSD-MODEL host_mib={:.1} store_waf={:.3} store_gc_mib={:.1} waf_with_placement={:.3} waf_without={:.3} reduction={:.3}",
        stats.host_bytes as f64 / (1 << 20) as f64,
        stats.waf,
        stats.gc_bytes_moved as f64 / (1 << 20) as f64,
        with.waf(),
        without.waf(),
        without.waf() - with.waf()
    );
    assert!(
        without.gc_pages_moved > 0,
        "the model never collected: {without:?}"
    );
    assert!(
        with.waf() < without.waf(),
        "placement did not lower the model's WAF: {with:?} vs {without:?}"
    );
}
