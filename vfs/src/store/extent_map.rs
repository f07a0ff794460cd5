//! A file's extent map: which zone blocks hold which file blocks.
//!
//! Keys are file block numbers; an extent never spans zones and never holds more than
//! [`MAX_EXTENT_BLOCKS`]. Inserting over an existing range splits and displaces what was
//! there (out-of-place overwrite), and the displaced pieces are returned so their zone blocks
//! can be invalidated. An extent that continues its neighbour in both the file and the zone
//! joins it (appends flushed one after another, a defragmented window): the map, and so
//! the metadata, grows with the file's fragments, not with its writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::device::ZoneId;

/// Largest extent: 512 KiB of 4 KiB blocks.
pub const MAX_EXTENT_BLOCKS: u32 = 128;

/// A contiguous run of one file's blocks inside one zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub zone: ZoneId,
    /// First block inside the zone.
    pub block: u32,
    /// Length in blocks.
    pub len: u32,
}

impl Extent {
    /// The part of this extent starting `skip` blocks in, `len` blocks long.
    pub(crate) fn slice(&self, skip: u32, len: u32) -> Extent {
        Extent {
            zone: self.zone,
            block: self.block + skip,
            len,
        }
    }

    /// This extent (at file block `at`) and `next` (at `next_at`) as one, if `next`
    /// continues it in the file and in the zone and the two fit in one extent.
    fn joined(&self, at: u64, next: &Extent, next_at: u64) -> Option<Extent> {
        let continues = at + self.len as u64 == next_at
            && self.zone == next.zone
            && self.block + self.len == next.block;
        (continues && self.len + next.len <= MAX_EXTENT_BLOCKS).then_some(Extent {
            len: self.len + next.len,
            ..*self
        })
    }
}

/// File block → extent, non-overlapping.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentMap {
    map: BTreeMap<u64, Extent>,
}

impl ExtentMap {
    /// Maps `extent` at file block `at`, returning the displaced zone ranges.
    pub fn insert(&mut self, at: u64, extent: Extent) -> Vec<Extent> {
        let end = at + extent.len as u64;
        let displaced = self.remove_range(at, end);
        let (mut at, mut extent) = (at, extent);
        if let Some((&key, &before)) = self.map.range(..at).next_back() {
            if let Some(joined) = before.joined(key, &extent, at) {
                self.map.remove(&key);
                (at, extent) = (key, joined);
            }
        }
        if let Some(&after) = self.map.get(&end) {
            if let Some(joined) = extent.joined(at, &after, end) {
                self.map.remove(&end);
                extent = joined;
            }
        }
        self.map.insert(at, extent);
        displaced
    }

    /// Number of extents (one per contiguous fragment, see [`ExtentMap::insert`]).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Drops every mapping at or past file block `from`, returning what was dropped.
    pub fn truncate(&mut self, from: u64) -> Vec<Extent> {
        self.remove_range(from, u64::MAX)
    }

    /// Unmaps file blocks `[start, end)`, splitting extents at the edges.
    fn remove_range(&mut self, start: u64, end: u64) -> Vec<Extent> {
        let mut displaced = Vec::new();
        // An extent beginning before `start` may reach into the range.
        if let Some((&key, &ext)) = self.map.range(..start).next_back() {
            let ext_end = key + ext.len as u64;
            if ext_end > start {
                let keep = (start - key) as u32;
                self.map.insert(key, ext.slice(0, keep));
                let cut_end = ext_end.min(end);
                displaced.push(ext.slice(keep, (cut_end - start) as u32));
                if ext_end > end {
                    let tail_skip = (end - key) as u32;
                    self.map
                        .insert(end, ext.slice(tail_skip, (ext_end - end) as u32));
                }
            }
        }
        let inside: Vec<u64> = self.map.range(start..end).map(|(&k, _)| k).collect();
        for key in inside {
            let ext = self.map.remove(&key).expect("key just listed");
            let ext_end = key + ext.len as u64;
            if ext_end > end {
                let cut = (end - key) as u32;
                displaced.push(ext.slice(0, cut));
                self.map.insert(end, ext.slice(cut, ext.len - cut));
            } else {
                displaced.push(ext);
            }
        }
        displaced
    }

    /// Pieces covering file blocks `[start, end)`: `(file block, Some(zone location) | None
    /// for a hole, length in blocks)`, in order and without gaps.
    pub fn pieces(&self, start: u64, end: u64) -> Vec<(u64, Option<Extent>, u64)> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let mut pos = start;
        let first = self.map.range(..=start).next_back().map(|(&k, &e)| (k, e));
        let rest = self.map.range(start + 1..end).map(|(&k, &e)| (k, e));
        for (key, ext) in first.into_iter().chain(rest) {
            let ext_end = key + ext.len as u64;
            if ext_end <= pos || key >= end {
                continue;
            }
            if key > pos {
                out.push((pos, None, key - pos));
                pos = key;
            }
            let upto = ext_end.min(end);
            let skip = (pos - key) as u32;
            out.push((pos, Some(ext.slice(skip, (upto - pos) as u32)), upto - pos));
            pos = upto;
        }
        if pos < end {
            out.push((pos, None, end - pos));
        }
        out
    }

    /// All mappings in file order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Extent)> + '_ {
        self.map.iter().map(|(&k, &e)| (k, e))
    }

    /// The mappings that start at file block `block` or later, in file order.
    pub fn iter_from(&self, block: u64) -> impl Iterator<Item = (u64, Extent)> + '_ {
        self.map.range(block..).map(|(&k, &e)| (k, e))
    }

    /// One past the last mapped file block.
    #[cfg(test)]
    pub fn end_block(&self) -> u64 {
        self.map
            .iter()
            .next_back()
            .map(|(&k, e)| k + e.len as u64)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(zone: u32, block: u32, len: u32) -> Extent {
        Extent { zone, block, len }
    }

    #[test]
    fn overwrite_in_the_middle_splits_and_displaces() {
        let mut m = ExtentMap::default();
        assert!(m.insert(0, ext(1, 0, 10)).is_empty());
        let displaced = m.insert(3, ext(2, 0, 4));
        assert_eq!(displaced, vec![ext(1, 3, 4)]);
        let all: Vec<_> = m.iter().collect();
        assert_eq!(
            all,
            vec![(0, ext(1, 0, 3)), (3, ext(2, 0, 4)), (7, ext(1, 7, 3))]
        );
    }

    #[test]
    fn overwrite_spanning_several_extents() {
        let mut m = ExtentMap::default();
        m.insert(0, ext(1, 0, 4));
        m.insert(4, ext(1, 10, 4));
        m.insert(8, ext(1, 20, 4));
        let displaced = m.insert(2, ext(3, 0, 8));
        assert_eq!(displaced, vec![ext(1, 2, 2), ext(1, 10, 4), ext(1, 20, 2)]);
        assert_eq!(m.pieces(0, 12).len(), 3);
        assert_eq!(m.end_block(), 12);
    }

    #[test]
    fn pieces_report_holes() {
        let mut m = ExtentMap::default();
        m.insert(2, ext(1, 5, 2));
        let p = m.pieces(0, 6);
        assert_eq!(
            p,
            vec![(0, None, 2), (2, Some(ext(1, 5, 2)), 2), (4, None, 2)]
        );
        assert_eq!(m.pieces(3, 4), vec![(3, Some(ext(1, 6, 1)), 1)]);
        // An empty range (a read of no bytes at a block boundary) has no pieces.
        assert_eq!(m.pieces(3, 3), vec![]);
    }

    #[test]
    fn truncate_cuts_the_straddling_extent() {
        let mut m = ExtentMap::default();
        m.insert(0, ext(1, 0, 8));
        m.insert(8, ext(2, 8, 8));
        let dropped = m.truncate(5);
        assert_eq!(dropped, vec![ext(1, 5, 3), ext(2, 8, 8)]);
        assert_eq!(m.end_block(), 5);
    }

    #[test]
    fn contiguous_fragments_join_up_to_the_largest_extent() {
        let mut m = ExtentMap::default();
        // Appends landing one after another in a zone are one extent.
        m.insert(0, ext(1, 10, 4));
        m.insert(4, ext(1, 14, 4));
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![(0, ext(1, 10, 8))]);
        // A gap filled from both sides joins all three.
        m.insert(12, ext(1, 22, 4));
        m.insert(8, ext(1, 18, 4));
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![(0, ext(1, 10, 16))]);
        // Contiguous in the file but not in the zone, or in another zone: apart.
        m.insert(16, ext(1, 40, 2));
        m.insert(18, ext(2, 42, 2));
        assert_eq!(m.len(), 3);
        // An overwrite elsewhere in the middle splits it in three.
        m.insert(4, ext(3, 0, 1));
        assert_eq!(m.len(), 5);
        // Never past the largest extent.
        let mut big = ExtentMap::default();
        big.insert(0, ext(1, 0, MAX_EXTENT_BLOCKS));
        big.insert(MAX_EXTENT_BLOCKS as u64, ext(1, MAX_EXTENT_BLOCKS, 1));
        assert_eq!(big.len(), 2);
        assert_eq!(big.pieces(0, MAX_EXTENT_BLOCKS as u64 + 1).len(), 2);
    }
}
