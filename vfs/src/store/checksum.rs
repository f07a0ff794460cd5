//! Extent checksums: the crc32c of every unit of data as it was written, kept for as long as
//! any of its blocks is live, so that GC never launders a damaged block into a fresh
//! checksum and `fsck --deep` can read and verify every live block.
//!
//! A *unit* is one device write the store made and mapped: a flushed piece of a file or a GC
//! copy, at most one buffer (512 KiB). Its [`MetaOp::MapExtent`] already carries its crc for
//! recovery, so the live path journals nothing more; a checkpoint carries the units of the
//! zones that hold data ([`MetaOp::Units`]). Extents split by later overwrites keep pointing
//! into their unit: verifying a piece reads its whole unit. Units are indexed per zone by
//! their first block and dropped once none of their blocks is live.
//!
//! Blocks written by a store that did not keep units (before this format) have none and are
//! reported as unverified, never as damaged.
//!
//! [`MetaOp::MapExtent`]: super::state::MetaOp::MapExtent
//! [`MetaOp::Units`]: super::state::MetaOp::Units

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::zone_map::ZoneMap;
use super::{Inner, Store};
use crate::device::ZoneId;
use crate::Result;

/// One written unit: `len` blocks from `block` of its zone, with their crc32c.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    pub block: u32,
    pub len: u32,
    pub crc: u32,
}

impl Unit {
    fn end(&self) -> u32 {
        self.block + self.len
    }
}

/// The units of every zone.
#[derive(Clone, Debug)]
pub struct Units {
    zones: Vec<BTreeMap<u32, Unit>>,
}

impl Units {
    pub fn new(zones: u32) -> Self {
        Units {
            zones: vec![BTreeMap::new(); zones as usize],
        }
    }

    /// Records a unit written to `zone`. A unit at the same first block replaces the old one
    /// (the zone was reset and written anew).
    pub fn add(&mut self, zone: ZoneId, unit: Unit) {
        let units = &mut self.zones[zone as usize];
        // Units of one zone never overlap unless the zone was reset in between.
        let stale: Vec<u32> = units
            .range(..unit.end())
            .rev()
            .take_while(|(_, u)| u.end() > unit.block)
            .map(|(&b, _)| b)
            .collect();
        for b in stale {
            units.remove(&b);
        }
        units.insert(unit.block, unit);
    }

    /// The units that cover blocks `block..block + len` of `zone`, in block order, and
    /// whether every block of the range is covered by one.
    pub fn covering(&self, zone: ZoneId, block: u32, len: u32) -> (Vec<Unit>, bool) {
        let units = &self.zones[zone as usize];
        let end = block + len;
        let mut found: Vec<Unit> = units
            .range(..end)
            .rev()
            .take_while(|(_, u)| u.end() > block)
            .map(|(_, u)| *u)
            .collect();
        found.reverse();
        let mut next = block;
        for u in &found {
            if u.block > next {
                break;
            }
            next = next.max(u.end());
        }
        let complete = next >= end;
        (found, complete)
    }

    /// Drops the units of `zone` that overlap `block..block + len` and hold no live block
    /// any more (called when those blocks die).
    pub fn prune(&mut self, zone: ZoneId, block: u32, len: u32, validity: &ZoneMap) {
        let (overlapping, _) = self.covering(zone, block, len);
        let live = &validity.validity[zone as usize];
        for u in overlapping {
            if !(u.block..u.end()).any(|b| live.is_valid(b)) {
                self.zones[zone as usize].remove(&u.block);
            }
        }
    }

    /// Forgets every unit of a released zone.
    pub fn clear(&mut self, zone: ZoneId) {
        self.zones[zone as usize].clear();
    }

    /// The units of `zone`, in block order.
    pub fn of_zone(&self, zone: ZoneId) -> Vec<Unit> {
        self.zones[zone as usize].values().copied().collect()
    }
}

/// What a verified read found wrong: the first unit whose data does not match its crc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub zone: ZoneId,
    pub unit: Unit,
    pub found: u32,
}

impl Inner {
    /// A copy (GC's, defragmentation's) found data that does not match its checksum: its
    /// zone is left as it is, never collected or copied from again, and counted.
    pub(super) fn note_damage(&mut self, mismatch: &Mismatch) {
        self.damaged.insert(mismatch.zone);
        self.counters.checksum_failures += 1;
        self.counters.last_checksum_failure = Some(mismatch.to_string());
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "zone {} blocks {}..{}: crc32c {:08x}, written as {:08x}",
            self.zone,
            self.unit.block,
            self.unit.end(),
            self.found,
            self.unit.crc
        )
    }
}

/// Blocks of a verified read: checked against their units, or without a unit to check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    pub blocks: u64,
    pub unverified: u64,
}

impl Store {
    /// Reads blocks `block..block + len` of `zone` (pinned by the caller) by reading the
    /// units that cover them whole and checking each against its crc. `units` and
    /// `complete` come from [`Units::covering`], taken under the lock with the pin.
    pub(super) fn read_verified(
        &self,
        zone: ZoneId,
        block: u32,
        len: u32,
        units: &[Unit],
        complete: bool,
    ) -> Result<std::result::Result<(Vec<u8>, Verified), Mismatch>> {
        let bs = self.shared.device.geometry().block_size as usize;
        let start = units.first().map_or(block, |u| u.block.min(block));
        let end = units
            .last()
            .map_or(block + len, |u| u.end().max(block + len));
        let mut span = vec![0u8; (end - start) as usize * bs];
        self.shared
            .device
            .read(zone, start as u64 * bs as u64, &mut span)?;
        for unit in units {
            let at = (unit.block - start) as usize * bs;
            let found = crc32c::crc32c(&span[at..at + unit.len as usize * bs]);
            if found != unit.crc {
                return Ok(Err(Mismatch {
                    zone,
                    unit: *unit,
                    found,
                }));
            }
        }
        let covered: u64 = match complete {
            true => len as u64,
            false => (block..block + len)
                .filter(|b| units.iter().any(|u| (u.block..u.end()).contains(b)))
                .count() as u64,
        };
        let at = (block - start) as usize * bs;
        span.truncate(at + len as usize * bs);
        span.drain(..at);
        let verified = Verified {
            blocks: covered,
            unverified: len as u64 - covered,
        };
        Ok(Ok((span, verified)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(block: u32, len: u32) -> Unit {
        Unit {
            block,
            len,
            crc: block,
        }
    }

    #[test]
    fn covering_finds_overlaps_and_gaps() {
        let mut u = Units::new(2);
        u.add(1, unit(0, 4));
        u.add(1, unit(4, 2));
        u.add(1, unit(8, 8));
        let (found, complete) = u.covering(1, 2, 4);
        assert_eq!(found, vec![unit(0, 4), unit(4, 2)]);
        assert!(complete);
        let (found, complete) = u.covering(1, 5, 4);
        assert_eq!(found, vec![unit(4, 2), unit(8, 8)]);
        assert!(!complete, "blocks 6 and 7 have no unit");
        assert_eq!(u.covering(0, 0, 10), (vec![], false));
    }

    #[test]
    fn a_rewritten_zone_replaces_its_old_units() {
        let mut u = Units::new(1);
        u.add(0, unit(0, 4));
        u.add(0, unit(4, 4));
        u.add(0, unit(2, 4));
        assert_eq!(u.of_zone(0), vec![unit(2, 4)]);
    }

    #[test]
    fn prune_drops_only_dead_units() {
        let mut zones = ZoneMap::new(1, 64);
        let mut u = Units::new(1);
        u.add(0, unit(0, 4));
        u.add(0, unit(4, 4));
        zones.mark_valid(0, 0, 8);
        zones.mark_invalid(0, 2, 4);
        u.prune(0, 2, 4, &zones);
        assert_eq!(u.of_zone(0).len(), 2, "both units keep a live block");
        zones.mark_invalid(0, 0, 2);
        u.prune(0, 0, 2, &zones);
        assert_eq!(u.of_zone(0), vec![unit(4, 4)]);
        u.clear(0);
        assert!(u.of_zone(0).is_empty());
    }
}
