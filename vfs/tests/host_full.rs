//! The host's file system under the image fills up: a write of file data then fails with
//! ENOSPC. The guest's sync gets ENOSPC (not EIO: nothing was lost, there is no room), the
//! data stays buffered and keeps failing its syncs while the room is missing, and once
//! there is room again the next sync writes it and every byte reads back, also after a
//! remount.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use valet_vfs::device::{DeviceError, Geometry, MemoryDevice, ZoneId, ZoneInfo, ZonedDevice};
use valet_vfs::{OpenOptions, Store, StoreConfig};

const BLOCK: usize = 4096;

fn geometry() -> Geometry {
    Geometry {
        zone_count: 12,
        zone_size: 64 * BLOCK as u64,
        zone_capacity: 64 * BLOCK as u64,
        block_size: BLOCK as u32,
        max_open: 8,
        max_active: 8,
    }
}

/// A memory device whose data-zone writes fail with ENOSPC while `full` is set, as writes
/// into the image's unallocated blocks fail on a full host file system. (The journal's
/// writes land in blocks the image prepared ahead, so they go on.)
struct HostFull {
    inner: MemoryDevice,
    full: AtomicBool,
}

impl HostFull {
    fn room(&self, zone: ZoneId) -> Result<(), DeviceError> {
        if zone > 1 && self.full.load(Ordering::SeqCst) {
            return Err(DeviceError::Io(std::io::Error::from_raw_os_error(
                libc::ENOSPC,
            )));
        }
        Ok(())
    }
}

impl ZonedDevice for HostFull {
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
        self.room(zone)?;
        self.inner.write(zone, offset, data)
    }
    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.room(zone)?;
        self.inner.append(zone, data)
    }
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read(zone, offset, buf)
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

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed ^ (i / 13) as u8).collect()
}

fn mount(dev: &Arc<HostFull>) -> Store {
    let config = StoreConfig {
        buffers: 4,
        buffer_size: 16 * BLOCK,
        ..Default::default()
    };
    Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap()
}

#[test]
fn a_full_host_file_system_is_enospc_and_the_data_waits_for_room() {
    let dev = Arc::new(HostFull {
        inner: MemoryDevice::new(geometry()).unwrap(),
        full: AtomicBool::new(false),
    });
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let f = store
        .open_file(root, "data.log", OpenOptions::create())
        .unwrap();
    let mut expect = pattern(100_000, 1);
    f.write_at(&expect, 0).unwrap();
    f.sync_data().unwrap();

    dev.full.store(true, Ordering::SeqCst);
    let more = pattern(200_000, 2);
    // Writes may be taken into buffers, or fail at once when one has to be written.
    let mut at = expect.len();
    for piece in more.chunks(20_000) {
        match f.write_at(piece, at as u64) {
            Ok(_) => {
                expect.extend_from_slice(piece);
                at += piece.len();
            }
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                break;
            }
        }
    }
    for _ in 0..2 {
        let e = f.sync_data().expect_err("a sync without room succeeded");
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    }

    dev.full.store(false, Ordering::SeqCst);
    f.sync_data().unwrap();
    let read = |store: &Store| {
        let f = store
            .open_file(root, "data.log", OpenOptions::read())
            .unwrap();
        let mut buf = vec![0u8; expect.len() + 1];
        let n = f.read_at(&mut buf, 0).unwrap();
        buf.truncate(n);
        buf
    };
    assert!(read(&store) == expect, "the file after the room came back");
    f.close().unwrap();
    store.unmount().unwrap();
    let store = mount(&dev);
    assert!(read(&store) == expect, "the file after a remount");
    assert!(store.fsck().unwrap().is_clean());
}
