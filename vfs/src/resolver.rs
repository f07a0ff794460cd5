//! Resolvers: turn a [`Hint`] into what a device understands.
//!
//! - ZNS: a zone per stream, lifetime groups laid out one after another inside it, a new
//!   group starting a new zone when the hint asks. That bookkeeping needs the zone map, so it
//!   lives with the store's allocator ([`crate::store`]); [`ZnsHead`] is its per-stream state.
//! - Multi-stream: one of the four kernel write-life levels (`F_SET_RW_HINT`); lossy, since
//!   the kernel offers four levels for any number of streams.
//! - FDP: a placement identifier from the lifetime group (streams are discarded, as in
//!   the Valet paper), fed to the conventional-SSD model's reclaim-unit handles.

use crate::device::ZoneId;
use crate::hint::{Class, Hint};

/// The kernel's write-life hints (`RWH_WRITE_LIFE_*` in `linux/fcntl.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum WriteLife {
    NotSet = 0,
    None = 1,
    Short = 2,
    Medium = 3,
    Long = 4,
    Extreme = 5,
}

impl WriteLife {
    /// The kernel value back to the enum.
    pub fn from_raw(raw: u64) -> Option<WriteLife> {
        Some(match raw {
            0 => WriteLife::NotSet,
            1 => WriteLife::None,
            2 => WriteLife::Short,
            3 => WriteLife::Medium,
            4 => WriteLife::Long,
            5 => WriteLife::Extreme,
            _ => return None,
        })
    }
}

/// Multi-stream resolver: streams folded onto the four write-life levels.
///
/// Streams 0..4 get their own level; beyond four writers several streams share a level,
/// keeping a diminished isolation. Conventional files get `NotSet` (the filesystem decides).
pub fn write_life(hint: &Hint) -> WriteLife {
    if hint.class == Class::Conventional {
        return WriteLife::NotSet;
    }
    match hint.stream % 4 {
        0 => WriteLife::Short,
        1 => WriteLife::Medium,
        2 => WriteLife::Long,
        _ => WriteLife::Extreme,
    }
}

/// FDP resolver: a placement identifier (reclaim-unit handle) from the lifetime group.
pub fn placement_id(hint: &Hint, reclaim_unit_handles: u32) -> u32 {
    hint.group % reclaim_unit_handles.max(1)
}

/// ZNS resolver state for one stream: the zone being filled and the group it is filling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZnsHead {
    pub zone: ZoneId,
    pub group: u32,
}

impl ZnsHead {
    /// Whether an extent of `hint` may be appended to this head, or needs a fresh zone.
    pub fn accepts(&self, hint: &Hint) -> bool {
        !(hint.group_starts_zone && hint.group != self.group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_stream_folds_streams_onto_four_levels() {
        let levels: Vec<_> = (0..8).map(|s| write_life(&Hint::zoned(s))).collect();
        assert_eq!(levels[0], WriteLife::Short);
        assert_eq!(levels[3], WriteLife::Extreme);
        assert_eq!(levels[4], levels[0]);
        assert_eq!(write_life(&Hint::conventional()), WriteLife::NotSet);
    }

    #[test]
    fn fdp_uses_groups_not_streams() {
        let mut h = Hint::zoned(7);
        h.group = 5;
        assert_eq!(placement_id(&h, 4), 1);
        h.stream = 1;
        assert_eq!(placement_id(&h, 4), 1);
        assert_eq!(placement_id(&h, 0), 0);
    }

    #[test]
    fn zns_head_starts_new_zone_only_when_asked() {
        let head = ZnsHead { zone: 3, group: 1 };
        let mut h = Hint::zoned(0);
        h.group = 2;
        assert!(head.accepts(&h));
        h.group_starts_zone = true;
        assert!(!head.accepts(&h));
        h.group = 1;
        assert!(head.accepts(&h));
    }
}
