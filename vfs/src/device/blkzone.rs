//! The kernel's zone report of a zoned block device (`BLKREPORTZONE`, what `blkzone report`
//! prints): the device-side truth the zonefs backend sizes itself by and that tests compare
//! the store's zone map with.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::ZoneState;

/// `_IOWR(0x12, 130, struct blk_zone_report)` from `linux/blkzoned.h`.
const BLKREPORTZONE: u64 = 0xC010_1282;
/// `BLK_ZONE_REP_CAPACITY`: the report's `capacity` fields are valid.
const REP_CAPACITY: u32 = 1;
/// Zones asked for per ioctl.
const BATCH: usize = 128;

/// `struct blk_zone`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawZone {
    start: u64,
    len: u64,
    wp: u64,
    kind: u8,
    cond: u8,
    non_seq: u8,
    reset: u8,
    resv: [u8; 4],
    capacity: u64,
    reserved: [u8; 24],
}

/// `struct blk_zone_report` followed by room for `BATCH` zones.
#[repr(C)]
struct Report {
    sector: u64,
    nr_zones: u32,
    flags: u32,
    zones: [RawZone; BATCH],
}

/// Zone types (`BLK_ZONE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneKind {
    Conventional,
    SequentialRequired,
    SequentialPreferred,
    Unknown(u8),
}

/// One zone as the kernel reports it, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelZone {
    pub start: u64,
    pub len: u64,
    /// Write pointer as an offset from the zone start.
    pub write_pointer: u64,
    pub capacity: u64,
    pub kind: ZoneKind,
    /// Condition; `None` for conventional zones (no write pointer).
    pub state: Option<ZoneState>,
}

/// Every zone of the zoned block device at `node` (e.g. `/dev/nvme0n1`).
pub fn report(node: &Path) -> io::Result<Vec<KernelZone>> {
    let file = File::open(node)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", node.display())))?;
    let mut out = Vec::new();
    let mut sector = 0u64;
    loop {
        let mut rep = Box::new(Report {
            sector,
            nr_zones: BATCH as u32,
            flags: 0,
            zones: [RawZone::default(); BATCH],
        });
        // SAFETY: `rep` is a valid blk_zone_report with room for `nr_zones` zones.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKREPORTZONE as _, &mut *rep) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("BLKREPORTZONE on {}: {e}", node.display()),
            ));
        }
        let n = (rep.nr_zones as usize).min(BATCH);
        if n == 0 {
            break;
        }
        for z in &rep.zones[..n] {
            let kind = match z.kind {
                1 => ZoneKind::Conventional,
                2 => ZoneKind::SequentialRequired,
                3 => ZoneKind::SequentialPreferred,
                k => ZoneKind::Unknown(k),
            };
            let state = match z.cond {
                0x1 => Some(ZoneState::Empty),
                0x2 => Some(ZoneState::ImplicitOpen),
                0x3 => Some(ZoneState::ExplicitOpen),
                0x4 => Some(ZoneState::Closed),
                0xD => Some(ZoneState::ReadOnly),
                0xE => Some(ZoneState::Full),
                0xF => Some(ZoneState::Offline),
                _ => None,
            };
            let capacity = if rep.flags & REP_CAPACITY != 0 {
                z.capacity
            } else {
                z.len
            };
            // A full zone's pointer is reported at its end; the store's tables put it at
            // the capacity.
            let wp = if state == Some(ZoneState::Full) {
                capacity
            } else {
                z.wp.saturating_sub(z.start)
            };
            out.push(KernelZone {
                start: z.start * 512,
                len: z.len * 512,
                write_pointer: wp * 512,
                capacity: capacity * 512,
                kind,
                state,
            });
        }
        let last = rep.zones[n - 1];
        sector = last.start + last.len;
    }
    Ok(out)
}
