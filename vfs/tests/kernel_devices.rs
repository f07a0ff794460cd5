//! The device backends on the kernel's real interfaces. Every test here is ignored: each needs
//! a device only the VM tests (`tests/tests/vm_*.rs`) provide, named by an environment
//! variable, and they run it inside QEMU:
//!
//! - `VALET_ZONEFS_MOUNT`: a zonefs mount (`mount -t zonefs -o errors=repair`) of an NVMe ZNS
//!   namespace with at least 8 zones and 4 active zones; the tests reset its zones.

use std::fs::OpenOptions as FsOpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use valet_vfs::device::sysfs::BlockDev;
use valet_vfs::device::{
    DeviceError, ZoneInfo, ZoneState, ZonedDevice, ZonefsDevice, ZonefsOptions,
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
    assert!(active > 0 && active < g.zone_count - 1, "need a drive with an active limit");
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
/// different zones, and the drive's write pointers where the store's zone map says.
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
    let open = || {
        let dev = ZonefsDevice::open(zonefs_mount(), ZonefsOptions::default()).unwrap();
        Store::open(Arc::new(dev), config.clone()).unwrap()
    };
    let store = open();
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
    check_zone_map(&store);
    drop(store);
    let store = open();
    let (_, root) = store.tenant("db").unwrap();
    for (i, (name, len)) in files.iter().enumerate() {
        let f = store.open_file(root, name, OpenOptions::read()).unwrap();
        let mut buf = vec![0; len + 1];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), *len, "{name}");
        assert!(buf[..*len] == pattern(i as u32, *len)[..], "{name} differs");
    }
    assert!(store.fsck().is_ok());
    check_zone_map(&store);
}

/// Streams own different zones, and every zone a stream owns has the write pointer on the
/// drive that the store's device table has.
fn check_zone_map(store: &Store) {
    let owners = store.zone_owners();
    let streams: std::collections::BTreeSet<u32> = owners.iter().map(|o| o.2).collect();
    assert!(streams.len() >= 2, "logs and tables share zones: {owners:?}");
    let ours = store.device().report_zones();
    let kernel = {
        let dev = ZonefsDevice::open(zonefs_mount(), ZonefsOptions::default()).unwrap();
        dev.kernel_report().unwrap().unwrap()
    };
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
