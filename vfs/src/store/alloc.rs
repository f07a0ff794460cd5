//! The ZNS resolver and zone lifecycle: which zone a stream appends to, opening zones within
//! the device's active limit, resetting zones whose data all died.

use super::state::MetaOp;
use super::zone_map::{StreamKey, ZoneUse};
use super::Inner;
use crate::device::ZoneId;
use crate::hint::Hint;
use crate::resolver::ZnsHead;
use crate::{Error, Result};

impl Inner {
    fn blocks_per_zone(&self) -> u64 {
        self.state.geometry.blocks_per_zone()
    }

    /// Chooses where up to `want` blocks of stream `key` go: `(zone, first block, blocks)`.
    /// The caller writes them and calls [`Inner::advance`]. `for_gc` may dip into the
    /// reserve and never starts another collection.
    pub(super) fn allocate(
        &mut self,
        key: StreamKey,
        hint: &Hint,
        want: u32,
        for_gc: bool,
    ) -> Result<(ZoneId, u32, u32)> {
        // Below the threshold, collect one victim per allocation: spreading the work keeps
        // a nearly full device from re-compacting everything on every flush. Only when no
        // zone is left outside the reserve does collection loop until one frees.
        if !for_gc {
            self.current_group.insert(key, hint.group);
        }
        let mut collected = false;
        loop {
            if let Some(found) = self.use_head(key, hint, want)? {
                return Ok(found);
            }
            // Collecting may itself open a head for this stream: look again after each step.
            if !for_gc && !collected && (self.free.len() as u32) < self.config.gc_threshold_zones {
                collected = true;
                if !self.to_reset.is_empty() {
                    self.commit()?;
                    continue;
                }
                if self.gc_one(true)? {
                    continue;
                }
            }
            let reserve = if for_gc {
                0
            } else {
                self.config.gc_reserve_zones as usize
            };
            if self.free.len() > reserve {
                let zone = self.open_zone(key)?;
                self.heads.insert(
                    key,
                    ZnsHead {
                        zone,
                        group: hint.group,
                    },
                );
                let tick = self.touch();
                self.head_used.insert(key, tick);
                return Ok((zone, 0, self.blocks_per_zone().min(want as u64) as u32));
            }
            if !self.to_reset.is_empty() {
                self.commit()?;
                continue;
            }
            if !for_gc && self.gc_one(false)? {
                continue;
            }
            if self.retire_empty_heads() {
                self.commit()?;
                continue;
            }
            let live = self.state.zones.total_valid() * self.state.block_size();
            return Err(Error::NoSpace(format!(
                "{live} bytes of live data fill the device's {} bytes: no zone can be freed",
                self.state.geometry.capacity_bytes()
            )));
        }
    }

    /// The stream's head zone if it can take this hint's data.
    fn use_head(
        &mut self,
        key: StreamKey,
        hint: &Hint,
        want: u32,
    ) -> Result<Option<(ZoneId, u32, u32)>> {
        let cap = self.blocks_per_zone();
        let Some(head) = self.heads.get(&key).copied() else {
            return Ok(None);
        };
        let wp = self.wp[head.zone as usize];
        if wp >= cap {
            self.retire_head(key);
            return Ok(None);
        }
        if !head.accepts(hint) && wp > 0 {
            // The policy wants this lifetime group apart: seal the zone.
            self.finish_zone(head.zone)?;
            self.retire_head(key);
            return Ok(None);
        }
        self.heads.get_mut(&key).expect("head").group = hint.group;
        let tick = self.touch();
        self.head_used.insert(key, tick);
        Ok(Some((
            head.zone,
            wp as u32,
            (cap - wp).min(want as u64) as u32,
        )))
    }

    /// Notes that `blocks` were written at the zone's write pointer.
    pub(super) fn advance(&mut self, zone: ZoneId, blocks: u32) {
        self.wp[zone as usize] += blocks as u64;
        self.unsynced_writes = true;
    }

    /// Data zones holding a partial write pointer: each holds an active-zone resource.
    fn active_data_zones(&self) -> usize {
        let cap = self.blocks_per_zone();
        self.wp
            .iter()
            .enumerate()
            .filter(|(z, &wp)| {
                wp > 0 && wp < cap && !matches!(self.state.zones.owner[*z], Some(ZoneUse::Meta))
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
    fn open_zone(&mut self, key: StreamKey) -> Result<ZoneId> {
        while self.active_data_zones() >= self.active_budget() {
            if !self.to_reset.is_empty() {
                // Emptied zones still hold active resources until their reset.
                self.commit()?;
                continue;
            }
            // Seal the least recently used other stream's zone (what a drive would need).
            let victim = self
                .heads
                .iter()
                .filter(|(k, h)| **k != key && self.wp[h.zone as usize] > 0)
                .min_by_key(|(k, _)| self.head_used.get(k).copied().unwrap_or(0))
                .map(|(k, h)| (*k, h.zone));
            let Some((victim_key, zone)) = victim else {
                return Err(Error::NoSpace(
                    "more streams than the device's active zones allow".into(),
                ));
            };
            self.finish_zone(zone)?;
            self.retire_head(victim_key);
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
        Ok(zone)
    }

    pub(super) fn finish_zone(&mut self, zone: ZoneId) -> Result<()> {
        self.device.finish(zone)?;
        self.wp[zone as usize] = self.blocks_per_zone();
        self.counters.finishes += 1;
        self.unsynced_writes = true;
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
    fn retire_empty_heads(&mut self) -> bool {
        let empty: Vec<StreamKey> = self
            .heads
            .iter()
            .filter(|(_, h)| {
                self.wp[h.zone as usize] > 0 && self.state.zones.valid_blocks(h.zone) == 0
            })
            .map(|(k, _)| *k)
            .collect();
        for key in &empty {
            self.retire_head(*key);
        }
        !empty.is_empty()
    }

    /// Stops appending to `key`'s head zone; if none of its data is live any more, it is
    /// reset after the next commit.
    fn retire_head(&mut self, key: StreamKey) {
        if let Some(head) = self.heads.remove(&key) {
            if self.state.zones.valid_blocks(head.zone) == 0 {
                self.to_reset.insert(head.zone);
            }
        }
    }

    /// Resets the zones freed by the last commit and returns them to the free list.
    pub(super) fn reset_freed_zones(&mut self) -> Result<()> {
        let zones = std::mem::take(&mut self.to_reset);
        for zone in zones {
            if self.state.zones.valid_blocks(zone) != 0 {
                continue;
            }
            self.device.reset(zone)?;
            self.wp[zone as usize] = 0;
            self.counters.resets += 1;
            self.record(MetaOp::ReleaseZone { zone })?;
            self.free.insert(zone);
        }
        Ok(())
    }
}
