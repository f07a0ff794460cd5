//! The ZNS zone state machine shared by every backend: states, write pointers and the
//! open / active resource limits. No I/O happens here; backends validate an operation with
//! the table, do the I/O, then commit, so a failed I/O never moves a write pointer.

use super::{DeviceError, Geometry, ZoneId, ZoneInfo, ZoneState};

#[derive(Clone, Copy, Debug)]
struct Zone {
    state: ZoneState,
    write_pointer: u64,
    /// Logical time of the last write or open; picks the implicitly open zone to close.
    touched: u64,
}

/// Per-zone state and write pointer of one device, with the ZNS rules enforced.
///
/// Writes go exactly to the write pointer, block aligned, within the zone capacity; a write
/// that fills the zone makes it Full. Writing to an Empty or Closed zone opens it implicitly;
/// when `max_open` zones are open the least recently used *implicitly* opened zone is closed
/// to make room (as the ZNS specification allows), otherwise the write fails `TooManyOpen`.
/// Making a zone active (Empty → open) beyond `max_active` fails `TooManyActive`.
#[derive(Clone, Debug)]
pub struct ZoneTable {
    geometry: Geometry,
    zones: Vec<Zone>,
    open: u32,
    active: u32,
    tick: u64,
}

/// What a write has to do to the zone's state before the data can land.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenNeed {
    /// Already open: nothing to do.
    None,
    /// Needs an open resource (and an active one if `activate`).
    Open { activate: bool },
}

impl ZoneTable {
    /// A table with every zone Empty at write pointer 0.
    pub fn new(geometry: Geometry) -> Result<Self, DeviceError> {
        geometry.validate()?;
        let zone = Zone {
            state: ZoneState::Empty,
            write_pointer: 0,
            touched: 0,
        };
        Ok(ZoneTable {
            geometry,
            zones: vec![zone; geometry.zone_count as usize],
            open: 0,
            active: 0,
            tick: 0,
        })
    }

    /// Rebuilds a table from persisted `(state, write pointer)` pairs, one per zone.
    ///
    /// Open zones come back Closed (or Empty at write pointer 0), as after a power cycle.
    /// Inconsistent input is refused; the error is the reason, for the caller to wrap (for
    /// example in [`DeviceError::BadImage`]).
    pub fn restore(geometry: Geometry, zones: &[(ZoneState, u64)]) -> Result<Self, String> {
        geometry.validate().map_err(|e| e.to_string())?;
        if zones.len() != geometry.zone_count as usize {
            return Err(format!(
                "zone table has {} entries, geometry has {} zones",
                zones.len(),
                geometry.zone_count
            ));
        }
        let cap = geometry.zone_capacity;
        let bs = geometry.block_size as u64;
        let mut table = ZoneTable::new(geometry).map_err(|e| e.to_string())?;
        for (i, &(state, wp)) in zones.iter().enumerate() {
            if wp > cap {
                return Err(format!(
                    "zone {i}: write pointer {wp} is beyond the zone capacity {cap}"
                ));
            }
            if wp % bs != 0 {
                return Err(format!(
                    "zone {i}: write pointer {wp} is not a multiple of the block size {bs}"
                ));
            }
            let state = match state {
                ZoneState::Empty if wp != 0 => {
                    return Err(format!("zone {i}: Empty with write pointer {wp}"))
                }
                ZoneState::Full if wp != cap => {
                    return Err(format!(
                        "zone {i}: Full with write pointer {wp} below capacity {cap}"
                    ))
                }
                ZoneState::Closed | ZoneState::ImplicitOpen | ZoneState::ExplicitOpen
                    if wp == cap =>
                {
                    return Err(format!("zone {i}: {state:?} with a full write pointer"))
                }
                ZoneState::Closed if wp == 0 => {
                    return Err(format!("zone {i}: Closed with write pointer 0"))
                }
                ZoneState::ImplicitOpen | ZoneState::ExplicitOpen if wp == 0 => ZoneState::Empty,
                ZoneState::ImplicitOpen | ZoneState::ExplicitOpen => ZoneState::Closed,
                other => other,
            };
            table.zones[i].write_pointer = wp;
            table.set_state(i, state);
        }
        if table.active > geometry.max_active {
            return Err(format!(
                "{} zones are active but the device allows {}",
                table.active, geometry.max_active
            ));
        }
        Ok(table)
    }

    /// The geometry the table enforces.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Zones currently open (implicitly or explicitly).
    pub fn open_zones(&self) -> u32 {
        self.open
    }

    /// Zones currently active (open or closed).
    pub fn active_zones(&self) -> u32 {
        self.active
    }

    /// One row of the zone report.
    pub fn info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        let z = self.zone(zone)?;
        Ok(ZoneInfo {
            id: zone,
            state: z.state,
            write_pointer: z.write_pointer,
            capacity: self.geometry.zone_capacity,
        })
    }

    /// The state of every zone, in zone order.
    pub fn report(&self) -> Vec<ZoneInfo> {
        (0..self.geometry.zone_count)
            .map(|id| {
                let z = &self.zones[id as usize];
                ZoneInfo {
                    id,
                    state: z.state,
                    write_pointer: z.write_pointer,
                    capacity: self.geometry.zone_capacity,
                }
            })
            .collect()
    }

    /// `(state, write pointer)` per zone as it should be persisted: open zones are recorded
    /// Closed (or Empty), because that is what they are after a restart.
    pub fn persistent_entries(&self) -> Vec<(ZoneState, u64)> {
        self.zones
            .iter()
            .map(|z| {
                let state = match z.state {
                    ZoneState::ImplicitOpen | ZoneState::ExplicitOpen if z.write_pointer == 0 => {
                        ZoneState::Empty
                    }
                    ZoneState::ImplicitOpen | ZoneState::ExplicitOpen => ZoneState::Closed,
                    s => s,
                };
                (state, z.write_pointer)
            })
            .collect()
    }

    /// Checks that `len` bytes may be written at `offset` of `zone` now.
    pub fn check_write(&self, zone: ZoneId, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.plan_write(zone, offset, len).map(|_| ())
    }

    /// Checks a zone append of `len` bytes and returns the offset it will land at.
    pub fn check_append(&self, zone: ZoneId, len: u64) -> Result<u64, DeviceError> {
        let wp = self.zone(zone)?.write_pointer;
        self.plan_write(zone, wp, len)?;
        Ok(wp)
    }

    /// Records a write whose data has landed: opens the zone if needed (closing an implicitly
    /// opened zone to make room), advances the write pointer, and fills the zone at capacity.
    /// Validates again, so a commit without a check is still safe.
    pub fn commit_write(&mut self, zone: ZoneId, offset: u64, len: u64) -> Result<(), DeviceError> {
        let need = self.plan_write(zone, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let i = zone as usize;
        if let OpenNeed::Open { .. } = need {
            self.make_open_room(zone)?;
            self.set_state(i, ZoneState::ImplicitOpen);
        }
        self.touch(i);
        let z = &mut self.zones[i];
        z.write_pointer += len;
        if z.write_pointer == self.geometry.zone_capacity {
            self.set_state(i, ZoneState::Full);
        }
        Ok(())
    }

    /// Checks that `len` bytes at `offset` lie below the write pointer and may be read.
    pub fn check_read(&self, zone: ZoneId, offset: u64, len: u64) -> Result<(), DeviceError> {
        let z = self.zone(zone)?;
        if z.state == ZoneState::Offline {
            return Err(invalid(zone, z.state, "read"));
        }
        match offset.checked_add(len) {
            Some(end) if end <= z.write_pointer => Ok(()),
            _ => Err(DeviceError::ReadPastWritePointer { zone, offset, len }),
        }
    }

    /// Empties the zone (write pointer 0, resources released). Returns the old write pointer
    /// so a backend knows how much space to give back.
    pub fn reset(&mut self, zone: ZoneId) -> Result<u64, DeviceError> {
        let z = *self.zone(zone)?;
        if matches!(z.state, ZoneState::ReadOnly | ZoneState::Offline) {
            return Err(invalid(zone, z.state, "reset"));
        }
        let i = zone as usize;
        self.set_state(i, ZoneState::Empty);
        self.zones[i].write_pointer = 0;
        Ok(z.write_pointer)
    }

    /// Moves the zone to Full (write pointer at capacity), releasing its resources.
    pub fn finish(&mut self, zone: ZoneId) -> Result<(), DeviceError> {
        let z = *self.zone(zone)?;
        if matches!(z.state, ZoneState::ReadOnly | ZoneState::Offline) {
            return Err(invalid(zone, z.state, "finish"));
        }
        let i = zone as usize;
        self.set_state(i, ZoneState::Full);
        self.zones[i].write_pointer = self.geometry.zone_capacity;
        Ok(())
    }

    /// Explicitly opens the zone; it then stays open until closed, finished or filled.
    pub fn open(&mut self, zone: ZoneId) -> Result<(), DeviceError> {
        let z = *self.zone(zone)?;
        let i = zone as usize;
        match z.state {
            ZoneState::ExplicitOpen => return Ok(()),
            ZoneState::ImplicitOpen => {}
            ZoneState::Empty => {
                self.check_resources(zone, true)?;
                self.make_open_room(zone)?;
            }
            ZoneState::Closed => {
                self.check_resources(zone, false)?;
                self.make_open_room(zone)?;
            }
            ZoneState::Full | ZoneState::ReadOnly | ZoneState::Offline => {
                return Err(invalid(zone, z.state, "open"))
            }
        }
        self.set_state(i, ZoneState::ExplicitOpen);
        self.touch(i);
        Ok(())
    }

    /// Closes an open zone: Closed if it holds data, Empty otherwise. Closing a Closed zone
    /// is a no-op.
    pub fn close(&mut self, zone: ZoneId) -> Result<(), DeviceError> {
        let z = *self.zone(zone)?;
        match z.state {
            ZoneState::Closed => Ok(()),
            ZoneState::ImplicitOpen | ZoneState::ExplicitOpen => {
                self.close_index(zone as usize);
                Ok(())
            }
            s => Err(invalid(zone, s, "close")),
        }
    }

    /// Fault injection: puts the zone in `ReadOnly` (reads only) or `Offline` (nothing),
    /// releasing its resources. The write pointer is kept.
    pub fn set_condition(&mut self, zone: ZoneId, state: ZoneState) -> Result<(), DeviceError> {
        let z = *self.zone(zone)?;
        if !matches!(state, ZoneState::ReadOnly | ZoneState::Offline) {
            return Err(invalid(
                zone,
                z.state,
                "set_condition (only ReadOnly or Offline)",
            ));
        }
        if z.state == ZoneState::Offline && state == ZoneState::ReadOnly {
            return Err(invalid(zone, z.state, "set_condition ReadOnly"));
        }
        self.set_state(zone as usize, state);
        Ok(())
    }

    /// Recovery on a device whose write pointers persist lazily: moves the write pointer of
    /// a zone forward to `wp`, where data written and synced before a crash is known to end.
    /// The zone comes back Closed (Full at capacity), as any partly written zone after a
    /// restart. Returns whether it moved. Should the zone not fit the active-zone limit (a
    /// zone finished just before the crash, its finish not yet persisted, still counts as
    /// active), it is finished instead: its data stays readable, its rest unused.
    pub fn restore_write_pointer(&mut self, zone: ZoneId, wp: u64) -> Result<bool, DeviceError> {
        let z = *self.zone(zone)?;
        if wp <= z.write_pointer {
            return Ok(false);
        }
        let g = self.geometry;
        if wp % g.block_size as u64 != 0 || wp > g.zone_capacity {
            return Err(DeviceError::ZoneBoundary {
                zone,
                offset: z.write_pointer,
                len: wp - z.write_pointer,
            });
        }
        match z.state {
            ZoneState::Empty | ZoneState::Closed => {}
            s => return Err(invalid(zone, s, "restore write pointer")),
        }
        let full =
            wp == g.zone_capacity || (z.state == ZoneState::Empty && self.active >= g.max_active);
        let i = zone as usize;
        if full {
            self.set_state(i, ZoneState::Full);
            self.zones[i].write_pointer = g.zone_capacity;
        } else {
            self.set_state(i, ZoneState::Closed);
            self.zones[i].write_pointer = wp;
        }
        Ok(true)
    }

    /// Takes back a write that [`ZoneTable::commit_write`] admitted but whose data never
    /// landed (the host write failed), if nothing was admitted after it.
    pub fn undo_write(&mut self, zone: ZoneId, offset: u64, len: u64) {
        let i = zone as usize;
        let Some(z) = self.zones.get_mut(i) else {
            return;
        };
        if len == 0 || z.write_pointer != offset + len {
            return;
        }
        z.write_pointer = offset;
        let state = match (offset, z.state) {
            (0, _) => ZoneState::Empty,
            (_, ZoneState::Full) => ZoneState::Closed,
            (_, s) => s,
        };
        self.set_state(i, state);
    }

    fn zone(&self, zone: ZoneId) -> Result<&Zone, DeviceError> {
        self.zones
            .get(zone as usize)
            .ok_or(DeviceError::NoSuchZone(zone))
    }

    /// Validates a write and says which state change it needs, without changing anything.
    fn plan_write(&self, zone: ZoneId, offset: u64, len: u64) -> Result<OpenNeed, DeviceError> {
        let z = self.zone(zone)?;
        let need = match z.state {
            ZoneState::ImplicitOpen | ZoneState::ExplicitOpen => OpenNeed::None,
            ZoneState::Empty => OpenNeed::Open { activate: true },
            ZoneState::Closed => OpenNeed::Open { activate: false },
            s => return Err(invalid(zone, s, "write")),
        };
        let bs = self.geometry.block_size as u64;
        if offset % bs != 0 || len % bs != 0 {
            return Err(DeviceError::Unaligned { zone, offset, len });
        }
        if offset != z.write_pointer {
            return Err(DeviceError::NotAtWritePointer {
                zone,
                offset,
                write_pointer: z.write_pointer,
            });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.geometry.zone_capacity => {}
            _ => return Err(DeviceError::ZoneBoundary { zone, offset, len }),
        }
        if len == 0 {
            // Nothing lands, so nothing opens.
            return Ok(OpenNeed::None);
        }
        if let OpenNeed::Open { activate } = need {
            self.check_resources(zone, activate)?;
        }
        Ok(need)
    }

    /// Can `zone` become open (and active, if `activate`)?
    fn check_resources(&self, zone: ZoneId, activate: bool) -> Result<(), DeviceError> {
        let g = &self.geometry;
        if activate && self.active >= g.max_active {
            return Err(DeviceError::TooManyActive(g.max_active));
        }
        if self.open >= g.max_open && self.implicit_victim(zone).is_none() {
            return Err(DeviceError::TooManyOpen(g.max_open));
        }
        Ok(())
    }

    /// Frees an open resource for `zone` if all are taken, by closing the least recently
    /// used implicitly opened zone.
    fn make_open_room(&mut self, zone: ZoneId) -> Result<(), DeviceError> {
        if self.open < self.geometry.max_open {
            return Ok(());
        }
        match self.implicit_victim(zone) {
            Some(victim) => {
                self.close_index(victim);
                Ok(())
            }
            None => Err(DeviceError::TooManyOpen(self.geometry.max_open)),
        }
    }

    fn implicit_victim(&self, except: ZoneId) -> Option<usize> {
        self.zones
            .iter()
            .enumerate()
            .filter(|(i, z)| z.state == ZoneState::ImplicitOpen && *i != except as usize)
            .min_by_key(|(_, z)| z.touched)
            .map(|(i, _)| i)
    }

    fn close_index(&mut self, i: usize) {
        let next = if self.zones[i].write_pointer == 0 {
            ZoneState::Empty
        } else {
            ZoneState::Closed
        };
        self.set_state(i, next);
    }

    fn touch(&mut self, i: usize) {
        self.tick += 1;
        self.zones[i].touched = self.tick;
    }

    /// The one place states change, so the open / active counters stay right.
    fn set_state(&mut self, i: usize, state: ZoneState) {
        let old = self.zones[i].state;
        if old.is_open() {
            self.open -= 1;
        }
        if old.is_active() {
            self.active -= 1;
        }
        if state.is_open() {
            self.open += 1;
        }
        if state.is_active() {
            self.active += 1;
        }
        self.zones[i].state = state;
    }
}

fn invalid(zone: ZoneId, state: ZoneState, op: &'static str) -> DeviceError {
    DeviceError::InvalidState { zone, state, op }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 4096;

    fn geo(zones: u32, max_open: u32, max_active: u32) -> Geometry {
        Geometry {
            zone_count: zones,
            zone_size: 8 * BS,
            zone_capacity: 4 * BS,
            block_size: BS as u32,
            max_open,
            max_active,
        }
    }

    fn table(zones: u32, max_open: u32, max_active: u32) -> ZoneTable {
        ZoneTable::new(geo(zones, max_open, max_active)).unwrap()
    }

    fn write(t: &mut ZoneTable, zone: ZoneId, len: u64) -> Result<u64, DeviceError> {
        let off = t.check_append(zone, len)?;
        t.commit_write(zone, off, len)?;
        Ok(off)
    }

    fn state(t: &ZoneTable, zone: ZoneId) -> ZoneState {
        t.info(zone).unwrap().state
    }

    #[test]
    fn new_table_is_empty_and_validates_geometry() {
        let t = table(3, 2, 2);
        assert!(t
            .report()
            .iter()
            .all(|z| z.state == ZoneState::Empty && z.write_pointer == 0 && z.capacity == 4 * BS));
        assert_eq!(t.report().len(), 3);
        let mut g = geo(3, 2, 2);
        g.max_open = 3;
        assert!(matches!(
            ZoneTable::new(g),
            Err(DeviceError::BadGeometry(_))
        ));
        assert!(matches!(t.info(3), Err(DeviceError::NoSuchZone(3))));
    }

    #[test]
    fn write_must_be_at_write_pointer() {
        let mut t = table(2, 2, 2);
        t.commit_write(0, 0, BS).unwrap();
        assert!(matches!(
            t.check_write(0, 0, BS),
            Err(DeviceError::NotAtWritePointer {
                write_pointer: 4096,
                ..
            })
        ));
        assert!(matches!(
            t.commit_write(0, 2 * BS, BS),
            Err(DeviceError::NotAtWritePointer { .. })
        ));
        t.check_write(0, BS, BS).unwrap();
        assert_eq!(t.info(0).unwrap().write_pointer, BS);
    }

    #[test]
    fn write_must_be_block_aligned() {
        let t = table(1, 1, 1);
        assert!(matches!(
            t.check_write(0, 0, 100),
            Err(DeviceError::Unaligned { len: 100, .. })
        ));
        assert!(matches!(
            t.check_write(0, 512, BS),
            Err(DeviceError::Unaligned { .. })
        ));
    }

    #[test]
    fn write_may_not_cross_capacity_and_filling_makes_full() {
        let mut t = table(1, 1, 1);
        assert!(matches!(
            t.check_write(0, 0, 5 * BS),
            Err(DeviceError::ZoneBoundary { .. })
        ));
        assert!(matches!(
            t.check_write(0, 0, u64::MAX - 4095),
            Err(DeviceError::ZoneBoundary { .. })
        ));
        write(&mut t, 0, 3 * BS).unwrap();
        assert_eq!(state(&t, 0), ZoneState::ImplicitOpen);
        assert_eq!((t.open_zones(), t.active_zones()), (1, 1));
        write(&mut t, 0, BS).unwrap();
        assert_eq!(state(&t, 0), ZoneState::Full);
        assert_eq!((t.open_zones(), t.active_zones()), (0, 0));
        assert!(matches!(
            t.check_append(0, BS),
            Err(DeviceError::InvalidState {
                state: ZoneState::Full,
                ..
            })
        ));
    }

    #[test]
    fn append_returns_write_pointer() {
        let mut t = table(1, 1, 1);
        assert_eq!(write(&mut t, 0, BS).unwrap(), 0);
        assert_eq!(write(&mut t, 0, 2 * BS).unwrap(), BS);
        assert_eq!(t.info(0).unwrap().write_pointer, 3 * BS);
    }

    #[test]
    fn zero_length_write_changes_nothing() {
        let mut t = table(1, 1, 1);
        t.commit_write(0, 0, 0).unwrap();
        assert_eq!(state(&t, 0), ZoneState::Empty);
        assert!(t.check_write(0, BS, 0).is_err());
    }

    #[test]
    fn failed_check_changes_nothing() {
        let mut t = table(1, 1, 1);
        assert!(t.commit_write(0, BS, BS).is_err());
        assert_eq!(state(&t, 0), ZoneState::Empty);
        assert_eq!(t.open_zones(), 0);
    }

    #[test]
    fn reads_only_below_write_pointer() {
        let mut t = table(1, 1, 1);
        assert!(t.check_read(0, 0, 0).is_ok());
        assert!(matches!(
            t.check_read(0, 0, 1),
            Err(DeviceError::ReadPastWritePointer { .. })
        ));
        write(&mut t, 0, BS).unwrap();
        t.check_read(0, 10, 100).unwrap();
        t.check_read(0, 0, BS).unwrap();
        assert!(t.check_read(0, 1, BS).is_err());
        assert!(t.check_read(0, u64::MAX, 2).is_err());
        t.finish(0).unwrap();
        t.check_read(0, 0, 4 * BS).unwrap();
    }

    #[test]
    fn explicit_open_close_transitions() {
        let mut t = table(2, 2, 2);
        t.open(0).unwrap();
        assert_eq!(state(&t, 0), ZoneState::ExplicitOpen);
        t.open(0).unwrap();
        assert_eq!(t.open_zones(), 1);
        // Closing an explicitly opened zone with nothing written makes it Empty again.
        t.close(0).unwrap();
        assert_eq!(state(&t, 0), ZoneState::Empty);
        assert_eq!((t.open_zones(), t.active_zones()), (0, 0));
        assert!(matches!(
            t.close(0),
            Err(DeviceError::InvalidState { op: "close", .. })
        ));
        write(&mut t, 0, BS).unwrap();
        t.close(0).unwrap();
        assert_eq!(state(&t, 0), ZoneState::Closed);
        assert_eq!((t.open_zones(), t.active_zones()), (0, 1));
        t.close(0).unwrap();
        // Writing to a Closed zone opens it implicitly again.
        write(&mut t, 0, BS).unwrap();
        assert_eq!(state(&t, 0), ZoneState::ImplicitOpen);
        // Explicit open upgrades an implicitly open zone.
        t.open(0).unwrap();
        assert_eq!(state(&t, 0), ZoneState::ExplicitOpen);
        write(&mut t, 0, BS).unwrap();
        assert_eq!(state(&t, 0), ZoneState::ExplicitOpen);
        t.close(0).unwrap();
        t.open(0).unwrap();
        assert_eq!(state(&t, 0), ZoneState::ExplicitOpen);
        assert_eq!((t.open_zones(), t.active_zones()), (1, 1));
    }

    #[test]
    fn finish_from_every_writable_state() {
        let mut t = table(4, 4, 4);
        write(&mut t, 1, BS).unwrap();
        t.open(2).unwrap();
        write(&mut t, 3, BS).unwrap();
        t.close(3).unwrap();
        for z in 0..4 {
            t.finish(z).unwrap();
            let info = t.info(z).unwrap();
            assert_eq!(info.state, ZoneState::Full);
            assert_eq!(info.write_pointer, 4 * BS);
        }
        assert_eq!((t.open_zones(), t.active_zones()), (0, 0));
        t.finish(0).unwrap();
        assert!(t.open(0).is_err());
        assert!(t.close(0).is_err());
    }

    #[test]
    fn reset_empties_and_releases() {
        let mut t = table(2, 1, 2);
        write(&mut t, 0, 2 * BS).unwrap();
        assert_eq!(t.reset(0).unwrap(), 2 * BS);
        let info = t.info(0).unwrap();
        assert_eq!((info.state, info.write_pointer), (ZoneState::Empty, 0));
        assert_eq!((t.open_zones(), t.active_zones()), (0, 0));
        t.finish(1).unwrap();
        assert_eq!(t.reset(1).unwrap(), 4 * BS);
        assert_eq!(t.reset(1).unwrap(), 0);
        write(&mut t, 1, BS).unwrap();
    }

    #[test]
    fn read_only_and_offline_conditions() {
        let mut t = table(2, 2, 2);
        write(&mut t, 0, BS).unwrap();
        t.set_condition(0, ZoneState::ReadOnly).unwrap();
        assert_eq!((t.open_zones(), t.active_zones()), (0, 0));
        t.check_read(0, 0, BS).unwrap();
        assert!(t.check_write(0, BS, BS).is_err());
        assert!(t.reset(0).is_err());
        assert!(t.finish(0).is_err());
        assert!(t.open(0).is_err());
        assert!(t.close(0).is_err());
        t.set_condition(0, ZoneState::Offline).unwrap();
        assert!(matches!(
            t.check_read(0, 0, BS),
            Err(DeviceError::InvalidState {
                state: ZoneState::Offline,
                ..
            })
        ));
        assert!(t.check_write(0, BS, BS).is_err());
        assert!(t.reset(0).is_err());
        assert!(t.set_condition(0, ZoneState::ReadOnly).is_err());
        assert!(t.set_condition(1, ZoneState::Full).is_err());
    }

    #[test]
    fn max_open_closes_least_recent_implicit_zone() {
        let mut t = table(4, 2, 4);
        write(&mut t, 0, BS).unwrap();
        write(&mut t, 1, BS).unwrap();
        write(&mut t, 0, BS).unwrap(); // zone 1 is now the least recently used
        write(&mut t, 2, BS).unwrap();
        assert_eq!(state(&t, 1), ZoneState::Closed);
        assert_eq!(state(&t, 0), ZoneState::ImplicitOpen);
        assert_eq!(state(&t, 2), ZoneState::ImplicitOpen);
        assert_eq!((t.open_zones(), t.active_zones()), (2, 3));
    }

    #[test]
    fn max_open_with_only_explicit_zones_fails() {
        let mut t = table(4, 2, 4);
        t.open(0).unwrap();
        t.open(1).unwrap();
        assert!(matches!(
            t.check_write(2, 0, BS),
            Err(DeviceError::TooManyOpen(2))
        ));
        assert!(matches!(t.open(2), Err(DeviceError::TooManyOpen(2))));
        // Writing to an already explicitly open zone needs no resource.
        write(&mut t, 0, BS).unwrap();
        // One implicit zone makes room for an explicit open of another.
        t.close(1).unwrap();
        write(&mut t, 1, BS).unwrap();
        t.open(2).unwrap();
        assert_eq!(state(&t, 1), ZoneState::Closed);
        assert_eq!(state(&t, 2), ZoneState::ExplicitOpen);
        // A Closed zone needs an open resource to be written again.
        assert!(matches!(
            t.check_write(1, BS, BS),
            Err(DeviceError::TooManyOpen(2))
        ));
    }

    #[test]
    fn max_active_counts_open_and_closed() {
        let mut t = table(4, 2, 3);
        write(&mut t, 0, BS).unwrap();
        write(&mut t, 1, BS).unwrap();
        t.close(0).unwrap();
        t.close(1).unwrap();
        write(&mut t, 2, BS).unwrap();
        assert_eq!(t.active_zones(), 3);
        assert!(matches!(
            t.check_write(3, 0, BS),
            Err(DeviceError::TooManyActive(3))
        ));
        assert!(matches!(t.open(3), Err(DeviceError::TooManyActive(3))));
        // Already active zones can still be reopened and written.
        write(&mut t, 0, BS).unwrap();
        // Finishing or resetting one frees an active resource.
        t.finish(1).unwrap();
        write(&mut t, 3, BS).unwrap();
        t.reset(3).unwrap();
        t.open(3).unwrap();
        assert_eq!(t.active_zones(), 3);
    }

    #[test]
    fn implicit_close_does_not_free_an_active_resource() {
        let mut t = table(3, 1, 2);
        write(&mut t, 0, BS).unwrap();
        write(&mut t, 1, BS).unwrap(); // implicitly closes zone 0
        assert_eq!(state(&t, 0), ZoneState::Closed);
        assert!(matches!(
            t.check_write(2, 0, BS),
            Err(DeviceError::TooManyActive(2))
        ));
        write(&mut t, 0, BS).unwrap(); // zone 0 is active already: only swaps the open one
        assert_eq!(state(&t, 1), ZoneState::Closed);
    }

    #[test]
    fn restore_round_trips_and_closes_open_zones() {
        let mut t = table(5, 2, 3);
        write(&mut t, 0, BS).unwrap();
        t.open(1).unwrap();
        write(&mut t, 2, 2 * BS).unwrap();
        t.close(2).unwrap();
        t.finish(3).unwrap();
        t.set_condition(4, ZoneState::ReadOnly).unwrap();
        let saved = t.persistent_entries();
        assert_eq!(
            saved,
            vec![
                (ZoneState::Closed, BS),
                (ZoneState::Empty, 0),
                (ZoneState::Closed, 2 * BS),
                (ZoneState::Full, 4 * BS),
                (ZoneState::ReadOnly, 0),
            ]
        );
        let r = ZoneTable::restore(geo(5, 2, 3), &saved).unwrap();
        assert_eq!(r.persistent_entries(), saved);
        assert_eq!((r.open_zones(), r.active_zones()), (0, 2));
        // Raw open states are accepted and closed.
        let raw = [
            (ZoneState::ImplicitOpen, BS),
            (ZoneState::ExplicitOpen, 0),
            (ZoneState::Empty, 0),
            (ZoneState::Empty, 0),
            (ZoneState::Offline, 0),
        ];
        let r = ZoneTable::restore(geo(5, 2, 3), &raw).unwrap();
        assert_eq!(r.info(0).unwrap().state, ZoneState::Closed);
        assert_eq!(r.info(1).unwrap().state, ZoneState::Empty);
    }

    #[test]
    fn restore_refuses_inconsistent_tables() {
        let g = geo(2, 1, 1);
        let e = (ZoneState::Empty, 0);
        let bad = [
            vec![e],
            vec![(ZoneState::Empty, BS), e],
            vec![(ZoneState::Closed, 5 * BS), e],
            vec![(ZoneState::Closed, 100), e],
            vec![(ZoneState::Closed, 0), e],
            vec![(ZoneState::Closed, 4 * BS), e],
            vec![(ZoneState::Full, BS), e],
            vec![(ZoneState::Closed, BS), (ZoneState::Closed, BS)],
        ];
        for zones in bad {
            let err = ZoneTable::restore(g, &zones).unwrap_err();
            assert!(!err.is_empty() && !err.contains('\n'), "{err}");
        }
    }
}
