//! Garbage collection: migrate the valid extents of the zone with the fewest valid blocks
//! into the same stream's head zone, then reset it once the move is durable.

use super::extent_map::Extent;
use super::state::{Ino, MetaOp};
use super::zone_map::ZoneUse;
use super::Inner;
use crate::device::ZoneId;
use crate::hint::Hint;
use crate::Result;

impl Inner {
    /// Sealed data zones that GC may collect, with their valid blocks.
    fn sealed_zones(&self) -> Vec<(ZoneId, u64)> {
        let cap = self.state.geometry.blocks_per_zone();
        let heads: Vec<ZoneId> = self.heads.values().map(|h| h.zone).collect();
        (0..self.state.geometry.zone_count)
            .filter(|z| matches!(self.state.zones.owner[*z as usize], Some(ZoneUse::Data(_))))
            .filter(|z| !heads.contains(z) && !self.to_reset.contains(z))
            .filter(|z| self.wp[*z as usize] >= cap)
            .map(|z| (z, self.state.zones.valid_blocks(z) as u64))
            .collect()
    }

    /// The sealed zone with the fewest valid blocks, if collecting it is worth it: it must
    /// free at least `min_gain` blocks, and the sealed zones together must hold at least a
    /// zone's worth of dead blocks (else no amount of moving frees a zone, and collecting
    /// would only churn).
    fn gc_victim(&self, min_gain: u64) -> Option<ZoneId> {
        let cap = self.state.geometry.blocks_per_zone();
        let sealed = self.sealed_zones();
        let dead: u64 = sealed.iter().map(|&(_, valid)| cap - valid).sum();
        if dead < cap {
            return None;
        }
        sealed
            .into_iter()
            .filter(|&(_, valid)| cap - valid >= min_gain.max(1))
            .min_by_key(|&(_, valid)| valid)
            .map(|(z, _)| z)
    }

    /// Migrates one victim zone when free zones run short. `eager` (collection ahead of
    /// need) takes only victims that free an eighth of a zone or more. Returns false when
    /// there is nothing worth collecting.
    pub(super) fn gc_one(&mut self, eager: bool) -> Result<bool> {
        let min_gain = if eager {
            self.state.geometry.blocks_per_zone() / 8
        } else {
            1
        };
        let Some(victim) = self.gc_victim(min_gain) else {
            return Ok(false);
        };

        let Some(ZoneUse::Data(key)) = self.state.zones.owner[victim as usize] else {
            return Ok(false);
        };
        let mut moving: Vec<(Ino, u64, Extent)> = Vec::new();
        for (&ino, inode) in &self.state.inodes {
            for (file_block, ext) in inode.extents.iter() {
                if ext.zone == victim {
                    moving.push((ino, file_block, ext));
                }
            }
        }
        moving.sort_by_key(|(_, _, e)| e.block);
        let bs = self.state.block_size();
        // Moved data joins the stream's current group, so that the next write of the stream
        // does not take it for a group change and seal the zone it just filled.
        let group = self
            .current_group
            .get(&key)
            .copied()
            .or_else(|| self.heads.get(&key).map(|h| h.group))
            .unwrap_or(0);
        let hint = Hint {
            group,
            ..Hint::zoned(key.stream)
        };
        for (ino, file_block, ext) in moving {
            let mut data = vec![0u8; ext.len as usize * bs as usize];
            self.device.read(victim, ext.block as u64 * bs, &mut data)?;
            let mut done = 0u32;
            while done < ext.len {
                let (zone, block, n) = self.allocate(key, &hint, ext.len - done, true)?;
                let bytes = &data[(done as u64 * bs) as usize..((done + n) as u64 * bs) as usize];
                self.device.write(zone, block as u64 * bs, bytes)?;
                self.advance(zone, n);
                let c = self.counters.streams.entry(key).or_default();
                c.gc += bytes.len() as u64;
                c.device += bytes.len() as u64;
                let crc = crc32c::crc32c(bytes);
                self.record(MetaOp::MapExtent {
                    ino,
                    file_block: file_block + done as u64,
                    extent: Extent {
                        zone,
                        block,
                        len: n,
                    },
                    crc,
                })?;
                done += n;
            }
        }
        // The moves are durable before the victim is reset.
        self.commit()?;
        Ok(true)
    }
}
