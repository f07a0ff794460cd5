//! A zoned device in memory, for fast tests, with simulated power loss.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::{DeviceError, Geometry, ZoneId, ZoneInfo, ZoneState, ZoneTable, ZonedDevice};

/// One zone's bytes and what of it would survive a power failure.
#[derive(Clone, Default)]
struct MemZone {
    /// Bytes written so far; a finished zone reads zeros past them.
    data: Vec<u8>,
    /// Bytes of `data` covered by a `sync`.
    durable_len: u64,
    /// The zone was Full at the last sync or was finished (finish is durable at once).
    durable_full: bool,
}

struct Inner {
    table: ZoneTable,
    zones: Vec<MemZone>,
}

/// A zoned device whose data lives in memory.
///
/// Shareable across threads (`Arc<MemoryDevice>`); every call takes one internal lock.
///
/// Durability model, for crash tests: each zone has a durable write pointer. [`sync`] makes
/// everything written so far durable; a reset or finish is durable at once;
/// [`power_fail`](MemoryDevice::power_fail) throws away every write after the durable
/// write pointer, as a drive with a volatile write cache would.
///
/// [`sync`]: ZonedDevice::sync
pub struct MemoryDevice {
    inner: Mutex<Inner>,
    syncs: AtomicU64,
}

impl MemoryDevice {
    /// An empty device of the given shape.
    pub fn new(geometry: Geometry) -> Result<Self, DeviceError> {
        let table = ZoneTable::new(geometry)?;
        let zones = (0..geometry.zone_count)
            .map(|_| MemZone::default())
            .collect();
        Ok(MemoryDevice {
            inner: Mutex::new(Inner { table, zones }),
            syncs: AtomicU64::new(0),
        })
    }

    /// Number of `sync` calls so far (device cache flushes).
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Simulates losing power: every write not covered by a `sync` disappears.
    ///
    /// Each zone's write pointer drops to its durable write pointer. Zones at write pointer
    /// 0 come back Empty, partially written ones Closed, durably finished or filled ones
    /// Full (reading zeros where unsynced data was lost); open zones are closed, as after
    /// any power cycle. ReadOnly and Offline conditions stay. If the zones that fall back
    /// from an unsynced Full to Closed would exceed `max_active`, the extra ones stay Full
    /// with their lost tail reading zeros, so the device is always in a state a drive
    /// could report.
    pub fn power_fail(&self) {
        self.power_fail_keeping(|_| false);
    }

    /// A new device holding what this one would hold if its power failed now, leaving
    /// this one as it is: a crash test can look at what a store running on it has made
    /// durable without stopping it.
    pub fn durable_copy(&self) -> MemoryDevice {
        let copy = {
            let inner = self.lock();
            MemoryDevice {
                inner: Mutex::new(Inner {
                    table: inner.table.clone(),
                    zones: inner.zones.clone(),
                }),
                syncs: AtomicU64::new(0),
            }
        };
        copy.power_fail();
        copy
    }

    /// [`MemoryDevice::power_fail`], except that the zones `keep` picks keep what was
    /// written to them since the last sync, as a drive's cache may have written some of its
    /// contents out before the power failed and not others (say, the journal's newest
    /// records but not the data they name).
    pub fn power_fail_keeping(&self, keep: impl Fn(ZoneId) -> bool) {
        let mut inner = self.lock();
        {
            let Inner { table, zones } = &mut *inner;
            for (info, zone) in table.report().iter().zip(zones.iter_mut()) {
                if keep(info.id) {
                    zone.durable_len = zone.data.len() as u64;
                    zone.durable_full |= info.state == ZoneState::Full;
                }
            }
        }
        let geometry = inner.table.geometry();
        let cap = geometry.zone_capacity;
        let before = inner.table.report();
        let mut entries = Vec::with_capacity(before.len());
        let mut fallen_from_full = Vec::new();
        for (info, zone) in before.iter().zip(inner.zones.iter_mut()) {
            zone.data.truncate(zone.durable_len as usize);
            let len = zone.data.len() as u64;
            let state = match info.state {
                ZoneState::ReadOnly | ZoneState::Offline => {
                    let wp = if zone.durable_full {
                        cap
                    } else {
                        info.write_pointer.min(len)
                    };
                    entries.push((info.state, wp));
                    continue;
                }
                _ if zone.durable_full => ZoneState::Full,
                _ if len == 0 => ZoneState::Empty,
                _ if len == cap => ZoneState::Full,
                _ => {
                    if info.state == ZoneState::Full {
                        fallen_from_full.push(entries.len());
                    }
                    ZoneState::Closed
                }
            };
            let wp = if state == ZoneState::Full { cap } else { len };
            entries.push((state, wp));
        }
        let active = entries.iter().filter(|(s, _)| s.is_active()).count();
        let excess = active.saturating_sub(geometry.max_active as usize);
        for &i in fallen_from_full.iter().take(excess) {
            entries[i] = (ZoneState::Full, cap);
            inner.zones[i].durable_full = true;
        }
        match ZoneTable::restore(geometry, &entries) {
            Ok(table) => inner.table = table,
            // Unreachable by construction; keep the old table rather than panic.
            Err(why) => debug_assert!(false, "power_fail built a bad table: {why}"),
        }
    }

    /// Fault injection: makes the zone ReadOnly or Offline.
    pub fn set_condition(&self, zone: ZoneId, state: ZoneState) -> Result<(), DeviceError> {
        self.lock().table.set_condition(zone, state)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic in another thread cannot leave the table half-updated (updates are
        // validated first), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ZonedDevice for MemoryDevice {
    fn geometry(&self) -> Geometry {
        self.lock().table.geometry()
    }

    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.lock().table.report()
    }

    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        self.lock().table.info(zone)
    }

    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        inner.table.commit_write(zone, offset, data.len() as u64)?;
        inner.zones[zone as usize].data.extend_from_slice(data);
        Ok(())
    }

    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        let mut inner = self.lock();
        let offset = inner.table.check_append(zone, data.len() as u64)?;
        inner.table.commit_write(zone, offset, data.len() as u64)?;
        inner.zones[zone as usize].data.extend_from_slice(data);
        Ok(offset)
    }

    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let inner = self.lock();
        inner.table.check_read(zone, offset, buf.len() as u64)?;
        let data = &inner.zones[zone as usize].data;
        // Past the written bytes of a finished zone the device returns zeros.
        let start = (offset as usize).min(data.len());
        let end = (offset as usize + buf.len()).min(data.len());
        let n = end - start;
        buf[..n].copy_from_slice(&data[start..end]);
        buf[n..].fill(0);
        Ok(())
    }

    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        inner.table.reset(zone)?;
        let z = &mut inner.zones[zone as usize];
        *z = MemZone::default();
        Ok(())
    }

    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        inner.table.finish(zone)?;
        inner.zones[zone as usize].durable_full = true;
        Ok(())
    }

    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.open(zone)
    }

    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.close(zone)
    }

    fn sync(&self) -> Result<(), DeviceError> {
        let mut inner = self.lock();
        let Inner { table, zones } = &mut *inner;
        for (info, zone) in table.report().iter().zip(zones.iter_mut()) {
            zone.durable_len = zone.data.len() as u64;
            zone.durable_full |= info.state == ZoneState::Full;
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const BS: usize = 4096;

    fn geo() -> Geometry {
        Geometry {
            zone_count: 4,
            zone_size: 4 * BS as u64,
            zone_capacity: 4 * BS as u64,
            block_size: BS as u32,
            max_open: 2,
            max_active: 2,
        }
    }

    fn block(byte: u8) -> Vec<u8> {
        vec![byte; BS]
    }

    fn state(d: &MemoryDevice, zone: ZoneId) -> (ZoneState, u64) {
        let i = d.zone_info(zone).unwrap();
        (i.state, i.write_pointer)
    }

    #[test]
    fn write_read_append_roundtrip() {
        let d = MemoryDevice::new(geo()).unwrap();
        d.write(0, 0, &block(1)).unwrap();
        assert_eq!(d.append(0, &block(2)).unwrap(), BS as u64);
        let mut buf = vec![0; 2 * BS];
        d.read(0, 0, &mut buf).unwrap();
        assert!(buf[..BS].iter().all(|&b| b == 1) && buf[BS..].iter().all(|&b| b == 2));
        let mut small = [0u8; 3];
        d.read(0, BS as u64 - 1, &mut small).unwrap();
        assert_eq!(small, [1, 2, 2]);
        assert!(d.read(0, 0, &mut vec![0; 2 * BS + 1]).is_err());
        assert!(d.write(0, 0, &block(3)).is_err());
        // A failed write leaves the zone as it was.
        assert_eq!(state(&d, 0), (ZoneState::ImplicitOpen, 2 * BS as u64));
    }

    #[test]
    fn finished_zone_reads_zeros_past_data_and_reset_clears() {
        let d = MemoryDevice::new(geo()).unwrap();
        d.write(1, 0, &block(7)).unwrap();
        d.finish(1).unwrap();
        let mut buf = vec![9; 4 * BS];
        d.read(1, 0, &mut buf).unwrap();
        assert!(buf[..BS].iter().all(|&b| b == 7) && buf[BS..].iter().all(|&b| b == 0));
        d.reset(1).unwrap();
        assert_eq!(state(&d, 1), (ZoneState::Empty, 0));
        d.write(1, 0, &block(8)).unwrap();
        let mut one = vec![0; BS];
        d.read(1, 0, &mut one).unwrap();
        assert_eq!(one, block(8));
    }

    #[test]
    fn sync_count_counts_syncs() {
        let d = MemoryDevice::new(geo()).unwrap();
        assert_eq!(d.sync_count(), 0);
        d.sync().unwrap();
        d.sync().unwrap();
        assert_eq!(d.sync_count(), 2);
    }

    #[test]
    fn power_fail_drops_unsynced_writes() {
        let d = MemoryDevice::new(geo()).unwrap();
        d.write(0, 0, &block(1)).unwrap();
        d.sync().unwrap();
        d.write(0, BS as u64, &block(2)).unwrap();
        d.write(1, 0, &block(3)).unwrap();
        d.power_fail();
        assert_eq!(state(&d, 0), (ZoneState::Closed, BS as u64));
        assert_eq!(state(&d, 1), (ZoneState::Empty, 0));
        let mut buf = vec![0; BS];
        d.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, block(1));
        assert!(d.read(0, BS as u64, &mut buf).is_err());
        // The device carries on from the durable write pointer.
        d.write(0, BS as u64, &block(4)).unwrap();
        d.read(0, BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(4));
    }

    #[test]
    fn power_fail_keeps_durable_reset_and_finish() {
        let d = MemoryDevice::new(geo()).unwrap();
        d.write(0, 0, &block(1)).unwrap();
        d.write(1, 0, &block(2)).unwrap();
        d.sync().unwrap();
        d.reset(0).unwrap(); // durable at once
        d.write(1, BS as u64, &block(3)).unwrap();
        d.finish(1).unwrap(); // durable at once, but the unsynced block is lost
        d.power_fail();
        assert_eq!(state(&d, 0), (ZoneState::Empty, 0));
        assert_eq!(state(&d, 1), (ZoneState::Full, 4 * BS as u64));
        let mut buf = vec![0; 2 * BS];
        d.read(1, 0, &mut buf).unwrap();
        assert_eq!(&buf[..BS], &block(2)[..]);
        assert!(buf[BS..].iter().all(|&b| b == 0));
    }

    #[test]
    fn power_fail_unsynced_fill_falls_back_to_closed() {
        let d = MemoryDevice::new(geo()).unwrap();
        d.write(0, 0, &block(1)).unwrap();
        d.write(2, 0, &block(5)).unwrap();
        d.sync().unwrap();
        for i in 1..4 {
            d.write(0, (i * BS) as u64, &block(1)).unwrap();
        }
        assert_eq!(state(&d, 0).0, ZoneState::Full);
        d.write(2, BS as u64, &block(5)).unwrap();
        d.power_fail();
        assert_eq!(state(&d, 0), (ZoneState::Closed, BS as u64));
        assert_eq!(state(&d, 2), (ZoneState::Closed, BS as u64));
        // Filled and synced stays Full.
        d.reset(2).unwrap();
        for i in 0..4 {
            d.write(3, (i * BS) as u64, &block(6)).unwrap();
        }
        d.sync().unwrap();
        d.power_fail();
        assert_eq!(state(&d, 3), (ZoneState::Full, 4 * BS as u64));
    }

    #[test]
    fn power_fail_respects_max_active() {
        let d = MemoryDevice::new(geo()).unwrap(); // max_active 2
        d.write(0, 0, &block(1)).unwrap();
        d.write(1, 0, &block(1)).unwrap();
        d.sync().unwrap();
        for z in 0..2 {
            for i in 1..4 {
                d.write(z, (i * BS) as u64, &block(1)).unwrap();
            }
        }
        d.write(2, 0, &block(1)).unwrap();
        d.sync().unwrap();
        d.write(2, BS as u64, &block(1)).unwrap(); // lost
        d.power_fail();
        let report = d.report_zones();
        let active = report.iter().filter(|z| z.state.is_active()).count();
        assert!(active <= 2, "{report:?}");
        assert_eq!(state(&d, 2), (ZoneState::Closed, BS as u64));
    }

    #[test]
    fn power_fail_closes_open_zones_and_keeps_conditions() {
        let d = MemoryDevice::new(geo()).unwrap();
        d.open(0).unwrap();
        d.write(1, 0, &block(1)).unwrap();
        d.sync().unwrap();
        d.set_condition(1, ZoneState::ReadOnly).unwrap();
        d.power_fail();
        assert_eq!(state(&d, 0), (ZoneState::Empty, 0));
        assert_eq!(state(&d, 1), (ZoneState::ReadOnly, BS as u64));
        let mut buf = vec![0; BS];
        d.read(1, 0, &mut buf).unwrap();
        assert_eq!(buf, block(1));
    }

    #[test]
    fn shared_between_threads() {
        let d = Arc::new(MemoryDevice::new(geo()).unwrap());
        let handles: Vec<_> = (0..2u32)
            .map(|z| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    for i in 0..4u64 {
                        d.append(z, &block(z as u8 + 1)).unwrap();
                        assert_eq!(d.zone_info(z).unwrap().write_pointer, (i + 1) * BS as u64);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(state(&d, 0).0, ZoneState::Full);
        assert_eq!(state(&d, 1).0, ZoneState::Full);
    }
}
