//! Resolvers: turn a [`Hint`] into what a device understands.
//!
//! - ZNS: a zone per stream, lifetime groups laid out one after another inside it, a new
//!   group starting a new zone when the hint asks. That bookkeeping needs the zone map, so it
//!   lives with the store's allocator ([`crate::store`]); [`ZnsHead`] is its per-stream state.
//! - Multi-stream: one of the four kernel write-life levels (`F_SET_RW_HINT`); lossy, since
//!   the kernel offers four levels for any number of streams.
//! - FDP: a placement identifier (an index into the namespace's reclaim unit handles) from
//!   the stream and the lifetime group: streams first, so that no two streams share a
//!   handle while the drive has one per stream, and the handles left over spread each
//!   stream's lifetime groups. The FDP backend ([`crate::device::FdpDevice`]) tags every
//!   write of a zone with it; the conventional-SSD model's reclaim-unit handles take the
//!   same identifiers.

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

/// FDP resolver: the placement identifier for data of `stream` in lifetime group `group`,
/// on a drive with `handles` reclaim unit handles and a store that keeps `streams` streams
/// apart.
///
/// With at least as many handles as streams, stream `s` uses handles `s`, `s + streams`,
/// `s + 2·streams`, ... as its groups advance, so streams never share a handle and
/// consecutive groups of a stream land in different reclaim units where handles are left
/// over. With fewer handles than streams, streams fold onto handles (modulo) and groups are
/// not told apart.
pub fn placement_id(stream: u32, group: u32, streams: u32, handles: u32) -> u32 {
    let handles = handles.max(1);
    let lanes = streams.clamp(1, handles);
    let per_stream = handles / lanes;
    stream % lanes + lanes * (group % per_stream)
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
    fn fdp_keeps_streams_apart_and_spreads_groups_over_spare_handles() {
        // 8 handles, 2 streams: each stream has 4 handles for its groups.
        let ids: Vec<_> = (0..5).map(|g| placement_id(1, g, 2, 8)).collect();
        assert_eq!(ids, vec![1, 3, 5, 7, 1]);
        assert!((0..16).all(|g| placement_id(0, g, 2, 8) % 2 == 0));
        // As many streams as handles: one handle per stream, groups ignored.
        assert_eq!(placement_id(3, 9, 8, 8), 3);
        // More streams than handles: streams fold.
        assert_eq!(placement_id(5, 0, 12, 4), 1);
        // Degenerate inputs stay in range.
        assert_eq!(placement_id(7, 7, 0, 0), 0);
        for (s, g, st, h) in [(3, 100, 5, 8), (0, 1, 1, 3), (9, 9, 3, 5)] {
            assert!(placement_id(s, g, st, h) < h);
        }
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
