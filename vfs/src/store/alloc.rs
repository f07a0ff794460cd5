//! The ZNS resolver and zone lifecycle: which zone a stream appends to, opening zones within
//! the device's active limit, sealing zones, resetting zones whose data all died.
//!
//! Allocation reserves blocks under the store's lock by advancing the store's write pointer
//! of the zone; the caller writes them with no lock held (see [`Store::write_blocks`]) and
//! the zone's `written` pointer follows. When allocation needs work that must not run under
//! the lock (a commit that lets emptied zones be reset, a GC pass), it says so with a
//! [`Need`] and the caller does that work and asks again.

use std::sync::atomic::Ordering;

use super::extent_map::Extent;
use super::gc::Pick;
use super::journal::META_ZONES;
use super::state::MetaOp;
use super::zone_map::{StreamKey, ZoneUse};
use super::{Inner, Store};
use crate::device::{ZoneId, ZonePlacement};
use crate::hint::Hint;
use crate::resolver::ZnsHead;
use crate::{Error, Result};

/// Blocks reserved for one write: `(zone, first block, blocks)`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reserved {
    pub zone: ZoneId,
    pub block: u32,
    pub blocks: u32,
}

impl Reserved {
    /// The extent these blocks make once written.
    pub fn extent(&self) -> Extent {
        Extent {
            zone: self.zone,
            block: self.block,
            len: self.blocks,
        }
    }
}

/// How long an allocation waits for work in flight (writes, resets, a GC pass, pinned
/// zones) to give it room before it looks for space elsewhere and may report ENOSPC. A
/// time, not a count of wake-ups: on a busy store, wake-ups come by the thousand a second.
/// A thread never waits on its own pin (a flush records each piece before it allocates the
/// next), so the bound only guards against a bug turning into a hang.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Work an allocation needs done outside the lock before it can succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// A commit: zones whose data died become free once it is durable.
    Commit,
    /// A GC pass on the allocating call: no zone outside the reserve is left.
    Collect(Pick),
    /// Writes in flight must complete first (a zone to seal is still being written).
    InFlight,
}

impl Store {
    /// Reserves up to `want` blocks for stream `key` and pins their zone; the caller writes
    /// them with [`Store::write_blocks`]. Runs commits and GC passes as allocation needs
    /// them. `for_gc` may dip into the reserve and never starts another collection.
    pub(super) fn allocate(
        &self,
        key: StreamKey,
        hint: &Hint,
        want: u32,
        for_gc: bool,
    ) -> Result<Reserved> {
        // Waits for work in flight (bounded, see PATIENCE).
        let started = std::time::Instant::now();
        let mut out_of_patience = false;
        loop {
            let need = {
                let mut inner = self.lock()?;
                let patient = started.elapsed() < PATIENCE;
                if !patient && !out_of_patience {
                    // A wait for nothing: worth a look (the stats count it).
                    out_of_patience = true;
                    inner.counters.allocation_stalls += 1;
                }
                match inner.try_allocate(key, hint, want, for_gc, patient)? {
                    Ok(r) => {
                        self.shared.pins[r.zone as usize].fetch_add(1, Ordering::AcqRel);
                        let low = inner.config.gc_low_zones as usize;
                        let (short, short_soon) = (inner.free.len() < low, inner.free_soon() < low);
                        drop(inner);
                        if short && !for_gc {
                            // Zones waiting for a reset may be enough: then only reset them.
                            match short_soon {
                                true => self.shared.reclaimer.wake(),
                                false => self.shared.reclaimer.wake_for_resets(),
                            }
                        }
                        return Ok(r);
                    }
                    Err(need) => match need {
                        Need::InFlight => {
                            // Pins drop without the lock, so wait a little at most.
                            let wait = std::time::Duration::from_millis(1);
                            drop(self.shared.changed.wait_timeout(inner, wait));
                            continue;
                        }
                        need => need,
                    },
                }
            };
            match need {
                Need::Commit => self.commit_for_resets()?,
                Need::Collect(pick) => {
                    self.shared.reclaimer.wake();
                    if self.collect(pick)? {
                        self.lock()?.counters.gc_foreground_passes += 1;
                    }
                }
                Need::InFlight => {}
            }
        }
    }
}

impl Inner {
    fn blocks_per_zone(&self) -> u64 {
        self.state.geometry.blocks_per_zone()
    }

    /// One allocation attempt under the lock: blocks reserved, or the work that must be
    /// done first. Collection ahead of need is the reclaimer's ([`super::reclaim`]); only
    /// when no zone is left outside the reserve does an allocation ask for collections on
    /// its own call until one frees.
    pub(super) fn try_allocate(
        &mut self,
        key: StreamKey,
        hint: &Hint,
        want: u32,
        for_gc: bool,
        patient: bool,
    ) -> Result<std::result::Result<Reserved, Need>> {
        if !for_gc {
            self.current_group.insert(key, hint.group);
            // At the reserve, a running GC pass may be filling a head zone it took from the
            // reserve: writes that shared that zone could leave the pass no room to finish.
            let at_reserve = self.free.len() as u32 <= self.config.gc_reserve_zones;
            if at_reserve && patient && self.collecting.is_some() {
                return Ok(Err(Need::InFlight));
            }
        }
        if let Some(found) = self.use_head(key, hint, want)? {
            return Ok(Ok(self.reserve(found)));
        }
        let reserve = if for_gc {
            0
        } else {
            self.config.gc_reserve_zones as usize
        };
        if self.free.len() > reserve {
            let zone = match self.open_zone(key, hint.group)? {
                Ok(zone) => zone,
                Err(need) => return Ok(Err(need)),
            };
            self.heads.insert(
                key,
                ZnsHead {
                    zone,
                    group: hint.group,
                },
            );
            let tick = self.touch();
            self.head_used.insert(key, tick);
            let blocks = self.blocks_per_zone().min(want as u64) as u32;
            return Ok(Ok(self.reserve(Reserved {
                zone,
                block: 0,
                blocks,
            })));
        }
        self.retire_full_heads()?;
        match self.reset_need() {
            Some(Need::InFlight) if !patient => {}
            Some(need) => return Ok(Err(need)),
            None => {}
        }
        // Another pass is moving data out of a zone: its reset is the space to wait for.
        if !for_gc && patient && self.collecting.is_some() {
            return Ok(Err(Need::InFlight));
        }
        if !for_gc && self.gc_victim(Pick::Needed).is_some() {
            return Ok(Err(Need::Collect(Pick::Needed)));
        }
        if !for_gc && patient && self.victim_in_use() {
            return Ok(Err(Need::InFlight));
        }
        if self.retire_empty_heads()? {
            return Ok(Err(Need::Commit));
        }
        if self.seal_pending.iter().any(|&s| s) {
            return Ok(Err(Need::InFlight));
        }
        // Writes of other threads still in flight: the zones they fill become collectable
        // when they land (no thread allocates while it holds an unwritten reservation).
        if patient && self.writes_in_flight() {
            return Ok(Err(Need::InFlight));
        }
        if let Some(r) = self.borrow_head(key, want) {
            return Ok(Ok(self.reserve(r)));
        }
        // Down to the reserve with nothing to borrow: many tenants' half-written zones
        // may be what fills the device. Seal a tenant's open zone whose data fits in its
        // GC zone (GC can then collect it), else give the tenant room in its own zones.
        if !for_gc {
            if self.seal_mergeable_head()? {
                return Ok(Err(Need::Collect(Pick::Needed)));
            }
            let own = Pick::Own(key.tenant);
            if self.gc_victim(own).is_some() {
                return Ok(Err(Need::Collect(own)));
            }
        }
        // Say what the room for data is, not the raw device: the metadata zones and GC's
        // reserve are never the guests'.
        let live = self.state.zones.total_valid() * self.state.block_size();
        let geometry = &self.state.geometry;
        let data_zones = geometry.zone_count.saturating_sub(META_ZONES.len() as u32);
        Err(Error::NoSpace(format!(
            "{live} bytes of live data are in the device's {data_zones} data zones of {} bytes \
             ({} of them kept for GC): no zone can be freed",
            geometry.zone_capacity, self.config.gc_reserve_zones
        )))
    }

    /// Whether reserved blocks of some zone are not written yet.
    fn writes_in_flight(&self) -> bool {
        self.written.iter().zip(&self.wp).any(|(w, r)| w < r)
    }

    /// Free zones, counting those waiting for their reset (free space on its way).
    pub(super) fn free_soon(&self) -> usize {
        self.free.len() + self.to_reset.len() + self.resetting.len()
    }

    /// Whether a zone waiting for its reset could be reset by a commit now.
    pub(super) fn resettable_now(&self) -> bool {
        self.reset_need() == Some(Need::Commit)
    }

    /// What it takes to get the zones waiting for a reset back: a commit if one can be
    /// reset now, else the end of the reads and writes that still use them. A zone no one
    /// uses any more whose data came back to life also takes a commit: one written to while
    /// it emptied (the write in flight, recorded after its zone's last block died) waits
    /// here with live blocks, and only a commit's [`Store::reset_zones`] seals it again
    /// (for GC). Waiting for it instead waited for nothing, for the whole PATIENCE.
    fn reset_need(&self) -> Option<Need> {
        if self.to_reset.is_empty() {
            // A commit is resetting zones now: they come back when it is done.
            return (!self.resetting.is_empty()).then_some(Need::InFlight);
        }
        let ready = self.to_reset.iter().any(|&zone| {
            let z = zone as usize;
            self.pins[z].load(Ordering::Acquire) == 0 && self.written[z] == self.wp[z]
        });
        Some(if ready { Need::Commit } else { Need::InFlight })
    }

    /// Advances the store's write pointer over reserved blocks.
    fn reserve(&mut self, r: Reserved) -> Reserved {
        debug_assert_eq!(self.wp[r.zone as usize], r.block as u64);
        self.wp[r.zone as usize] += r.blocks as u64;
        r
    }

    /// The last resort before ENOSPC: room in the open zone of another stream of the same
    /// tenant (tenants never share a zone). Mixing lifetimes there costs GC work later;
    /// refusing a write whose data fits the device would cost the application now.
    fn borrow_head(&mut self, key: StreamKey, want: u32) -> Option<Reserved> {
        let cap = self.blocks_per_zone();
        let (zone, wp) = self
            .heads
            .iter()
            .filter(|(k, _)| **k != key && k.tenant == key.tenant)
            .map(|(_, h)| (h.zone, self.wp[h.zone as usize]))
            .filter(|&(z, wp)| {
                wp < cap && !self.fault[z as usize] && !self.seal_pending[z as usize]
            })
            .max_by_key(|&(z, wp)| (cap - wp, std::cmp::Reverse(z)))?;
        Some(Reserved {
            zone,
            block: wp as u32,
            blocks: (cap - wp).min(want as u64) as u32,
        })
    }

    /// Blocks left in the zone `tenant`'s GC copies go to.
    pub(super) fn gc_head_room(&self, tenant: u32) -> u64 {
        let cap = self.blocks_per_zone();
        self.heads
            .get(&StreamKey::gc(tenant))
            .map(|h| h.zone as usize)
            .filter(|&z| !self.fault[z] && !self.seal_pending[z])
            .map_or(0, |z| cap.saturating_sub(self.wp[z]))
    }

    /// With no zone to free and none to take, the zones a tenant holds open may merge:
    /// seals the head whose live blocks fit in what is left of its tenant's GC zone, so
    /// that GC can move them there and free its zone. Every tenant appends to a zone of
    /// its own per stream, and GC to one more, so on a device with many tenants those
    /// half-written zones, not the live data, would otherwise run the device out of
    /// space. Returns whether it sealed one.
    fn seal_mergeable_head(&mut self) -> Result<bool> {
        let candidate = self
            .heads
            .iter()
            .filter(|(k, _)| k.stream != StreamKey::GC_STREAM)
            .map(|(k, h)| (*k, h.zone, self.state.zones.valid_blocks(h.zone) as u64))
            .filter(|&(_, zone, _)| self.pins[zone as usize].load(Ordering::Acquire) == 0)
            .filter(|&(k, _, valid)| valid <= self.gc_head_room(k.tenant))
            .min_by_key(|&(_, zone, valid)| (valid, zone));
        let Some((key, _, _)) = candidate else {
            return Ok(false);
        };
        self.retire_head(key)?;
        Ok(true)
    }

    /// The stream's head zone if it can take this hint's data.
    fn use_head(&mut self, key: StreamKey, hint: &Hint, want: u32) -> Result<Option<Reserved>> {
        let cap = self.blocks_per_zone();
        let Some(head) = self.heads.get(&key).copied() else {
            return Ok(None);
        };
        let wp = self.wp[head.zone as usize];
        if wp >= cap || self.fault[head.zone as usize] {
            self.retire_head(key)?;
            return Ok(None);
        }
        if !head.accepts(hint) && wp > 0 {
            // The policy wants this lifetime group apart: seal the zone.
            self.seal(head.zone)?;
            self.retire_head(key)?;
            return Ok(None);
        }
        self.heads.get_mut(&key).expect("head").group = hint.group;
        let tick = self.touch();
        self.head_used.insert(key, tick);
        Ok(Some(Reserved {
            zone: head.zone,
            block: wp as u32,
            blocks: (cap - wp).min(want as u64) as u32,
        }))
    }

    /// Notes that the device write of `blocks` at `block` completed (writes of a zone
    /// complete in reservation order); finishes the zone if it was waiting for that.
    pub(super) fn wrote(&mut self, zone: ZoneId, block: u32, blocks: u32) -> Result<()> {
        let z = zone as usize;
        debug_assert_eq!(self.written[z], block as u64);
        self.written[z] = block as u64 + blocks as u64;
        self.unsynced_writes = true;
        self.changes += 1;
        if self.seal_pending[z] && self.written[z] == self.wp[z] {
            self.seal(zone)?;
        }
        Ok(())
    }

    /// Data zones holding a partial write pointer on the device: each holds an
    /// active-zone resource. A zone whose last blocks are reserved stays active until they
    /// are written (`written`, not `wp`, is what the device has).
    fn active_data_zones(&self) -> usize {
        let cap = self.blocks_per_zone();
        (0..self.wp.len())
            .filter(|&z| {
                self.wp[z] > 0
                    && self.written[z] < cap
                    && !matches!(self.state.zones.owner[z], Some(ZoneUse::Meta))
            })
            .count()
    }

    /// How many data zones may be active: the device limit less the metadata zone and the
    /// one a checkpoint briefly needs.
    fn active_budget(&self) -> usize {
        (self.state.geometry.max_active as usize)
            .saturating_sub(2)
            .max(1)
    }

    /// Takes a free zone for stream `key`, making room under the active limit first.
    fn open_zone(
        &mut self,
        key: StreamKey,
        group: u32,
    ) -> Result<std::result::Result<ZoneId, Need>> {
        while self.active_data_zones() >= self.active_budget() {
            if self.reset_need() == Some(Need::Commit) {
                // Emptied zones still hold active resources until their reset.
                return Ok(Err(Need::Commit));
            }
            // Seal the least recently used other stream's zone (what a drive would need).
            let victim = self
                .heads
                .iter()
                .filter(|(k, h)| **k != key && self.wp[h.zone as usize] > 0)
                .min_by_key(|(k, _)| self.head_used.get(k).copied().unwrap_or(0))
                .map(|(k, h)| (*k, h.zone));
            let Some((victim_key, zone)) = victim else {
                // Zones with writes in flight stop being active when those land.
                if self.writes_in_flight() || self.seal_pending.iter().any(|&s| s) {
                    return Ok(Err(Need::InFlight));
                }
                return Err(Error::NoSpace(
                    "more streams than the device's active zones allow".into(),
                ));
            };
            self.seal(zone)?;
            self.retire_head(victim_key)?;
            if self.seal_pending[zone as usize] {
                return Ok(Err(Need::InFlight));
            }
        }
        let zone = *self
            .free
            .iter()
            .next()
            .ok_or_else(|| Error::NoSpace("no free zone".into()))?;
        self.free.remove(&zone);
        self.record(MetaOp::AssignZone {
            zone,
            owner: ZoneUse::Data(key),
        })?;
        let placement = ZonePlacement {
            tenant: key.tenant,
            stream: key.stream,
            group,
        };
        self.device.assign_zone(zone, &placement);
        Ok(Ok(zone))
    }

    /// Finishes a zone so it stops holding an active resource; a zone with writes in
    /// flight is finished when the last of them completes. (Finish is a zone-table update
    /// on the emulated device and one `ftruncate` on zonefs: it may run under the lock.)
    pub(super) fn seal(&mut self, zone: ZoneId) -> Result<()> {
        let z = zone as usize;
        if self.written[z] != self.wp[z] {
            self.seal_pending[z] = true;
            return Ok(());
        }
        self.seal_pending[z] = false;
        if self.wp[z] >= self.blocks_per_zone() {
            return Ok(());
        }
        self.device.finish(zone)?;
        self.wp[z] = self.blocks_per_zone();
        self.written[z] = self.wp[z];
        self.counters.finishes += 1;
        self.unsynced_writes = true;
        self.changes += 1;
        Ok(())
    }

    /// Moves zones whose last valid block died to the reset list (reset after the commit
    /// that makes their death durable).
    pub(super) fn reclaim_emptied(&mut self) {
        while let Some(zone) = self.state.emptied.pop() {
            if self.state.zones.valid_blocks(zone) != 0 {
                continue;
            }
            let Some(ZoneUse::Data(key)) = self.state.zones.owner[zone as usize] else {
                continue;
            };
            if self.resetting.contains(&zone) {
                // A commit is resetting it already (it emptied, came alive with a late
                // write's record and emptied again meanwhile).
                continue;
            }
            if self.collecting == Some(zone) {
                // A GC pass is emptying it: the pass queues its reset when it ends. Reset
                // now, the zone could be reused by another stream (or tenant) while the
                // pass still looks for extents in it, and move their new data.
                continue;
            }
            if self.heads.get(&key).is_some_and(|h| h.zone == zone) {
                // Still being filled: keep appending to it. Resetting it now would, for a
                // stream of short-lived files (a database's rollback journal, created and
                // deleted per transaction), reset and rewrite the same zone every time.
                // It is reset when retired, if still empty then.
                continue;
            }
            self.to_reset.insert(zone);
        }
    }

    /// Retires the head zones that hold no live data (their space is needed elsewhere);
    /// returns whether there were any.
    fn retire_empty_heads(&mut self) -> Result<bool> {
        let empty: Vec<StreamKey> = self
            .heads
            .iter()
            .filter(|(_, h)| {
                self.wp[h.zone as usize] > 0 && self.state.zones.valid_blocks(h.zone) == 0
            })
            .map(|(k, _)| *k)
            .collect();
        for key in &empty {
            self.retire_head(*key)?;
        }
        Ok(!empty.is_empty())
    }

    /// Retires the head zones that are full: a stream retires its head when it next writes,
    /// but a stream that stopped writing would keep a full zone out of GC's reach forever.
    pub(super) fn retire_full_heads(&mut self) -> Result<()> {
        let cap = self.blocks_per_zone();
        let full: Vec<StreamKey> = self
            .heads
            .iter()
            .filter(|(_, h)| self.wp[h.zone as usize] >= cap)
            .map(|(k, _)| *k)
            .collect();
        for key in full {
            self.retire_head(key)?;
        }
        Ok(())
    }

    /// Stops appending to `key`'s head zone (see [`Inner::retire_zone`]).
    pub(super) fn retire_head(&mut self, key: StreamKey) -> Result<()> {
        match self.heads.remove(&key) {
            Some(head) => self.retire_zone(head.zone),
            None => Ok(()),
        }
    }

    /// A data zone nobody appends to any more: reset after the next commit if none of its
    /// data is live or on its way (a write in flight, or written and not yet recorded: its
    /// writer still pins the zone), else sealed, so that GC can collect it. A zone left
    /// half written and unsealed could be neither collected nor reset: its space would be
    /// lost until the next mount.
    pub(super) fn retire_zone(&mut self, zone: ZoneId) -> Result<()> {
        let z = zone as usize;
        let idle = self.pins[z].load(Ordering::Acquire) == 0 && self.written[z] == self.wp[z];
        if idle && self.state.zones.valid_blocks(zone) == 0 {
            self.to_reset.insert(zone);
            Ok(())
        } else {
            self.seal(zone)
        }
    }

    /// A zone the device has just reset goes back to the free list.
    pub(super) fn zone_emptied(&mut self, zone: ZoneId) -> Result<()> {
        let z = zone as usize;
        self.wp[z] = 0;
        self.written[z] = 0;
        self.fault[z] = false;
        self.seal_pending[z] = false;
        self.zone_resets[z] += 1;
        self.counters.resets += 1;
        if self.state.zones.owner[z].is_some() {
            self.record(MetaOp::ReleaseZone { zone })?;
        }
        self.free.insert(zone);
        Ok(())
    }

    /// Resets the zones in the reset list now (mount only: nothing else runs yet).
    pub(super) fn reset_now(&mut self) -> Result<()> {
        for zone in std::mem::take(&mut self.to_reset) {
            if self.state.zones.valid_blocks(zone) != 0 {
                continue;
            }
            self.device.reset(zone)?;
            self.zone_emptied(zone)?;
        }
        Ok(())
    }
}
