//! The store: namespace, files as extent lists, write buffers, allocation, GC, journal.
//!
//! [`Store`] is a cheap handle to one mounted device. Module map: [`state`] is the metadata
//! and the only place it changes; [`data`] the file data path (windows, flushes, reads);
//! [`commit`] group commit; [`writer`] the background writer of full buffers; [`namespace`]
//! paths and directory operations; [`alloc`] the ZNS resolver and zone lifecycle; [`gc`]
//! one collection pass; [`reclaim`] the thread that runs passes in the background against
//! free-zone watermarks; [`defrag`] rewriting fragmented files' windows whole when their
//! extents near what a checkpoint can hold; [`checksum`] the crc of every written unit,
//! which GC, defragmentation and the deep fsck verify; [`mount`] recovery; [`fsck`] the
//! invariant checker; [`inline`] small synced tails that travel in journal records until
//! their window reaches a data zone; [`spin_lock`] how the store's lock is taken;
//! [`writeback`] the thread that hands unsynced writes to the host every few seconds and
//! makes them durable every half minute (as configured); [`work`] the CPU time those
//! threads spend for each tenant.
//!
//! # Concurrency: who owns what
//!
//! A guest waits only for the work it asked for. No lock that another file, tenant or
//! thread needs is held while the device reads, writes, syncs or resets.
//!
//! - **`Shared::inner`** (one mutex) guards the metadata ([`State`]), the open files and
//!   their windows, the buffer pool, the allocator (heads, free list, the store's write
//!   pointers) and the counters. It is held for memory work only: planning a read,
//!   reserving blocks, recording operations; a thread spins briefly for it before it
//!   sleeps ([`spin_lock`]). Every device call happens after it is
//!   released, except `finish` of a zone with nothing in flight (a table update on the
//!   emulated device, one `ftruncate` on zonefs) and the rare metadata calls of the
//!   conventional area (opening or truncating a host file, syncing its directory). Its
//!   reads, writes and fsyncs run with the lock released: a host file is shared as an
//!   `Arc<File>`, a write marks it dirty only once its bytes are in the file, and a sync
//!   clears the mark before its fsync (and sets it again if the fsync fails).
//! - **A file's window** is changed only under `inner`. A thread that must do device I/O
//!   to change it (read the prefix of a new window, the padding of a last block) first sets
//!   the file's `busy` flag; other writers of that file wait for it (`Shared::changed`).
//!   A write of 64 KiB or more is copied into the window with `inner` released: the
//!   window's buffer is lent out of it (an empty placeholder stands in) and the file is
//!   busy until the buffer is back; readers of the file wait for it meanwhile, and nothing
//!   else touches a busy file's window.
//! - **A file's writes and size changes** are applied one at a time, as Linux's inode
//!   lock applies them. A write that fits the window is copied under `inner`; one that
//!   does not, a write to a conventional file (its host write) and every `set_len` set
//!   the file's `writing` flag for their whole course (which releases `inner` between
//!   steps), and the file's other writes and size changes wait for it before they decide
//!   their offset, so an append always starts at the end of every write and truncation
//!   before it.
//! - **Detached buffers** (a file's `inflight` queue) are written oldest first, each by one
//!   thread (`writing`; one thread may own a run of small ones from the front and write
//!   them as one device write), and recorded in that order, so a file's extents are mapped
//!   in the order its bytes were written. A sync writes its file's queued buffers itself rather
//!   than wait for the background writer, unless their bytes were already synced inline
//!   (then the sync does not wait for them at all). A write that finds no free buffer
//!   writes the front of one of its own tenant's queues that no thread has taken, before
//!   it sleeps: it would only wait for the writer to do the same.
//! - **Zones**: blocks are reserved under `inner` by advancing the store's write pointer
//!   (`wp`); the device writes of one zone are issued in reservation order: a writer waits
//!   until `written[zone]` reaches its first block. Writes to different zones run in
//!   parallel. A zone is reset only when no reader or writer holds a pin on it (`pins`,
//!   taken under `inner`, dropped without it) and no write to it is in flight.
//! - **Commits** ([`commit`]): the leader takes pending operations under `inner`, then
//!   writes the journal and flushes the device with no lock held. The zones it will reset
//!   after the flush are listed in `resetting` meanwhile, so that an allocation waits for
//!   them instead of reporting ENOSPC; they are that commit's until it has reset them or
//!   put them back on the reset list, and no one else lists them for a reset meanwhile.
//!   Only the store's own commits (the reclaimer's, an allocation's, a whole-store sync)
//!   reset zones, and only after their leader has let go of the leader role
//!   (`durable_dead`): a guest's sync wakes the reclaimer for that and returns, and never
//!   waits behind a reset. A guest's sync that becomes leader first waits (no lock held, at
//!   most half a commit's time and 1 ms) for the syncers of the last two commits, so that
//!   syncers in closed loops share every flush. A hand-off ([`writeback`]) holds the leader
//!   role for a journal write with no flush: it takes the pending operations and no resets,
//!   and the next commit flushes whatever hand-offs wrote, even with nothing pending.
//! - **GC** ([`gc`], [`reclaim`]): one pass at a time (`collecting` names its victim). The
//!   reclaimer thread runs passes when free zones fall below the low watermark; an
//!   allocation runs one itself only when no zone outside the reserve is left and no pass is
//!   running. While a pass runs at the reserve, other allocations wait for it: the zone it
//!   copies into may be the reserve itself. A pass reads its victim pinned, with no lock,
//!   and copies into its tenant's GC stream, whose zones only GC appends to. A zone a
//!   writer still pins (its extent written, not yet recorded) is never a victim.
//! - **Defragmentation** ([`defrag`]) copies as a GC pass does (plan under `inner`, read
//!   pinned and write with no lock, map a copy only if the file still maps what was read),
//!   into the file's own stream, on the reclaimer's thread and, past the metadata's line,
//!   on a sync of the fragmented file after its commit. Passes may run at once with each
//!   other and with GC: each only maps what it read, unchanged.
//! - **Placement calls and events** happen with no lock held: hints are decided before the
//!   namespace lock is taken (and checked again after), events are queued under `inner`
//!   and delivered after it is released.
//!
//! - **The store's own threads** (the background writer, the reclaimer, the writeback,
//!   the image's fill-ahead) run at nice 10 ([`crate::background`]): on a machine with
//!   as many busy guests as cores, a core they take from a guest is that guest's tail
//!   latency.
//!
//! - **Work for tenants** ([`work`]): a store thread reads its CPU clock around each round
//!   of work for one tenant's files and adds the difference to that tenant's counter; the
//!   counters' list has a lock of its own, taken with no other lock held.
//!
//! Lock order: a file's `writing` flag → its `busy` flag → the commit leader role → the
//! journal → `inner` → the commit state. `inner` is never held while waiting for the
//! leader role.

mod alloc;
mod buffer;
mod checksum;
mod commit;
mod conventional;
mod data;
mod defrag;
mod events;
pub(crate) mod extent_map;
mod fsck;
mod gc;
mod inline;
pub(crate) mod journal;
mod mount;
mod namespace;
mod reclaim;
#[cfg(test)]
mod reset_tests;
mod spin_lock;
pub(crate) mod state;
mod work;
mod writeback;
mod writer;
pub(crate) mod zone_map;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::device::{ZoneId, ZonedDevice};
use crate::hint::{Class, DefaultPlacement, Hint, OpenReason, Placement};
use crate::resolver::ZnsHead;
use crate::stats::{ratio, Stats, StreamStats, SyncLatency, TenantStats};
use crate::{Error, Result};

use buffer::{BufferPool, Detached, Window};
use commit::{Asker, GroupCommit, Led};
use conventional::ConventionalArea;
use events::Event;
pub use fsck::FsckReport;
use journal::{CheckpointRoom, Journal};
pub use state::{FileKind, Ino, TenantId};
use state::{MetaOp, State};
pub use work::TenantWork;
use zone_map::{StreamKey, ZoneUse};

/// Metadata past this share of a metadata zone's capacity (3/8) makes the store refuse
/// new names (files, directories, links) with ENOSPC until removals shrink it: a
/// checkpoint must stay under half a zone (see [`journal::CheckpointRoom`]), and one that
/// does not fit stops the store for every tenant. The size is the newest checkpoint's plus
/// [`NAME_BYTES`] and the name's length for each name made since (more than a name adds),
/// so a burst of names with no commit in between stops in time too. Extents are not
/// refused but made fewer ([`defrag`]); a checkpoint is taken once the transactions since
/// the last one could have carried the metadata past this share, and every 1/32 of a zone
/// of such growth beyond it ([`Journal::checkpoint_due`]).
const METADATA_FULL: (u64, u64) = (3, 8);

/// What one new name may add to a checkpoint besides its own bytes: an empty inode and its
/// directory entry take about 50 (measured: 59 bytes a file with 11-byte names).
const NAME_BYTES: u64 = 64;

/// Tuning of a mounted store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Write buffers allocated at mount (one per file being written).
    pub buffers: usize,
    /// Size of each buffer: the largest extent a flush writes (≤ 512 KiB, block multiple).
    pub buffer_size: usize,
    /// The reclaimer starts collecting when fewer free zones than this remain (the low
    /// watermark)...
    pub gc_low_zones: u32,
    /// ...and stops once this many are free (the high watermark).
    pub gc_high_zones: u32,
    /// Most of the device's time the reclaimer takes while the device is not short (it
    /// rests in proportion to its passes).
    pub gc_share_percent: u8,
    /// Free zones only GC may take, so that a full device can always make progress.
    pub gc_reserve_zones: u32,
    /// Host directory of the conventional area. Without one, files a policy marks
    /// conventional are stored zoned (and remapped on overwrite).
    pub conventional_dir: Option<PathBuf>,
    /// Commit metadata on its own once this many operations are pending.
    pub max_pending_ops: usize,
    /// Size of the next checkpoint past which the reclaimer rewrites fragmented files;
    /// None: a quarter of a metadata zone. Tests set 0 to have it run whenever a file has
    /// a window worth rewriting (see [`defrag`]).
    pub defrag_start_bytes: Option<u64>,
    /// Mount for reading only, as tools that inspect a store do: nothing on the device
    /// changes (see [`mount`]), every change is refused with [`Error::ReadOnly`], and the
    /// store starts no threads and allocates no write buffers. Recovered metadata that does
    /// not hold together is not refused: check [`Store::fsck`] before trusting it.
    pub read_only: bool,
    /// Make what guests wrote and did not sync durable this often ([`writeback`]), so that
    /// a crash of the process or the host loses at most about this much; None: only syncs,
    /// closes and the unmount do (tests that count device flushes).
    pub writeback: Option<std::time::Duration>,
    /// Hand what guests wrote and did not sync to the host this often ([`writeback`]):
    /// written to the device and journaled, with no device flush. A process killed by
    /// SIGKILL or the OOM killer then loses at most about this much (the host's page cache,
    /// or the drive, holds it); a power cut still up to `writeback`. None: no hand-offs.
    pub handoff: Option<std::time::Duration>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            buffers: 64,
            buffer_size: 512 * 1024,
            gc_low_zones: 3,
            gc_high_zones: 5,
            gc_share_percent: 50,
            gc_reserve_zones: 1,
            conventional_dir: None,
            max_pending_ops: 4096,
            defrag_start_bytes: None,
            read_only: false,
            writeback: None,
            handoff: None,
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
    /// A final symlink is not followed: opening one is [`Error::Loop`] (`O_NOFOLLOW`).
    pub nofollow: bool,
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

/// Per-inode state while at least one handle has it open (or while it holds data whose
/// write failed, so that the data is not lost with the last handle).
struct OpenFile {
    refs: u32,
    writers: u32,
    window: Option<Window>,
    /// Windows detached for flushing, oldest first (see the module docs).
    inflight: VecDeque<Detached>,
    /// A thread is changing the window with device I/O (prefix or padding reads).
    busy: bool,
    /// A write is in the slow path (its offset decided, its bytes not all in the window
    /// yet) or the size is being changed: the file's other writes and size changes wait
    /// for it (see the module docs).
    writing: bool,
    last_use: u64,
    /// Guest bytes written since the last `Written` event.
    unreported: u64,
    /// Open host file of a conventional file (shared with the threads reading, writing or
    /// syncing it with the store lock released).
    host: Option<Arc<std::fs::File>>,
    /// `tick` of the last write or size change of the host file, and the newest `tick` a
    /// completed host sync began at: bytes wait for a sync while the first is newer.
    /// Ticks, not a flag: a sync that finds another in flight must make its own.
    host_write_tick: u64,
    host_sync_tick: u64,
}

impl OpenFile {
    fn new(tick: u64) -> Self {
        OpenFile {
            refs: 0,
            writers: 0,
            window: None,
            inflight: VecDeque::new(),
            busy: false,
            writing: false,
            last_use: tick,
            unreported: 0,
            host: None,
            host_write_tick: 0,
            host_sync_tick: 0,
        }
    }

    /// Holds host file bytes no completed sync covers.
    fn host_dirty(&self) -> bool {
        self.host_write_tick > self.host_sync_tick
    }

    /// Holds data that is not on the device yet.
    fn has_unwritten(&self) -> bool {
        !self.inflight.is_empty() || self.window.as_ref().is_some_and(|w| w.dirty)
    }

    /// The front of the queue found no room on the device and waits for a retry.
    fn waits_for_room(&self) -> bool {
        self.inflight
            .front()
            .is_some_and(|d| d.no_space && !d.writing)
    }
}

struct Handle {
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
    /// Writes that waited for a buffer to come back from the device (back-pressure).
    buffer_waits: u64,
    buffer_wait_ns: u64,
    /// Full buffers handed to the background writer.
    background_flushes: u64,
    /// Queued buffers written by a write waiting for a buffer.
    flushes_while_waiting: u64,
    /// Syncs whose tail went inline in the journal.
    inline_syncs: u64,
    /// Units whose data did not match their checksum when GC read them.
    checksum_failures: u64,
    last_checksum_failure: Option<String>,
    /// GC passes run by the reclaimer, and on allocating calls.
    gc_background_passes: u64,
    gc_foreground_passes: u64,
    /// Bytes copied by defragmentation, and its passes by the reclaimer, on syncs and on
    /// flushes past the hard line.
    defrag_bytes: u64,
    defrag_passes: u64,
    defrag_sync_passes: u64,
    defrag_flush_passes: u64,
    last_defrag_failure: Option<String>,
    /// Allocations that waited their whole PATIENCE for work in flight.
    allocation_stalls: u64,
    /// Rounds of the periodic writeback that found something unsynced, and their time.
    writebacks: u64,
    writeback_ns: u64,
    /// Hand-offs that found something to hand to the host, and their time.
    handoffs: u64,
    handoff_ns: u64,
    /// Hand-off rounds run, with something to do or not.
    handoff_rounds: u64,
    /// The time of each tenant's successful syncs, and its failed ones.
    sync_latency: BTreeMap<TenantId, SyncLatency>,
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
    /// Operations applied to `state` but not yet in the journal.
    pending: Vec<MetaOp>,
    /// Counts every recorded operation and completed device write: a sync asks for the
    /// value it saw to become durable (see [`commit`]).
    changes: u64,
    /// Per inode, the counter value of its newest change no commit has made durable yet
    /// (absent: all of it is durable). A sync or close waits for its own file's changes
    /// only, so closing a file written long ago costs no commit.
    undurable: IntMap<Ino, u64>,
    /// Device writes since the last commit took the pending operations.
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
    /// The store's view of each zone's write pointer, in blocks: reserved, maybe in flight.
    wp: Vec<u64>,
    /// Per zone: blocks whose device write completed (≤ `wp`); writes issue in order.
    written: Vec<u64>,
    /// Per zone: a write failed; no more writes go there.
    fault: Vec<bool>,
    /// Per zone: to be finished once its in-flight writes complete.
    seal_pending: Vec<bool>,
    free: BTreeSet<ZoneId>,
    /// Zones whose data all died; reset after the next commit makes that durable.
    to_reset: BTreeSet<ZoneId>,
    /// Zones where GC found data that does not match its checksum: left as they are for
    /// fsck and the operator, never collected.
    damaged: BTreeSet<ZoneId>,
    /// Zones a commit took from `to_reset` and is resetting now (after its flush). A zone
    /// leaves it only by the hand of the commit that took it: reset, or back on `to_reset`
    /// (still in use, or the commit failed). While here it goes on no reset list again:
    /// two resets of one zone at once let the second wipe what was written after the
    /// first.
    resetting: BTreeSet<ZoneId>,
    /// Those of `resetting` whose device reset runs now: debug builds check that no zone
    /// is reset twice at once (it was, before the rule above).
    resets_in_flight: BTreeSet<ZoneId>,
    /// Those of `resetting` whose death a commit made durable: the store's thread that
    /// asked for it resets them once it has let go of the leader role.
    durable_dead: BTreeSet<ZoneId>,
    /// The victim a GC pass is moving data out of now (one pass runs at a time).
    collecting: Option<ZoneId>,
    conv: Option<ConventionalArea>,
    counters: Counters,
    tick: u64,
    /// `tick` at the last hand-off: files used since were busy then (see [`writeback`]).
    handoff_tick: u64,
    placements: Arc<Placements>,
    /// Placement events to deliver once the lock is released.
    events: Vec<Event>,
    /// Journal bytes written so far (the journal itself belongs to the commit leader).
    meta_bytes: u64,
    /// The size of the newest checkpoint, and what the names made since may have added to
    /// the next (see [`METADATA_FULL`]).
    checkpoint_len: u64,
    names_since_checkpoint: u64,
    /// The files' extents when the newest checkpoint's snapshot was taken (see
    /// [`Inner::metadata_estimate`]).
    extents_at_checkpoint: usize,
    /// Per fragmented file, where defragmentation stands ([`defrag`]); and the files'
    /// extents below which no file is worth looking at again.
    defrag_cursor: HashMap<Ino, defrag::Cursor>,
    defrag_quiet_below: usize,
    /// Most directory entries a tenant's tree may hold (see [`Store::set_entry_limit`]).
    entry_limits: HashMap<TenantId, u64>,
    /// Per zone: how many times it was reset. A copy that let go of a zone's pin before it
    /// maps (defragmentation) checks that the blocks it read were not reset and written
    /// again at the same place meanwhile, which the extents alone cannot tell.
    zone_resets: Vec<u64>,
    /// The newest window generation handed out (see [`inline`]).
    window_gen: u64,
    /// Per zone: readers and writers using it (taken under the lock, dropped without it).
    pins: Arc<[AtomicU32]>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Signalled when a zone write completes, a flush ends, a file stops being busy or a
    /// buffer comes back to the pool.
    changed: Condvar,
    commit: GroupCommit,
    /// Per zone: readers and writers using it now (a zone is not reset while pinned); the
    /// same counters as `Inner::pins`.
    pins: Arc<[AtomicU32]>,
    device: Arc<dyn ZonedDevice>,
    placements: Arc<Placements>,
    /// Hands full buffers to the background writer.
    writer: writer::Queue,
    /// Collects zones in the background when free zones run low.
    reclaimer: reclaim::Reclaimer,
    /// Makes unsynced writes durable every `StoreConfig::writeback`.
    writeback: writeback::Writeback,
    /// The CPU time those threads spent for each tenant.
    work: work::WorkLedger,
    /// Store handles held by users (file handles included).
    users: std::sync::atomic::AtomicUsize,
    /// Mounted read-only (the config's flag, here to be read without the lock).
    read_only: bool,
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

/// A mounted store. Clones share the mount. When the last clone (and the last file
/// handle) is dropped, the background writer finishes its queue and stops before the drop
/// returns, so the device is free for another mount.
pub struct Store {
    shared: Arc<Shared>,
    /// Counted in `Shared::users` (the writer's own handle is not).
    user: bool,
}

impl Clone for Store {
    fn clone(&self) -> Self {
        self.shared.users.fetch_add(1, Ordering::AcqRel);
        Store {
            shared: self.shared.clone(),
            user: true,
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.user && self.shared.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.writeback.stop();
            self.shared.writer.stop();
            self.shared.reclaimer.stop();
        }
    }
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
    /// Mounts the store on `device`, formatting it if it is blank and recovering it otherwise
    /// (a read-only mount refuses a blank device).
    pub fn open(device: Arc<dyn ZonedDevice>, config: StoreConfig) -> Result<Store> {
        let placements = Arc::new(Placements::default());
        let read_only = config.read_only;
        let (writeback, handoff) = (config.writeback, config.handoff);
        let (inner, journal) = mount::mount(device.clone(), config, placements.clone())?;
        if !read_only {
            device.recovered();
        }
        let pins = inner.pins.clone();
        let shared = Arc::new(Shared {
            inner: Mutex::new(inner),
            changed: Condvar::new(),
            commit: GroupCommit::new(journal),
            pins,
            device,
            placements,
            writer: writer::Queue::default(),
            reclaimer: reclaim::Reclaimer::default(),
            writeback: writeback::Writeback::default(),
            work: work::WorkLedger::default(),
            users: std::sync::atomic::AtomicUsize::new(1),
            read_only,
        });
        if read_only {
            return Ok(Store { shared, user: true });
        }
        shared.writer.start(Store {
            shared: shared.clone(),
            user: false,
        });
        shared.reclaimer.start(Store {
            shared: shared.clone(),
            user: false,
        });
        if writeback.is_some() || handoff.is_some() {
            shared.writeback.start(
                Store {
                    shared: shared.clone(),
                    user: false,
                },
                writeback,
                handoff,
            );
        }
        let store = Store { shared, user: true };
        store.write_back_inline()?;
        Ok(store)
    }

    /// After a crash: writes the synced bytes that only the journal held (inline tails,
    /// see [`state::MetaOp::Inline`]) into their files, which records them done, and commits.
    fn write_back_inline(&self) -> Result<()> {
        let files: Vec<(Ino, Vec<inline::Piece>)> = {
            let inner = self.lock()?;
            let files = inner.state.inline.files();
            files.map(|(ino, pieces)| (ino, pieces.to_vec())).collect()
        };
        for (ino, pieces) in files {
            let id = self.with(|inner| {
                let write = OpenOptions {
                    write: true,
                    ..Default::default()
                };
                inner.open_handle(ino, write)
            })?;
            let handle = FileHandle {
                store: self.clone(),
                id,
                ino,
            };
            for piece in pieces {
                handle.write_at(&piece.data, piece.offset)?;
            }
            handle.close()?;
        }
        if let Some((ino, _)) = self.lock()?.state.inline.files().next() {
            return Err(Error::Corrupt(format!(
                "inode {ino}: journaled inline data could not be written back"
            )));
        }
        Ok(())
    }

    /// The store's lock (see [`spin_lock`]). A panic under it may have left the metadata
    /// half changed, so a poisoned lock stops the store instead of being used.
    fn lock(&self) -> Result<MutexGuard<'_, Inner>> {
        spin_lock::lock(&self.shared.inner)
            .map_err(|_| Error::Stopped("a panic inside the store left its state unknown".into()))
    }

    /// Waits on `Shared::changed`, giving the lock back meanwhile.
    fn wait<'a>(&'a self, inner: MutexGuard<'a, Inner>) -> Result<MutexGuard<'a, Inner>> {
        self.shared
            .changed
            .wait(inner)
            .map_err(|_| Error::Stopped("a panic inside the store left its state unknown".into()))
    }

    fn notify(&self) {
        self.shared.changed.notify_all();
    }

    /// Runs `f` under the lock; then, with the lock released, delivers the placement events
    /// it queued and commits if enough operations are pending.
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        let mut inner = self.lock()?;
        let out = f(&mut inner);
        let released = self.release(inner);
        let value = out?;
        released?;
        Ok(value)
    }

    /// Releases the lock, delivers queued events and commits if one is due.
    fn release(&self, mut inner: MutexGuard<'_, Inner>) -> Result<()> {
        let events = std::mem::take(&mut inner.events);
        let due = inner.pending.len() >= inner.config.max_pending_ops;
        drop(inner);
        self.deliver(events);
        if due {
            self.commit()?;
        }
        Ok(())
    }

    /// Refuses changes to a read-only store, and once a commit failed (see [`commit`]).
    fn check_running(&self) -> Result<()> {
        if self.shared.read_only {
            return Err(Error::ReadOnly);
        }
        match self.shared.commit.failure() {
            Some(why) => Err(Error::Stopped(why)),
            None => Ok(()),
        }
    }

    /// Makes every change made so far durable, sharing the journal write and the device
    /// flush with concurrent syncs.
    fn commit(&self) -> Result<()> {
        self.commit_for(Asker::Store)
    }

    /// Makes the changes to `ino` durable for a guest's fsync, fdatasync or close (with
    /// every change made before them: the journal is one sequence). A leader waits briefly
    /// for the other syncers it expects (see [`commit`]).
    fn commit_inode(&self, ino: Ino) -> Result<()> {
        let target = self.lock()?.undurable_upto(ino);
        self.commit_upto(target, Asker::Sync)
    }

    fn commit_for(&self, asker: Asker) -> Result<()> {
        let target = self.lock()?.changes;
        self.commit_upto(target, asker)
    }

    fn commit_upto(&self, target: u64, asker: Asker) -> Result<()> {
        self.shared
            .commit
            .make_durable(target, asker, || self.lead_commit(asker))
            .map_err(Error::Stopped)?;
        if asker == Asker::Store {
            // After the leader role is let go: a sync that comes meanwhile does not wait
            // for the resets.
            let zones = std::mem::take(&mut self.lock()?.durable_dead);
            self.reset_zones(zones)?;
        }
        Ok(())
    }

    /// A commit led even when every change is durable already: zones wait on the reset
    /// list for a commit (only a commit's leader resets them), and one whose data died
    /// before a commit took it there would otherwise wait for the next change.
    fn commit_for_resets(&self) -> Result<()> {
        self.lock()?.changes += 1;
        self.commit()
    }

    /// One commit as the leader: take the pending operations, write them, flush, then hand
    /// the zones whose death is now durable to the store's own committer to reset. A
    /// guest's sync takes none: it leaves them to the reclaimer (a reset of a large zone
    /// can take milliseconds on the host, and the guest asked only for durability), and an
    /// allocation that needs the space commits and resets them itself.
    fn lead_commit(&self, asker: Asker) -> Led {
        let mut journal = self.shared.commit.journal();
        let mut upto = 0;
        // The zones this commit takes to reset, and the conventional files whose host files
        // it removes, given back if it fails.
        let mut taken = BTreeSet::new();
        let mut freed = Vec::new();
        let mut run = || -> Result<()> {
            let (record, snapshot, resets) = {
                let mut inner = self.lock()?;
                upto = inner.changes;
                if let Some(conv) = &mut inner.conv {
                    freed = conv.take_freed();
                }
                let resets = match asker {
                    Asker::Store => std::mem::take(&mut inner.to_reset),
                    Asker::Sync => {
                        if !inner.to_reset.is_empty() {
                            self.shared.reclaimer.wake_for_resets();
                        }
                        BTreeSet::new()
                    }
                };
                // Allocations that need space meanwhile wait for these resets, not ENOSPC.
                inner.resetting.extend(resets.iter().copied());
                taken.clone_from(&resets);
                if inner.pending.is_empty() && !inner.unsynced_writes {
                    (None, None, resets)
                } else {
                    let ops = std::mem::take(&mut inner.pending);
                    inner.unsynced_writes = false;
                    let record = journal.encode_transaction(&ops)?;
                    // When the active metadata zone is full, or the metadata may be near
                    // its limit, checkpoint into the other one, from the state exactly as
                    // of these operations. Names made since the last checkpoint count as in
                    // `metadata_room`, so a refusal on their estimate is soon checked
                    // against a real checkpoint.
                    let full = inner
                        .metadata_full_bytes()
                        .saturating_sub(inner.names_since_checkpoint);
                    let snapshot = match journal.checkpoint_due(&record, full)? {
                        false => None,
                        true => Some((
                            inner.state.snapshot(),
                            inner.state.carried_ops(),
                            (inner.names_since_checkpoint, inner.state.extents),
                        )),
                    };
                    (Some(record), snapshot, resets)
                }
            };
            let mut syncs = 0;
            // The names made, and the extents there were, when the snapshot was taken: what
            // the checkpoint now measures.
            let mut measured = None;
            if let Some((snapshot, inline, at_snapshot)) = snapshot {
                // The data the checkpoint refers to must be durable before it is.
                self.shared.device.sync()?;
                journal.checkpoint(&snapshot, &inline, CheckpointRoom::Running)?;
                self.shared.device.sync()?;
                journal.note_flushed();
                journal.retire_previous()?;
                syncs += 2;
                measured = Some(at_snapshot);
            } else if let Some(record) = record {
                journal.append_record(&record)?;
                self.shared.device.sync()?;
                journal.note_flushed();
                syncs += 1;
            } else if journal.unflushed() > 0 {
                // What hand-offs journaled is durable only after a flush.
                self.shared.device.sync()?;
                journal.note_flushed();
                syncs += 1;
            }
            let defrag = {
                let mut inner = self.lock()?;
                inner.counters.syncs += syncs;
                inner.meta_bytes = journal.bytes_written;
                if let Some((names, extents)) = measured {
                    inner.note_checkpoint(&journal, names, extents);
                }
                inner.undurable.retain(|_, change| *change > upto);
                if let Some(conv) = &mut inner.conv {
                    conv.remove_freed(std::mem::take(&mut freed))?;
                }
                inner.durable_dead.extend(resets);
                inner.defrag_wanted(false)
            };
            if defrag {
                self.shared.reclaimer.wake_for_defrag();
            }
            Ok(())
        };
        match run() {
            Ok(()) => Led::Durable(upto),
            Err(e) => {
                journal.note_failure();
                // The zones this commit took wait for the next one (only those: others
                // in `resetting` are another commit's, perhaps being reset now).
                if let Ok(mut inner) = self.lock() {
                    if let Some(conv) = &mut inner.conv {
                        conv.give_back_freed(freed);
                    }
                    for zone in taken {
                        if inner.resetting.remove(&zone) {
                            inner.durable_dead.remove(&zone);
                            inner.to_reset.insert(zone);
                        }
                    }
                }
                Led::Failed(upto, e.to_string())
            }
        }
    }

    /// Resets zones whose death is durable and gives them back to the free list. A zone a
    /// reader or writer still uses waits for the next commit.
    fn reset_zones(&self, zones: BTreeSet<ZoneId>) -> Result<()> {
        if zones.is_empty() {
            return Ok(());
        }
        let ready: Vec<ZoneId> = {
            let mut inner = self.lock()?;
            let mut ready = Vec::new();
            for &zone in &zones {
                let z = zone as usize;
                if inner.free.contains(&zone) {
                    inner.resetting.remove(&zone);
                    continue;
                }
                if inner.state.zones.valid_blocks(zone) != 0 {
                    // Live again (a write that was in flight when the zone was retired
                    // has been recorded): GC collects it once it is sealed.
                    inner.resetting.remove(&zone);
                    inner.seal(zone)?;
                    continue;
                }
                debug_assert!(!inner.heads.values().any(|h| h.zone == zone));
                let busy = self.shared.pins[z].load(Ordering::Acquire) > 0
                    || inner.written[z] != inner.wp[z];
                if busy {
                    // Back for the next commit, which may take it before this call ends.
                    inner.resetting.remove(&zone);
                    inner.to_reset.insert(zone);
                } else {
                    let first = inner.resets_in_flight.insert(zone);
                    debug_assert!(first, "zone {zone} reset twice at once");
                    ready.push(zone);
                }
            }
            ready
        };
        let mut done = Vec::with_capacity(ready.len());
        let mut failed = None;
        for &zone in &ready {
            match self.shared.device.reset(zone) {
                Ok(()) => done.push(zone),
                Err(e) => failed = Some(e),
            }
        }
        let mut inner = self.lock()?;
        for zone in &ready {
            inner.resetting.remove(zone);
            inner.resets_in_flight.remove(zone);
        }
        for zone in done {
            inner.zone_emptied(zone)?;
        }
        drop(inner);
        self.notify();
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Delivers placement events (no lock held: a policy call may take its time).
    fn deliver(&self, events: Vec<Event>) {
        for event in events {
            let placement = self.shared.placements.get(event.tenant());
            event.deliver(&*placement);
        }
    }

    /// The device under the store.
    pub fn device(&self) -> &Arc<dyn ZonedDevice> {
        &self.shared.device
    }

    /// The tenant called `name`, created with an empty root directory if new.
    pub fn tenant(&self, name: &str) -> Result<(TenantId, Ino)> {
        let mut created = false;
        let found = self.with(|inner| {
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
            created = true;
            Ok((id, root))
        })?;
        if created {
            self.commit()?;
        }
        Ok(found)
    }

    /// Names of all tenants, by id.
    pub fn tenants(&self) -> Vec<(TenantId, String, Ino)> {
        let Ok(inner) = self.lock() else {
            return Vec::new();
        };
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

    /// Resolves `path` relative to directory `dir`, following symlinks (`stat`).
    pub fn lookup(&self, dir: Ino, path: &str) -> Result<Ino> {
        self.lock()?.state.lookup(dir, path)
    }

    /// Resolves `path` relative to directory `dir`; a final symlink is followed only if
    /// `follow` (`lstat` otherwise) or if the path ends in `/`.
    pub fn lookup_at(&self, dir: Ino, path: &str, follow: bool) -> Result<Ino> {
        self.lock()?.state.lookup_at(dir, path, follow)
    }

    /// `symlink`: makes `path` a symbolic link to `target`, a relative path that need not
    /// exist. An absolute target is refused ([`Error::Escape`]): a link never names a path
    /// outside the store.
    pub fn symlink(&self, dir: Ino, target: &str, path: &str) -> Result<Ino> {
        self.check_running()?;
        self.with(|inner| inner.symlink(dir, target, path))
    }

    /// `readlink`: the target of the link `path` names ([`Error::Invalid`] if it is no link).
    pub fn read_link(&self, dir: Ino, path: &str) -> Result<String> {
        self.lock()?.state.read_link(dir, path)
    }

    /// `stat` of an inode.
    pub fn metadata(&self, ino: Ino) -> Result<Metadata> {
        self.lock()?.metadata(ino)
    }

    /// Limits the directory entries (files, directories, symbolic and hard links) of
    /// `tenant`'s tree to `limit`, or lifts the limit: past it, new names get ENOSPC as
    /// past the store's own metadata line, and entries already there stay. The store's
    /// room for names is one for all its tenants; this keeps one from taking all of it.
    /// Kept in memory: a mount starts with no limits.
    pub fn set_entry_limit(&self, tenant: TenantId, limit: Option<u64>) -> Result<()> {
        let mut inner = self.lock()?;
        match limit {
            Some(limit) => inner.entry_limits.insert(tenant, limit),
            None => inner.entry_limits.remove(&tenant),
        };
        Ok(())
    }

    /// The directory entries in `tenant`'s tree.
    pub fn tenant_entries(&self, tenant: TenantId) -> Result<u64> {
        let inner = self.lock()?;
        Ok(inner.state.entries_of.get(&tenant).copied().unwrap_or(0))
    }

    /// The bytes a tenant's files and links hold (their sizes, each inode once), files
    /// removed while still open included, since their data stays: what a quota counts.
    pub fn tenant_bytes(&self, tenant: TenantId) -> Result<u64> {
        Ok(self.lock()?.state.tenant_bytes(tenant))
    }

    /// The entries of a directory, by name (without `.` and `..`).
    pub fn read_dir(&self, dir: Ino) -> Result<Vec<DirEntry>> {
        self.lock()?.state.read_dir(dir)
    }

    /// The parent of a directory (a tenant root is its own parent).
    pub fn parent(&self, dir: Ino) -> Result<Ino> {
        let inner = self.lock()?;
        let inode = inner.state.inode(dir)?;
        if inode.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(inode.parent)
    }

    /// `mkdir`.
    pub fn create_dir(&self, dir: Ino, path: &str) -> Result<Ino> {
        self.check_running()?;
        self.with(|inner| inner.create_dir(dir, path))
    }

    /// `rmdir`.
    pub fn remove_dir(&self, dir: Ino, path: &str) -> Result<()> {
        self.check_running()?;
        self.with(|inner| inner.remove_dir(dir, path))
    }

    /// `unlink`: the file goes away when its last handle closes.
    pub fn unlink(&self, dir: Ino, path: &str) -> Result<()> {
        self.check_running()?;
        self.with(|inner| inner.unlink(dir, path))
    }

    /// `rename`, replacing the target the way POSIX does. A renamed file is placed anew
    /// (the policy is asked with no lock held; the answer applies if the file is still there).
    pub fn rename(&self, from_dir: Ino, from: &str, to_dir: Ino, to: &str) -> Result<()> {
        self.check_running()?;
        let moved = self.with(|inner| inner.rename(from_dir, from, to_dir, to))?;
        if let Some((ino, tenant, path)) = moved {
            let hint = self.place(tenant, &path, OpenReason::Rename, 0);
            self.with(|inner| {
                if inner.state.inodes.contains_key(&ino) && inner.state.any_path(ino) == path {
                    inner.set_hint(ino, hint)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// `link`: a second name for a file (for a symlink, a second name for the link itself,
    /// as Linux's `link` does).
    pub fn link(&self, from_dir: Ino, from: &str, to_dir: Ino, to: &str) -> Result<()> {
        self.link_at(from_dir, from, false, to_dir, to)
    }

    /// `linkat`: as [`Store::link`], following a final symlink of `from` if `follow`
    /// (`AT_SYMLINK_FOLLOW`).
    pub fn link_at(
        &self,
        from_dir: Ino,
        from: &str,
        follow: bool,
        to_dir: Ino,
        to: &str,
    ) -> Result<()> {
        self.check_running()?;
        self.with(|inner| inner.link(from_dir, from, follow, to_dir, to))
    }

    /// Sets access and modification times (None leaves one unchanged).
    pub fn set_times(&self, ino: Ino, atime_ns: Option<u64>, mtime_ns: Option<u64>) -> Result<()> {
        self.check_running()?;
        self.flush_file(ino)?;
        self.with(|inner| inner.set_times(ino, atime_ns, mtime_ns))
    }

    /// Opens (and maybe creates) a file. The placement is asked with no lock held; if the
    /// namespace changed meanwhile, the question is asked again.
    pub fn open_file(&self, dir: Ino, path: &str, opts: OpenOptions) -> Result<FileHandle> {
        let wants_write = opts.write || opts.append || opts.truncate;
        if wants_write || opts.create {
            self.check_running()?;
        }
        let mut decided: Option<(OpenReason, String, Hint)> = None;
        // A final link is followed (a dangling one to create its target, as `open` does),
        // except by an exclusive create, for which any existing name is EEXIST.
        let exclusive = opts.create && opts.exclusive;
        let follow = !(opts.nofollow || exclusive);
        loop {
            let mut inner = self.lock()?;
            let resolved = inner.state.resolve(dir, path, follow)?;
            let Some((parent, name)) = resolved.last else {
                return Err(match path.trim_end_matches('/').rsplit('/').next() {
                    Some("." | "..") => Error::Invalid("path ends in . or .."),
                    _ => Error::IsDir,
                });
            };
            let (name, existing, slash) = (name.to_string(), resolved.ino, resolved.slash);
            let tenant = inner.state.inode(parent)?.tenant;
            // The placement question this open asks, if any.
            let question = match existing {
                Some(_) if opts.create && opts.exclusive => return Err(Error::Exists),
                Some(ino) => {
                    let inode = inner.state.inode(ino)?;
                    match inode.kind {
                        FileKind::Dir => return Err(Error::IsDir),
                        FileKind::Symlink => return Err(Error::Loop),
                        FileKind::File => {}
                    }
                    if slash {
                        return Err(Error::NotDir);
                    }
                    let first_writer = inner.open.get(&ino).is_none_or(|o| o.writers == 0);
                    (wants_write && first_writer).then(|| {
                        let full = inner.state.path_of_new(parent, &name);
                        (OpenReason::OpenForWrite, full, inode.size)
                    })
                }
                None if opts.create => {
                    if slash {
                        return Err(Error::IsDir);
                    }
                    let full = inner.state.path_of_new(parent, &name);
                    Some((OpenReason::Create, full, 0))
                }
                None => return Err(Error::NotFound),
            };
            let hint = match question {
                None => None,
                Some((reason, full, size)) => match &decided {
                    Some((r, p, hint)) if *r == reason && *p == full => Some(*hint),
                    _ => {
                        drop(inner);
                        let hint = self.place(tenant, &full, reason, size);
                        decided = Some((reason, full, hint));
                        continue;
                    }
                },
            };
            let ino = match (existing, hint) {
                (Some(ino), Some(hint)) => {
                    inner.set_hint(ino, hint)?;
                    ino
                }
                (Some(ino), None) => ino,
                (None, hint) => {
                    let hint = hint.expect("a create always asks the placement");
                    inner.create_file(parent, &name, hint)?
                }
            };
            let id = inner.open_handle(ino, opts)?;
            let truncate = opts.truncate && inner.state.inode(ino)?.size > 0;
            self.release(inner)?;
            let handle = FileHandle {
                store: self.clone(),
                id,
                ino,
            };
            if truncate {
                // On failure the handle closes as it drops.
                self.set_len(id, ino, 0)?;
            }
            return Ok(handle);
        }
    }

    /// Makes every buffered write and metadata change durable.
    pub fn sync(&self) -> Result<()> {
        let inos: Vec<Ino> = self.lock()?.open.keys().copied().collect();
        let mut first_error = None;
        for ino in inos {
            if let Err(e) = self.flush_or_sync_conventional(ino) {
                if !matches!(e, Error::NotFound | Error::BadHandle) {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.commit()?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes every change to the namespace and the metadata made so far durable (entries
    /// removed, renamed, made), leaving open files' buffered data where it is, unlike
    /// [`Store::sync`]: an administrative change does not cost the guests' buffers.
    pub fn sync_metadata(&self) -> Result<()> {
        self.commit()
    }

    /// `fsync` of a directory: its entries durable (with everything recorded before them),
    /// as on a POSIX file system. Other files' buffered data stays where it is: a database
    /// that syncs its directory after creating a file does not wait for another tenant's
    /// megabytes.
    pub fn sync_dir(&self, dir: Ino) -> Result<()> {
        let kind = self.lock()?.state.inode(dir).map(|i| i.kind);
        match kind {
            Ok(FileKind::Dir) => self.commit_inode(dir),
            Ok(_) => Err(Error::NotDir),
            // A removed directory (a descriptor outlived it): its removal is what to make
            // durable, as Linux's fsync of such a descriptor does.
            Err(Error::NotFound) => self.commit_for(Asker::Sync),
            Err(e) => Err(e),
        }
    }

    /// Checks every invariant of the store; see [`FsckReport`].
    pub fn fsck(&self) -> Result<FsckReport> {
        fsck::report(&*self.lock()?)
    }

    /// Whether the store takes changes: an error naming why not once a commit failed (its
    /// flush may have lost data the host held, so the store refuses writes until it is
    /// mounted again) or a panic inside it left its state unknown. A read-only store is
    /// healthy.
    pub fn health(&self) -> Result<()> {
        drop(self.lock()?);
        match self.shared.commit.failure() {
            Some(why) => Err(Error::Stopped(why)),
            None => Ok(()),
        }
    }

    /// The accounting so far.
    pub fn stats(&self) -> Stats {
        let counts = self.shared.commit.counts();
        let Ok(inner) = self.lock() else {
            return Stats::default();
        };
        let mut stats = inner.stats();
        drop(inner);
        let work = self.shared.work.all();
        for t in &mut stats.tenants {
            let cpu = work.get(t.tenant as usize).copied().unwrap_or_default();
            t.store_cpu_ns = u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX);
        }
        stats.group_commits = counts.commits;
        stats.syncs_joined = counts.joined;
        stats.commit_batch_waits = counts.batch_waits;
        stats.commit_batch_wait_ns = counts.batch_wait_ns;
        stats
    }

    /// Data zones a new stream could be given without GC moving any data: the free ones
    /// beyond GC's reserve, and the ones whose data all died, waiting for their reset. (What
    /// the node agent admits new tenants by: tenants never share a zone.)
    pub fn spare_zones(&self) -> u32 {
        let Ok(inner) = self.lock() else {
            return 0;
        };
        let free = inner.free.len() as u32;
        let dead = (inner.to_reset.len() + inner.resetting.len()) as u32;
        free.saturating_sub(inner.config.gc_reserve_zones) + dead
    }

    /// Every data zone that a stream owns now, as (zone, tenant, stream), by zone. Read-only;
    /// for tools and tests that check that tenants and streams never share a zone.
    pub fn zone_owners(&self) -> Vec<(ZoneId, TenantId, u32)> {
        let Ok(inner) = self.lock() else {
            return Vec::new();
        };
        let owners = inner.state.zones.owner.iter().enumerate();
        owners
            .filter_map(|(zone, owner)| match owner {
                Some(ZoneUse::Data(key)) => Some((zone as ZoneId, key.tenant, key.stream)),
                _ => None,
            })
            .collect()
    }

    /// A clean stop of this handle: flushes everything, commits, and seals the journal (see
    /// [`journal::Journal::seal`]). Other handles of the store stay usable, without the
    /// periodic writeback.
    pub fn unmount(self) -> Result<()> {
        // No writeback round after the seal: what it would write, this sync writes.
        self.shared.writeback.stop();
        self.sync()?;
        if self.shared.read_only {
            return Ok(());
        }
        // Under the journal's lock no commit is between its record and its flush, and a
        // failed commit marked the journal before letting it go.
        let mut journal = self.shared.commit.journal();
        journal.seal()?;
        // The seal durable too, and a device that keeps its write pointers lazily writes
        // them as they are: the process may end without dropping it (a signal handler or
        // another tenant's thread can hold the store to the end).
        Ok(self.shared.device.sync_at_close()?)
    }

    /// Closes handle `id` of `ino`: its data and metadata are durable on return. The handle
    /// is gone even when that fails; data whose write failed stays with the file.
    fn close_handle(&self, id: u64, ino: Ino) -> Result<()> {
        if !self.lock()?.handles.contains_key(&id) {
            return Ok(());
        }
        // Durable on close, as the Valet paper promises and as applications assume. When
        // every byte is durable already (a log synced inline, a table synced before its
        // close), the flush only moves bytes from journal records to a data zone, and that
        // needs no commit of its own: recovery writes inline bytes back anyway.
        let settled = {
            let inner = self.lock()?;
            inner.bytes_durable(ino).then(|| inner.undurable_upto(ino))
        };
        let synced = self
            .flush_or_sync_conventional(ino)
            .and_then(|()| match settled {
                Some(target) => self.commit_upto(target, Asker::Sync),
                None => self.commit_inode(ino),
            });
        let freed = self.with(|inner| {
            let Some(handle) = inner.handles.remove(&id) else {
                return Ok(false);
            };
            let of = inner
                .open
                .get_mut(&ino)
                .expect("open handle has open state");
            of.refs -= 1;
            if handle.write {
                of.writers -= 1;
            }
            inner.settle_closed(ino)
        })?;
        self.notify();
        if freed {
            self.commit()?;
        }
        synced
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
        self.store.read_data(Some(self.id), self.ino, buf, offset)
    }

    /// Writes all of `data` at `offset` (or at the end of file for an append handle; the
    /// offset written at is returned).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<u64> {
        self.store.write_data(self.id, self.ino, data, offset)
    }

    /// `ftruncate`.
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.store.set_len(self.id, self.ino, size)
    }

    /// `posix_fallocate` up to `size`: the file grows to it unless it is already as large,
    /// which is decided with the file's other writes held off (it never shrinks).
    pub fn allocate(&self, size: u64) -> Result<()> {
        self.store.grow_to(self.id, self.ino, size)
    }

    /// `fdatasync`: the file's data and what is needed to find it are durable on return.
    pub fn sync_data(&self) -> Result<()> {
        self.sync_all()
    }

    /// `fsync`.
    pub fn sync_all(&self) -> Result<()> {
        let start = Instant::now();
        if let Err(e) = self.make_durable() {
            if let Ok(mut inner) = self.store.lock() {
                if let Ok(inode) = inner.state.inode(self.ino) {
                    let tenant = inode.tenant;
                    inner
                        .counters
                        .sync_latency
                        .entry(tenant)
                        .or_default()
                        .failures += 1;
                }
            }
            return Err(e);
        }
        let took = start.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
        let defrag = self.store.with(|inner| {
            let tenant = inner.state.inode(self.ino)?.tenant;
            let latency = inner.counters.sync_latency.entry(tenant).or_default();
            latency.record(took);
            let path = inner.state.any_path(self.ino);
            inner.events.push(Event::Synced { tenant, path });
            Ok(inner.defrag_needed())
        })?;
        if defrag {
            self.store.defrag_on_sync(self.ino);
        }
        Ok(())
    }

    /// The work of a sync: the file's data written, then its metadata committed.
    fn make_durable(&self) -> Result<()> {
        self.store.lock()?.handle(self.id)?;
        self.store.sync_file(self.ino)?;
        self.store.commit_inode(self.ino)
    }

    pub fn metadata(&self) -> Result<Metadata> {
        self.store.lock()?.metadata(self.ino)
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
            let got = self
                .store
                .read_data(None, self.ino, &mut scratch[..n], at)?;
            if got < n {
                break;
            }
            at += n as u64;
        }
        Ok(())
    }

    /// Sets access and modification times (None leaves one unchanged).
    pub fn set_times(&self, atime_ns: Option<u64>, mtime_ns: Option<u64>) -> Result<()> {
        self.store.set_times(self.ino, atime_ns, mtime_ns)
    }

    /// Whether this handle appends.
    pub fn is_append(&self) -> bool {
        self.store
            .lock()
            .is_ok_and(|inner| inner.handles.get(&self.id).is_some_and(|h| h.append))
    }

    /// Switches append mode (`fd_fdstat_set_flags`).
    pub fn set_append(&self, append: bool) -> Result<()> {
        let mut inner = self.store.lock()?;
        inner
            .handles
            .get_mut(&self.id)
            .ok_or(Error::BadHandle)?
            .append = append;
        Ok(())
    }

    /// Closes the file: its data and metadata are durable on return, or the error says why
    /// not (and the data stays with the file, to be written by a later sync).
    pub fn close(self) -> Result<()> {
        self.store.close_handle(self.id, self.ino)
    }
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        let _ = self.store.close_handle(self.id, self.ino);
    }
}

impl Inner {
    /// The checkpoint size past which new names are refused (see [`METADATA_FULL`]).
    fn metadata_full_bytes(&self) -> u64 {
        let (num, den) = METADATA_FULL;
        self.state.geometry.zone_capacity / den * num
    }

    /// Notes the size of the checkpoint `journal` wrote last, which holds the names counted
    /// `names` bytes and the `extents` there were when its snapshot was taken (see
    /// [`METADATA_FULL`]).
    fn note_checkpoint(&mut self, journal: &Journal, names: u64, extents: usize) {
        self.checkpoint_len = journal.checkpoint_len;
        self.names_since_checkpoint = self.names_since_checkpoint.saturating_sub(names);
        self.extents_at_checkpoint = extents;
    }

    /// Counts a new name of `len` bytes (with a link's target) in a directory of `tenant`
    /// against the metadata's room, or refuses it while the metadata is nearly full or the
    /// tenant's tree holds its limit of entries.
    fn metadata_room(&mut self, tenant: TenantId, len: usize) -> Result<()> {
        if let Some(&limit) = self.entry_limits.get(&tenant) {
            let entries = self.state.entries_of.get(&tenant).copied().unwrap_or(0);
            if entries >= limit {
                return Err(Error::NoSpace(format!(
                    "the tenant's limit of {limit} names (files, directories, links) is \
                     reached: remove some before creating more"
                )));
            }
        }
        let adds = NAME_BYTES + len as u64;
        let size = self.checkpoint_len + self.names_since_checkpoint;
        if size + adds > self.metadata_full_bytes() {
            return Err(Error::NoSpace(format!(
                "the store's metadata is nearly full (about {size} bytes, of at most {} in a \
                 metadata zone): remove files before creating more",
                self.state.geometry.zone_capacity / 2
            )));
        }
        self.names_since_checkpoint += adds;
        Ok(())
    }

    /// Applies an operation and queues it for the journal. Never commits: the records of
    /// one operation (a rename's unlink and link) must reach the journal together.
    fn record(&mut self, op: MetaOp) -> Result<()> {
        // Every metadata change comes here: the last line of a read-only store's defence.
        if self.config.read_only {
            return Err(Error::ReadOnly);
        }
        self.state.apply(&op)?;
        if let Some((ino, size)) = op.claimed_size() {
            self.state.size_recorded(ino, size);
        }
        self.changes += 1;
        for ino in op.inodes().into_iter().flatten() {
            self.undurable.insert(ino, self.changes);
        }
        self.pending.push(op);
        self.reclaim_emptied();
        Ok(())
    }

    /// The change counter `ino`'s changes are durable at (0 when they are already).
    fn undurable_upto(&self, ino: Ino) -> u64 {
        self.undurable.get(&ino).copied().unwrap_or(0)
    }

    /// Whether every byte written to `ino` is durable once its recorded changes are: nothing
    /// waits in its window, its detached buffers or its host file that no sync covered.
    fn bytes_durable(&self, ino: Ino) -> bool {
        let Some(of) = self.open.get(&ino) else {
            return true;
        };
        let window_synced = of
            .window
            .as_ref()
            .is_none_or(|w| !w.dirty || w.unsynced_from == u64::MAX);
        window_synced && !of.host_dirty() && of.inflight.iter().all(|d| !d.unsynced)
    }

    /// Lets go of a file nobody has open: its open state goes once nothing of it is left
    /// to write (or, with no name left, at once: nobody can read that data any more), and
    /// an unlinked file is freed then. Returns whether a file was freed.
    fn settle_closed(&mut self, ino: Ino) -> Result<bool> {
        let Some(of) = self.open.get(&ino) else {
            return Ok(false);
        };
        let writing = of.busy || of.inflight.iter().any(|d| d.writing);
        if of.refs > 0 || writing {
            return Ok(false);
        }
        let inode = self.state.inode(ino)?;
        let (tenant, size, nlink) = (inode.tenant, inode.size, inode.nlink);
        // A conventional file whose close could not sync it stays for the next sync to try
        // again (the writeback round's, the unmount's), unless its host file's sync failed:
        // then nothing can make those bytes durable, and each sync of it says so.
        let failed = self.conv.as_ref().is_some_and(|c| c.sync_failed(ino));
        if nlink > 0 && (of.has_unwritten() || (of.host_dirty() && !failed)) {
            return Ok(false);
        }
        let of = self.open.remove(&ino).expect("checked above");
        if let Some(w) = of.window {
            self.pool.give_back(w.buf);
        }
        for d in of.inflight {
            self.pool.retire(d.backing, d.buf);
        }
        let path = self.state.any_path(ino);
        self.events.push(Event::Closed {
            tenant,
            path: path.clone(),
            size,
        });
        if nlink == 0 {
            self.free_inode(ino, &path)?;
            return Ok(true);
        }
        Ok(false)
    }

    fn handle(&self, id: u64) -> Result<&Handle> {
        self.handles.get(&id).ok_or(Error::BadHandle)
    }

    /// A generation for a new window, newer than every inline piece.
    fn next_window_gen(&mut self) -> u64 {
        self.window_gen += 1;
        self.window_gen
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn metadata(&self, ino: Ino) -> Result<Metadata> {
        let inode = self.state.inode(ino)?;
        let nlink = match inode.kind {
            FileKind::File | FileKind::Symlink => inode.nlink,
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
        let entry = self.open.entry(ino).or_insert_with(|| OpenFile::new(tick));
        entry.refs += 1;
        if write {
            entry.writers += 1;
        }
        let id = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(
            id,
            Handle {
                write,
                read: opts.read || !write,
                append: opts.append,
            },
        );
        Ok(id)
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
        let inode = self.state.inode(ino)?;
        let size = inode.size;
        let op = MetaOp::SetAttr {
            ino,
            size: self.state.recordable_size(ino, inode),
            atime_ns: atime.unwrap_or(inode.atime_ns),
            mtime_ns: mtime.unwrap_or(inode.mtime_ns),
            ctime_ns: now_ns(),
        };
        self.record(op)?;
        // The file keeps the bytes no record covers yet: only the record holds the size
        // recordable.
        self.state.grow_unrecorded(ino, size)?;
        Ok(())
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
            meta_bytes: self.meta_bytes,
            buffer_waits: self.counters.buffer_waits,
            buffer_wait_ns: self.counters.buffer_wait_ns,
            background_flushes: self.counters.background_flushes,
            flushes_while_waiting: self.counters.flushes_while_waiting,
            inline_syncs: self.counters.inline_syncs,
            gc_background_passes: self.counters.gc_background_passes,
            gc_foreground_passes: self.counters.gc_foreground_passes,
            defrag_bytes_moved: self.counters.defrag_bytes,
            defrag_passes: self.counters.defrag_passes,
            defrag_sync_passes: self.counters.defrag_sync_passes,
            defrag_flush_passes: self.counters.defrag_flush_passes,
            last_defrag_failure: self.counters.last_defrag_failure.clone(),
            allocation_stalls: self.counters.allocation_stalls,
            writebacks: self.counters.writebacks,
            writeback_ns: self.counters.writeback_ns,
            handoffs: self.counters.handoffs,
            handoff_ns: self.counters.handoff_ns,
            handoff_rounds: self.counters.handoff_rounds,
            checksum_failures: self.counters.checksum_failures,
            last_checksum_failure: self.counters.last_checksum_failure.clone(),
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
                tenant_name: names(tenant),
                name: placement.name(),
                decisions: placement.decisions(),
                faults: placement.faults(),
            });
        }
        for (&tenant, latency) in &self.counters.sync_latency {
            stats.sync_latency.push(SyncLatency {
                tenant,
                name: names(tenant),
                ..latency.clone()
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
