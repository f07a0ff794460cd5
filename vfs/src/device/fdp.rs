//! An NVMe namespace with Flexible Data Placement, presented to the store as zones.
//!
//! FDP keeps the block interface: any LBA may be written at any time, and the drive places
//! each write in the reclaim unit of the handle the write names (its placement identifier).
//! Data that dies together is erased together only if it was written under one handle, so
//! the backend cuts the namespace into fixed LBA ranges ("zones", one reclaim unit each by
//! default), writes each range sequentially like a zone, tags every write of a range with the
//! placement identifier the resolver gave the stream that owns it
//! ([`crate::resolver::placement_id`], told through [`ZonedDevice::assign_zone`]), and
//! deallocates a range (NVMe Dataset Management, through `BLKDISCARD`) when the store resets
//! it. Writes go through NVMe passthrough on the namespace's generic character device
//! `/dev/ngXnY` ([`super::nvme::PlacementWriter`]: io_uring `URING_CMD`, or the ioctl), the
//! way FDPFS writes; where the kernel offers the namespace's handles as block-layer write
//! streams (6.16+, `queue/max_write_streams`), ordinary io_uring writes to the block device
//! carry the stream instead (unless [`FdpOptions::passthrough`]). Reads, deallocation and
//! cache flushes go through the block device `/dev/nvmeXnY` with `O_DIRECT`, so no page cache
//! can hold a stale copy.
//!
//! The zone table lives on the namespace itself, kept the way the image device keeps its own
//! (`image.rs`): a header block, then two table copies written alternately with a sequence
//! number and a crc32c, written only when a zone is reset, finished or filled, so a small
//! synced write costs one write plus the flush. Write pointers that only moved forward are
//! recovered from the store's journal after a crash ([`ZonedDevice::lazy_write_pointers`]).
//!
//! ```text
//! LBA 0       header: magic "VALETFDP", version, block size, zone size, zone count,
//!             open/active limits, data start, table length, crc32c
//! block 1     zone table copy A: sequence, zone count, (write pointer u64, state u8,
//!             7 reserved) per zone, crc32c; padded to whole blocks; then copy B
//! data_start  zone i at data_start + i * zone_size (data_start on a 1 MiB boundary)
//! ```

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::exclusive;
use super::nvme::{self, AlignedBuffer, Placement, PlacementWriter};
use super::sysfs::BlockDev;
use super::{
    DeviceError, Geometry, ZoneId, ZoneInfo, ZonePlacement, ZoneState, ZoneTable, ZonedDevice,
};
use crate::resolver;

const MAGIC: &[u8; 8] = b"VALETFDP";
const VERSION: u32 = 1;
const HEADER_FIELDS: usize = 52;
const TABLE_HEAD: usize = 16;
const ENTRY_LEN: usize = 16;
const DATA_ALIGN: u64 = 1 << 20;
/// `_IO(0x12, 119)`: discard (deallocate) a byte range of a block device.
const BLKDISCARD: u64 = 0x1277;

/// How to open an FDP namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdpOptions {
    /// Zone size in bytes when formatting; `None`: the drive's reclaim unit size.
    pub zone_size: Option<u64>,
    /// Most zones the store may keep open or active at once when formatting; `None`: one per
    /// placement handle plus the two the store's metadata needs, so that the store keeps as
    /// many streams apart as the drive has handles.
    pub max_active: Option<u32>,
    /// Use at most this many zones when formatting (the rest of the namespace stays unused).
    pub max_zones: Option<u32>,
    /// Format a namespace that holds something other than this layout (its data is lost).
    /// A blank namespace (zeros at LBA 0) is formatted without it.
    pub format: bool,
    /// Write through NVMe passthrough even where the kernel offers write streams.
    pub passthrough: bool,
    /// Keep a log of every write and deallocation (LBA, blocks, placement identifier) for the
    /// SSD model to replay ([`FdpDevice::take_write_log`]).
    pub record_writes: bool,
    /// Refuse a blank namespace with [`DeviceError::Blank`] instead of formatting it: for
    /// tools that must find a store there (`read_only` implies it).
    pub existing: bool,
    /// Open for reading only (tools that inspect a store): nothing is ever written to the
    /// namespace (not even the zone table at close), a blank one is refused as with
    /// `existing`, and the namespace is locked shared, so inspections may run side by side
    /// but never beside a store that writes to it.
    pub read_only: bool,
}

/// One command the backend sent the drive, for the SSD model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacedIo {
    /// `blocks` logical blocks written at `lba` under placement identifier `pid`.
    Write { lba: u64, blocks: u32, pid: u16 },
    /// `blocks` logical blocks at `lba` deallocated (a zone reset).
    Deallocate { lba: u64, blocks: u32 },
}

#[derive(Clone, Copy, Debug)]
struct Layout {
    block: u64,
    zone_size: u64,
    zone_count: u32,
    data_start: u64,
    /// Bytes of one table copy.
    table_len: u64,
}

impl Layout {
    fn new(block: u64, zone_size: u64, namespace: u64, max_zones: u32) -> Result<Layout, String> {
        if zone_size == 0 || zone_size % block != 0 {
            return Err(format!(
                "zone size {zone_size} is not a multiple of the block size {block}"
            ));
        }
        // Size the table for the most zones that could fit, then count what fits after it.
        let most = namespace / zone_size;
        let table_len = round_up(TABLE_HEAD as u64 + ENTRY_LEN as u64 * most + 4, block);
        let data_start = round_up(block + 2 * table_len, DATA_ALIGN.max(block));
        let zone_count = (namespace.saturating_sub(data_start) / zone_size).min(max_zones as u64);
        if zone_count < 4 {
            return Err(format!(
                "a namespace of {namespace} bytes holds only {zone_count} zones of {zone_size} bytes"
            ));
        }
        Ok(Layout {
            block,
            zone_size,
            zone_count: zone_count as u32,
            data_start,
            table_len,
        })
    }

    fn zone_start(&self, zone: ZoneId) -> u64 {
        self.data_start + zone as u64 * self.zone_size
    }

    fn table_at(&self, copy: u64) -> u64 {
        self.block + copy * self.table_len
    }
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

struct State {
    table: ZoneTable,
    /// The table as the namespace holds it (its newest copy).
    on_disk: Vec<(ZoneState, u64)>,
    /// Sequence number of the newest copy on the namespace.
    seq: u64,
    /// A reset, finish, fill or fault happened since the last table write.
    table_dirty: bool,
    /// Placement identifier of each zone's writes.
    pids: Vec<u16>,
    log: Vec<PlacedIo>,
}

/// A zoned device over an FDP namespace; see the module docs.
pub struct FdpDevice {
    /// The block device node (`/dev/nvmeXnY`).
    node: PathBuf,
    block: File,
    writer: PlacementWriter,
    layout: Layout,
    /// Placement identifiers the namespace may use, as the drive lists them.
    handles: Vec<u16>,
    /// Streams the store keeps apart (what the resolver spreads over the handles).
    streams: u32,
    record: bool,
    read_only: bool,
    state: Mutex<State>,
    /// Bytes written to the namespace (data, tables, header): what the drive's FDP
    /// statistics count as host bytes.
    bytes_written: AtomicU64,
    syncs: AtomicU64,
}

impl FdpDevice {
    /// Opens (formatting a blank one) the FDP namespace `path`: its block device
    /// (`/dev/nvmeXnY`) or its generic character device (`/dev/ngXnY`).
    pub fn open(path: impl AsRef<Path>, options: FdpOptions) -> Result<FdpDevice, DeviceError> {
        let path = path.as_ref();
        let fail = |why: String| bad(path, why);
        let dev = BlockDev::of_node(path).map_err(|e| fail(e.to_string()))?;
        let node = dev.node();
        let generic_node = PathBuf::from(format!(
            "/dev/ng{}",
            dev.name
                .strip_prefix("nvme")
                .ok_or_else(|| fail(format!("{} is not an NVMe namespace", dev.name)))?
        ));
        let read_only = options.read_only;
        let block = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_DIRECT)
            .open(&node)
            .map_err(|e| fail(format!("cannot open {}: {e}", node.display())))?;
        exclusive::lock(&node, &block, read_only, "namespace")?;
        let generic = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&generic_node)
            .map_err(|e| fail(format!("cannot open {}: {e}", generic_node.display())))?;
        let nsid = nvme::namespace_id(&generic).map_err(|e| fail(format!("namespace id: {e}")))?;
        let handles = nvme::placement_ids(&generic, nsid).map_err(|e| {
            fail(format!(
                "{e}: no FDP placement handles (is FDP enabled on the endurance group?)"
            ))
        })?;
        if handles.is_empty() {
            return Err(fail("the namespace has no placement handles".into()));
        }
        let bs = dev.logical_block_size().map_err(|e| fail(e.to_string()))? as u64;
        let size = dev.size().map_err(|e| fail(e.to_string()))?;
        // Passthrough commands are not split by the block layer: none may exceed the
        // controller's transfer limit.
        let max_transfer = dev
            .number("queue/max_hw_sectors_kb")
            .map_err(|e| fail(e.to_string()))?
            * 1024;
        let mut writer = PlacementWriter::new(generic, nsid, bs as u32, max_transfer.max(bs));
        let streams = dev.max_write_streams().unwrap_or(0) as usize;
        if !options.passthrough && streams >= handles.len() {
            let stream_fd = block
                .try_clone()
                .map_err(|e| fail(format!("cannot duplicate {}: {e}", node.display())))?;
            writer = writer
                .with_streams(stream_fd)
                .map_err(|e| fail(format!("write streams: {e}")))?;
        }

        let mut header = AlignedBuffer::zeroed(bs as usize);
        block
            .read_exact_at(header.as_mut_slice(), 0)
            .map_err(|e| fail(format!("cannot read the header: {e}")))?;
        let blank = header.as_slice().iter().all(|&b| b == 0);
        let ours = &header.as_slice()[..8] == MAGIC;
        if blank && (read_only || options.existing) {
            return Err(DeviceError::Blank);
        }
        if read_only && !ours {
            return Err(fail("holds data that is not a Valet FDP layout".into()));
        }
        let (geometry, layout, state, formatted_bytes) = if ours && !options.format {
            let (geometry, layout) = decode_header(header.as_slice(), bs, size).map_err(fail)?;
            let (seq, entries) = read_tables(&block, &layout).map_err(fail)?;
            let table = ZoneTable::restore(geometry, &entries).map_err(fail)?;
            (geometry, layout, (table, entries, seq), 0)
        } else if blank || options.format {
            let zone_size = match options.zone_size {
                Some(z) => z,
                None => {
                    let controller = controller_of(&dev).map_err(|e| fail(e.to_string()))?;
                    nvme::reclaim_unit_size(&controller, nsid)
                        .map_err(|e| fail(format!("reclaim unit size: {e}")))?
                }
            };
            let max_zones = options.max_zones.unwrap_or(u32::MAX);
            let layout = Layout::new(bs, zone_size, size, max_zones).map_err(fail)?;
            let active = options
                .max_active
                .unwrap_or(handles.len() as u32 + 2)
                .min(layout.zone_count);
            let geometry = Geometry {
                zone_count: layout.zone_count,
                zone_size,
                zone_capacity: zone_size,
                block_size: bs as u32,
                max_open: active,
                max_active: active,
            };
            geometry.validate()?;
            let table = ZoneTable::new(geometry)?;
            let entries = table.persistent_entries();
            // Tables first, header last: a torn format leaves no header.
            let mut written = 0;
            for copy in 0..2 {
                written += write_table(&block, &layout, copy, &entries).map_err(fail)?;
            }
            // Deallocate the data area so the drive starts with nothing valid there.
            discard(
                &block,
                layout.data_start,
                layout.zone_count as u64 * zone_size,
            )
            .map_err(|e| fail(format!("deallocating the namespace: {e}")))?;
            let header = encode_header(&geometry, &layout);
            block
                .write_all_at(header.as_slice(), 0)
                .map_err(|e| fail(format!("cannot write the header: {e}")))?;
            written += bs;
            block.sync_data()?;
            (geometry, layout, (table, entries, 1), written)
        } else {
            return Err(fail(
                "holds data that is not a Valet FDP layout (format it to use it)".into(),
            ));
        };
        let (table, on_disk, seq) = state;
        let streams = geometry.max_active.saturating_sub(2).max(1);
        Ok(FdpDevice {
            node,
            block,
            writer,
            layout,
            streams,
            record: options.record_writes,
            read_only,
            state: Mutex::new(State {
                table,
                on_disk,
                seq,
                table_dirty: false,
                pids: vec![handles[0]; layout.zone_count as usize],
                log: Vec::new(),
            }),
            handles,
            bytes_written: AtomicU64::new(formatted_bytes),
            syncs: AtomicU64::new(0),
        })
    }

    /// The block device node.
    pub fn node(&self) -> &Path {
        &self.node
    }

    /// Placement identifiers the namespace may use.
    pub fn placement_handles(&self) -> &[u16] {
        &self.handles
    }

    /// How writes reach the drive (`"io_uring write streams"`, `"io_uring passthrough"` or
    /// `"ioctl passthrough"`).
    pub fn io_kind(&self) -> &'static str {
        self.writer.kind()
    }

    /// Byte offset of zone 0 on the namespace.
    pub fn data_start(&self) -> u64 {
        self.layout.data_start
    }

    /// Bytes this device wrote to the namespace since it was opened (data, zone tables and,
    /// when it formatted, the header): what the drive counts as host bytes written.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }

    /// Number of `sync` calls that completed.
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The writes and deallocations since the last call (with `record_writes`).
    pub fn take_write_log(&self) -> Vec<PlacedIo> {
        std::mem::take(&mut self.lock().log)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Table updates are validated before they change anything.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses `what` on a device opened for reading only.
    fn writable(&self, what: &'static str) -> Result<(), DeviceError> {
        match self.read_only {
            true => Err(DeviceError::ReadOnly(what)),
            false => Ok(()),
        }
    }

    fn write_locked(
        &self,
        st: &mut State,
        zone: ZoneId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), DeviceError> {
        let len = data.len() as u64;
        st.table.check_write(zone, offset, len)?;
        if len > 0 {
            let mut buf = AlignedBuffer::zeroed(data.len());
            buf.as_mut_slice().copy_from_slice(data);
            let pid = st.pids[zone as usize];
            let index = self.handles.iter().position(|&h| h == pid).unwrap_or(0) as u16;
            let at = self.layout.zone_start(zone) + offset;
            self.writer
                .write(at, buf.as_slice(), Placement { pid, index })?;
            self.bytes_written.fetch_add(len, Ordering::Relaxed);
            if self.record {
                st.log.push(PlacedIo::Write {
                    lba: at / self.layout.block,
                    blocks: (len / self.layout.block) as u32,
                    pid,
                });
            }
        }
        st.table.commit_write(zone, offset, len)?;
        if st.table.info(zone)?.state == ZoneState::Full {
            st.table_dirty = true;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` of `zone` through an aligned bounce buffer.
    fn read_raw(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        if buf.is_empty() {
            return Ok(());
        }
        let bs = self.layout.block;
        let start = self.layout.zone_start(zone) + offset;
        let first = start / bs * bs;
        let end = round_up(start + buf.len() as u64, bs);
        let mut bounce = AlignedBuffer::zeroed((end - first) as usize);
        self.block.read_exact_at(bounce.as_mut_slice(), first)?;
        let skip = (start - first) as usize;
        buf.copy_from_slice(&bounce.as_slice()[skip..skip + buf.len()]);
        Ok(())
    }

    /// Writes the table into the older copy when it changed in a way recovery cannot
    /// redo (or always, with `exact`).
    fn write_table_locked(&self, st: &mut State, exact: bool) -> Result<(), DeviceError> {
        let entries = st.table.persistent_entries();
        if !(st.table_dirty || exact && entries != st.on_disk) {
            return Ok(());
        }
        let seq = st.seq + 1;
        let bytes = write_table_seq(&self.block, &self.layout, seq, &entries)
            .map_err(|why| bad(&self.node, why))?;
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        st.seq = seq;
        st.on_disk = entries;
        st.table_dirty = false;
        Ok(())
    }
}

impl ZonedDevice for FdpDevice {
    fn geometry(&self) -> Geometry {
        self.lock().table.geometry()
    }

    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.lock().table.report()
    }

    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        self.lock().table.info(zone)
    }

    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.writable("write")?;
        let mut st = self.lock();
        self.write_locked(&mut st, zone, offset, data)
    }

    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.writable("append")?;
        let mut st = self.lock();
        let offset = st.table.check_append(zone, data.len() as u64)?;
        self.write_locked(&mut st, zone, offset, data)?;
        Ok(offset)
    }

    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.lock()
            .table
            .check_read(zone, offset, buf.len() as u64)?;
        // Data below the write pointer is immutable until a reset, which the store never
        // issues while a read is in flight.
        self.read_raw(zone, offset, buf)
    }

    fn lazy_write_pointers(&self) -> bool {
        true
    }

    fn read_unwritten(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let cap = self.layout.zone_size;
        self.lock().table.info(zone)?;
        if offset + buf.len() as u64 > cap {
            return Err(DeviceError::ReadPastWritePointer {
                zone,
                offset,
                len: buf.len() as u64,
            });
        }
        self.read_raw(zone, offset, buf)
    }

    fn restore_write_pointer(&self, zone: ZoneId, wp: u64) -> Result<(), DeviceError> {
        self.lock()
            .table
            .restore_write_pointer(zone, wp)
            .map(|_| ())
    }

    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("reset")?;
        let mut st = self.lock();
        let mut next = st.table.clone();
        let old_wp = next.reset(zone)?;
        if old_wp > 0 {
            let start = self.layout.zone_start(zone);
            discard(&self.block, start, self.layout.zone_size)?;
            if self.record {
                st.log.push(PlacedIo::Deallocate {
                    lba: start / self.layout.block,
                    blocks: (self.layout.zone_size / self.layout.block) as u32,
                });
            }
        }
        st.table = next;
        st.table_dirty = true;
        Ok(())
    }

    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("finish")?;
        let mut st = self.lock();
        st.table.finish(zone)?;
        st.table_dirty = true;
        Ok(())
    }

    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.open(zone)
    }

    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.close(zone)
    }

    fn assign_zone(&self, zone: ZoneId, placement: &ZonePlacement) {
        let index = resolver::placement_id(
            placement.stream,
            placement.group,
            self.streams,
            self.handles.len() as u32,
        );
        let pid = self.handles[index as usize];
        if let Some(slot) = self.lock().pids.get_mut(zone as usize) {
            *slot = pid;
        }
    }

    fn zone_placement(&self, zone: ZoneId) -> Option<u16> {
        self.lock().pids.get(zone as usize).copied()
    }

    fn sync(&self) -> Result<(), DeviceError> {
        self.sync_with_table(false)
    }

    fn sync_at_close(&self) -> Result<(), DeviceError> {
        self.sync_with_table(true)
    }
}

impl FdpDevice {
    /// Writes the zone table if it must (with `exact`, whenever a write pointer moved too),
    /// then flushes the namespace.
    fn sync_with_table(&self, exact: bool) -> Result<(), DeviceError> {
        if self.read_only {
            // Nothing was written through this device: nothing to make durable.
            return Ok(());
        }
        {
            let mut st = self.lock();
            self.write_table_locked(&mut st, exact)?;
        }
        // An fdatasync of the block device is an NVMe Flush of the namespace: it covers the
        // passthrough writes too.
        self.block.sync_data()?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for FdpDevice {
    /// A clean close leaves exact write pointers.
    fn drop(&mut self) {
        if self.read_only {
            return;
        }
        let mut st = self.lock();
        let result = self
            .write_table_locked(&mut st, true)
            .and_then(|()| Ok(self.block.sync_data()?));
        if let Err(e) = result {
            eprintln!(
                "valet: {}: zone table not written at close ({e}); the next mount recovers \
                 the write pointers from the journal",
                self.node.display()
            );
        }
    }
}

/// Replays the backend's write stream on the conventional-SSD model: `log` as recorded
/// (with `record_writes`), on an SSD whose logical space is the zones' LBA range
/// (`data_start` .. `data_start + logical_bytes`) with `config`'s flash. With
/// `use_placement` each write keeps its placement identifier (an FDP drive); without, every
/// write goes to one handle (the same drive with placement ignored). Deallocations are
/// trims.
pub fn replay_on_ssd(
    log: &[PlacedIo],
    block_size: u64,
    data_start: u64,
    config: crate::ftl::FtlConfig,
    use_placement: bool,
) -> Result<crate::ftl::FtlStats, String> {
    let mut ftl = crate::ftl::Ftl::new(config).map_err(|e| e.to_string())?;
    for io in log {
        match *io {
            PlacedIo::Write { lba, blocks, pid } => {
                let at = (lba * block_size)
                    .checked_sub(data_start)
                    .ok_or("a write below the zones")?;
                let pid = if use_placement { pid as u32 } else { 0 };
                ftl.write(at, blocks as u64 * block_size, pid)
                    .map_err(|e| e.to_string())?;
            }
            PlacedIo::Deallocate { lba, blocks } => {
                let at = (lba * block_size)
                    .checked_sub(data_start)
                    .ok_or("a deallocation below the zones")?;
                ftl.trim(at, blocks as u64 * block_size)
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(ftl.stats())
}

fn bad(path: &Path, why: impl Into<String>) -> DeviceError {
    DeviceError::BadImage {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// The controller character device (`/dev/nvmeX`) of namespace `dev`.
fn controller_of(dev: &BlockDev) -> io::Result<File> {
    let link = std::fs::read_link(format!("/sys/class/block/{}/device", dev.name))?;
    let name = link
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::other("no controller for the namespace"))?
        .to_string();
    File::open(Path::new("/dev").join(&name))
        .map_err(|e| io::Error::new(e.kind(), format!("/dev/{name}: {e}")))
}

fn discard(block: &File, offset: u64, len: u64) -> io::Result<()> {
    let range = [offset, len];
    // SAFETY: BLKDISCARD reads two u64s through the pointer.
    if unsafe { libc::ioctl(block.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())
}

fn get_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().unwrap())
}

fn encode_header(g: &Geometry, layout: &Layout) -> AlignedBuffer {
    let mut buf = AlignedBuffer::zeroed(layout.block as usize);
    let b = buf.as_mut_slice();
    b[..8].copy_from_slice(MAGIC);
    put_u32(b, 8, VERSION);
    put_u32(b, 12, g.block_size);
    put_u64(b, 16, g.zone_size);
    put_u32(b, 24, g.zone_count);
    put_u32(b, 28, g.max_open);
    put_u32(b, 32, g.max_active);
    put_u64(b, 36, layout.data_start);
    put_u64(b, 44, layout.table_len);
    let crc = crc32c::crc32c(&b[..HEADER_FIELDS]);
    put_u32(b, HEADER_FIELDS, crc);
    buf
}

fn decode_header(b: &[u8], block: u64, size: u64) -> Result<(Geometry, Layout), String> {
    if crc32c::crc32c(&b[..HEADER_FIELDS]) != get_u32(b, HEADER_FIELDS) {
        return Err("header checksum mismatch".into());
    }
    if get_u32(b, 8) != VERSION {
        return Err(format!("unknown layout version {}", get_u32(b, 8)));
    }
    let g = Geometry {
        zone_count: get_u32(b, 24),
        zone_size: get_u64(b, 16),
        zone_capacity: get_u64(b, 16),
        block_size: get_u32(b, 12),
        max_open: get_u32(b, 28),
        max_active: get_u32(b, 32),
    };
    g.validate().map_err(|e| e.to_string())?;
    if g.block_size as u64 != block {
        return Err(format!(
            "formatted with {}-byte blocks, the namespace now has {block}",
            g.block_size
        ));
    }
    let layout = Layout {
        block,
        zone_size: g.zone_size,
        zone_count: g.zone_count,
        data_start: get_u64(b, 36),
        table_len: get_u64(b, 44),
    };
    if layout.zone_start(g.zone_count) > size {
        return Err("the namespace is smaller than its layout".into());
    }
    Ok((g, layout))
}

fn encode_table(layout: &Layout, seq: u64, entries: &[(ZoneState, u64)]) -> AlignedBuffer {
    let mut buf = AlignedBuffer::zeroed(layout.table_len as usize);
    let b = buf.as_mut_slice();
    put_u64(b, 0, seq);
    put_u32(b, 8, entries.len() as u32);
    for (i, (state, wp)) in entries.iter().enumerate() {
        let at = TABLE_HEAD + i * ENTRY_LEN;
        put_u64(b, at, *wp);
        b[at + 8] = state_code(*state);
    }
    let end = TABLE_HEAD + entries.len() * ENTRY_LEN;
    let crc = crc32c::crc32c(&b[..end]);
    put_u32(b, end, crc);
    buf
}

fn decode_table(b: &[u8], zones: u32) -> Option<(u64, Vec<(ZoneState, u64)>)> {
    if get_u32(b, 8) != zones {
        return None;
    }
    let end = TABLE_HEAD + zones as usize * ENTRY_LEN;
    if end + 4 > b.len() || crc32c::crc32c(&b[..end]) != get_u32(b, end) {
        return None;
    }
    let entries = (0..zones as usize)
        .map(|i| {
            let at = TABLE_HEAD + i * ENTRY_LEN;
            Some((state_from_code(b[at + 8])?, get_u64(b, at)))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((get_u64(b, 0), entries))
}

/// Writes copy `copy` with sequence number `copy + 1` (formatting). Returns bytes written.
fn write_table(
    block: &File,
    layout: &Layout,
    copy: u64,
    entries: &[(ZoneState, u64)],
) -> Result<u64, String> {
    let buf = encode_table(layout, copy, entries);
    block
        .write_all_at(buf.as_slice(), layout.table_at(copy))
        .map_err(|e| format!("cannot write the zone table: {e}"))?;
    Ok(layout.table_len)
}

/// Writes the table with sequence number `seq` into copy `seq % 2`.
fn write_table_seq(
    block: &File,
    layout: &Layout,
    seq: u64,
    entries: &[(ZoneState, u64)],
) -> Result<u64, String> {
    let buf = encode_table(layout, seq, entries);
    block
        .write_all_at(buf.as_slice(), layout.table_at(seq % 2))
        .map_err(|e| format!("cannot write the zone table: {e}"))?;
    Ok(layout.table_len)
}

/// The newest valid table copy.
fn read_tables(block: &File, layout: &Layout) -> Result<(u64, Vec<(ZoneState, u64)>), String> {
    let mut best: Option<(u64, Vec<(ZoneState, u64)>)> = None;
    for copy in 0..2 {
        let mut buf = AlignedBuffer::zeroed(layout.table_len as usize);
        block
            .read_exact_at(buf.as_mut_slice(), layout.table_at(copy))
            .map_err(|e| format!("cannot read the zone table: {e}"))?;
        if let Some((seq, entries)) = decode_table(buf.as_slice(), layout.zone_count) {
            if best.as_ref().is_none_or(|(s, _)| seq > *s) {
                best = Some((seq, entries));
            }
        }
    }
    best.ok_or_else(|| "both zone table copies are damaged".to_string())
}

fn state_code(s: ZoneState) -> u8 {
    match s {
        ZoneState::Empty => 0,
        ZoneState::ImplicitOpen => 1,
        ZoneState::ExplicitOpen => 2,
        ZoneState::Closed => 3,
        ZoneState::Full => 4,
        ZoneState::ReadOnly => 5,
        ZoneState::Offline => 6,
    }
}

fn state_from_code(c: u8) -> Option<ZoneState> {
    Some(match c {
        0 => ZoneState::Empty,
        1 => ZoneState::ImplicitOpen,
        2 => ZoneState::ExplicitOpen,
        3 => ZoneState::Closed,
        4 => ZoneState::Full,
        5 => ZoneState::ReadOnly,
        6 => ZoneState::Offline,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_leaves_room_for_two_tables_and_aligns_data() {
        let l = Layout::new(4096, 16 << 20, 256 << 20, u32::MAX).unwrap();
        assert_eq!(l.data_start, 1 << 20);
        assert_eq!(l.zone_count, 15);
        assert!(l.table_at(1) + l.table_len <= l.data_start);
        assert_eq!(
            Layout::new(4096, 16 << 20, 256 << 20, 6)
                .unwrap()
                .zone_count,
            6
        );
        assert!(Layout::new(4096, 16 << 20, 40 << 20, u32::MAX).is_err());
        assert!(Layout::new(4096, 1000, 1 << 30, u32::MAX).is_err());
    }

    #[test]
    fn header_and_table_round_trip_and_detect_damage() {
        let l = Layout::new(4096, 1 << 20, 64 << 20, u32::MAX).unwrap();
        let g = Geometry {
            zone_count: l.zone_count,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            block_size: 4096,
            max_open: 10,
            max_active: 10,
        };
        let h = encode_header(&g, &l);
        let (g2, l2) = decode_header(h.as_slice(), 4096, 64 << 20).unwrap();
        assert_eq!(g2, g);
        assert_eq!((l2.data_start, l2.table_len), (l.data_start, l.table_len));
        assert!(decode_header(h.as_slice(), 512, 64 << 20).is_err());
        let mut entries = vec![(ZoneState::Empty, 0); l.zone_count as usize];
        entries[3] = (ZoneState::Closed, 8192);
        entries[5] = (ZoneState::Full, 1 << 20);
        let t = encode_table(&l, 7, &entries);
        assert_eq!(
            decode_table(t.as_slice(), l.zone_count),
            Some((7, entries.clone()))
        );
        let mut torn = t.as_slice().to_vec();
        torn[TABLE_HEAD + 3 * ENTRY_LEN] ^= 1;
        assert_eq!(decode_table(&torn, l.zone_count), None);
    }
}
