//! Zones the store finished to stay within the device's active-zone limit hold data but
//! are not full. The image device does not keep write pointers between mounts (the journal
//! gives them back), so such zones come back partly written: a mount must still leave the
//! journal an active zone, however many of them there are.

use std::sync::Arc;

use valet_vfs::device::{Geometry, ImageDevice, ImageOptions, ZonedDevice};
use valet_vfs::{Hint, OpenOptions, Placement, PlacementRequest, Store, StoreConfig};

const BLOCK: usize = 4096;

fn geometry() -> Geometry {
    Geometry {
        zone_count: 14,
        zone_size: 64 * BLOCK as u64,
        zone_capacity: 64 * BLOCK as u64,
        block_size: BLOCK as u32,
        max_open: 5,
        max_active: 5,
    }
}

/// Stream = the number the file name ends with, plus one.
struct ByName;
impl Placement for ByName {
    fn place(&self, req: &PlacementRequest<'_>) -> Hint {
        let digits = req.path.trim_start_matches(|c: char| !c.is_ascii_digit());
        Hint::zoned(digits.parse::<u32>().unwrap_or(0) + 1)
    }
}

/// Mounts the image; checks that the mount left an active zone for the journal's next
/// checkpoint (besides the zone the journal writes now).
fn mount(path: &std::path::Path) -> Store {
    let dev = Arc::new(ImageDevice::open(path, ImageOptions::default()).unwrap());
    let store =
        Store::open(dev.clone(), StoreConfig::default()).unwrap_or_else(|e| panic!("mount: {e}"));
    let active = dev
        .report_zones()
        .iter()
        .filter(|z| z.state.is_active())
        .count();
    assert!(
        active < geometry().max_active as usize,
        "{active} active zones after the mount: none left for a checkpoint"
    );
    store
}

#[test]
fn many_finished_zones_come_back_at_mount() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zones.img");
    let dev = ImageDevice::create(&path, geometry(), ImageOptions::default()).unwrap();
    let store = Store::open(Arc::new(dev), StoreConfig::default()).unwrap();
    let (t, root) = store.tenant("app").unwrap();
    store.set_placement(t, Arc::new(ByName));
    // Eight streams, three data zones active at most: opening each new stream's zone
    // finishes the least recently used one, half written.
    for i in 0..8u8 {
        let f = store
            .open_file(root, &format!("file{i}"), OpenOptions::create())
            .unwrap();
        f.write_at(&vec![i + 1; 2 * BLOCK], 0).unwrap();
        f.sync_data().unwrap();
    }
    // Killed, not unmounted: then again after a clean unmount.
    drop(store);
    for round in 0..2 {
        let store = mount(&path);
        let (_, root) = store.tenant("app").unwrap();
        for i in 0..8u8 {
            let f = store
                .open_file(root, &format!("file{i}"), OpenOptions::read())
                .unwrap();
            let mut buf = vec![0u8; 2 * BLOCK];
            assert_eq!(f.read_at(&mut buf, 0).unwrap(), 2 * BLOCK);
            assert!(buf.iter().all(|&b| b == i + 1), "file{i} in round {round}");
        }
        // Data still goes to new zones.
        let f = store
            .open_file(root, &format!("more{round}"), OpenOptions::create())
            .unwrap();
        f.write_at(&vec![9; 3 * BLOCK], 0).unwrap();
        f.sync_data().unwrap();
        store.unmount().unwrap();
    }
}
