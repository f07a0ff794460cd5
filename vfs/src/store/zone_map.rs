//! Per-zone bookkeeping: which stream owns a zone and which of its blocks are still valid.
//!
//! Validity is derived from the files' extent maps (it is rebuilt on mount, never journaled);
//! ownership is journaled, so that a stream keeps appending to its partly written zone after
//! a remount.

use serde::{Deserialize, Serialize};

use crate::device::ZoneId;

/// A stream of one tenant: the unit that never shares a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamKey {
    pub tenant: u32,
    pub stream: u32,
}

impl StreamKey {
    /// The stream number of a tenant's GC output (see [`StreamKey::gc`]); applications'
    /// streams stop one below it.
    pub const GC_STREAM: u32 = u32::MAX;

    /// An application stream of `tenant`.
    pub fn user(tenant: u32, stream: u32) -> Self {
        StreamKey {
            tenant,
            stream: stream.min(Self::GC_STREAM - 1),
        }
    }

    /// The stream GC copies `tenant`'s surviving data into. Only GC appends to its zones,
    /// so a pass that found room for its victim's data keeps it while applications write
    /// on (a zone shared with their writes could fill under the pass, leaving it unable to
    /// finish, with GC's reserve spent). Data that outlived its zone is colder than what
    /// its stream writes now, so keeping it apart is also what keeps the next pass cheap.
    pub fn gc(tenant: u32) -> Self {
        StreamKey {
            tenant,
            stream: Self::GC_STREAM,
        }
    }
}

/// What a zone is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ZoneUse {
    /// Holds the metadata journal.
    Meta,
    /// Owned by a stream (possibly empty of valid data, awaiting reset).
    Data(StreamKey),
}

/// Validity of one zone's blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZoneValidity {
    bits: Vec<u64>,
    valid: u32,
}

impl ZoneValidity {
    fn new(blocks: u64) -> Self {
        ZoneValidity {
            bits: vec![0; blocks.div_ceil(64) as usize],
            valid: 0,
        }
    }

    pub fn is_valid(&self, block: u32) -> bool {
        self.bits[(block / 64) as usize] & (1 << (block % 64)) != 0
    }

    pub fn valid_blocks(&self) -> u32 {
        self.valid
    }

    /// Marks blocks valid; returns how many were already valid (must be 0 when consistent).
    fn set(&mut self, block: u32, len: u32) -> u32 {
        let mut already = 0;
        for b in block..block + len {
            let (word, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            if self.bits[word] & bit != 0 {
                already += 1;
            } else {
                self.bits[word] |= bit;
                self.valid += 1;
            }
        }
        already
    }

    /// Marks blocks invalid; returns how many were not valid (must be 0 when consistent).
    fn clear(&mut self, block: u32, len: u32) -> u32 {
        let mut missing = 0;
        for b in block..block + len {
            let (word, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            if self.bits[word] & bit == 0 {
                missing += 1;
            } else {
                self.bits[word] &= !bit;
                self.valid -= 1;
            }
        }
        missing
    }
}

/// Ownership and validity of every zone.
#[derive(Clone, Debug)]
pub struct ZoneMap {
    pub owner: Vec<Option<ZoneUse>>,
    pub validity: Vec<ZoneValidity>,
    /// Blocks that were marked twice or cleared while not set: any non-zero is a bug that
    /// fsck reports.
    pub inconsistencies: u64,
}

impl ZoneMap {
    pub fn new(zones: u32, blocks_per_zone: u64) -> Self {
        ZoneMap {
            owner: vec![None; zones as usize],
            validity: (0..zones)
                .map(|_| ZoneValidity::new(blocks_per_zone))
                .collect(),
            inconsistencies: 0,
        }
    }

    pub fn mark_valid(&mut self, zone: ZoneId, block: u32, len: u32) {
        self.inconsistencies += self.validity[zone as usize].set(block, len) as u64;
    }

    pub fn mark_invalid(&mut self, zone: ZoneId, block: u32, len: u32) {
        self.inconsistencies += self.validity[zone as usize].clear(block, len) as u64;
    }

    pub fn valid_blocks(&self, zone: ZoneId) -> u32 {
        self.validity[zone as usize].valid_blocks()
    }

    /// Total valid blocks over all zones.
    pub fn total_valid(&self) -> u64 {
        self.validity.iter().map(|v| v.valid_blocks() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_counts_and_detects_double_marks() {
        let mut m = ZoneMap::new(2, 100);
        m.mark_valid(1, 10, 20);
        assert_eq!(m.valid_blocks(1), 20);
        m.mark_invalid(1, 15, 5);
        assert_eq!(m.valid_blocks(1), 15);
        assert!(!m.validity[1].is_valid(16));
        assert!(m.validity[1].is_valid(29));
        assert_eq!(m.inconsistencies, 0);
        m.mark_valid(1, 29, 2);
        assert_eq!(m.inconsistencies, 1);
        assert_eq!(m.total_valid(), 16);
    }
}
