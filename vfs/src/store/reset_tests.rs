//! The rule of [`Inner::resetting`] held against the interleaving that once broke it: a
//! zone stays listed as being reset for as long as the commit that took it is resetting it,
//! whatever another commit that held it before does meanwhile. Before b59f351 the first
//! commit's end of `reset_zones` took every zone it had been given out of `resetting`, the
//! second commit's too; the zone could then be listed for a reset again and reset a second
//! time after new data was written into it.
//!
//! The interleaving is driven step by step: the device holds chosen zones' resets until the
//! test lets them go, and the test pins a zone as a reader does.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use super::*;
use crate::device::{DeviceError, Geometry, MemoryDevice, ZoneInfo};

const ZONE: u64 = 64 * 1024;

/// A memory device whose resets of held zones wait until the test releases them.
struct HeldResets {
    inner: MemoryDevice,
    gate: Mutex<Gate>,
    changed: Condvar,
}

#[derive(Default)]
struct Gate {
    held: BTreeSet<ZoneId>,
    /// Zones whose reset is waiting at the gate now.
    waiting: BTreeSet<ZoneId>,
}

impl HeldResets {
    fn new() -> Arc<HeldResets> {
        let geometry = Geometry {
            zone_count: 16,
            zone_size: ZONE,
            zone_capacity: ZONE,
            block_size: 4096,
            max_open: 6,
            max_active: 6,
        };
        Arc::new(HeldResets {
            inner: MemoryDevice::new(geometry).unwrap(),
            gate: Mutex::new(Gate::default()),
            changed: Condvar::new(),
        })
    }

    fn hold(&self, zone: ZoneId) {
        self.gate.lock().unwrap().held.insert(zone);
    }

    fn release(&self, zone: ZoneId) {
        self.gate.lock().unwrap().held.remove(&zone);
        self.changed.notify_all();
    }

    /// Waits until a reset of `zone` is held at the gate.
    fn wait_for_reset_of(&self, zone: ZoneId) {
        let gate = self.gate.lock().unwrap();
        let _held = self
            .changed
            .wait_while(gate, |g| !g.waiting.contains(&zone))
            .unwrap();
    }
}

impl ZonedDevice for HeldResets {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.inner.report_zones()
    }
    fn zone_info(&self, zone: ZoneId) -> std::result::Result<ZoneInfo, DeviceError> {
        self.inner.zone_info(zone)
    }
    fn write(
        &self,
        zone: ZoneId,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<(), DeviceError> {
        self.inner.write(zone, offset, data)
    }
    fn append(&self, zone: ZoneId, data: &[u8]) -> std::result::Result<u64, DeviceError> {
        self.inner.append(zone, data)
    }
    fn read(
        &self,
        zone: ZoneId,
        offset: u64,
        buf: &mut [u8],
    ) -> std::result::Result<(), DeviceError> {
        self.inner.read(zone, offset, buf)
    }
    fn reset(&self, zone: ZoneId) -> std::result::Result<(), DeviceError> {
        let mut gate = self.gate.lock().unwrap();
        gate.waiting.insert(zone);
        self.changed.notify_all();
        gate = self
            .changed
            .wait_while(gate, |g| g.held.contains(&zone))
            .unwrap();
        gate.waiting.remove(&zone);
        drop(gate);
        self.inner.reset(zone)
    }
    fn finish(&self, zone: ZoneId) -> std::result::Result<(), DeviceError> {
        self.inner.finish(zone)
    }
    fn open(&self, zone: ZoneId) -> std::result::Result<(), DeviceError> {
        self.inner.open(zone)
    }
    fn close(&self, zone: ZoneId) -> std::result::Result<(), DeviceError> {
        self.inner.close(zone)
    }
    fn sync(&self) -> std::result::Result<(), DeviceError> {
        self.inner.sync()
    }
}

/// Starts a commit (one that resets the zones on the reset list) on its own thread, and
/// waits until it is held resetting `zone`.
fn commit_held_at(
    store: &Store,
    device: &HeldResets,
    zone: ZoneId,
) -> thread::JoinHandle<Result<()>> {
    device.hold(zone);
    let commit = {
        let store = store.clone();
        thread::spawn(move || store.commit_for_resets())
    };
    device.wait_for_reset_of(zone);
    commit
}

#[test]
fn a_zone_the_next_commit_is_resetting_stays_listed_while_the_first_commit_ends() {
    let device = HeldResets::new();
    let store = Store::open(device.clone(), StoreConfig::default()).unwrap();
    // Only the test's own commits reset zones.
    store.shared.reclaimer.stop();
    let (_, root) = store.tenant("t").unwrap();
    for name in ["x", "y", "z"] {
        let f = store.open_file(root, name, OpenOptions::create()).unwrap();
        f.write_at(&vec![7; ZONE as usize], 0).unwrap();
        f.sync_all().unwrap();
        f.close().unwrap();
    }
    store.unlink(root, "x").unwrap();
    store.unlink(root, "y").unwrap();
    let dead: Vec<ZoneId> = store.lock().unwrap().to_reset.iter().copied().collect();
    let &[busy, other, ..] = dead.as_slice() else {
        panic!("two removed files of a zone each left {dead:?} to reset");
    };

    // Commit 1 takes both; `busy` is pinned (a reader), so it goes back on the reset
    // list, and `other`'s reset is held.
    store.shared.pins[busy as usize].fetch_add(1, Ordering::AcqRel);
    let first = commit_held_at(&store, &device, other);
    assert!(store.lock().unwrap().to_reset.contains(&busy));

    // The reader lets go; commit 2 takes `busy` and is held resetting it.
    store.shared.pins[busy as usize].fetch_sub(1, Ordering::AcqRel);
    let second = commit_held_at(&store, &device, busy);

    // Commit 1 ends while commit 2 still resets `busy`.
    device.release(other);
    first.join().unwrap().unwrap();
    {
        let inner = store.lock().unwrap();
        assert!(
            inner.resetting.contains(&busy),
            "zone {busy} is being reset by the second commit, but the first one's end \
             took it off the list of zones being reset"
        );
        assert!(!inner.to_reset.contains(&busy));
        assert!(inner.free.contains(&other));
    }

    device.release(busy);
    second.join().unwrap().unwrap();
    let inner = store.lock().unwrap();
    assert!(inner.free.contains(&busy) && inner.free.contains(&other));
    assert!(inner.resetting.is_empty() && inner.to_reset.is_empty());
    drop(inner);
    store.fsck().unwrap();
    let mut back = vec![0; ZONE as usize];
    let f = store.open_file(root, "z", OpenOptions::read()).unwrap();
    assert_eq!(f.read_at(&mut back, 0).unwrap(), ZONE as usize);
    assert!(back.iter().all(|&b| b == 7));
}
