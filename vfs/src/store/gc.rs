//! Garbage collection: migrate the valid extents of the zone with the fewest valid blocks
//! into the tenant's GC stream ([`StreamKey::gc`]); the victim is reset once the move is
//! durable.
//!
//! A pass plans under the store's lock (victim, extents to move), then reads and writes
//! with no lock held. Every extent is read with the units that cover it and checked
//! against their checksums ([`super::checksum`]) before it is copied: a block that does not
//! match is never copied under a fresh checksum. Its zone is left as it is (damaged, never
//! chosen again), counted in the stats, and the pass ends. Each moved extent is mapped only if the file still has exactly that
//! extent there when the copy lands: a file overwritten or deleted meanwhile keeps its new
//! data, and the copy is simply dead.

use std::sync::atomic::Ordering;

use super::extent_map::Extent;
use super::state::{Ino, MetaOp};
use super::work::WorkStart;
use super::zone_map::{StreamKey, ZoneUse};
use super::{Inner, Store};
use crate::device::ZoneId;
use crate::hint::Hint;
use crate::Result;

/// Which sealed zone a GC pass takes: always the one with the fewest valid blocks among
/// those the kind allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// Ahead of need (the reclaimer): a zone that frees an eighth of a zone or more, when
    /// the sealed zones hold a zone's worth of dead blocks between them (else no amount of
    /// moving frees a zone, and collecting would only churn).
    Ahead,
    /// For an allocation: any zone with a dead block, on the same condition.
    Needed,
    /// The last resort of an allocation of this tenant down to the reserve: one of its own
    /// zones. Moving it to a fresh zone frees none, but leaves the tenant the victim's
    /// dead blocks to write in, and moves no other tenant's data.
    Own(u32),
}

/// Whether file `ino` maps `ext` at `file_block`, block for block (a moved copy may replace
/// it only then).
pub(super) fn maps(inner: &Inner, ino: Ino, file_block: u64, ext: Extent) -> bool {
    let Some(inode) = inner.state.inodes.get(&ino) else {
        return false;
    };
    let pieces = inode
        .extents
        .pieces(file_block, file_block + ext.len as u64);
    pieces.iter().all(|(fb, e, _)| {
        e.is_some_and(|e| {
            e.zone == ext.zone && e.block as u64 == ext.block as u64 + (fb - file_block)
        })
    })
}

impl Inner {
    /// Sealed data zones that GC may collect, with their valid blocks. A pinned zone is not
    /// one of them: a writer pins the zone it writes until its extent is recorded, so a
    /// zone written to the end may still have blocks about to become valid. A pass that
    /// took them for dead would leave its victim in use after moving the rest, having
    /// spent GC's reserve and freed nothing. (No writer pins a sealed zone anew.)
    fn sealed_zones(&self, with_pinned: bool) -> Vec<(ZoneId, u64)> {
        let cap = self.state.geometry.blocks_per_zone();
        let heads: Vec<ZoneId> = self.heads.values().map(|h| h.zone).collect();
        (0..self.state.geometry.zone_count)
            .filter(|z| matches!(self.state.zones.owner[*z as usize], Some(ZoneUse::Data(_))))
            .filter(|z| !heads.contains(z))
            .filter(|z| !self.to_reset.contains(z) && !self.resetting.contains(z))
            .filter(|z| !self.damaged.contains(z) && self.collecting != Some(*z))
            .filter(|z| self.wp[*z as usize] >= cap && self.written[*z as usize] >= cap)
            .filter(|z| with_pinned || self.pins[*z as usize].load(Ordering::Acquire) == 0)
            .map(|z| (z, self.state.zones.valid_blocks(z) as u64))
            .collect()
    }

    /// The sealed zone with the fewest valid blocks that `pick` takes, if any.
    pub(super) fn gc_victim(&self, pick: Pick) -> Option<ZoneId> {
        self.victim_among(pick, false)
    }

    /// Whether a victim is there counting zones in use now, which are let go the moment a
    /// writer records its extent or a reader is done: worth waiting for, not ENOSPC. (Pins
    /// drop without the lock: one may have dropped since [`Inner::gc_victim`] looked.)
    pub(super) fn victim_in_use(&self) -> bool {
        self.victim_among(Pick::Needed, true).is_some()
    }

    fn victim_among(&self, pick: Pick, with_pinned: bool) -> Option<ZoneId> {
        let cap = self.state.geometry.blocks_per_zone();
        let sealed = self.sealed_zones(with_pinned);
        let dead: u64 = sealed.iter().map(|&(_, valid)| cap - valid).sum();
        let at_reserve = self.free.len() <= self.config.gc_reserve_zones as usize;
        let min_gain = match pick {
            Pick::Ahead => cap / 8,
            _ => 1,
        };
        let tenant_of = |z: ZoneId| match self.state.zones.owner[z as usize] {
            Some(ZoneUse::Data(key)) => Some(key.tenant),
            _ => None,
        };
        let takes = |z: ZoneId, valid: u64| match pick {
            Pick::Ahead | Pick::Needed => dead >= cap && valid <= self.gc_room(z),
            Pick::Own(tenant) => {
                at_reserve && tenant_of(z) == Some(tenant) && valid <= self.gc_room(z)
            }
        };
        sealed
            .into_iter()
            .filter(|&(_, valid)| cap - valid >= min_gain)
            .filter(|&(z, valid)| takes(z, valid))
            .min_by_key(|&(_, valid)| valid)
            .map(|(z, _)| z)
    }

    /// Blocks a pass collecting `victim` can copy into: what is left of its tenant's GC
    /// zone, plus a zone if one is free. A pass must be able to finish, or it would take
    /// space and free none.
    fn gc_room(&self, victim: ZoneId) -> u64 {
        let cap = self.state.geometry.blocks_per_zone();
        let free = if self.free.is_empty() { 0 } else { cap };
        match self.state.zones.owner[victim as usize] {
            Some(ZoneUse::Data(key)) => self.gc_head_room(key.tenant) + free,
            _ => 0,
        }
    }
}

impl Store {
    /// Migrates the victim `pick` takes. Returns false when there is none.
    pub(super) fn collect(&self, pick: Pick) -> Result<bool> {
        let (victim, key, hint) = {
            let mut inner = self.lock()?;
            // One pass at a time: passes at once would each take GC's reserve of free
            // zones for their copies. An allocation that finds one running waits for it.
            if inner.collecting.is_some() {
                return Ok(false);
            }
            inner.retire_full_heads()?;
            let Some(victim) = inner.gc_victim(pick) else {
                return Ok(false);
            };
            let Some(ZoneUse::Data(key)) = inner.state.zones.owner[victim as usize] else {
                return Ok(false);
            };
            // Moved data goes to the tenant's GC stream (see [`StreamKey::gc`]).
            let hint = Hint::zoned(StreamKey::GC_STREAM);
            inner.collecting = Some(victim);
            (victim, key, hint)
        };
        // The copies are the victim's tenant's (on the reclaimer's thread; an allocation's
        // own pass is its guest's thread's time already).
        let start = WorkStart::now();
        let moved = self.empty_victim(victim, key, &hint);
        self.charge_work(key.tenant, start);
        if let Ok(mut inner) = self.lock() {
            inner.collecting = None;
            // Usually the last moved extent's record put the victim on the reset list; a
            // victim whose data had all died before the pass (so no record emptied it) goes
            // there now, or passes would pick it again and again.
            // (Unless that record's commit already reset the zone and it is in use again.)
            let z = victim as usize;
            let still_sealed = inner.wp[z] >= inner.state.geometry.blocks_per_zone()
                && !inner.free.contains(&victim)
                && !inner.resetting.contains(&victim)
                && !inner.heads.values().any(|h| h.zone == victim);
            if still_sealed
                && inner.state.zones.valid_blocks(victim) == 0
                && !inner.damaged.contains(&victim)
            {
                inner.to_reset.insert(victim);
            }
        }
        self.notify();
        moved?;
        Ok(true)
    }

    /// Moves the victim's valid extents until none is left. A file overwritten while its
    /// extent is copied keeps its new data, and what is left of the old extent (a part not
    /// overwritten) is still in the victim: the next round moves it. Had a pass stopped
    /// with data left, it would have spent room and freed no zone: on a nearly full device,
    /// that is how the GC reserve runs out.
    fn empty_victim(&self, victim: ZoneId, key: StreamKey, hint: &Hint) -> Result<()> {
        // No writer adds to a sealed zone, so each round has less to do unless the
        // application overwrites exactly what is being copied, round after round; the
        // bound keeps such a pass from running forever (the zone is simply chosen again).
        const ROUNDS: usize = 8;
        for _ in 0..ROUNDS {
            let moving = {
                let inner = self.lock()?;
                let mut moving: Vec<(Ino, u64, Extent)> = Vec::new();
                for (&ino, inode) in &inner.state.inodes {
                    for (file_block, ext) in inode.extents.iter() {
                        if ext.zone == victim {
                            moving.push((ino, file_block, ext));
                        }
                    }
                }
                moving
            };
            if moving.is_empty() || !self.move_extents(victim, key, hint, moving)? {
                break;
            }
        }
        Ok(())
    }

    /// Copies `moving` out of the victim; false if the pass must end (a checksum mismatch).
    fn move_extents(
        &self,
        victim: ZoneId,
        key: StreamKey,
        hint: &Hint,
        mut moving: Vec<(Ino, u64, Extent)>,
    ) -> Result<bool> {
        moving.sort_by_key(|(_, _, e)| e.block);
        let bs = self.shared.device.geometry().block_size as u64;
        for (ino, file_block, ext) in moving {
            // Read with the victim pinned (not reset under the reader), and only while the
            // pin is needed: the allocations below may need the victim's reset themselves.
            let (units, complete) = {
                let inner = self.lock()?;
                if !maps(&inner, ino, file_block, ext) {
                    continue;
                }
                self.shared.pins[victim as usize].fetch_add(1, Ordering::AcqRel);
                inner.state.units.covering(victim, ext.block, ext.len)
            };
            let read = self.read_verified(victim, ext.block, ext.len, &units, complete);
            self.unpin(victim);
            let data = match read? {
                Ok((data, _)) => data,
                Err(mismatch) => {
                    self.lock()?.note_damage(&mismatch);
                    return Ok(false);
                }
            };
            let mut done = 0u32;
            while done < ext.len {
                let r = self.allocate(StreamKey::gc(key.tenant), hint, ext.len - done, true)?;
                let range = (done as u64 * bs) as usize..((done + r.blocks) as u64 * bs) as usize;
                let bytes = &data[range];
                let crc = self.write_copy(r, bytes)?;
                let mut inner = self.lock()?;
                let c = inner.counters.streams.entry(key).or_default();
                c.gc += bytes.len() as u64;
                c.device += bytes.len() as u64;
                // Map the copy only over the very blocks it copied, if still the file's.
                let piece = Extent {
                    zone: victim,
                    block: ext.block + done,
                    len: r.blocks,
                };
                let current = maps(&inner, ino, file_block + done as u64, piece);
                if current {
                    inner.record(MetaOp::MapExtent {
                        ino,
                        file_block: file_block + done as u64,
                        extent: r.extent(),
                        crc,
                    })?;
                }
                drop(inner);
                self.unpin(r.zone);
                done += r.blocks;
            }
        }
        Ok(true)
    }
}
