//! A zoned device over a zonefs mount (or a directory laid out like one, for tests).
//!
//! zonefs exposes every sequential zone of a drive as a file `seq/<n>`: the file size is the
//! zone's write pointer, writes append at the file size, `truncate(0)` resets the zone and
//! `truncate(capacity)` finishes it. Conventional zones live in `cnv/`; the store does not use
//! them, so they are only tolerated.
//!
//! On a real mount (`mount -t zonefs -o errors=repair /dev/nvmeXnY DIR`, recognised by the
//! file system's magic number) everything is read from the kernel: the zone size from
//! `queue/chunk_sectors`, the zone capacity from the zone report (`BLKREPORTZONE`, as
//! `blkzone report` prints it; it may be smaller than the zone size), the open / active limits
//! from `queue/max_open_zones` and `max_active_zones`, and the logical block size. Sequential
//! files accept only direct writes, so every write goes through an `O_DIRECT` handle from a
//! buffer aligned to the block size. A real mount holds no file but the zone files: zonefs
//! answers a lookup of any other name with ENAMETOOLONG.
//!
//! When a write exceeds the drive's open or active zone limits the kernel fails it with
//! ETOOMANYREFS or EOVERFLOW; they come back as [`DeviceError::TooManyOpen`] and
//! [`DeviceError::TooManyActive`]. zonefs's default `errors=remount-ro` turns any such error
//! into a read-only file system, so mount with `errors=repair`: the write pointer is then
//! read back from the device, the zone file's size fixed, and the mount stays writable.
//!
//! The mount's root directory is locked (see `exclusive`): one store writes to a mount at a
//! time, and tools that only read it ([`ZonefsOptions::read_only`]) share it among
//! themselves, never with a writer.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::blkzone::{self, KernelZone, ZoneKind};
use super::exclusive;
use super::sysfs::BlockDev;
use super::{DeviceError, Geometry, ZoneId, ZoneInfo, ZoneState, ZoneTable, ZonedDevice};

/// `ZONEFS_MAGIC` from `linux/magic.h`: `statfs` of a real zonefs mount.
const ZONEFS_MAGIC: i64 = 0x5a4f_4653;

/// On an emulated layout, records the zone capacity `format_emulated` was given (a real
/// zonefs mount has no such file and cannot hold one).
const CAPACITY_FILE: &str = ".valet-zone-capacity";
/// Zone files kept open at once; others are reopened on demand.
const MAX_HANDLES: usize = 256;

/// How to interpret a zonefs mount.
///
/// On a real mount the device's own values win: `zone_capacity`, when given, must agree with
/// the zone report; `max_open` / `max_active` only lower the drive's limits (a drive without
/// limits gets these); `block_size` and `direct_io` are taken from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZonefsOptions {
    /// Writable bytes per zone. `None`: from the zone report of a real mount, else from the
    /// emulated layout's record.
    pub zone_capacity: Option<u64>,
    /// Most zones open at once.
    pub max_open: u32,
    /// Most zones open or closed at once.
    pub max_active: u32,
    /// Write granularity in bytes (emulated layouts).
    pub block_size: u32,
    /// Write through `O_DIRECT` handles (always on a real mount).
    pub direct_io: bool,
    /// Open for reading only (tools that inspect a store): zone files are opened read-only,
    /// writes, resets and finishes are refused, and the mount is locked shared, so several
    /// readers may open it at once but none while a store writes to it.
    pub read_only: bool,
}

impl Default for ZonefsOptions {
    /// ZN540-like limits, 4 KiB blocks, buffered writes (for emulated layouts).
    fn default() -> Self {
        ZonefsOptions {
            zone_capacity: None,
            max_open: 14,
            max_active: 14,
            block_size: 4096,
            direct_io: false,
            read_only: false,
        }
    }
}

/// Open handles of one zone file.
struct ZoneFile {
    file: File,
    /// `O_DIRECT` handle for writes, when `direct_io`.
    direct: Option<File>,
}

struct State {
    table: ZoneTable,
    /// Zones written, reset or finished since the last sync.
    dirty: BTreeSet<ZoneId>,
}

#[derive(Default)]
struct Handles {
    open: HashMap<ZoneId, (Arc<ZoneFile>, u64)>,
    tick: u64,
}

/// A zoned device backed by the `seq/` files of a zonefs mount.
///
/// Zone states are not persisted by zonefs: at open, empty files are Empty zones, files at
/// capacity Full ones, and everything in between Closed.
pub struct ZonefsDevice {
    root: PathBuf,
    /// The root directory, open for as long as the device is: it holds the lock.
    _lock: File,
    read_only: bool,
    direct_io: bool,
    /// The zoned block device of a real mount.
    kernel: Option<KernelDevice>,
    state: Mutex<State>,
    handles: Mutex<Handles>,
    syncs: AtomicU64,
}

impl ZonefsDevice {
    /// Opens the zonefs layout at `root`, reading write pointers from the file sizes.
    pub fn open(root: impl AsRef<Path>, options: ZonefsOptions) -> Result<Self, DeviceError> {
        let root = root.as_ref();
        let seq = root.join("seq");
        if !seq.is_dir() {
            return Err(bad(root, "not a zonefs layout: no seq/ directory"));
        }
        let lock = File::open(root).map_err(|e| bad(root, format!("cannot open: {e}")))?;
        exclusive::lock(root, &lock, options.read_only, "zonefs mount")?;
        let zone_count = count_zone_files(root, &seq)?;
        let (geometry, kernel) = if is_zonefs_mount(root)? {
            let (geometry, kernel) = KernelDevice::probe(root, zone_count, &options)?;
            (geometry, Some(kernel))
        } else {
            let zone_capacity = resolve_capacity(root, options.zone_capacity)?;
            let geometry = Geometry {
                zone_count,
                zone_size: zone_capacity,
                zone_capacity,
                block_size: options.block_size,
                max_open: options.max_open,
                max_active: options.max_active,
            };
            (geometry, None)
        };
        geometry.validate()?;
        let zone_capacity = geometry.zone_capacity;
        let bs = geometry.block_size as u64;
        let mut entries = Vec::with_capacity(zone_count as usize);
        for zone in 0..zone_count {
            let path = seq.join(zone.to_string());
            let size = std::fs::metadata(&path)
                .map_err(|e| bad(&path, format!("cannot stat: {e}")))?
                .len();
            if size > zone_capacity {
                return Err(bad(
                    &path,
                    format!("size {size} exceeds the zone capacity {zone_capacity}"),
                ));
            }
            if size % bs != 0 {
                return Err(bad(
                    &path,
                    format!("size {size} is not a multiple of the block size {bs}"),
                ));
            }
            let mut state = match size {
                0 => ZoneState::Empty,
                s if s == zone_capacity => ZoneState::Full,
                _ => ZoneState::Closed,
            };
            if let Some(k) = &kernel {
                state = k
                    .check_zone(zone, state, size)
                    .map_err(|why| bad(&path, why))?;
            }
            entries.push((state, size));
        }
        let table = ZoneTable::restore(geometry, &entries).map_err(|why| bad(root, why))?;
        Ok(ZonefsDevice {
            root: root.to_path_buf(),
            _lock: lock,
            read_only: options.read_only,
            direct_io: (options.direct_io || kernel.is_some()) && !options.read_only,
            kernel,
            state: Mutex::new(State {
                table,
                dirty: BTreeSet::new(),
            }),
            handles: Mutex::new(Handles::default()),
            syncs: AtomicU64::new(0),
        })
    }

    /// Lays out an emulated zonefs mount at `root`: `seq/0 .. seq/<zone_count - 1>` empty,
    /// an empty `cnv/`, and a record of the zone capacity for `open`.
    pub fn format_emulated(
        root: impl AsRef<Path>,
        zone_count: u32,
        zone_capacity: u64,
    ) -> Result<(), DeviceError> {
        let root = root.as_ref();
        if zone_count == 0 || zone_capacity == 0 {
            return Err(DeviceError::BadGeometry(
                "need at least one zone and a non-zero capacity".to_string(),
            ));
        }
        let seq = root.join("seq");
        std::fs::create_dir_all(&seq)?;
        std::fs::create_dir_all(root.join("cnv"))?;
        if std::fs::read_dir(&seq)?.next().is_some() {
            return Err(bad(root, "already formatted: seq/ is not empty"));
        }
        for zone in 0..zone_count {
            File::create(seq.join(zone.to_string()))?;
        }
        std::fs::write(root.join(CAPACITY_FILE), format!("{zone_capacity}\n"))?;
        Ok(())
    }

    /// The mount point.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this is a real zonefs mount (not an emulated layout).
    pub fn is_kernel_zonefs(&self) -> bool {
        self.kernel.is_some()
    }

    /// On a real mount, the device's own zone report now (`BLKREPORTZONE`) for the store's
    /// zones, numbered as the store numbers them; `None` for an emulated layout.
    pub fn kernel_report(&self) -> Result<Option<Vec<ZoneInfo>>, DeviceError> {
        let Some(k) = &self.kernel else {
            return Ok(None);
        };
        let report = blkzone::report(&k.dev.node())?;
        let zones = report
            .into_iter()
            .skip(1)
            .filter(|z| z.kind == ZoneKind::SequentialRequired)
            .enumerate()
            .map(|(i, z)| ZoneInfo {
                id: i as ZoneId,
                state: z.state.unwrap_or(ZoneState::Offline),
                write_pointer: z.write_pointer,
                capacity: z.capacity,
            })
            .collect();
        Ok(Some(zones))
    }

    /// The block device of a real mount (`nvme0n1`).
    pub fn kernel_device(&self) -> Option<&str> {
        self.kernel.as_ref().map(|k| k.dev.name.as_str())
    }

    /// Number of `sync` calls that completed.
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Fault injection: makes the zone ReadOnly or Offline (in memory only).
    pub fn set_condition(&self, zone: ZoneId, state: ZoneState) -> Result<(), DeviceError> {
        self.lock().table.set_condition(zone, state)
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

    fn zone_path(&self, zone: ZoneId) -> PathBuf {
        self.root.join("seq").join(zone.to_string())
    }

    /// The open handles of a zone file, opening (and evicting the least recently used) as
    /// needed so a drive with thousands of zones does not hold thousands of descriptors.
    fn handle(&self, zone: ZoneId) -> Result<Arc<ZoneFile>, DeviceError> {
        let mut h = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        h.tick += 1;
        let tick = h.tick;
        if let Some((file, used)) = h.open.get_mut(&zone) {
            *used = tick;
            return Ok(Arc::clone(file));
        }
        let path = self.zone_path(zone);
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!self.read_only);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(&path)
                .map_err(|e| bad(&path, format!("cannot open zone file: {e}")))
        };
        let zf = Arc::new(ZoneFile {
            file: open(false)?,
            direct: if self.direct_io {
                Some(open(true)?)
            } else {
                None
            },
        });
        if h.open.len() >= MAX_HANDLES {
            if let Some(&victim) = h
                .open
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(z, _)| z)
            {
                // Users holding the Arc keep the descriptor until they finish.
                h.open.remove(&victim);
            }
        }
        h.open.insert(zone, (Arc::clone(&zf), tick));
        Ok(zf)
    }

    /// Writes at the write pointer and advances it; a failed write leaves it where it was.
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
            let zf = self.handle(zone)?;
            let geometry = st.table.geometry();
            let res = match &zf.direct {
                Some(direct) => AlignedBuf::copy_of(data, geometry.block_size as usize)
                    .and_then(|buf| direct.write_all_at(buf.as_slice(), offset)),
                None => zf.file.write_all_at(data, offset),
            };
            if let Err(e) = res {
                if self.kernel.is_some() {
                    // The kernel keeps the file size at the device's write pointer: follow
                    // it past whatever part of the write landed.
                    if let Ok(size) = zf.file.metadata().map(|m| m.len()) {
                        if size > offset && size <= offset + len {
                            st.table.commit_write(zone, offset, size - offset)?;
                            st.dirty.insert(zone);
                        }
                    }
                } else if let Err(undo) = zf.file.set_len(offset) {
                    // An emulated layout keeps file size == write pointer itself.
                    return Err(bad(
                        &self.zone_path(zone),
                        format!("write failed ({e}) and could not be undone ({undo})"),
                    ));
                }
                return Err(kernel_error(e, &geometry));
            }
        }
        st.table.commit_write(zone, offset, len)?;
        st.dirty.insert(zone);
        Ok(())
    }
}

impl ZonedDevice for ZonefsDevice {
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
        if buf.is_empty() {
            return Ok(());
        }
        // Data below the write pointer is immutable until a reset: no lock needed.
        self.handle(zone)?.file.read_exact_at(buf, offset)?;
        Ok(())
    }

    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("reset")?;
        let mut st = self.lock();
        let mut next = st.table.clone();
        next.reset(zone)?;
        self.handle(zone)?.file.set_len(0)?;
        st.table = next;
        st.dirty.insert(zone);
        Ok(())
    }

    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.writable("finish")?;
        let mut st = self.lock();
        let mut next = st.table.clone();
        next.finish(zone)?;
        let cap = next.geometry().zone_capacity;
        self.handle(zone)?.file.set_len(cap)?;
        st.table = next;
        st.dirty.insert(zone);
        Ok(())
    }

    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.open(zone)
    }

    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.lock().table.close(zone)
    }

    fn sync(&self) -> Result<(), DeviceError> {
        let dirty = std::mem::take(&mut self.lock().dirty);
        let mut pending = dirty.iter();
        // fdatasync is per file, not per descriptor, so a reopened handle flushes too.
        for &zone in pending.by_ref() {
            if let Err(e) = self.handle(zone).and_then(|zf| Ok(zf.file.sync_data()?)) {
                let mut st = self.lock();
                st.dirty.insert(zone);
                st.dirty.extend(pending);
                return Err(e);
            }
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The zoned block device under a real zonefs mount.
struct KernelDevice {
    dev: BlockDev,
    /// The device's zone report at open, for the zones behind `seq/0..`, in order.
    zones: Vec<KernelZone>,
}

impl KernelDevice {
    /// Reads the geometry of the device mounted at `root` from sysfs and its zone report.
    fn probe(
        root: &Path,
        zone_count: u32,
        options: &ZonefsOptions,
    ) -> Result<(Geometry, KernelDevice), DeviceError> {
        let fail = |what: &str, e: io::Error| bad(root, format!("{what}: {e}"));
        let dev = BlockDev::mounted_at(root).map_err(|e| fail("no block device", e))?;
        let zone_size = dev.zone_size().map_err(|e| fail("zone size", e))?;
        let block_size = dev
            .logical_block_size()
            .map_err(|e| fail("block size", e))?;
        // 0 means the drive sets no limit; ours then apply.
        let limit = |device: u32, ours: u32| if device == 0 { ours } else { device.min(ours) };
        let max_active = limit(
            dev.max_active_zones()
                .map_err(|e| fail("max_active_zones", e))?,
            options.max_active,
        );
        let max_open = limit(
            dev.max_open_zones()
                .map_err(|e| fail("max_open_zones", e))?,
            options.max_open,
        )
        .min(max_active);
        let report = blkzone::report(&dev.node()).map_err(|e| fail("zone report", e))?;
        // zonefs keeps its superblock in the first zone and lists every other sequential
        // zone, in order, as seq/0, seq/1, ...
        let zones: Vec<KernelZone> = report
            .into_iter()
            .skip(1)
            .filter(|z| z.kind == ZoneKind::SequentialRequired)
            .collect();
        if zones.len() != zone_count as usize {
            return Err(bad(
                root,
                format!(
                    "seq/ holds {zone_count} files but {} has {} sequential zones after the first",
                    dev.name,
                    zones.len()
                ),
            ));
        }
        let zone_capacity = zones[0].capacity;
        if let Some(z) = zones.iter().find(|z| z.capacity != zone_capacity) {
            return Err(bad(
                root,
                format!(
                    "zones of different capacities ({zone_capacity} and {} at byte {}) are not supported",
                    z.capacity, z.start
                ),
            ));
        }
        if let Some(given) = options.zone_capacity {
            if given != zone_capacity {
                return Err(bad(
                    root,
                    format!(
                        "zone capacity {given} was given but {} reports {zone_capacity}",
                        dev.name
                    ),
                ));
            }
        }
        let geometry = Geometry {
            zone_count,
            zone_size,
            zone_capacity,
            block_size,
            max_open,
            max_active,
        };
        Ok((geometry, KernelDevice { dev, zones }))
    }

    /// Checks a zone file against the device's report at open; the device's fault states
    /// (read-only, offline) win.
    fn check_zone(&self, zone: ZoneId, state: ZoneState, size: u64) -> Result<ZoneState, String> {
        let k = &self.zones[zone as usize];
        match k.state {
            Some(s @ (ZoneState::ReadOnly | ZoneState::Offline)) => Ok(s),
            _ if k.write_pointer != size => Err(format!(
                "size {size} differs from the device's write pointer {} (zone at byte {})",
                k.write_pointer, k.start
            )),
            _ => Ok(state),
        }
    }
}

/// Whether `root` is a real zonefs mount (not an emulated layout).
fn is_zonefs_mount(root: &Path) -> Result<bool, DeviceError> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(root.as_os_str().as_bytes())
        .map_err(|_| bad(root, "path holds a NUL byte"))?;
    // SAFETY: `statfs` is plain data, filled in by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` is a valid out pointer.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return Err(bad(
            root,
            format!("cannot statfs: {}", io::Error::last_os_error()),
        ));
    }
    Ok(st.f_type as i64 == ZONEFS_MAGIC)
}

/// The kernel's error for a write that broke a zone resource limit, named as a drive names it.
fn kernel_error(e: io::Error, geometry: &Geometry) -> DeviceError {
    match e.raw_os_error() {
        Some(libc::EOVERFLOW) => DeviceError::TooManyActive(geometry.max_active),
        Some(libc::ETOOMANYREFS) => DeviceError::TooManyOpen(geometry.max_open),
        _ => DeviceError::Io(e),
    }
}

fn bad(path: &Path, why: impl Into<String>) -> DeviceError {
    DeviceError::BadImage {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// Checks `seq/` holds exactly the files `0 .. N-1` and returns N.
fn count_zone_files(root: &Path, seq: &Path) -> Result<u32, DeviceError> {
    let mut ids = Vec::new();
    let entries = std::fs::read_dir(seq).map_err(|e| bad(seq, format!("cannot list: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| bad(seq, format!("cannot list: {e}")))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let id = name
            .parse::<u32>()
            .ok()
            .filter(|id| id.to_string() == name)
            .ok_or_else(|| bad(seq, format!("unexpected entry `{name}`")))?;
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        if !is_file {
            return Err(bad(seq, format!("`{name}` is not a regular file")));
        }
        ids.push(id);
    }
    if ids.is_empty() {
        return Err(bad(root, "seq/ holds no zone files"));
    }
    ids.sort_unstable();
    if let Some(missing) = ids.iter().enumerate().find(|(i, id)| *i as u32 != **id) {
        return Err(bad(
            seq,
            format!(
                "zone files are not numbered 0..{} contiguously (zone {} is missing)",
                ids.len(),
                missing.0
            ),
        ));
    }
    Ok(ids.len() as u32)
}

fn resolve_capacity(root: &Path, given: Option<u64>) -> Result<u64, DeviceError> {
    let record = root.join(CAPACITY_FILE);
    let recorded = match std::fs::read_to_string(&record) {
        Ok(s) => Some(
            s.trim()
                .parse::<u64>()
                .map_err(|_| bad(&record, format!("not a capacity: `{}`", s.trim())))?,
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(bad(&record, format!("cannot read: {e}"))),
    };
    match (given, recorded) {
        (Some(g), Some(r)) if g != r => Err(bad(
            root,
            format!("zone capacity {g} was given but the layout was formatted with {r}"),
        )),
        (Some(g), _) => Ok(g),
        (None, Some(r)) => Ok(r),
        (None, None) => sysfs_zone_size(root).ok_or_else(|| {
            bad(
                root,
                "zone capacity unknown: pass ZonefsOptions::zone_capacity \
                 (`blkzone report` shows it as cap)",
            )
        }),
    }
}

/// Zone size of the zoned block device `root` is mounted from, from sysfs.
fn sysfs_zone_size(root: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(root).ok()?.dev();
    let queue = format!(
        "/sys/dev/block/{}:{}/queue",
        libc::major(dev),
        libc::minor(dev)
    );
    let read = |name: &str| std::fs::read_to_string(format!("{queue}/{name}")).ok();
    if read("zoned")?.trim() == "none" {
        return None;
    }
    let sectors: u64 = read("chunk_sectors")?.trim().parse().ok()?;
    (sectors > 0).then(|| sectors * 512)
}

/// A heap buffer aligned for `O_DIRECT`.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    /// Memory alignment that satisfies `O_DIRECT` on every device we meet.
    const ALIGN: usize = 4096;

    fn copy_of(data: &[u8], block_size: usize) -> io::Result<Self> {
        let align = Self::ALIGN.max(block_size);
        let layout = std::alloc::Layout::from_size_align(data.len().max(1), align)
            .map_err(|_| io::Error::other("write too large for an aligned buffer"))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr = std::ptr::NonNull::new(raw)
            .ok_or_else(|| io::Error::other("out of memory for an aligned buffer"))?;
        // SAFETY: `ptr` points to at least `data.len()` freshly allocated bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len()) };
        Ok(AlignedBuf { ptr, layout })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: initialised by `copy_of` for the requested length (≤ layout size).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `copy_of` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4096;
    const CAP: u64 = 4 * BS as u64;

    fn opts() -> ZonefsOptions {
        ZonefsOptions {
            max_open: 2,
            max_active: 3,
            ..ZonefsOptions::default()
        }
    }

    fn formatted(zones: u32) -> (tempfile::TempDir, ZonefsDevice) {
        let dir = tempfile::tempdir().unwrap();
        ZonefsDevice::format_emulated(dir.path(), zones, CAP).unwrap();
        let d = ZonefsDevice::open(dir.path(), opts()).unwrap();
        (dir, d)
    }

    fn size(dir: &tempfile::TempDir, zone: u32) -> u64 {
        std::fs::metadata(dir.path().join("seq").join(zone.to_string()))
            .unwrap()
            .len()
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

    #[test]
    fn format_then_open() {
        let (dir, d) = formatted(3);
        assert!(dir.path().join("cnv").is_dir());
        let g = d.geometry();
        assert_eq!((g.zone_count, g.zone_capacity, g.max_open), (3, CAP, 2));
        assert!(d.report_zones().iter().all(|z| z.state == ZoneState::Empty));
        let again = ZonefsDevice::format_emulated(dir.path(), 3, CAP).unwrap_err();
        assert!(why(again).contains("already formatted"));
    }

    #[test]
    fn writes_resets_and_finishes_map_to_file_sizes() {
        let (dir, d) = formatted(3);
        d.write(0, 0, &block(1)).unwrap();
        assert_eq!(size(&dir, 0), BS as u64);
        assert_eq!(d.append(0, &block(2)).unwrap(), BS as u64);
        assert_eq!(size(&dir, 0), 2 * BS as u64);
        let mut buf = vec![0; 2 * BS];
        d.read(0, 0, &mut buf).unwrap();
        assert_eq!(&buf[..BS], &block(1)[..]);
        assert_eq!(&buf[BS..], &block(2)[..]);
        assert!(matches!(
            d.write(0, 0, &block(3)),
            Err(DeviceError::NotAtWritePointer { .. })
        ));
        assert!(d.read(0, 0, &mut vec![0; 2 * BS + 1]).is_err());
        d.finish(0).unwrap();
        assert_eq!(size(&dir, 0), CAP);
        assert_eq!(d.zone_info(0).unwrap().state, ZoneState::Full);
        d.reset(0).unwrap();
        assert_eq!(size(&dir, 0), 0);
        assert_eq!(d.zone_info(0).unwrap().state, ZoneState::Empty);
        d.set_condition(1, ZoneState::ReadOnly).unwrap();
        assert!(d.reset(1).is_err());
        assert!(d.finish(1).is_err());
        d.sync().unwrap();
        assert_eq!(d.sync_count(), 1);
    }

    #[test]
    fn one_writer_at_a_time_and_readers_only_beside_readers() {
        let (dir, d) = formatted(2);
        d.write(0, 0, &block(7)).unwrap();
        let read_only = ZonefsOptions {
            read_only: true,
            ..opts()
        };
        let in_use = |e| why(e).contains("zonefs mount is in use by another process");
        assert!(in_use(
            ZonefsDevice::open(dir.path(), opts()).err().unwrap()
        ));
        assert!(in_use(
            ZonefsDevice::open(dir.path(), read_only).err().unwrap()
        ));
        drop(d);

        let reader = ZonefsDevice::open(dir.path(), read_only).unwrap();
        let other = ZonefsDevice::open(dir.path(), read_only).unwrap();
        assert!(in_use(
            ZonefsDevice::open(dir.path(), opts()).err().unwrap()
        ));
        let mut buf = vec![0; BS];
        other.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, block(7));
        for refused in [
            reader.write(0, BS as u64, &block(1)).err(),
            reader.append(1, &block(1)).err(),
            reader.reset(0).err(),
            reader.finish(1).err(),
        ] {
            assert!(
                matches!(refused, Some(DeviceError::ReadOnly(_))),
                "{refused:?}"
            );
        }
        reader.sync().unwrap();
        assert_eq!((size(&dir, 0), size(&dir, 1)), (BS as u64, 0));
        drop((reader, other));
        ZonefsDevice::open(dir.path(), opts()).unwrap();
    }

    #[test]
    fn reopen_reads_write_pointers_from_file_sizes() {
        let (dir, d) = formatted(4);
        d.write(0, 0, &block(1)).unwrap();
        for _ in 0..4 {
            d.append(1, &block(2)).unwrap();
        }
        d.finish(2).unwrap();
        d.open(3).unwrap();
        d.sync().unwrap();
        drop(d);
        let d = ZonefsDevice::open(dir.path(), opts()).unwrap();
        let got: Vec<_> = d
            .report_zones()
            .iter()
            .map(|z| (z.state, z.write_pointer))
            .collect();
        assert_eq!(
            got,
            vec![
                (ZoneState::Closed, BS as u64),
                (ZoneState::Full, CAP),
                (ZoneState::Full, CAP),
                (ZoneState::Empty, 0),
            ]
        );
        let mut buf = vec![0; BS];
        d.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, block(1));
        d.append(0, &block(3)).unwrap();
    }

    #[test]
    fn limits_are_enforced() {
        let (_dir, d) = formatted(5);
        d.open(0).unwrap();
        d.open(1).unwrap();
        assert!(matches!(
            d.write(2, 0, &block(1)),
            Err(DeviceError::TooManyOpen(2))
        ));
        d.write(0, 0, &block(1)).unwrap();
        d.close(0).unwrap();
        d.write(2, 0, &block(1)).unwrap();
        assert!(matches!(
            d.write(3, 0, &block(1)),
            Err(DeviceError::TooManyActive(3))
        ));
    }

    #[test]
    fn bad_layouts_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let w = why(ZonefsDevice::open(dir.path(), opts()).err().unwrap());
        assert!(w.contains("no seq/"), "{w}");

        ZonefsDevice::format_emulated(dir.path(), 3, CAP).unwrap();
        let seq = dir.path().join("seq");
        std::fs::remove_file(seq.join("1")).unwrap();
        let w = why(ZonefsDevice::open(dir.path(), opts()).err().unwrap());
        assert!(w.contains("zone 1 is missing"), "{w}");

        File::create(seq.join("1")).unwrap();
        std::fs::write(seq.join("2"), vec![0; 100]).unwrap();
        let w = why(ZonefsDevice::open(dir.path(), opts()).err().unwrap());
        assert!(w.contains("not a multiple"), "{w}");

        std::fs::write(seq.join("2"), vec![0; CAP as usize + BS]).unwrap();
        let w = why(ZonefsDevice::open(dir.path(), opts()).err().unwrap());
        assert!(w.contains("exceeds the zone capacity"), "{w}");

        std::fs::write(seq.join("2"), b"").unwrap();
        std::fs::write(seq.join("x"), b"").unwrap();
        let w = why(ZonefsDevice::open(dir.path(), opts()).err().unwrap());
        assert!(w.contains("unexpected entry `x`"), "{w}");
        std::fs::remove_file(seq.join("x")).unwrap();

        let other = ZonefsOptions {
            zone_capacity: Some(2 * CAP),
            ..opts()
        };
        let w = why(ZonefsDevice::open(dir.path(), other).err().unwrap());
        assert!(w.contains("formatted with"), "{w}");

        // Too many partially written zones for max_active.
        for z in 0..3 {
            std::fs::write(seq.join(z.to_string()), block(1)).unwrap();
        }
        let tight = ZonefsOptions {
            max_open: 1,
            max_active: 2,
            ..opts()
        };
        assert!(ZonefsDevice::open(dir.path(), tight).is_err());
        ZonefsDevice::open(dir.path(), opts()).unwrap();
    }

    #[test]
    fn capacity_must_be_known() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("seq")).unwrap();
        File::create(dir.path().join("seq/0")).unwrap();
        let w = why(ZonefsDevice::open(dir.path(), opts()).err().unwrap());
        assert!(w.contains("zone capacity unknown"), "{w}");
        let given = ZonefsOptions {
            zone_capacity: Some(CAP),
            ..opts()
        };
        let d = ZonefsDevice::open(dir.path(), given).unwrap();
        assert_eq!(d.geometry().zone_capacity, CAP);
    }

    #[test]
    fn direct_io_writes_where_supported() {
        let dir = tempfile::tempdir().unwrap();
        ZonefsDevice::format_emulated(dir.path(), 2, CAP).unwrap();
        let d = ZonefsDevice::open(
            dir.path(),
            ZonefsOptions {
                direct_io: true,
                ..opts()
            },
        )
        .unwrap();
        match d.write(0, 0, &block(5)) {
            Ok(()) => {}
            Err(e) => {
                eprintln!("O_DIRECT unsupported here, skipping: {e}");
                return;
            }
        }
        let mut buf = vec![0; BS];
        d.read(0, 0, &mut buf).unwrap();
        assert_eq!(buf, block(5));
        assert_eq!(size(&dir, 0), BS as u64);
    }

    #[test]
    fn many_zones_share_a_bounded_handle_cache() {
        let dir = tempfile::tempdir().unwrap();
        let zones = MAX_HANDLES as u32 + 20;
        ZonefsDevice::format_emulated(dir.path(), zones, CAP).unwrap();
        let d = ZonefsDevice::open(
            dir.path(),
            ZonefsOptions {
                max_open: 1,
                max_active: 1,
                ..opts()
            },
        )
        .unwrap();
        for z in 0..zones {
            d.write(z, 0, &block(z as u8)).unwrap();
            d.finish(z).unwrap();
        }
        d.sync().unwrap();
        assert!(d.handles.lock().unwrap().open.len() <= MAX_HANDLES);
        let mut buf = vec![0; BS];
        d.read(3, 0, &mut buf).unwrap();
        assert_eq!(buf, block(3));
    }
}
