//! Zoned devices: the ZNS / ZBC command set the store is written against.
//!
//! A zone is an append-only region with a write pointer. Writes land exactly at the write
//! pointer (or anywhere the device chooses, with zone append), reads are allowed below it,
//! reset empties the zone and finish fills it. Open and active resources are limited the way
//! a drive limits them, and exceeding them fails the way a drive fails.
//!
//! Backends: [`MemoryDevice`] (unit tests, with simulated power loss), [`ImageDevice`] (the
//! embedded default: one image file, io_uring with a pread/pwrite fallback),
//! [`ZonefsDevice`] (a zonefs mount of a real ZNS drive) and [`FdpDevice`] (an NVMe namespace
//! with Flexible Data Placement, its LBA ranges written as zones with placement identifiers).

pub mod blkzone;
mod exclusive;
mod fdp;
mod image;
mod io;
mod memory;
pub mod nvme;
pub mod sysfs;
mod zonefs;
mod zones;

pub use fdp::{replay_on_ssd, FdpDevice, FdpOptions, PlacedIo};
pub use image::{ImageDevice, ImageOptions};
pub use io::IoMode;
pub use memory::MemoryDevice;
pub use zonefs::{ZonefsDevice, ZonefsOptions};
pub use zones::ZoneTable;

use serde::{Deserialize, Serialize};

/// Index of a zone on its device.
pub type ZoneId = u32;

/// The fixed shape of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// Number of sequential-write-required zones.
    pub zone_count: u32,
    /// Distance between zone starts, in bytes.
    pub zone_size: u64,
    /// Writable bytes of each zone (≤ `zone_size`).
    pub zone_capacity: u64,
    /// Write granularity: offsets and lengths of writes are multiples of it.
    pub block_size: u32,
    /// Most zones that may be implicitly or explicitly open at once.
    pub max_open: u32,
    /// Most zones that may be open or closed (holding a partial write pointer) at once.
    pub max_active: u32,
}

impl Geometry {
    /// The embedded default device: 256 zones of 128 MiB with 96 MiB writable (capacity
    /// below size, as on ZN540-class drives), 14 open / 14 active zones like the ZN540.
    /// The image is sparse, so it takes disk space only for what is written.
    pub const EMBEDDED_DEFAULT: Geometry = Geometry {
        zone_count: 256,
        zone_size: 128 << 20,
        zone_capacity: 96 << 20,
        block_size: 4096,
        max_open: 14,
        max_active: 14,
    };

    /// Checks the geometry is one a device could have.
    pub fn validate(&self) -> Result<(), DeviceError> {
        let bs = self.block_size as u64;
        let bad = |why: &str| Err(DeviceError::BadGeometry(why.to_string()));
        if self.block_size < 512 || !self.block_size.is_power_of_two() {
            return bad("block size must be a power of two ≥ 512");
        }
        if self.zone_count == 0 {
            return bad("device has no zones");
        }
        if self.zone_capacity == 0 || self.zone_capacity > self.zone_size {
            return bad("zone capacity must be in 1..=zone size");
        }
        if self.zone_size % bs != 0 || self.zone_capacity % bs != 0 {
            return bad("zone size and capacity must be multiples of the block size");
        }
        if self.max_open == 0 || self.max_active == 0 || self.max_open > self.max_active {
            return bad("need 0 < max_open ≤ max_active");
        }
        Ok(())
    }

    /// Total writable bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.zone_capacity * self.zone_count as u64
    }

    /// Blocks per zone capacity.
    pub fn blocks_per_zone(&self) -> u64 {
        self.zone_capacity / self.block_size as u64
    }
}

/// Zone conditions, as in the ZNS specification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ZoneState {
    /// Nothing written (write pointer 0); holds no resources.
    Empty,
    /// Opened by a write; the device may close it to make room for another open.
    ImplicitOpen,
    /// Opened by an open command; stays open until closed, finished or filled.
    ExplicitOpen,
    /// Partially written and not open; still holds an active resource.
    Closed,
    /// Written to capacity or finished; read only until reset.
    Full,
    /// Fault: readable, never writable again.
    ReadOnly,
    /// Fault: neither readable nor writable.
    Offline,
}

impl ZoneState {
    /// Open zones count against `max_open`.
    pub fn is_open(self) -> bool {
        matches!(self, ZoneState::ImplicitOpen | ZoneState::ExplicitOpen)
    }

    /// Open and closed zones count against `max_active`.
    pub fn is_active(self) -> bool {
        self.is_open() || self == ZoneState::Closed
    }
}

/// One row of a zone report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneInfo {
    /// The zone.
    pub id: ZoneId,
    /// Its condition.
    pub state: ZoneState,
    /// Bytes written from the zone start.
    pub write_pointer: u64,
    /// Writable bytes of the zone.
    pub capacity: u64,
}

/// What a zoned device refuses, named the way a drive reports it.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("zone {0} does not exist")]
    NoSuchZone(ZoneId),
    #[error("zone {zone}: write at {offset} is not at the write pointer {write_pointer}")]
    NotAtWritePointer {
        zone: ZoneId,
        offset: u64,
        write_pointer: u64,
    },
    #[error("zone {zone}: offset {offset} or length {len} is not block aligned")]
    Unaligned { zone: ZoneId, offset: u64, len: u64 },
    #[error("zone {zone}: write of {len} bytes at {offset} crosses the zone capacity")]
    ZoneBoundary { zone: ZoneId, offset: u64, len: u64 },
    #[error("zone {zone}: read of {len} bytes at {offset} goes past the write pointer")]
    ReadPastWritePointer { zone: ZoneId, offset: u64, len: u64 },
    #[error("zone {zone} is {state:?}: {op} not allowed")]
    InvalidState {
        zone: ZoneId,
        state: ZoneState,
        op: &'static str,
    },
    #[error("too many open zones (max {0})")]
    TooManyOpen(u32),
    #[error("too many active zones (max {0})")]
    TooManyActive(u32),
    #[error("bad geometry: {0}")]
    BadGeometry(String),
    #[error("image {path}: {why}")]
    BadImage { path: String, why: String },
    /// A device opened for reading only holds no store: nothing was ever written to it.
    #[error("blank: it holds no store")]
    Blank,
    /// A write, reset or finish on a device opened for reading only.
    #[error("device opened read-only: {0} not allowed")]
    ReadOnly(&'static str),
    /// The I/O error is in the message, not its source: one line shows it once.
    #[error("device I/O: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for DeviceError {
    fn from(e: std::io::Error) -> Self {
        DeviceError::Io(e)
    }
}

/// Who a data zone was given to: what a device that places data by more than its address
/// (FDP) needs to tag the zone's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZonePlacement {
    pub tenant: u32,
    pub stream: u32,
    /// The lifetime group the stream was writing when it took the zone.
    pub group: u32,
}

/// The zoned block interface the store uses.
///
/// All methods take `&self`: backends keep their zone table behind their own lock, so a
/// device can be shared (`Arc<dyn ZonedDevice>`) by the store and by tools that inspect it.
pub trait ZonedDevice: Send + Sync {
    /// The fixed shape of the device.
    fn geometry(&self) -> Geometry;

    /// The state of every zone, in zone order.
    fn report_zones(&self) -> Vec<ZoneInfo>;

    /// The state of one zone.
    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError>;

    /// Writes `data` at `offset`, which must equal the zone's write pointer. Block aligned.
    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError>;

    /// [`ZonedDevice::write`], running `during` while the write is in flight where the
    /// backend writes asynchronously (the store checksums the data meanwhile).
    fn write_overlapped(
        &self,
        zone: ZoneId,
        offset: u64,
        data: &[u8],
        during: &mut dyn FnMut(),
    ) -> Result<(), DeviceError> {
        during();
        self.write(zone, offset, data)
    }

    /// Writes `data` wherever the write pointer is and returns the offset it landed at.
    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError>;

    /// Reads `buf.len()` bytes at `offset`; the whole range must lie below the write pointer.
    /// Neither offset nor length needs to be aligned.
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError>;

    /// Empties the zone: write pointer back to 0, state Empty, resources released.
    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError>;

    /// [`ZonedDevice::reset`] of a zone about to be written again at once (the journal's
    /// next metadata zone): a device that gives a reset zone's space back to its host (the
    /// embedded image's hole punch) may keep it, since it is needed again right away.
    fn reset_for_rewrite(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.reset(zone)
    }

    /// Moves the zone to Full without writing the rest of it; resources released.
    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError>;

    /// Makes sure that writes to `zone` find room: the embedded image allocates the zone's
    /// blocks in its file, which is sparse, so that a host file system filled up meanwhile
    /// cannot refuse them. The store reserves its metadata zones, so that a mount and the
    /// removals that free space still work when the host's disk is full. A drive's zones
    /// have their room.
    fn reserve(&self, _zone: ZoneId) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Explicitly opens the zone (it stays open until closed, finished or filled).
    fn open(&self, zone: ZoneId) -> Result<(), DeviceError>;

    /// Closes an open zone; it stays active while its write pointer is past 0.
    fn close(&self, zone: ZoneId) -> Result<(), DeviceError>;

    /// The store gave `zone` to a stream (at allocation, and again at mount for zones that
    /// hold data). A device that tags writes with a placement (FDP) resolves and remembers
    /// it for the zone's writes; others ignore it.
    fn assign_zone(&self, _zone: ZoneId, _placement: &ZonePlacement) {}

    /// The placement identifier `zone`'s writes carry on a device that tags writes (FDP);
    /// `None` elsewhere.
    fn zone_placement(&self, _zone: ZoneId) -> Option<u16> {
        None
    }

    /// Makes every completed write, reset and finish durable (a device cache flush).
    fn sync(&self) -> Result<(), DeviceError>;

    /// The sync of a clean stop: as [`ZonedDevice::sync`], and a device that keeps its write
    /// pointers lazily ([`ZonedDevice::lazy_write_pointers`]) also writes them as they are,
    /// so that tools reading them without the store's recovery see the truth, and the next
    /// mount's damage checks reach the journal's end. A drive keeps them itself.
    fn sync_at_close(&self) -> Result<(), DeviceError> {
        self.sync()
    }

    /// A writable mount recovered: every zone's write pointer is now what the store knows,
    /// and an empty zone holds nothing. The image takes the empty zones whose blocks are
    /// still allocated (reset zones an earlier process kept for their next writer) as its
    /// own warm zones again: reused, or given back once they stay empty a while. Before
    /// recovery a lazily kept pointer may call a zone empty that holds synced data.
    fn recovered(&self) {}

    /// Whether a sync may leave write pointers behind the data it made durable. A drive keeps
    /// its write pointers itself; the image device writes its zone table only when a zone is
    /// reset, finished or faulted, so that a small synced write costs one page, and after a
    /// crash the store finds where its zones really end from its journal (see
    /// [`ZonedDevice::read_unwritten`] and [`ZonedDevice::restore_write_pointer`]).
    fn lazy_write_pointers(&self) -> bool {
        false
    }

    /// Recovery only: reads like [`ZonedDevice::read`] but may go past the write pointer (up
    /// to the zone capacity) on a device with lazy write pointers. Elsewhere it is `read`.
    fn read_unwritten(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.read(zone, offset, buf)
    }

    /// Recovery only: the data of `zone` is known to reach `wp` (the store's journal says
    /// so). A device with lazy write pointers moves the pointer forward; any other device
    /// must already be there, or it lost synced data.
    fn restore_write_pointer(&self, zone: ZoneId, wp: u64) -> Result<(), DeviceError> {
        let info = self.zone_info(zone)?;
        if wp <= info.write_pointer {
            return Ok(());
        }
        Err(DeviceError::ReadPastWritePointer {
            zone,
            offset: info.write_pointer,
            len: wp - info.write_pointer,
        })
    }
}
