//! The store: namespace, files as extent lists, write buffers, allocation, GC, journal.
//!
//! [`Store`] is a cheap handle to one mounted device. All state sits behind one mutex; device
//! I/O happens under it, which keeps the write path short and its order obvious (guest
//! `write` → window copy → flush → allocate → device write → journal op).
//!
//! Module map: [`state`] is the metadata and the only place it changes; [`data`] the file
//! data path; [`namespace`] paths and directory operations; [`alloc`] the ZNS resolver and
//! zone lifecycle; [`gc`] reclaim; [`mount`] recovery; [`fsck`] the invariant checker.

mod alloc;
mod buffer;
mod conventional;
mod data;
pub(crate) mod extent_map;
mod fsck;
mod gc;
pub(crate) mod journal;
mod mount;
mod namespace;
pub(crate) mod state;
pub(crate) mod zone_map;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::device::{ZoneId, ZonedDevice};
use crate::hint::{Class, DefaultPlacement, FileEvent, Hint, OpenReason, Placement};
use crate::resolver::ZnsHead;
use crate::stats::{ratio, Stats, StreamStats, TenantStats};
use crate::{Error, Result};

use buffer::{BufferPool, Window};
use conventional::ConventionalArea;
pub use fsck::FsckReport;
use journal::Journal;
pub use state::{FileKind, Ino, TenantId};
use state::{MetaOp, State};
use zone_map::{StreamKey, ZoneUse};

/// Tuning of a mounted store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Write buffers allocated at mount (one per file being written).
    pub buffers: usize,
    /// Size of each buffer: the largest extent a flush writes (≤ 512 KiB, block multiple).
    pub buffer_size: usize,
    /// Start migrating data when fewer free zones than this remain.
    pub gc_threshold_zones: u32,
    /// Free zones only GC may take, so that a full device can always make progress.
    pub gc_reserve_zones: u32,
    /// Host directory of the conventional area. Without one, files a policy marks
    /// conventional are stored zoned (and remapped on overwrite).
    pub conventional_dir: Option<PathBuf>,
    /// Commit metadata on its own once this many operations are pending.
    pub max_pending_ops: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            buffers: 64,
            buffer_size: 512 * 1024,
            gc_threshold_zones: 3,
            gc_reserve_zones: 1,
            conventional_dir: None,
            max_pending_ops: 4096,
        }
    }
}

/// How to open a file (the POSIX `open` flags the store understands).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    pub exclusive: bool,
    pub truncate: bool,
    pub append: bool,
}

impl OpenOptions {
    pub fn read() -> Self {
        OpenOptions {
            read: true,
            ..Default::default()
        }
    }

    /// Read-write, created if missing.
    pub fn create() -> Self {
        OpenOptions {
            read: true,
            write: true,
            create: true,
            ..Default::default()
        }
    }
}

/// What `stat` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metadata {
    pub ino: Ino,
    pub kind: FileKind,
    pub size: u64,
    pub nlink: u32,
    pub atime_ns: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub hint: Hint,
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub ino: Ino,
    pub kind: FileKind,
}

/// Per-inode state while at least one handle has it open.
struct OpenFile {
    refs: u32,
    writers: u32,
    window: Option<Window>,
    last_use: u64,
    /// Guest bytes written since the last `Written` event.
    unreported: u64,
    /// Open host file of a conventional file.
    host: Option<std::fs::File>,
    host_dirty: bool,
}

struct Handle {
    ino: Ino,
    write: bool,
    read: bool,
    append: bool,
}

#[derive(Default)]
struct Counters {
    streams: BTreeMap<StreamKey, StreamCounters>,
    conventional: BTreeMap<TenantId, u64>,
    tenant_host: BTreeMap<TenantId, u64>,
    resets: u64,
    finishes: u64,
    syncs: u64,
}

#[derive(Default, Clone, Copy)]
struct StreamCounters {
    host: u64,
    device: u64,
    gc: u64,
}

/// Everything behind the store's lock.
struct Inner {
    device: Arc<dyn ZonedDevice>,
    config: StoreConfig,
    state: State,
    journal: Journal,
    /// Operations applied to `state` but not yet in the journal.
    pending: Vec<MetaOp>,
    /// Device writes since the last device sync.
    unsynced_writes: bool,
    pool: BufferPool,
    open: IntMap<Ino, OpenFile>,
    handles: IntMap<u64, Handle>,
    next_handle: u64,
    /// The zone each stream appends to (the ZNS resolver's state).
    heads: HashMap<StreamKey, ZnsHead>,
    head_used: HashMap<StreamKey, u64>,
    /// The lifetime group each stream wrote last (what GC-moved data joins).
    current_group: HashMap<StreamKey, u32>,
    /// The store's view of each zone's write pointer, in blocks.
    wp: Vec<u64>,
    free: BTreeSet<ZoneId>,
    /// Zones whose data all died; reset after the next commit makes that durable.
    to_reset: BTreeSet<ZoneId>,
    conv: Option<ConventionalArea>,
    counters: Counters,
    tick: u64,
    placements: Arc<Placements>,
}

struct Shared {
    inner: Mutex<Inner>,
    device: Arc<dyn ZonedDevice>,
    placements: Arc<Placements>,
}

/// The placement of each tenant ([`DefaultPlacement`] where none was set).
#[derive(Default)]
struct Placements(RwLock<HashMap<TenantId, Arc<dyn Placement>>>);

impl Placements {
    fn get(&self, tenant: TenantId) -> Arc<dyn Placement> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&tenant)
            .cloned()
            .unwrap_or_else(|| Arc::new(DefaultPlacement))
    }

    fn all(&self) -> Vec<(TenantId, Arc<dyn Placement>)> {
        let map = self.0.read().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = map.iter().map(|(t, p)| (*t, p.clone())).collect();
        all.sort_by_key(|(t, _)| *t);
        all
    }

    fn set(&self, tenant: TenantId, placement: Arc<dyn Placement>) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tenant, placement);
    }
}

/// A mounted store. Clones share the mount.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

pub(crate) fn now_ns() -> u64 {
    // The kernel's coarse clock (updated every tick), as file systems use for timestamps.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if rc != 0 {
        return SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Hashing for maps keyed by inode numbers and handle ids: small sequential integers need no
/// SipHash.
#[derive(Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

impl std::hash::Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(crate) type IntMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IntHasher>>;

impl Store {
    /// Mounts the store on `device`, formatting it if it is blank and recovering it otherwise.
    pub fn open(device: Arc<dyn ZonedDevice>, config: StoreConfig) -> Result<Store> {
        let placements = Arc::new(Placements::default());
        let inner = mount::mount(device.clone(), config, placements.clone())?;
        Ok(Store {
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
                device,
                placements,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic under the lock leaves no half-applied metadata (every change is one
        // `apply`); continuing is safer than poisoning every later call of the guest.
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The device under the store.
    pub fn device(&self) -> &Arc<dyn ZonedDevice> {
        &self.shared.device
    }

    /// The tenant called `name`, created with an empty root directory if new.
    pub fn tenant(&self, name: &str) -> Result<(TenantId, Ino)> {
        let mut inner = self.lock();
        if let Some((id, t)) = inner
            .state
            .tenants
            .iter()
            .enumerate()
            .find(|(_, t)| t.name == name)
        {
            return Ok((id as TenantId, t.root));
        }
        let id = inner.state.tenants.len() as TenantId;
        let root = inner.state.next_ino;
        let now = now_ns();
        inner.record(MetaOp::CreateInode {
            ino: root,
            kind: FileKind::Dir,
            tenant: id,
            hint: Hint::zoned(0),
            time_ns: now,
            born_host_bytes: 0,
        })?;
        inner.record(MetaOp::NewTenant {
            id,
            name: name.to_string(),
            root,
        })?;
        inner.commit()?;
        Ok((id, root))
    }

    /// Names of all tenants, by id.
    pub fn tenants(&self) -> Vec<(TenantId, String, Ino)> {
        let inner = self.lock();
        let tenants = &inner.state.tenants;
        (0..tenants.len())
            .map(|i| (i as TenantId, tenants[i].name.clone(), tenants[i].root))
            .collect()
    }

    /// Sets the placement that decides hints for a tenant's files from now on. Files that
    /// are open keep the hint they were opened with.
    pub fn set_placement(&self, tenant: TenantId, placement: Arc<dyn Placement>) {
        self.shared.placements.set(tenant, placement);
    }

    fn placement(&self, tenant: TenantId) -> Arc<dyn Placement> {
        self.shared.placements.get(tenant)
    }

    fn place(&self, tenant: TenantId, path: &str, reason: OpenReason, size: u64) -> Hint {
        self.placement(tenant).place(&crate::PlacementRequest {
            tenant,
            path,
            reason,
            size,
        })
    }

    /// Resolves `path` relative to directory `dir`.
    pub fn lookup(&self, dir: Ino, path: &str) -> Result<Ino> {
        self.lock().state.lookup(dir, path)
    }

    /// `stat` of an inode.
    pub fn metadata(&self, ino: Ino) -> Result<Metadata> {
        self.lock().metadata(ino)
    }

    /// The entries of a directory, by name (without `.` and `..`).
    pub fn read_dir(&self, dir: Ino) -> Result<Vec<DirEntry>> {
        self.lock().state.read_dir(dir)
    }

    /// The parent of a directory (a tenant root is its own parent).
    pub fn parent(&self, dir: Ino) -> Result<Ino> {
        let inner = self.lock();
        let inode = inner.state.inode(dir)?;
        if inode.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(inode.parent)
    }

    /// `mkdir`.
    pub fn create_dir(&self, dir: Ino, path: &str) -> Result<Ino> {
        self.lock().create_dir(dir, path)
    }

    /// `rmdir`.
    pub fn remove_dir(&self, dir: Ino, path: &str) -> Result<()> {
        self.lock().remove_dir(dir, path)
    }

    /// `unlink`: the file goes away when its last handle closes.
    pub fn unlink(&self, dir: Ino, path: &str) -> Result<()> {
        self.lock().unlink(dir, path)
    }

    /// `rename`, replacing the target the way POSIX does. A renamed file is placed anew.
    pub fn rename(&self, from_dir: Ino, from: &str, to_dir: Ino, to: &str) -> Result<()> {
        let mut inner = self.lock();
        let moved = inner.rename(from_dir, from, to_dir, to)?;
        if let Some((ino, tenant, path)) = moved {
            let hint = self.place(tenant, &path, OpenReason::Rename, 0);
            inner.set_hint(ino, hint)?;
        }
        Ok(())
    }

    /// `link`: a second name for a file.
    pub fn link(&self, from_dir: Ino, from: &str, to_dir: Ino, to: &str) -> Result<()> {
        self.lock().link(from_dir, from, to_dir, to)
    }

    /// Sets access and modification times (None leaves one unchanged).
    pub fn set_times(&self, ino: Ino, atime_ns: Option<u64>, mtime_ns: Option<u64>) -> Result<()> {
        self.lock().set_times(ino, atime_ns, mtime_ns)
    }

    /// Opens (and maybe creates) a file.
    pub fn open_file(&self, dir: Ino, path: &str, opts: OpenOptions) -> Result<FileHandle> {
        let mut inner = self.lock();
        let (parent, name) = inner.state.resolve_parent(dir, path)?;
        let tenant = inner.state.inode(parent)?.tenant;
        let existing = inner.state.inode(parent)?.entries.get(&name).copied();
        let wants_write = opts.write || opts.append || opts.truncate;
        let ino = match existing {
            Some(_) if opts.create && opts.exclusive => return Err(Error::Exists),
            Some(ino) => {
                let inode = inner.state.inode(ino)?;
                if inode.kind == FileKind::Dir {
                    return Err(Error::IsDir);
                }
                if path.ends_with('/') {
                    return Err(Error::NotDir);
                }
                if wants_write && inner.open.get(&ino).is_none_or(|o| o.writers == 0) {
                    let size = inode.size;
                    let full = inner.state.path_of_new(parent, &name);
                    let hint = self.place(tenant, &full, OpenReason::OpenForWrite, size);
                    inner.set_hint(ino, hint)?;
                }
                ino
            }
            None if opts.create => {
                if path.ends_with('/') {
                    return Err(Error::IsDir);
                }
                let full = inner.state.path_of_new(parent, &name);
                let hint = self.place(tenant, &full, OpenReason::Create, 0);
                inner.create_file(parent, &name, hint)?
            }
            None => return Err(Error::NotFound),
        };
        let id = inner.open_handle(ino, opts)?;
        if opts.truncate && inner.state.inode(ino)?.size > 0 {
            if let Err(e) = inner.set_len(ino, 0) {
                let _ = inner.close_handle(id);
                return Err(e);
            }
        }
        Ok(FileHandle {
            store: self.clone(),
            id,
            ino,
        })
    }

    /// Makes every buffered write and metadata change durable.
    pub fn sync(&self) -> Result<()> {
        let mut inner = self.lock();
        inner.flush_all()?;
        inner.commit()
    }

    /// Checks every invariant of the store; see [`FsckReport`].
    pub fn fsck(&self) -> Result<FsckReport> {
        let inner = self.lock();
        fsck::check(&inner)
    }

    /// The accounting so far.
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// Every data zone that a stream owns now, as (zone, tenant, stream), by zone. Read-only;
    /// for tools and tests that check that tenants and streams never share a zone.
    pub fn zone_owners(&self) -> Vec<(ZoneId, TenantId, u32)> {
        let inner = self.lock();
        let owners = inner.state.zones.owner.iter().enumerate();
        owners
            .filter_map(|(zone, owner)| match owner {
                Some(ZoneUse::Data(key)) => Some((zone as ZoneId, key.tenant, key.stream)),
                _ => None,
            })
            .collect()
    }

    /// Flushes everything and commits; the store stays usable. Same as [`Store::sync`].
    pub fn unmount(self) -> Result<()> {
        self.sync()
    }
}

/// An open file. Dropping it closes it (errors then go unreported: call [`FileHandle::close`]
/// to see them).
pub struct FileHandle {
    store: Store,
    id: u64,
    ino: Ino,
}

impl FileHandle {
    pub fn ino(&self) -> Ino {
        self.ino
    }

    /// Reads at `offset`; returns fewer bytes only at end of file.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut inner = self.store.lock();
        let h = inner.handle(self.id)?;
        if !h.read {
            return Err(Error::NotPermitted("reading"));
        }
        inner.read(self.ino, buf, offset)
    }

    /// Writes all of `data` at `offset` (or at the end of file for an append handle; the
    /// offset written at is returned).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<u64> {
        let mut inner = self.store.lock();
        let h = inner.handle(self.id)?;
        if !h.write {
            return Err(Error::NotPermitted("writing"));
        }
        let at = if h.append {
            inner.state.inode(self.ino)?.size
        } else {
            offset
        };
        inner.write(self.ino, data, at)?;
        Ok(at)
    }

    /// `ftruncate`.
    pub fn set_len(&self, size: u64) -> Result<()> {
        let mut inner = self.store.lock();
        if !inner.handle(self.id)?.write {
            // POSIX: EINVAL when the descriptor is not open for writing.
            return Err(Error::Invalid("file not open for writing"));
        }
        inner.set_len(self.ino, size)
    }

    /// `fdatasync`: the file's data and what is needed to find it are durable on return.
    pub fn sync_data(&self) -> Result<()> {
        self.sync_all()
    }

    /// `fsync`.
    pub fn sync_all(&self) -> Result<()> {
        let mut inner = self.store.lock();
        inner.handle(self.id)?;
        inner.sync_file(self.ino)?;
        let tenant = inner.state.inode(self.ino)?.tenant;
        let path = inner.state.any_path(self.ino);
        drop(inner);
        self.store.placement(tenant).event(&FileEvent::Synced {
            tenant,
            path: &path,
        });
        Ok(())
    }

    pub fn metadata(&self) -> Result<Metadata> {
        self.store.lock().metadata(self.ino)
    }

    /// Readahead (`fd_advise` WILLNEED): reads up to 8 MiB of the range through the device
    /// so that it sits in the host's cache when the guest asks for it.
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        const MAX: u64 = 8 << 20;
        const CHUNK: usize = 512 << 10;
        let mut scratch = vec![0u8; CHUNK.min(len.min(MAX) as usize)];
        let mut at = offset;
        let end = offset.saturating_add(len.min(MAX));
        while at < end && !scratch.is_empty() {
            let n = (end - at).min(scratch.len() as u64) as usize;
            let got = self.store.lock().read(self.ino, &mut scratch[..n], at)?;
            if got < n {
                break;
            }
            at += n as u64;
        }
        Ok(())
    }

    /// Sets access and modification times (None leaves one unchanged).
    pub fn set_times(&self, atime_ns: Option<u64>, mtime_ns: Option<u64>) -> Result<()> {
        self.store.lock().set_times(self.ino, atime_ns, mtime_ns)
    }

    /// Whether this handle appends.
    pub fn is_append(&self) -> bool {
        self.store
            .lock()
            .handles
            .get(&self.id)
            .is_some_and(|h| h.append)
    }

    /// Switches append mode (`fd_fdstat_set_flags`).
    pub fn set_append(&self, append: bool) -> Result<()> {
        let mut inner = self.store.lock();
        inner
            .handles
            .get_mut(&self.id)
            .ok_or(Error::BadHandle)?
            .append = append;
        Ok(())
    }

    /// Closes the file: its data and metadata are durable on return.
    pub fn close(self) -> Result<()> {
        self.close_inner()
    }

    fn close_inner(&self) -> Result<()> {
        self.store.lock().close_handle(self.id)
    }
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

impl Inner {
    /// Applies an operation and queues it for the journal. Never commits: the records of
    /// one operation (a rename's unlink and link) must reach the journal together.
    fn record(&mut self, op: MetaOp) -> Result<()> {
        self.state.apply(&op)?;
        self.pending.push(op);
        self.reclaim_emptied();
        Ok(())
    }

    /// Commits once `max_pending_ops` are pending; called where an operation is complete.
    fn commit_if_due(&mut self) -> Result<()> {
        if self.pending.len() >= self.config.max_pending_ops {
            self.commit()?;
        }
        Ok(())
    }

    fn handle(&self, id: u64) -> Result<&Handle> {
        self.handles.get(&id).ok_or(Error::BadHandle)
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Makes pending metadata and every device write so far durable: one journal record and
    /// one device sync. Zones freed by the committed operations are reset afterwards.
    fn commit(&mut self) -> Result<()> {
        if self.pending.is_empty() && !self.unsynced_writes {
            return Ok(());
        }
        let mut rotated = false;
        if !self.pending.is_empty() && !self.journal.append(&self.pending)? {
            // The active metadata zone is full: checkpoint into the other one. The data the
            // checkpoint refers to must be durable before the checkpoint can be.
            self.device.sync()?;
            self.counters.syncs += 1;
            self.journal.checkpoint(&self.state.snapshot())?;
            rotated = true;
        }
        self.device.sync()?;
        self.counters.syncs += 1;
        self.pending.clear();
        self.unsynced_writes = false;
        if rotated {
            self.journal.retire_previous()?;
        }
        if let Some(conv) = &mut self.conv {
            conv.remove_freed()?;
        }
        self.reset_freed_zones()
    }

    fn metadata(&self, ino: Ino) -> Result<Metadata> {
        let inode = self.state.inode(ino)?;
        let nlink = match inode.kind {
            FileKind::File => inode.nlink,
            FileKind::Dir => {
                2 + inode
                    .entries
                    .values()
                    .filter(|i| {
                        self.state
                            .inodes
                            .get(i)
                            .is_some_and(|n| n.kind == FileKind::Dir)
                    })
                    .count() as u32
            }
        };
        Ok(Metadata {
            ino,
            kind: inode.kind,
            size: inode.size,
            nlink,
            atime_ns: inode.atime_ns,
            mtime_ns: inode.mtime_ns,
            ctime_ns: inode.ctime_ns,
            hint: inode.hint,
        })
    }

    fn open_handle(&mut self, ino: Ino, opts: OpenOptions) -> Result<u64> {
        let write = opts.write || opts.append;
        let tick = self.touch();
        let entry = self.open.entry(ino).or_insert(OpenFile {
            refs: 0,
            writers: 0,
            window: None,
            last_use: tick,
            unreported: 0,
            host: None,
            host_dirty: false,
        });
        entry.refs += 1;
        if write {
            entry.writers += 1;
        }
        let id = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(
            id,
            Handle {
                ino,
                write,
                read: opts.read || !write,
                append: opts.append,
            },
        );
        Ok(id)
    }

    fn close_handle(&mut self, id: u64) -> Result<()> {
        let Some(handle) = self.handles.remove(&id) else {
            return Ok(());
        };
        let ino = handle.ino;
        // Durable on close, as the Valet paper promises and as applications assume.
        let synced = self.sync_file(ino);
        let of = self.open.get_mut(&ino).expect("open handle has open state");
        of.refs -= 1;
        if handle.write {
            of.writers -= 1;
        }
        if of.refs > 0 {
            return synced;
        }
        let of = self.open.remove(&ino).expect("checked above");
        if let Some(w) = of.window {
            self.pool.give_back(w.buf);
        }
        let inode = self.state.inode(ino)?;
        let (tenant, size, nlink) = (inode.tenant, inode.size, inode.nlink);
        let path = self.state.any_path(ino);
        self.placements.get(tenant).event(&FileEvent::Closed {
            tenant,
            path: &path,
            size,
        });
        if nlink == 0 {
            self.free_inode(ino, &path)?;
            self.commit()?;
        }
        synced
    }

    /// Sets a file's hint (a new open or a rename decided again). The class never changes
    /// after creation: moving data between the areas would not be a placement decision.
    fn set_hint(&mut self, ino: Ino, mut hint: Hint) -> Result<()> {
        let inode = self.state.inode(ino)?;
        hint.class = inode.hint.class;
        if inode.hint != hint {
            self.record(MetaOp::SetHint { ino, hint })?;
        }
        Ok(())
    }

    fn set_times(&mut self, ino: Ino, atime: Option<u64>, mtime: Option<u64>) -> Result<()> {
        self.flush(ino)?;
        let inode = self.state.inode(ino)?;
        let op = MetaOp::SetAttr {
            ino,
            size: inode.size,
            atime_ns: atime.unwrap_or(inode.atime_ns),
            mtime_ns: mtime.unwrap_or(inode.mtime_ns),
            ctime_ns: now_ns(),
        };
        self.record(op)?;
        self.commit_if_due()
    }

    fn stats(&self) -> Stats {
        let geometry = self.device.geometry();
        let names = |t: TenantId| {
            self.state
                .tenants
                .get(t as usize)
                .map(|t| t.name.clone())
                .unwrap_or_default()
        };
        let mut zones_of: BTreeMap<StreamKey, u32> = BTreeMap::new();
        for owner in self.state.zones.owner.iter().flatten() {
            if let ZoneUse::Data(key) = owner {
                *zones_of.entry(*key).or_default() += 1;
            }
        }
        let mut stats = Stats {
            meta_bytes: self.journal.bytes_written,
            zone_resets: self.counters.resets,
            zone_finishes: self.counters.finishes,
            device_syncs: self.counters.syncs,
            zones: geometry.zone_count,
            free_zones: self.free.len() as u32,
            zone_capacity: geometry.zone_capacity,
            live_bytes: self.state.zones.total_valid() * geometry.block_size as u64,
            ..Default::default()
        };
        let mut tenants: BTreeMap<TenantId, TenantStats> = BTreeMap::new();
        for (key, c) in &self.counters.streams {
            stats.streams.push(StreamStats {
                tenant: key.tenant,
                tenant_name: names(key.tenant),
                stream: key.stream,
                host_bytes: c.host,
                device_bytes: c.device,
                gc_bytes_moved: c.gc,
                zones: zones_of.get(key).copied().unwrap_or(0),
                waf: ratio(c.device, c.host),
            });
            let t = tenants.entry(key.tenant).or_default();
            t.host_bytes += c.host;
            t.device_bytes += c.device;
            t.gc_bytes_moved += c.gc;
            stats.host_bytes += c.host;
            stats.device_bytes += c.device;
            stats.gc_bytes_moved += c.gc;
        }
        for (tenant, bytes) in &self.counters.conventional {
            tenants.entry(*tenant).or_default().conventional_bytes += bytes;
            stats.conventional_bytes += bytes;
        }
        for (id, mut t) in tenants {
            t.tenant = id;
            t.name = names(id);
            t.waf = ratio(t.device_bytes, t.host_bytes);
            stats.tenants.push(t);
        }
        for (tenant, placement) in self.placements.all() {
            stats.policies.push(crate::stats::PolicyStats {
                tenant,
                name: placement.name(),
                decisions: placement.decisions(),
                faults: placement.faults(),
            });
        }
        stats.waf = ratio(stats.device_bytes, stats.host_bytes);
        stats.waf_with_meta = ratio(stats.device_bytes + stats.meta_bytes, stats.host_bytes);
        stats
    }
}

/// Class a hint really gets on this mount.
fn effective_class(hint: &Hint, conv: &Option<ConventionalArea>) -> Class {
    match (hint.class, conv) {
        (Class::Conventional, Some(_)) => Class::Conventional,
        _ => Class::Zoned,
    }
}
