//! The embedded default device: an emulated ZNS drive in one sparse image file.
//!
//! Layout (little endian):
//!
//! ```text
//! 0          header block (4 KiB): magic "VALETZNS", format version, geometry, layout,
//!            crc32c of the fields
//! 4 KiB      zone table, two copies (A and B), each: sequence number, zone count,
//!            (write pointer u64, state u8, 7 reserved bytes) per zone, crc32c;
//!            each copy padded to a multiple of 4 KiB
//! data_start zone i at data_start + i * zone_stride (zone size rounded up to 4 KiB)
//! ```
//!
//! `sync` issues one fdatasync, writing the zone table first into the older copy with the
//! next sequence number only when a zone was reset, finished or faulted since the last
//! table write. Write pointers that only moved forward are not written: a small synced
//! write (a journal record) then costs one page, not two. So after a crash a write pointer
//! may lag behind data that was synced; the store finds where its zones really end from its
//! journal ([`ZonedDevice::lazy_write_pointers`], [`ZonedDevice::read_unwritten`],
//! [`ZonedDevice::restore_write_pointer`]). Dropping the device writes the table when it
//! differs, so a clean close leaves exact write pointers.
//!
//! A crash during a table write can tear only the copy being written, never the one the
//! previous table write left; open takes the newest copy whose checksum holds and reports
//! through [`ImageDevice::recovery_note`] when it had to fall back to the older one. Within
//! the one fdatasync the file system may persist the table before the data it describes, so
//! after a crash *during* a sync a write pointer can cover blocks that read as zeros;
//! callers checksum what they need to trust.
//!
//! The image is sparse, and a write into a hole makes the host file system allocate blocks,
//! so the fdatasync after it must also commit that allocation: on ext4 a small synced write
//! into a hole costs about twice a write into allocated blocks (a real zoned drive has no
//! such cost). After each sync the device therefore fills the next [`PREPARE_AHEAD`] bytes
//! past the write pointer of every zone written since the previous sync with zeros, so that
//! the small synced writes that follow (a log record, a journal transaction) land in blocks
//! the file system already holds. Only bytes past the write pointer are filled, which by
//! the zone rules hold nothing. The filling runs on a thread of the device's own after the
//! sync returns, in 128 KiB steps; a write into the step being filled waits for it.
//! A zone whose write pointer moved [`PREPARE_AHEAD`] or more since the previous sync is
//! left alone: its own writes would overtake the zeros before its next sync (a flushed
//! table, a cache's region), so filling would only double its bytes on the host disk and
//! make its writes wait for the filler.
//! Each step allocates blocks, and the sync after it commits the allocation to the host
//! file system's journal (two or three flushes instead of one), so a reset keeps the
//! zone's blocks allocated (warm): a zone written again soon needs no fill at all. The
//! filler gives a zone's space back (a hole punch) once it has stayed empty for ten
//! seconds, and no more than [`WARM_ZONES`] reset zones keep their space at once. A process
//! that ends without dropping the device (so without giving that space back) leaves its
//! warm zones allocated: the next writable mount takes them as warm again once the store
//! has recovered ([`ZonedDevice::recovered`]), so repeated short runs reuse them.
//!
//! Writes take the zone-table lock only to check and advance the write pointer: the data
//! goes to the file with no lock held, so writes to different zones and reads proceed in
//! parallel.
//!
//! Opened with [`ImageOptions::read_only`] (for tools that inspect a store), the file is
//! opened for reading only and locked shared: readers exclude a writer, not each other.
//! Such a device refuses writes, resets and finishes, and writes nothing on sync or drop.
//!
//! A write of [`EARLY_WRITEBACK`] bytes or more (a flushed buffer, a GC copy) starts the
//! host's writeback of its range at once. The image is one host file, so its fdatasync
//! writes back every dirty page of it: without this, a sync of a few bytes after megabytes
//! of unsynced writes (a close, another tenant's log record) would wait for all of them,
//! since the host holds dirty pages for up to half a minute. A real drive writes as it
//! receives.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::exclusive;
use super::io::{IoEngine, IoMode};
use super::{DeviceError, Geometry, ZoneId, ZoneInfo, ZoneState, ZoneTable, ZonedDevice};

const MAGIC: &[u8; 8] = b"VALETZNS";
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: u64 = 4096;
/// Header fields before the checksum.
const HEADER_FIELDS: usize = 80;
const ALIGN: u64 = 4096;
const SLOT_HEAD: usize = 16;
const ENTRY_LEN: usize = 16;
/// How far past a zone's write pointer a sync leaves allocated blocks.
const PREPARE_AHEAD: u64 = 1 << 20;
/// Writes at least this long start their writeback at once (smaller ones are synced soon,
/// or are not worth a system call).
const EARLY_WRITEBACK: usize = 64 * 1024;
/// What one hole punch of a reset gives back (see [`punch`]).
const PUNCH_STEP: u64 = 1 << 20;
/// Most reset zones whose blocks stay allocated (warm) for the next writer of the zone;
/// past this, the oldest is punched at once.
const WARM_ZONES: usize = 16;
/// How long a reset zone stays warm before the filler gives its space back.
const WARM_FOR: Duration = Duration::from_secs(10);
/// What preparing writes (never more than [`PREPARE_AHEAD`] at once); zero-initialised
/// statics cost no memory until read.
static ZEROS: [u8; PREPARE_AHEAD as usize] = [0; PREPARE_AHEAD as usize];
/// A sync prepares a zone again once fewer than this many prepared bytes remain ahead.
const PREPARE_LOW: u64 = PREPARE_AHEAD - (128 << 10);
/// The filler writes this much at a time (a write into that range waits for it).
const FILL_STEP: u64 = 128 << 10;

/// How to open or create an image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageOptions {
    /// I/O engine for data and metadata.
    pub io: IoMode,
    /// `open_or_create`: use an existing image even if its geometry differs from the one
    /// asked for (instead of failing).
    pub accept_existing_geometry: bool,
    /// Open for reading only (see the module comment); never creates an image.
    pub read_only: bool,
}

/// Where things live in the image, all derived from the geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    geometry: Geometry,
    slot_len: u64,
    data_start: u64,
    zone_stride: u64,
    file_len: u64,
}

impl Layout {
    fn new(geometry: Geometry) -> Option<Layout> {
        let align = ALIGN.max(geometry.block_size as u64);
        let table_bytes = (geometry.zone_count as u64)
            .checked_mul(ENTRY_LEN as u64)?
            .checked_add(SLOT_HEAD as u64 + 4)?;
        let slot_len = round_up(table_bytes, ALIGN)?;
        let data_start = round_up(HEADER_LEN.checked_add(slot_len.checked_mul(2)?)?, align)?;
        let zone_stride = round_up(geometry.zone_size, ALIGN)?;
        let file_len =
            data_start.checked_add(zone_stride.checked_mul(geometry.zone_count as u64)?)?;
        // Offsets must fit the kernel's signed off_t.
        if file_len > i64::MAX as u64 {
            return None;
        }
        Some(Layout {
            geometry,
            slot_len,
            data_start,
            zone_stride,
            file_len,
        })
    }

    fn slot_offset(&self, slot: usize) -> u64 {
        HEADER_LEN + slot as u64 * self.slot_len
    }

    /// Bytes of a table copy that carry meaning (entries and checksum).
    fn slot_used(&self) -> usize {
        SLOT_HEAD + self.geometry.zone_count as usize * ENTRY_LEN + 4
    }

    fn zone_start(&self, zone: ZoneId) -> u64 {
        self.data_start + zone as u64 * self.zone_stride
    }
}

fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

struct State {
    table: ZoneTable,
    /// The entries last written to the image; `sync` skips the table write when unchanged.
    persisted: Vec<(ZoneState, u64)>,
    /// Table copy holding `seq`.
    newest_slot: usize,
    seq: u64,
    /// Per zone: bytes from the zone's start known to be allocated in the image file.
    prepared: Vec<u64>,
    /// Zones written since the last sync.
    touched: Vec<ZoneId>,
    /// Per zone: its write pointer at the last sync that found it written.
    synced_wp: Vec<u64>,
    /// The range the filler is writing zeros to now: (zone, from, to) in zone bytes.
    filling: Option<(ZoneId, u64, u64)>,
    /// Reset zones whose blocks are still allocated, oldest first, with when they were
    /// reset (see [`ImageDevice::reset`]).
    warm: Vec<(ZoneId, Instant)>,
    /// Zones whose space is being given back now: their writes wait.
    punching: Vec<ZoneId>,
}

impl State {
    fn new(
        table: ZoneTable,
        persisted: Vec<(ZoneState, u64)>,
        newest_slot: usize,
        seq: u64,
    ) -> Self {
        let zones = table.report().len();
        State {
            table,
            persisted,
            newest_slot,
            seq,
            prepared: vec![0; zones],
            touched: Vec::new(),
            synced_wp: vec![0; zones],
            filling: None,
            warm: Vec::new(),
            punching: Vec::new(),
        }
    }

    fn touch(&mut self, zone: ZoneId) {
        if !self.touched.contains(&zone) {
            self.touched.push(zone);
        }
    }

    /// Whether the filler has work in `zone`: active, and less than [`PREPARE_LOW`]
    /// prepared past its write pointer (short of the zone's end).
    fn short_of_prepared(&self, zone: ZoneId, capacity: u64) -> bool {
        self.table.info(zone).is_ok_and(|info| {
            let wp = info.write_pointer;
            let ready = self.prepared[zone as usize].max(wp);
            info.state.is_active() && ready < capacity && ready - wp < PREPARE_LOW
        })
    }

    /// The warm zones reset [`WARM_FOR`] or longer before `now`, out of the warm list.
    fn take_cold(&mut self, now: Instant) -> Vec<ZoneId> {
        let n = self
            .warm
            .iter()
            .take_while(|&&(_, at)| now.saturating_duration_since(at) >= WARM_FOR)
            .count();
        self.warm.drain(..n).map(|(zone, _)| zone).collect()
    }

    /// Keeps only the touched zones the filler has work in, leaving out the zones that
    /// moved [`PREPARE_AHEAD`] or more since the previous sync; whether any is left. Most
    /// syncs leave plenty prepared, and then wake no thread.
    fn keep_zones_to_fill(&mut self, capacity: u64) -> bool {
        let mut touched = std::mem::take(&mut self.touched);
        touched.retain(|&zone| {
            let wp = self.table.info(zone).map_or(0, |i| i.write_pointer);
            // A reset since the last sync leaves the zone behind its old pointer.
            let moved = wp.checked_sub(self.synced_wp[zone as usize]).unwrap_or(wp);
            self.synced_wp[zone as usize] = wp;
            moved < PREPARE_AHEAD && self.short_of_prepared(zone, capacity)
        });
        self.touched = touched;
        !self.touched.is_empty()
    }
}

/// An emulated ZNS device in one sparse image file, enforcing the zone rules.
///
/// Opening takes an exclusive `flock` on the file, so one image is used by one device at a
/// time. Reads of data below the write pointer go to the file without holding the zone
/// table lock; writes hold it only to check and advance the write pointer. Write pointers
/// and states reach the image only through `sync`: what was not synced is gone after a
/// restart, as on a drive with a volatile cache.
pub struct ImageDevice {
    path: PathBuf,
    core: Arc<Core>,
    /// Serialises `sync` calls so table copies are written in sequence order.
    sync_lock: Mutex<()>,
    syncs: AtomicU64,
    note: Option<String>,
    filler: Filler,
    read_only: bool,
    /// Tests: drop as a crash would.
    #[cfg(test)]
    abandoned: Mutex<bool>,
}

/// What the device and its filler thread share.
struct Core {
    engine: IoEngine,
    layout: Layout,
    state: Mutex<State>,
    /// Signalled when the filler finishes a step.
    filled: Condvar,
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Table updates are validated before they change anything, so a poisoned lock still
        // guards a consistent table.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The fill-ahead thread: woken after a sync that left a zone short of prepared blocks,
/// ended (and joined) when the device drops, so the image's lock is released when the
/// device is gone.
struct Filler {
    wake: Option<Mutex<Sender<()>>>,
    thread: Option<JoinHandle<()>>,
    /// Fill rounds asked for and done (tests wait for the filler with these).
    asked: Arc<AtomicU64>,
    #[cfg_attr(not(test), allow(dead_code))]
    done: Arc<AtomicU64>,
}

impl Filler {
    /// No filler thread: a read-only device prepares nothing.
    fn none() -> Filler {
        Filler {
            wake: None,
            thread: None,
            asked: Arc::default(),
            done: Arc::default(),
        }
    }

    fn start(core: Arc<Core>) -> Filler {
        let (tx, rx) = channel();
        let asked = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let (a, d) = (asked.clone(), done.clone());
        let thread =
            crate::background::spawn("valet-image-fill", move || fill_loop(core, rx, a, d)).ok();
        Filler {
            wake: Some(Mutex::new(tx)),
            thread,
            asked,
            done,
        }
    }

    fn wake(&self) {
        if let Some(tx) = &self.wake {
            self.asked.fetch_add(1, Ordering::AcqRel);
            let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(());
        }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.wake = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn fill_loop(core: Arc<Core>, rx: Receiver<()>, asked: Arc<AtomicU64>, done: Arc<AtomicU64>) {
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(()) => {
                while rx.try_recv().is_ok() {}
                let round = asked.load(Ordering::Acquire);
                // Only a speed-up: a failure (a full host disk) leaves later small writes
                // slower.
                let _ = prepare_ahead(&core);
                done.store(round, Ordering::Release);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let cold = core.lock().take_cold(Instant::now());
        for zone in cold {
            // As for a reset: an error only means the space is not back.
            let _ = punch_if_empty(&core, zone);
        }
    }
}

/// Fills the bytes just past the write pointer of each zone written since the last sync
/// with zeros (see the module comment), one step at a time, with the table lock held only
/// to choose a step and to record it.
fn prepare_ahead(core: &Core) -> Result<(), DeviceError> {
    let touched = std::mem::take(&mut core.lock().touched);
    let capacity = core.layout.geometry.zone_capacity;
    for zone in touched {
        // Top the zone up to a megabyte past its write pointer once less than
        // PREPARE_LOW remains prepared.
        let mut target = None;
        loop {
            let (from, to) = {
                let mut st = core.lock();
                let info = st.table.info(zone)?;
                let wp = info.write_pointer;
                let prepared = st.prepared[zone as usize].max(wp);
                if !info.state.is_active() || prepared >= capacity {
                    break;
                }
                let end = match target {
                    Some(end) => end,
                    None if !st.short_of_prepared(zone, capacity) => break,
                    None => *target.insert((wp + PREPARE_AHEAD).min(capacity)),
                };
                if prepared >= end {
                    break;
                }
                let to = end.min(prepared + FILL_STEP);
                st.filling = Some((zone, prepared, to));
                (prepared, to)
            };
            let zeros = &ZEROS[..(to - from) as usize];
            let at = core.layout.zone_start(zone) + from;
            let wrote = core.engine.write_at(zeros, at);
            if wrote.is_ok() {
                // Start writing the zeros back now, so the next sync does not wait for them.
                start_writeback(core.engine.file(), at, zeros.len());
            }
            let mut st = core.lock();
            st.filling = None;
            if wrote.is_ok() {
                st.prepared[zone as usize] = st.prepared[zone as usize].max(to);
            }
            drop(st);
            core.filled.notify_all();
            wrote?;
        }
    }
    Ok(())
}

impl ImageDevice {
    /// Creates a new image (failing if `path` exists): a sparse file holding only a header
    /// and an all-Empty zone table, made durable before returning.
    pub fn create(
        path: impl AsRef<Path>,
        geometry: Geometry,
        options: ImageOptions,
    ) -> Result<Self, DeviceError> {
        let path = path.as_ref();
        if options.read_only {
            return Err(bad(
                path,
                "does not exist (a read-only open creates nothing)",
            ));
        }
        geometry.validate()?;
        let layout = Layout::new(geometry).ok_or_else(|| {
            DeviceError::BadGeometry("device is too large for an image file".to_string())
        })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => bad(path, "already exists"),
                _ => bad(path, format!("cannot create: {e}")),
            })?;
        let made = Self::init_new(path, file, layout, options);
        if made.is_err() {
            // Leave nothing half-made behind; the file is ours, we just created it.
            let _ = std::fs::remove_file(path);
        }
        made
    }

    fn init_new(
        path: &Path,
        file: File,
        layout: Layout,
        options: ImageOptions,
    ) -> Result<Self, DeviceError> {
        exclusive::lock(path, &file, false, "image")?;
        file.set_len(layout.file_len)?;
        // The header and both copies of the zone table are written in place for the
        // image's life: their room is taken now, so that a full host disk cannot refuse a
        // table write (and with it every mount).
        allocate(&file, 0, layout.data_start)?;
        let engine = IoEngine::new(file, options.io)?;
        let table = ZoneTable::new(layout.geometry)?;
        let entries = table.persistent_entries();
        engine.write_at(&encode_header(&layout), 0)?;
        engine.write_at(&encode_slot(&layout, 1, &entries), layout.slot_offset(0))?;
        engine.sync_data()?;
        sync_parent_dir(path)?;
        let state = State::new(table, entries, 0, 1);
        Ok(Self::assemble(path, engine, layout, state, None, false))
    }

    /// Opens an existing image, taking the geometry from its header. Every structure is
    /// validated; anything off is a [`DeviceError::BadImage`], never a repair.
    pub fn open(path: impl AsRef<Path>, options: ImageOptions) -> Result<Self, DeviceError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .open(path)
            .map_err(|e| bad(path, format!("cannot open: {e}")))?;
        exclusive::lock(path, &file, options.read_only, "image")?;
        let len = file
            .metadata()
            .map_err(|e| bad(path, format!("cannot stat: {e}")))?
            .len();
        if len < HEADER_LEN {
            return Err(bad(
                path,
                format!("truncated: {len} bytes is shorter than the {HEADER_LEN}-byte header"),
            ));
        }
        let engine = IoEngine::new(file, options.io)?;
        let mut header = vec![0; HEADER_LEN as usize];
        engine.read_at(&mut header, 0)?;
        let layout = decode_header(&header).map_err(|why| bad(path, why))?;
        if len < layout.file_len {
            return Err(bad(
                path,
                format!(
                    "truncated: {len} bytes, the geometry needs {}",
                    layout.file_len
                ),
            ));
        }
        if !options.read_only {
            // An image made before the table's room was taken at creation takes it now, if
            // the host has it.
            let _ = allocate(engine.file(), 0, layout.data_start);
        }
        let mut slots = Vec::with_capacity(2);
        for slot in 0..2 {
            let mut buf = vec![0; layout.slot_used()];
            engine.read_at(&mut buf, layout.slot_offset(slot))?;
            slots.push(decode_slot(&layout, &buf));
        }
        let (newest_slot, seq, entries, note) = choose_slot(slots).map_err(|why| bad(path, why))?;
        let table = ZoneTable::restore(layout.geometry, &entries)
            .map_err(|why| bad(path, format!("zone table: {why}")))?;
        let state = State::new(table, entries, newest_slot, seq);
        Ok(Self::assemble(
            path,
            engine,
            layout,
            state,
            note,
            options.read_only,
        ))
    }

    /// Opens the image if it exists, creates it otherwise. An existing image whose geometry
    /// differs from `geometry` is refused unless `options.accept_existing_geometry`.
    pub fn open_or_create(
        path: impl AsRef<Path>,
        geometry: Geometry,
        options: ImageOptions,
    ) -> Result<Self, DeviceError> {
        let path = path.as_ref();
        if !path.exists() {
            return Self::create(path, geometry, options);
        }
        let dev = Self::open(path, options)?;
        let have = dev.core.layout.geometry;
        if have != geometry && !options.accept_existing_geometry {
            return Err(bad(
                path,
                format!(
                    "holds geometry [{}] but [{}] was asked for",
                    describe(&have),
                    describe(&geometry)
                ),
            ));
        }
        Ok(dev)
    }

    fn assemble(
        path: &Path,
        engine: IoEngine,
        layout: Layout,
        state: State,
        note: Option<String>,
        read_only: bool,
    ) -> Self {
        let core = Arc::new(Core {
            engine,
            layout,
            state: Mutex::new(state),
            filled: Condvar::new(),
        });
        ImageDevice {
            path: path.to_path_buf(),
            filler: match read_only {
                true => Filler::none(),
                false => Filler::start(core.clone()),
            },
            core,
            sync_lock: Mutex::new(()),
            syncs: AtomicU64::new(0),
            note,
            read_only,
            #[cfg(test)]
            abandoned: Mutex::new(false),
        }
    }

    /// Drops the device the way a crash would: without writing the zone table (for tests).
    #[cfg(test)]
    fn abandon(self) {
        *self.abandoned.lock().unwrap() = true;
    }

    /// Waits until the fill-ahead asked for by every sync so far is done (for tests).
    #[cfg(test)]
    fn wait_filled(&self) {
        let asked = self.filler.asked.load(Ordering::Acquire);
        while self.filler.done.load(Ordering::Acquire) < asked {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The image file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The I/O engine in use: `"io_uring"` or `"sync"`.
    pub fn io_kind(&self) -> &'static str {
        self.core.engine.kind()
    }

    /// Number of `sync` calls that completed (each is one fdatasync of the image).
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Set when open found the newest zone table copy damaged and used the previous one
    /// (what a crash during a `sync` leaves); says which copy and why.
    pub fn recovery_note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Fault injection: makes the zone ReadOnly or Offline (persisted by the next sync).
    pub fn set_condition(&self, zone: ZoneId, state: ZoneState) -> Result<(), DeviceError> {
        self.writable("a fault")?;
        self.lock().table.set_condition(zone, state)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.core.lock()
    }

    /// Refuses `what` on a read-only device.
    fn writable(&self, what: &'static str) -> Result<(), DeviceError> {
        match self.read_only {
            true => Err(DeviceError::ReadOnly(what)),
            false => Ok(()),
        }
    }

    /// Writes the zone table into the older copy if it changed, or with `lazy` only if it
    /// changed in a way recovery could not redo: a reset, a finish, a fault. Write pointers
    /// that merely moved forward are found again from the store's journal after a crash.
    /// The caller holds `sync_lock` and syncs afterwards.
    fn write_table(&self, lazy: bool) -> Result<(), DeviceError> {
        let mut st = self.lock();
        let entries = st.table.persistent_entries();
        if entries == st.persisted || (lazy && only_advanced(&st.persisted, &entries)) {
            return Ok(());
        }
        let slot = 1 - st.newest_slot;
        let seq = st.seq + 1;
        let bytes = encode_slot(&self.core.layout, seq, &entries);
        self.core
            .engine
            .write_at(&bytes, self.core.layout.slot_offset(slot))?;
        st.persisted = entries;
        st.newest_slot = slot;
        st.seq = seq;
        Ok(())
    }

    /// Resets `zone` in the table; returns its old write pointer. The zone's blocks stay
    /// allocated in the file (and so count as prepared) until a punch gives them back.
    fn reset_table(&self, zone: ZoneId) -> Result<u64, DeviceError> {
        let mut st = self.lock();
        let old = st.table.reset(zone)?;
        let prepared = &mut st.prepared[zone as usize];
        *prepared = (*prepared).max(old);
        Ok(old)
    }
}

/// Gives the space of `zone` back to the host file system if it is still empty (a zone
/// written since its reset is in use, and its blocks with it). Its writes wait meanwhile.
fn punch_if_empty(core: &Core, zone: ZoneId) -> Result<(), DeviceError> {
    {
        let mut st = core.lock();
        if st.table.info(zone)?.write_pointer > 0 || st.punching.contains(&zone) {
            return Ok(());
        }
        st.punching.push(zone);
        st.prepared[zone as usize] = 0;
    }
    let punched = punch(core, zone);
    core.lock().punching.retain(|&z| z != zone);
    core.filled.notify_all();
    punched
}

/// Allocates `len` bytes of the image from `start` (their contents unchanged), so that
/// writing them later needs no room from the host file system. One that cannot allocate
/// ahead keeps the image sparse.
fn allocate(file: &File, start: u64, len: u64) -> Result<(), DeviceError> {
    fallocate(file, libc::FALLOC_FL_KEEP_SIZE, start, len)
}

/// Gives a zone's space back to the host file system (space only, so a file system
/// without hole punching is fine), in steps: a hole punch holds the image's inode locks,
/// so every other read and write of the image waits for the step in progress (a whole
/// 12 MiB zone at once took 3–8 ms).
fn punch(core: &Core, zone: ZoneId) -> Result<(), DeviceError> {
    let start = core.layout.zone_start(zone);
    let end = core.layout.zone_stride;
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let mut at = 0;
    while at < end {
        let len = PUNCH_STEP.min(end - at);
        fallocate(core.engine.file(), mode, start + at, len)?;
        at += len;
    }
    Ok(())
}

/// fallocate(2) of the image's bytes `start..start + len`; a host file system without the
/// operation counts as done.
fn fallocate(file: &File, mode: libc::c_int, start: u64, len: u64) -> Result<(), DeviceError> {
    // SAFETY: plain syscall on a descriptor we own; offsets fit off_t (Layout).
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            start as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(()),
            _ => Err(DeviceError::Io(err)),
        };
    }
    Ok(())
}

impl ZonedDevice for ImageDevice {
    fn geometry(&self) -> Geometry {
        self.core.layout.geometry
    }

    fn reserve(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("a reservation")?;
        self.zone_info(zone)?;
        let layout = &self.core.layout;
        allocate(
            self.core.engine.file(),
            layout.zone_start(zone),
            layout.geometry.zone_capacity,
        )
    }

    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.lock().table.report()
    }

    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        self.lock().table.info(zone)
    }

    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write_overlapped(zone, offset, data, &mut || {})
    }

    fn write_overlapped(
        &self,
        zone: ZoneId,
        offset: u64,
        data: &[u8],
        during: &mut dyn FnMut(),
    ) -> Result<(), DeviceError> {
        self.writable("a write")?;
        let len = data.len() as u64;
        {
            let mut st = self.lock();
            let filling = |st: &State| {
                st.filling
                    .is_some_and(|(z, from, to)| z == zone && offset < to && from < offset + len)
                    || st.punching.contains(&zone)
            };
            while filling(&st) {
                st = self.core.filled.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.table.commit_write(zone, offset, len)?;
            st.touch(zone);
        }
        // The write pointer already covers the data: nothing else can be admitted into this
        // range, and the store never reads what it has not seen written.
        let at = self.core.layout.zone_start(zone) + offset;
        if let Err(e) = self.core.engine.write_at_while(data, at, during) {
            self.lock().table.undo_write(zone, offset, len);
            return Err(e.into());
        }
        if data.len() >= EARLY_WRITEBACK {
            start_writeback(self.core.engine.file(), at, data.len());
        }
        Ok(())
    }

    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.writable("an append")?;
        let len = data.len() as u64;
        let mut st = self.lock();
        while st.punching.contains(&zone) {
            st = self.core.filled.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let offset = st.table.check_append(zone, len)?;
        self.core
            .engine
            .write_at(data, self.core.layout.zone_start(zone) + offset)?;
        st.touch(zone);
        st.table.commit_write(zone, offset, len)?;
        Ok(offset)
    }

    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.lock()
            .table
            .check_read(zone, offset, buf.len() as u64)?;
        // Data below the write pointer does not change until a reset, so the read needs no
        // lock (a read racing a reset of its own zone is the caller's bug).
        self.core
            .engine
            .read_at(buf, self.core.layout.zone_start(zone) + offset)?;
        Ok(())
    }

    fn lazy_write_pointers(&self) -> bool {
        true
    }

    fn read_unwritten(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let capacity = self.core.layout.geometry.zone_capacity;
        let info = self.zone_info(zone)?;
        if info.state == ZoneState::Offline {
            return Err(DeviceError::InvalidState {
                zone,
                state: info.state,
                op: "read",
            });
        }
        match offset.checked_add(buf.len() as u64) {
            Some(end) if end <= capacity => {}
            _ => {
                return Err(DeviceError::ZoneBoundary {
                    zone,
                    offset,
                    len: buf.len() as u64,
                })
            }
        }
        self.core
            .engine
            .read_at(buf, self.core.layout.zone_start(zone) + offset)?;
        Ok(())
    }

    fn restore_write_pointer(&self, zone: ZoneId, wp: u64) -> Result<(), DeviceError> {
        let mut st = self.lock();
        if st.table.restore_write_pointer(zone, wp)? {
            // Blocks up to the restored pointer are written; the filler prepares past it.
            let prepared = &mut st.prepared[zone as usize];
            *prepared = (*prepared).max(wp);
        }
        Ok(())
    }

    /// The zone's blocks stay allocated for a while (warm): a zone the store writes again
    /// soon needs no fill-ahead, whose block allocations the next sync would have to commit
    /// to the host file system's journal (see the module comment). The filler gives a
    /// zone's space back once it has stayed empty for [`WARM_FOR`]; past [`WARM_ZONES`] warm
    /// zones, the oldest goes at once.
    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("a reset")?;
        let old_wp = self.reset_table(zone)?;
        if old_wp == 0 {
            return Ok(());
        }
        let evicted = {
            let mut st = self.lock();
            st.warm.retain(|&(z, _)| z != zone);
            st.warm.push((zone, Instant::now()));
            (st.warm.len() > WARM_ZONES).then(|| st.warm.remove(0).0)
        };
        // The zone is reset either way; an error here only means its space is not back.
        match evicted {
            Some(cold) => punch_if_empty(&self.core, cold),
            None => Ok(()),
        }
    }

    /// No hole punch (3–8 ms for a whole zone): the journal writes its next checkpoint
    /// here at once. Old bytes past the new write pointer stay until overwritten; nothing
    /// reads past a write pointer but recovery, which takes a journal record there only
    /// when its sequence number continues the zone's records (the old ones are older).
    fn reset_for_rewrite(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("a reset")?;
        self.reset_table(zone).map(drop)
    }

    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("a finish")?;
        self.lock().table.finish(zone)
    }

    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.open(zone)
    }

    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.close(zone)
    }

    fn sync(&self) -> Result<(), DeviceError> {
        if self.read_only {
            // Nothing was written through this device: nothing to make durable.
            return Ok(());
        }
        self.sync_with_table(true)?;
        let capacity = self.core.layout.geometry.zone_capacity;
        if self.lock().keep_zones_to_fill(capacity) {
            self.filler.wake();
        }
        Ok(())
    }

    fn sync_at_close(&self) -> Result<(), DeviceError> {
        if self.read_only {
            return Ok(());
        }
        self.sync_with_table(false)
    }

    fn recovered(&self) {
        if self.read_only {
            return;
        }
        let candidates: Vec<ZoneId> = {
            let st = self.lock();
            st.table
                .report()
                .iter()
                .filter(|z| z.state == ZoneState::Empty && !st.warm.iter().any(|w| w.0 == z.id))
                .map(|z| z.id)
                .collect()
        };
        let capacity = self.core.layout.geometry.zone_capacity;
        let found: Vec<(ZoneId, u64)> = candidates
            .into_iter()
            .filter_map(|zone| Some((zone, self.allocated_prefix(zone)?.min(capacity))))
            .collect();
        let now = Instant::now();
        let cold: Vec<(ZoneId, Instant)> = {
            let mut st = self.lock();
            for &(zone, prefix) in &found {
                let prepared = &mut st.prepared[zone as usize];
                *prepared = (*prepared).max(prefix);
            }
            // Reset before anything of this process: the oldest. Past the bound the oldest
            // go now, so that short runs one after another never keep more than the bound.
            let mut warm: Vec<(ZoneId, Instant)> = found.iter().map(|&(z, _)| (z, now)).collect();
            warm.append(&mut st.warm);
            let excess = warm.len().saturating_sub(WARM_ZONES);
            st.warm = warm.split_off(excess);
            warm
        };
        for (zone, _) in cold {
            // Only space: a failure leaves the blocks allocated.
            let _ = punch_if_empty(&self.core, zone);
        }
    }
}

impl ImageDevice {
    /// One fdatasync, after writing the zone table if it changed (with `lazy`, only if a zone
    /// was reset, finished or faulted since the last table write).
    fn sync_with_table(&self, lazy: bool) -> Result<(), DeviceError> {
        let _serial = self.sync_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.write_table(lazy)?;
        if let Err(e) = self.core.engine.sync_data() {
            // The kernel may have dropped the dirty table pages: write it again next time.
            self.lock().persisted.clear();
            return Err(e.into());
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `zone` has blocks allocated in the image file, and if so how many bytes from
    /// its start are (0 when its first block is a hole). `None` also where the host file
    /// system cannot tell (no `SEEK_DATA`): nothing is adopted there.
    fn allocated_prefix(&self, zone: ZoneId) -> Option<u64> {
        let fd = self.core.engine.file().as_raw_fd();
        let start = self.core.layout.zone_start(zone);
        let end = start + self.core.layout.zone_stride;
        let seek = |whence| {
            // SAFETY: plain syscall on a descriptor we own; offsets fit off_t (Layout).
            let at = unsafe { libc::lseek(fd, start as libc::off_t, whence) };
            u64::try_from(at).ok()
        };
        let data = seek(libc::SEEK_DATA).filter(|&at| at < end)?;
        if data > start {
            return Some(0);
        }
        Some(seek(libc::SEEK_HOLE)?.min(end) - start)
    }
}

impl Drop for ImageDevice {
    /// A clean close leaves exact write pointers, so tools that read the table without the
    /// store's recovery see the truth, and gives the space of warm zones back (nothing is
    /// left for the next mount to take again). Best effort: recovery depends on neither.
    fn drop(&mut self) {
        #[cfg(test)]
        if *self.abandoned.lock().unwrap() {
            return;
        }
        if self.read_only {
            return;
        }
        let _serial = self.sync_lock.lock().unwrap_or_else(|e| e.into_inner());
        let before = self.lock().seq;
        if self.write_table(false).is_ok() && self.lock().seq != before {
            let _ = self.core.engine.sync_data();
        }
        let warm = std::mem::take(&mut self.lock().warm);
        for (zone, _) in warm {
            let _ = punch_if_empty(&self.core, zone);
        }
    }
}

/// Whether the table changed from `old` to `new` only by write pointers moving forward
/// within zones that stay partly written (Empty or Closed becoming Closed): what recovery
/// redoes. A zone that fills is written at once, so that recovery never has to guess
/// whether a zone was full (and holds no active resource).
fn only_advanced(old: &[(ZoneState, u64)], new: &[(ZoneState, u64)]) -> bool {
    old.len() == new.len()
        && old.iter().zip(new).all(|(&(os, owp), &(ns, nwp))| {
            (os, owp) == (ns, nwp)
                || (nwp > owp
                    && matches!(os, ZoneState::Empty | ZoneState::Closed)
                    && ns == ZoneState::Closed)
        })
}

fn bad(path: &Path, why: impl Into<String>) -> DeviceError {
    DeviceError::BadImage {
        path: path.display().to_string(),
        why: why.into(),
    }
}

fn describe(g: &Geometry) -> String {
    format!(
        "{} zones of {} bytes, capacity {}, block {}, max open {}, max active {}",
        g.zone_count, g.zone_size, g.zone_capacity, g.block_size, g.max_open, g.max_active
    )
}

/// Starts the host's writeback of `len` bytes at `at` without waiting for it (a later
/// fdatasync waits for what is still in flight, and reports any failure).
fn start_writeback(file: &File, at: u64, len: usize) {
    // SAFETY: plain syscall on a descriptor the caller owns; offsets fit off_t (Layout).
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            at as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

fn sync_parent_dir(path: &Path) -> Result<(), DeviceError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()?;
    Ok(())
}

fn state_code(s: ZoneState) -> u8 {
    // The ZNS zone state codes.
    match s {
        ZoneState::Empty => 0x1,
        ZoneState::ImplicitOpen => 0x2,
        ZoneState::ExplicitOpen => 0x3,
        ZoneState::Closed => 0x4,
        ZoneState::ReadOnly => 0xD,
        ZoneState::Full => 0xE,
        ZoneState::Offline => 0xF,
    }
}

fn state_from_code(c: u8) -> Option<ZoneState> {
    Some(match c {
        0x1 => ZoneState::Empty,
        0x2 => ZoneState::ImplicitOpen,
        0x3 => ZoneState::ExplicitOpen,
        0x4 => ZoneState::Closed,
        0xD => ZoneState::ReadOnly,
        0xE => ZoneState::Full,
        0xF => ZoneState::Offline,
        _ => return None,
    })
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

fn encode_header(layout: &Layout) -> Vec<u8> {
    let g = &layout.geometry;
    let mut h = vec![0; HEADER_LEN as usize];
    h[0..8].copy_from_slice(MAGIC);
    put_u32(&mut h, 8, FORMAT_VERSION);
    put_u32(&mut h, 12, HEADER_LEN as u32);
    put_u32(&mut h, 16, g.zone_count);
    put_u32(&mut h, 20, g.block_size);
    put_u64(&mut h, 24, g.zone_size);
    put_u64(&mut h, 32, g.zone_capacity);
    put_u32(&mut h, 40, g.max_open);
    put_u32(&mut h, 44, g.max_active);
    put_u64(&mut h, 48, HEADER_LEN);
    put_u64(&mut h, 56, layout.slot_len);
    put_u64(&mut h, 64, layout.data_start);
    put_u64(&mut h, 72, layout.zone_stride);
    let crc = crc32c::crc32c(&h[..HEADER_FIELDS]);
    put_u32(&mut h, HEADER_FIELDS, crc);
    h
}

fn decode_header(h: &[u8]) -> Result<Layout, String> {
    if &h[0..8] != MAGIC {
        return Err("not a valet ZNS image (bad magic)".to_string());
    }
    let version = get_u32(h, 8);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version} is not supported (this build reads {FORMAT_VERSION})"
        ));
    }
    let stored = get_u32(h, HEADER_FIELDS);
    let computed = crc32c::crc32c(&h[..HEADER_FIELDS]);
    if stored != computed {
        return Err(format!(
            "header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    let geometry = Geometry {
        zone_count: get_u32(h, 16),
        block_size: get_u32(h, 20),
        zone_size: get_u64(h, 24),
        zone_capacity: get_u64(h, 32),
        max_open: get_u32(h, 40),
        max_active: get_u32(h, 44),
    };
    geometry
        .validate()
        .map_err(|e| format!("header holds an impossible geometry: {e}"))?;
    let layout = Layout::new(geometry).ok_or_else(|| "header geometry is too large".to_string())?;
    let stored_layout = (
        get_u32(h, 12) as u64,
        get_u64(h, 48),
        get_u64(h, 56),
        get_u64(h, 64),
        get_u64(h, 72),
    );
    let expected = (
        HEADER_LEN,
        HEADER_LEN,
        layout.slot_len,
        layout.data_start,
        layout.zone_stride,
    );
    if stored_layout != expected {
        return Err(format!(
            "header layout {stored_layout:?} does not match its geometry (expected {expected:?})"
        ));
    }
    Ok(layout)
}

fn encode_slot(layout: &Layout, seq: u64, entries: &[(ZoneState, u64)]) -> Vec<u8> {
    let mut buf = vec![0; layout.slot_used()];
    put_u64(&mut buf, 0, seq);
    put_u32(&mut buf, 8, entries.len() as u32);
    for (i, &(state, wp)) in entries.iter().enumerate() {
        let at = SLOT_HEAD + i * ENTRY_LEN;
        put_u64(&mut buf, at, wp);
        buf[at + 8] = state_code(state);
    }
    let end = buf.len() - 4;
    let crc = crc32c::crc32c(&buf[..end]);
    put_u32(&mut buf, end, crc);
    buf
}

enum Slot {
    Unused,
    Valid {
        seq: u64,
        entries: Vec<(ZoneState, u64)>,
    },
    Corrupt(String),
}

fn decode_slot(layout: &Layout, buf: &[u8]) -> Slot {
    if buf.iter().all(|&b| b == 0) {
        return Slot::Unused;
    }
    let end = buf.len() - 4;
    let stored = get_u32(buf, end);
    let computed = crc32c::crc32c(&buf[..end]);
    if stored != computed {
        return Slot::Corrupt(format!(
            "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    let seq = get_u64(buf, 0);
    let count = get_u32(buf, 8);
    if count != layout.geometry.zone_count {
        return Slot::Corrupt(format!(
            "holds {count} zones, the header says {}",
            layout.geometry.zone_count
        ));
    }
    if seq == 0 {
        return Slot::Corrupt("sequence number 0".to_string());
    }
    let mut entries = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let at = SLOT_HEAD + i * ENTRY_LEN;
        let code = buf[at + 8];
        let Some(state) = state_from_code(code) else {
            return Slot::Corrupt(format!("zone {i}: unknown state code {code:#x}"));
        };
        entries.push((state, get_u64(buf, at)));
    }
    Slot::Valid { seq, entries }
}

type Chosen = (usize, u64, Vec<(ZoneState, u64)>, Option<String>);

/// Picks the newest valid table copy; falling back past a damaged copy is reported.
fn choose_slot(slots: Vec<Slot>) -> Result<Chosen, String> {
    let name = |i: usize| if i == 0 { "A" } else { "B" };
    let mut valid = Vec::new();
    let mut damaged = Vec::new();
    for (i, slot) in slots.into_iter().enumerate() {
        match slot {
            Slot::Valid { seq, entries } => valid.push((i, seq, entries)),
            Slot::Corrupt(why) => damaged.push(format!("copy {}: {why}", name(i))),
            Slot::Unused => {}
        }
    }
    valid.sort_by_key(|v| v.1);
    match (valid.pop(), valid.pop()) {
        (Some((_, a, _)), Some((_, b, _))) if a == b => Err(format!(
            "zone table copies A and B both claim sequence number {a}"
        )),
        (Some((i, seq, entries)), _) => {
            let note = (!damaged.is_empty()).then(|| {
                format!(
                    "zone table {}; using copy {} (sequence {seq}), the state of the last completed sync",
                    damaged.join(", "),
                    name(i)
                )
            });
            Ok((i, seq, entries, note))
        }
        (None, _) if damaged.is_empty() => Err("zone table is missing".to_string()),
        (None, _) => Err(format!("zone table is corrupt: {}", damaged.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    const BS: usize = 4096;

    /// The device's warm zones, oldest first.
    fn warm_zones(d: &ImageDevice) -> Vec<ZoneId> {
        d.core.lock().warm.iter().map(|&(z, _)| z).collect()
    }

    fn geo() -> Geometry {
        Geometry {
            zone_count: 4,
            zone_size: 8 * BS as u64,
            zone_capacity: 6 * BS as u64,
            block_size: BS as u32,
            max_open: 2,
            max_active: 3,
        }
    }

    fn opts(io: IoMode) -> ImageOptions {
        ImageOptions {
            io,
            ..ImageOptions::default()
        }
    }

    fn block(b: u8) -> Vec<u8> {
        vec![b; BS]
    }

    fn why(e: DeviceError) -> String {
        match e {
            DeviceError::BadImage { why, .. } => why,
            other => panic!("expected BadImage, got {other}"),
        }
    }

    fn flip(path: &Path, at: u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    }

    /// Found trying a full host disk: a sparse image whose host file system filled up
    /// could not mount again (its checkpoint went into a hole), so nothing could be removed
    /// to free space. A reserved zone holds its blocks.
    #[test]
    fn a_reserved_zone_holds_its_blocks() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.img");
        let d = ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap();
        let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let before = allocated();
        d.reserve(1).unwrap();
        let reserved = allocated() - before;
        assert!(reserved >= geo().zone_capacity, "{reserved} bytes");
        assert!(
            reserved < 2 * geo().zone_capacity,
            "only the zone asked for: {reserved}"
        );
        d.write(1, 0, &block(5)).unwrap();
        let mut back = block(0);
        d.read(1, 0, &mut back).unwrap();
        assert_eq!(back, block(5));
    }

    #[test]
    fn create_reopen_keeps_write_pointers_and_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.img");
        {
            let d = ImageDevice::create(&path, geo(), opts(IoMode::Auto)).unwrap();
            d.write(0, 0, &block(1)).unwrap();
            assert_eq!(d.append(0, &block(2)).unwrap(), BS as u64);
            d.write(1, 0, &block(3)).unwrap();
            d.finish(1).unwrap();
            d.write(2, 0, &block(4)).unwrap();
            d.reset(2).unwrap();
            d.open(3).unwrap();
            d.sync().unwrap();
            assert_eq!(d.sync_count(), 1);
            assert!(ImageDevice::create(&path, geo(), opts(IoMode::Auto)).is_err());
        }
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        assert_eq!(d.geometry(), geo());
        assert!(d.recovery_note().is_none());
        let states: Vec<_> = d
            .report_zones()
            .iter()
            .map(|z| (z.state, z.write_pointer))
            .collect();
        assert_eq!(
            states,
            vec![
                (ZoneState::Closed, 2 * BS as u64),
                (ZoneState::Full, 6 * BS as u64),
                (ZoneState::Empty, 0),
                (ZoneState::Empty, 0),
            ]
        );
        let mut buf = vec![0; 2 * BS];
        d.read(0, 0, &mut buf).unwrap();
        assert_eq!(&buf[..BS], &block(1)[..]);
        assert_eq!(&buf[BS..], &block(2)[..]);
        let mut full = vec![9; 6 * BS];
        d.read(1, 0, &mut full).unwrap();
        assert_eq!(&full[..BS], &block(3)[..]);
        assert!(full[BS..].iter().all(|&b| b == 0));
        // Writing carries on at the persisted write pointer.
        d.write(0, 2 * BS as u64, &block(5)).unwrap();
        assert!(d.write(0, 0, &block(5)).is_err());
    }

    #[test]
    fn a_crash_leaves_write_pointers_at_the_last_table_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.img");
        {
            let d = ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap();
            d.write(0, 0, &block(1)).unwrap();
            d.finish(1).unwrap();
            d.sync().unwrap(); // a finish: the table is written (zone 0 at one block)
            d.write(0, BS as u64, &block(2)).unwrap();
            d.sync().unwrap(); // only a write pointer moved: no table write
            d.write(0, 2 * BS as u64, &block(3)).unwrap();
            d.abandon();
        }
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        assert!(d.lazy_write_pointers());
        assert_eq!(d.zone_info(0).unwrap().write_pointer, BS as u64);
        assert_eq!(d.zone_info(1).unwrap().state, ZoneState::Full);
        // The synced block past the pointer is there for recovery to find...
        let mut buf = vec![0; BS];
        assert!(d.read(0, BS as u64, &mut buf).is_err());
        d.read_unwritten(0, BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(2));
        assert!(d.read_unwritten(0, 6 * BS as u64, &mut buf).is_err());
        // ...which moves the pointer forward, never back.
        d.restore_write_pointer(0, 2 * BS as u64).unwrap();
        d.restore_write_pointer(0, BS as u64).unwrap();
        let z = d.zone_info(0).unwrap();
        assert_eq!(
            (z.state, z.write_pointer),
            (ZoneState::Closed, 2 * BS as u64)
        );
        d.read(0, BS as u64, &mut buf).unwrap();
        d.write(0, 2 * BS as u64, &block(4)).unwrap();
        assert!(d.restore_write_pointer(1, BS as u64).is_ok()); // Full: already past
    }

    #[test]
    fn a_clean_close_persists_exact_write_pointers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.img");
        {
            let d = ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap();
            d.write(0, 0, &block(1)).unwrap();
            d.sync().unwrap();
            d.write(0, BS as u64, &block(1)).unwrap();
        }
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        assert_eq!(d.zone_info(0).unwrap().write_pointer, 2 * BS as u64);
    }

    #[test]
    fn restoring_past_the_active_limit_finishes_the_zone() {
        let dir = tempfile::tempdir().unwrap();
        let d = ImageDevice::create(dir.path().join("i"), geo(), opts(IoMode::Sync)).unwrap();
        // geo() allows three active zones.
        for zone in 0..3 {
            d.restore_write_pointer(zone, BS as u64).unwrap();
            assert_eq!(d.zone_info(zone).unwrap().state, ZoneState::Closed);
        }
        d.restore_write_pointer(3, BS as u64).unwrap();
        let z = d.zone_info(3).unwrap();
        assert_eq!((z.state, z.write_pointer), (ZoneState::Full, 6 * BS as u64));
        assert!(
            d.restore_write_pointer(0, BS as u64 + 3).is_err(),
            "unaligned"
        );
        assert!(
            d.restore_write_pointer(0, 7 * BS as u64).is_err(),
            "past capacity"
        );
    }

    #[test]
    fn zone_rules_are_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let d = ImageDevice::create(dir.path().join("i"), geo(), opts(IoMode::Auto)).unwrap();
        assert!(matches!(
            d.write(0, BS as u64, &block(1)),
            Err(DeviceError::NotAtWritePointer { .. })
        ));
        assert!(matches!(
            d.write(0, 0, &[1; 100]),
            Err(DeviceError::Unaligned { .. })
        ));
        assert!(matches!(
            d.write(0, 0, &vec![0; 7 * BS]),
            Err(DeviceError::ZoneBoundary { .. })
        ));
        assert!(matches!(
            d.read(0, 0, &mut [0; 1]),
            Err(DeviceError::ReadPastWritePointer { .. })
        ));
        d.open(0).unwrap();
        d.open(1).unwrap();
        assert!(matches!(d.open(2), Err(DeviceError::TooManyOpen(2))));
        assert!(matches!(d.zone_info(9), Err(DeviceError::NoSuchZone(9))));
    }

    #[test]
    fn sync_writes_the_table_only_when_recovery_could_not_redo_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let d = ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap();
        let slot = |d: &ImageDevice| {
            let st = d.lock();
            (st.seq, st.newest_slot)
        };
        d.sync().unwrap();
        assert_eq!(slot(&d), (1, 0));
        d.open(0).unwrap(); // open / close do not change what is persisted
        d.sync().unwrap();
        d.write(0, 0, &block(1)).unwrap(); // write pointers moving forward: not written
        d.sync().unwrap();
        d.write(0, BS as u64, &block(1)).unwrap();
        d.sync().unwrap();
        assert_eq!(slot(&d), (1, 0));
        d.finish(3).unwrap();
        d.sync().unwrap();
        assert_eq!(slot(&d), (2, 1));
        d.write(0, 2 * BS as u64, &block(1)).unwrap();
        d.sync().unwrap();
        assert_eq!(slot(&d), (2, 1));
        d.reset(0).unwrap();
        d.sync().unwrap();
        d.sync().unwrap();
        assert_eq!(slot(&d), (3, 0));
        d.write(1, 0, &vec![1; 6 * BS]).unwrap(); // a zone filling
        d.sync().unwrap();
        assert_eq!(slot(&d), (4, 1));
        assert_eq!(d.sync_count(), 9);
    }

    /// The journal's next metadata zone is reset without a hole punch, so its old records
    /// stay past the new checkpoint. A crash before the table records that reset leaves a
    /// write pointer from the zone's earlier life: recovery still reads only the records
    /// that continue the new checkpoint.
    #[test]
    fn a_journal_zone_reset_for_rewrite_recovers_only_its_new_records() {
        use crate::store::journal::{self, CheckpointRoom, Journal};
        use crate::store::state::State;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let d = Arc::new(ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap());
        let snapshot = State::new(geo()).snapshot();
        let mut j = Journal::new(d.clone(), 1, 1);
        // Zone 0: a checkpoint and two transactions; then zone 1 takes over and zone 0 is
        // finished, as the store does.
        for checkpoint in 0..2 {
            j.checkpoint(&snapshot, &[], CheckpointRoom::Running)
                .unwrap();
            d.sync().unwrap();
            j.retire_previous().unwrap();
            d.sync().unwrap();
            if checkpoint == 0 {
                assert!(j.append(&[]).unwrap() && j.append(&[]).unwrap());
                d.sync().unwrap();
            }
        }
        assert_eq!(d.zone_info(0).unwrap().state, ZoneState::Full);
        // The next checkpoint goes to zone 0 again, and the process dies before a sync.
        j.checkpoint(&snapshot, &[], CheckpointRoom::Running)
            .unwrap();
        drop(j);
        Arc::into_inner(d).unwrap().abandon();
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        assert_eq!(d.zone_info(0).unwrap().state, ZoneState::Full);
        let read = journal::read_zone(&d, 0).unwrap();
        assert_eq!(
            read.records.len(),
            1,
            "stale records read after the new checkpoint"
        );
        let recovered = journal::recover(&d).unwrap().expect("a checkpoint");
        assert_eq!(recovered.active, 0);
        assert!(recovered.transactions.is_empty());
        // Had the crash torn that checkpoint, the old records after it are no sign of
        // damage: recovery goes back to zone 1, still active.
        let start = d.core.layout.zone_start(0);
        d.abandon();
        use std::os::unix::fs::FileExt;
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0u8; BS], start).unwrap();
        drop(file);
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        let recovered = journal::recover(&d).unwrap().expect("a checkpoint");
        assert_eq!(recovered.active, 1);
    }

    #[test]
    fn create_is_sparse_and_reset_punches() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let g = Geometry {
            zone_count: 16,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            ..geo()
        };
        let d = ImageDevice::create(&path, g, opts(IoMode::Auto)).unwrap();
        let allocated = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
        assert!(std::fs::metadata(&path).unwrap().len() > 16 << 20);
        assert!(allocated(&path) < 1 << 20, "image is not sparse");
        let data = vec![7u8; 1 << 20];
        d.write(3, 0, &data).unwrap();
        d.sync().unwrap();
        let before = allocated(&path);
        d.reset(3).unwrap();
        let after = allocated(&path);
        // Hole punching is optional; where it works the space comes back.
        assert!(after <= before);
        d.write(3, 0, &block(1)).unwrap();
        let mut buf = vec![0; BS];
        d.read(3, 0, &mut buf).unwrap();
        assert_eq!(buf, block(1));
    }

    /// A new image of 8 zones of `zone_size` bytes, in a directory of its own.
    fn image_of_8_zones(zone_size: u64) -> (tempfile::TempDir, PathBuf, ImageDevice) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let g = Geometry {
            zone_count: 8,
            zone_size,
            zone_capacity: zone_size,
            ..geo()
        };
        let d = ImageDevice::create(&path, g, opts(IoMode::Auto)).unwrap();
        (dir, path, d)
    }

    /// How far the host file system's own extent-tree blocks, which it counts in a file's
    /// allocation and which come and go as its writeback merges extents (one 4 KiB block
    /// less, once in about 60 runs here), may move an allocation that a fill or a punch
    /// would change by a megabyte.
    const EXTENT_TREE_SLACK: u64 = 16 * BS as u64;

    /// Bytes the host file system holds for the file at `path`.
    fn allocated_bytes(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn a_zone_that_moved_a_megabyte_since_the_last_sync_is_not_prepared() {
        let (_dir, path, d) = image_of_8_zones(8 << 20);
        let allocated = || allocated_bytes(&path);
        // A stream writing a megabyte or more between syncs: its next bytes would overtake
        // any zeros, so the sync leaves its zone as it is.
        let big = vec![3u8; PREPARE_AHEAD as usize];
        d.write(2, 0, &big).unwrap();
        d.sync().unwrap();
        d.wait_filled();
        let streamed = allocated();
        d.write(2, PREPARE_AHEAD, &big).unwrap();
        d.sync().unwrap();
        d.wait_filled();
        // Its own megabyte; a fill would add another.
        assert!(
            allocated() <= streamed + PREPARE_AHEAD + EXTENT_TREE_SLACK,
            "a streaming zone was filled: {} after {streamed}",
            allocated()
        );
        // The same zone syncing small writes again is prepared after its next sync.
        let before = allocated();
        d.write(2, 2 * PREPARE_AHEAD, &block(4)).unwrap();
        d.sync().unwrap();
        d.wait_filled();
        assert!(
            allocated() >= before + PREPARE_AHEAD - BS as u64,
            "{} after {before}",
            allocated()
        );
        let mut buf = vec![0; BS];
        d.read(2, 2 * PREPARE_AHEAD, &mut buf).unwrap();
        assert_eq!(buf, block(4));
        d.read(2, PREPARE_AHEAD, &mut buf).unwrap();
        assert_eq!(buf, vec![3u8; BS]);
    }

    #[test]
    fn sync_prepares_blocks_past_the_write_pointer() {
        let (_dir, path, d) = image_of_8_zones(4 << 20);
        let allocated = || allocated_bytes(&path);
        let level = |a: u64, b: u64| a.abs_diff(b) <= EXTENT_TREE_SLACK;
        d.write(2, 0, &block(5)).unwrap();
        let before = allocated();
        d.sync().unwrap();
        d.wait_filled();
        // The megabyte past the write pointer is now held by the file system ...
        assert!(
            allocated() >= before + PREPARE_AHEAD - BS as u64,
            "{}",
            allocated()
        );
        // ... without changing the zone: same write pointer, same data, zeros after it.
        assert_eq!(d.zone_info(2).unwrap().write_pointer, BS as u64);
        let mut buf = vec![0; BS];
        d.read(2, 0, &mut buf).unwrap();
        assert_eq!(buf, block(5));
        d.write(2, BS as u64, &block(6)).unwrap();
        d.read(2, BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(6));
        // A sync with plenty prepared ahead writes nothing more; untouched zones never.
        d.sync().unwrap();
        d.wait_filled();
        let steady = allocated();
        d.write(2, 2 * BS as u64, &block(7)).unwrap();
        d.sync().unwrap();
        d.wait_filled();
        assert!(level(allocated(), steady), "{} {steady}", allocated());
        // A reset keeps the zone's blocks: writing it again needs no fill.
        d.reset(2).unwrap();
        d.write(2, 0, &block(8)).unwrap();
        d.sync().unwrap();
        d.wait_filled();
        assert!(level(allocated(), steady), "{} {steady}", allocated());
        d.read(2, 0, &mut buf).unwrap();
        assert_eq!(buf, block(8));
        // Once the space of an empty zone is given back, the next sync prepares it again.
        d.reset(2).unwrap();
        punch_if_empty(&d.core, 2).unwrap();
        assert!(allocated() < steady, "{} {steady}", allocated());
        d.write(2, 0, &block(9)).unwrap();
        d.sync().unwrap();
        d.wait_filled();
        d.read(2, 0, &mut buf).unwrap();
        assert_eq!(buf, block(9));
        assert_eq!(d.core.lock().prepared[2], BS as u64 + PREPARE_AHEAD);
        // A zone written since its reset is in use: its space stays.
        let used = allocated();
        d.reset(2).unwrap();
        d.write(2, 0, &block(10)).unwrap();
        punch_if_empty(&d.core, 2).unwrap();
        assert!(level(allocated(), used), "{} {used}", allocated());
        d.read(2, 0, &mut buf).unwrap();
        assert_eq!(buf, block(10));
    }

    #[test]
    fn reset_zones_stay_warm_up_to_a_bound() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let g = Geometry {
            zone_count: WARM_ZONES as u32 + 4,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            ..geo()
        };
        let d = ImageDevice::create(&path, g, opts(IoMode::Sync)).unwrap();
        let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let full = vec![3u8; 1 << 20];
        for zone in 0..g.zone_count {
            d.write(zone, 0, &full).unwrap();
        }
        d.sync().unwrap();
        let written = allocated();
        for zone in 0..g.zone_count {
            d.reset(zone).unwrap();
        }
        // The first four resets went cold when the bound was passed; the rest stay warm.
        let warm = warm_zones(&d);
        assert_eq!(warm, (4..g.zone_count).collect::<Vec<_>>());
        // ext4 counts its extent tree in the file's blocks: holes split the file's extents,
        // and a new tree block (4 KiB) can take back part of what a hole gave. How many
        // depends on how the file happened to be laid out, so allow a few of them.
        let tree = 4 * 4096;
        let given_back = written - allocated();
        assert!(
            ((4 << 20) - tree..=5 << 20).contains(&given_back),
            "{given_back} bytes given back"
        );
        // Dropping the device gives the rest back.
        let before_close = allocated();
        drop(d);
        let given_back = before_close - allocated();
        assert!(
            given_back >= ((g.zone_count as u64 - 4) << 20) - tree,
            "{given_back} bytes given back at close"
        );
    }

    /// A process may end without dropping its device (`valet-run` does, its store still
    /// held): the zones it kept warm stay allocated, and the next mount takes them as warm
    /// zones of its own once the store has recovered, giving back the oldest past the bound
    /// at once, and never taking a zone with a write pointer.
    #[test]
    fn warm_zones_an_earlier_process_left_are_taken_again_after_recovery() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let g = Geometry {
            zone_count: WARM_ZONES as u32 + 4,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            ..geo()
        };
        let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let d = ImageDevice::create(&path, g, opts(IoMode::Sync)).unwrap();
        let full = vec![3u8; 1 << 20];
        for zone in 0..g.zone_count {
            d.write(zone, 0, &full).unwrap();
        }
        // The last zone keeps its data; every other one is reset and stays warm (the first
        // three went cold past the bound, punched at once).
        for zone in 0..g.zone_count - 1 {
            d.reset(zone).unwrap();
        }
        d.sync_at_close().unwrap();
        let left = allocated();
        d.abandon();
        assert_eq!(allocated(), left, "nothing given back without a drop");
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        assert!(d.core.lock().warm.is_empty(), "an open knows no warm zone");
        d.recovered();
        let warm = warm_zones(&d);
        assert_eq!(warm, (3..g.zone_count - 1).collect::<Vec<_>>());
        let st = d.core.lock();
        for &zone in &warm {
            assert_eq!(
                st.prepared[zone as usize],
                1 << 20,
                "zone {zone} allocated whole"
            );
        }
        drop(st);
        // At the bound: none cold before its time.
        assert!(d.core.lock().take_cold(Instant::now()).is_empty());
        d.abandon();
        // Again, after a reset of this process's own: one past the bound, and the oldest
        // of those adopted gives its space back at once.
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        d.write(0, 0, &full).unwrap();
        d.reset(0).unwrap();
        let before = allocated();
        d.recovered();
        let warm = warm_zones(&d);
        let mut expected: Vec<ZoneId> = (4..g.zone_count - 1).collect();
        expected.push(0);
        assert_eq!(warm, expected);
        let given_back = before - allocated();
        assert!(
            ((1 << 20) - 4 * 4096..=1 << 20).contains(&given_back),
            "{given_back} bytes given back"
        );
        d.abandon();
    }

    /// Synced data in a zone the lazily kept table still calls empty: the open sees an
    /// empty zone with allocated blocks, like a warm one. Recovery restores its write
    /// pointer first, and then it is not taken.
    #[test]
    fn a_zone_whose_synced_data_the_table_does_not_show_is_not_taken_as_warm() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let d = ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap();
        let data = vec![7u8; 2 * BS];
        d.write(2, 0, &data).unwrap();
        d.sync().unwrap();
        d.abandon();
        let d = ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
        assert_eq!(d.zone_info(2).unwrap().state, ZoneState::Empty);
        d.restore_write_pointer(2, data.len() as u64).unwrap();
        d.recovered();
        assert!(d.core.lock().warm.is_empty());
        let mut back = vec![0u8; data.len()];
        d.read(2, 0, &mut back).unwrap();
        assert_eq!(back, data);
        d.abandon();
    }

    #[test]
    fn warm_zones_go_cold_with_age() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let d = ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap();
        for zone in 0..3 {
            d.write(zone, 0, &block(1)).unwrap();
            d.reset(zone).unwrap();
        }
        let warm = warm_zones(&d);
        // They go cold once they have stayed empty long enough.
        let mut st = d.core.lock();
        let (first, last) = (st.warm[0].1, st.warm[warm.len() - 1].1);
        assert!(st.take_cold(first + WARM_FOR / 2).is_empty());
        assert_eq!(st.take_cold(last + WARM_FOR).len(), warm.len());
        assert!(st.warm.is_empty());
    }

    #[test]
    fn second_open_is_refused_while_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let d = ImageDevice::create(&path, geo(), opts(IoMode::Sync)).unwrap();
        let err = why(ImageDevice::open(&path, opts(IoMode::Sync)).err().unwrap());
        assert!(err.contains("in use by another process"), "{err}");
        drop(d);
        ImageDevice::open(&path, opts(IoMode::Sync)).unwrap();
    }

    #[test]
    fn open_or_create_checks_geometry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        drop(ImageDevice::open_or_create(&path, geo(), opts(IoMode::Sync)).unwrap());
        drop(ImageDevice::open_or_create(&path, geo(), opts(IoMode::Sync)).unwrap());
        let other = Geometry {
            max_active: 4,
            ..geo()
        };
        let err = why(
            ImageDevice::open_or_create(&path, other, opts(IoMode::Sync))
                .err()
                .unwrap(),
        );
        assert!(
            err.contains("max active 3") && err.contains("max active 4"),
            "{err}"
        );
        let accept = ImageOptions {
            accept_existing_geometry: true,
            ..opts(IoMode::Sync)
        };
        let d = ImageDevice::open_or_create(&path, other, accept).unwrap();
        assert_eq!(d.geometry(), geo());
    }

    #[test]
    fn bad_images_are_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let p = dir.path().join(name);
            drop(ImageDevice::create(&p, geo(), opts(IoMode::Sync)).unwrap());
            p
        };
        let open = |p: &Path| why(ImageDevice::open(p, opts(IoMode::Sync)).err().unwrap());

        let p = dir.path().join("missing");
        assert!(open(&p).contains("cannot open"));

        let p = make("magic");
        flip(&p, 0);
        assert!(open(&p).contains("bad magic"));

        let p = make("short");
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(100)
            .unwrap();
        assert!(open(&p).contains("truncated"));

        let p = make("trunc");
        let len = std::fs::metadata(&p).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        assert!(open(&p).contains("truncated"));

        let p = make("header");
        flip(&p, 30);
        assert!(open(&p).contains("header checksum"));

        let p = make("version");
        flip(&p, 8);
        assert!(open(&p).contains("version"));

        let p = make("table");
        flip(&p, HEADER_LEN + SLOT_HEAD as u64 + 3);
        let w = open(&p);
        assert!(w.contains("zone table is corrupt"), "{w}");

        let p = make("empty");
        std::fs::write(&p, b"").unwrap();
        assert!(open(&p).contains("truncated"));

        for w in [
            open(&dir.path().join("magic")),
            open(&dir.path().join("table")),
        ] {
            assert!(!w.contains('\n'));
        }
    }

    #[test]
    fn inconsistent_table_with_valid_checksum_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("i");
        let layout = Layout::new(geo()).unwrap();
        drop(ImageDevice::create(&p, geo(), opts(IoMode::Sync)).unwrap());
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        let mut entries = vec![(ZoneState::Empty, 0); 4];
        entries[2] = (ZoneState::Closed, 100 * BS as u64);
        f.write_all_at(&encode_slot(&layout, 5, &entries), layout.slot_offset(1))
            .unwrap();
        let w = why(ImageDevice::open(&p, opts(IoMode::Sync)).err().unwrap());
        assert!(w.contains("zone 2") && w.contains("capacity"), "{w}");
        entries[2] = (ZoneState::Empty, BS as u64);
        f.write_all_at(&encode_slot(&layout, 5, &entries), layout.slot_offset(1))
            .unwrap();
        let w = why(ImageDevice::open(&p, opts(IoMode::Sync)).err().unwrap());
        assert!(w.contains("Empty with write pointer"), "{w}");
    }

    #[test]
    fn torn_newest_table_copy_falls_back_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("i");
        let layout = Layout::new(geo()).unwrap();
        {
            let d = ImageDevice::create(&p, geo(), opts(IoMode::Sync)).unwrap();
            d.finish(0).unwrap();
            d.sync().unwrap(); // copy B, sequence 2
            d.finish(1).unwrap();
            d.sync().unwrap(); // copy A, sequence 3
            d.abandon();
        }
        flip(&p, layout.slot_offset(0) + SLOT_HEAD as u64 + 2);
        {
            let d = ImageDevice::open(&p, opts(IoMode::Sync)).unwrap();
            let note = d.recovery_note().unwrap();
            assert!(
                note.contains("copy A") && note.contains("using copy B"),
                "{note}"
            );
            assert_eq!(d.zone_info(0).unwrap().state, ZoneState::Full);
            assert_eq!(d.zone_info(1).unwrap().state, ZoneState::Empty);
            // The next table write overwrites the damaged copy.
            d.finish(2).unwrap();
            d.sync().unwrap();
            d.abandon();
        }
        let d = ImageDevice::open(&p, opts(IoMode::Sync)).unwrap();
        assert!(d.recovery_note().is_none());
        assert_eq!(d.zone_info(2).unwrap().state, ZoneState::Full);
        drop(d);
        // Both copies damaged: refused.
        flip(&p, layout.slot_offset(0) + 40);
        flip(&p, layout.slot_offset(1) + 40);
        let w = why(ImageDevice::open(&p, opts(IoMode::Sync)).err().unwrap());
        assert!(w.contains("copy A") && w.contains("copy B"), "{w}");
    }

    #[test]
    fn uring_and_sync_images_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("i");
        let pattern: Vec<u8> = (0..3 * BS).map(|i| (i * 7 % 251) as u8).collect();
        {
            let d = match ImageDevice::create(&p, geo(), opts(IoMode::Uring)) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("io_uring unavailable here, skipping: {e}");
                    return;
                }
            };
            assert_eq!(d.io_kind(), "io_uring");
            d.write(1, 0, &pattern).unwrap();
            d.sync().unwrap();
        }
        let mut reads = Vec::new();
        for mode in [IoMode::Uring, IoMode::Sync] {
            let d = ImageDevice::open(&p, opts(mode)).unwrap();
            let mut buf = vec![0; pattern.len() - 5];
            d.read(1, 5, &mut buf).unwrap();
            reads.push(buf);
        }
        assert_eq!(reads[0], reads[1]);
        assert_eq!(reads[0], pattern[5..]);
    }

    #[test]
    fn sync_mode_reports_its_engine() {
        let dir = tempfile::tempdir().unwrap();
        let d = ImageDevice::create(dir.path().join("i"), geo(), opts(IoMode::Sync)).unwrap();
        assert_eq!(d.io_kind(), "sync");
    }

    #[test]
    fn conditions_persist() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("i");
        {
            let d = ImageDevice::create(&p, geo(), opts(IoMode::Sync)).unwrap();
            d.write(0, 0, &block(1)).unwrap();
            d.set_condition(0, ZoneState::ReadOnly).unwrap();
            d.set_condition(1, ZoneState::Offline).unwrap();
            d.sync().unwrap();
        }
        let d = ImageDevice::open(&p, opts(IoMode::Sync)).unwrap();
        assert_eq!(d.zone_info(0).unwrap().state, ZoneState::ReadOnly);
        assert_eq!(d.zone_info(1).unwrap().state, ZoneState::Offline);
        let mut buf = vec![0; BS];
        d.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, block(1));
    }

    #[test]
    fn shared_between_threads() {
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let d =
            Arc::new(ImageDevice::create(dir.path().join("i"), geo(), opts(IoMode::Auto)).unwrap());
        let handles: Vec<_> = (0..2u32)
            .map(|z| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    for i in 0..6u64 {
                        let off = d.append(z, &block(z as u8 + i as u8)).unwrap();
                        let mut buf = vec![0; BS];
                        d.read(z, off, &mut buf).unwrap();
                        assert_eq!(buf, block(z as u8 + i as u8));
                        d.sync().unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(d.zone_info(0).unwrap().state, ZoneState::Full);
        assert_eq!(d.zone_info(1).unwrap().state, ZoneState::Full);
    }
}
