//! Mounting: format a blank device, or recover one from its journal.
//!
//! Recovery takes the newest checkpoint and replays the transactions after it. The newest
//! transaction, and those before it that no completed flush covered when it was written
//! (its `unflushed` count: records a hand-off wrote without a flush), may be on the device
//! without their data, so their new extents are also checked against the crc32c they were
//! written with, oldest first; the first that does not match was never acknowledged, and
//! it and every transaction after it are dropped. The result is checked as
//! fsck checks it (every extent below its zone's write pointer and in a zone of its
//! tenant, no block claimed twice, a namespace that holds together), and a store that
//! fails is refused before anything on it changes. The mount then resets zones that hold
//! no live data, frees orphaned inodes, writes a fresh checkpoint and only then resets the
//! zones the orphans held.
//!
//! A read-only mount ([`StoreConfig::read_only`]) recovers the same metadata and changes
//! nothing: write pointers the journal restores stay in the device's memory, the synced
//! bytes only the journal holds are read from it (not written back), and nothing is
//! settled, freed, checkpointed or refused. Whoever inspects such a store runs fsck first.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::buffer::BufferPool;
use super::conventional::ConventionalArea;
use super::extent_map::MAX_EXTENT_BLOCKS;
use super::journal::{self, CheckpointRoom, Journal};
use super::state::{FileKind, MetaOp, State};
use super::zone_map::ZoneUse;
use super::{Counters, Inner, Placements, Store, StoreConfig};
use crate::device::{Geometry, ZonePlacement, ZoneState, ZonedDevice};
use crate::hint::Class;
use crate::resolver::ZnsHead;
use crate::{Error, Result};

impl Store {
    /// Whether a store fits a device of geometry `g` (which [`Geometry::validate`] passed):
    /// a tool about to create a device asks before it does.
    ///
    /// [`Geometry::validate`]: crate::device::Geometry::validate
    pub fn check_geometry(g: &Geometry) -> std::result::Result<(), String> {
        if g.zone_count < 4 {
            return Err(format!(
                "device has {} zones; the store needs at least 4",
                g.zone_count
            ));
        }
        if g.max_active < 3 {
            return Err(format!(
                "device allows {} active zones; the store needs at least 3",
                g.max_active
            ));
        }
        Ok(())
    }
}

fn check_config(device: &dyn ZonedDevice, config: &StoreConfig) -> Result<()> {
    let g = device.geometry();
    g.validate()?;
    let bad = |why: String| Err(Error::Corrupt(why));
    Store::check_geometry(&g).map_err(Error::Corrupt)?;
    let bs = g.block_size as usize;
    let max = MAX_EXTENT_BLOCKS as usize * bs;
    if config.buffer_size < bs || config.buffer_size % bs != 0 || config.buffer_size > max {
        return bad(format!(
            "buffer size {} must be a multiple of the {bs}-byte block, at most {max} bytes \
             (the largest extent)",
            config.buffer_size
        ));
    }
    if config.buffers == 0 {
        return bad("the store needs at least one write buffer".into());
    }
    Ok(())
}

/// Applies one operation of journal record `seq`. An operation that does not fit the
/// state (an inode or name that is not there, say) means the journal is damaged, whatever
/// error the state gave: say so, and which record.
fn replay(state: &mut State, op: &MetaOp, seq: u64) -> Result<()> {
    state.apply(op).map_err(|e| match e {
        Error::Corrupt(why) => Error::Corrupt(format!("journal record {seq}: {why}")),
        other => Error::Corrupt(format!("journal record {seq} does not apply: {other}")),
    })
}

pub(super) fn mount(
    device: Arc<dyn ZonedDevice>,
    config: StoreConfig,
    placements: Arc<Placements>,
) -> Result<(Inner, Journal)> {
    check_config(&*device, &config)?;
    let geometry = device.geometry();
    let bs = geometry.block_size as u64;
    let (state, mut journal) = match journal::recover(&*device)? {
        None if config.read_only => {
            return Err(Error::Corrupt(
                "no valet metadata on the device: not a store".into(),
            ))
        }
        None => format(&device)?,
        Some(rec) => {
            let mut state = State::from_snapshot(geometry, rec.snapshot)?;
            let first_seq = rec.last_seq + 1 - rec.transactions.len() as u64;
            for op in &rec.carry {
                replay(&mut state, op, first_seq - 1)?;
            }
            let txns = rec.transactions;
            // The newest transaction, and the ones before it that no flush had covered
            // when it was written, may be on the device without their data.
            let trusted = txns.len() - (rec.unflushed + 1).min(txns.len());
            for (seq, ops) in (first_seq..).zip(&txns[..trusted]) {
                for op in ops {
                    replay(&mut state, op, seq)?;
                }
            }
            state = durable_prefix(
                state,
                &txns[trusted..],
                first_seq + trusted as u64,
                &*device,
            )?;
            let journal = Journal::new(device.clone(), rec.active, rec.next_seq);
            if !config.read_only {
                // A store made before its journal's room was reserved gets it now, if the
                // host has it (without, it mounts as it always did).
                for zone in journal::META_ZONES {
                    let _ = device.reserve(zone);
                }
            }
            (state, journal)
        }
    };
    if device.lazy_write_pointers() {
        restore_data_write_pointers(&state, &*device)?;
    }
    let report = device.report_zones();
    let cap_blocks = geometry.blocks_per_zone();
    let conv = match &config.conventional_dir {
        Some(path) if config.read_only => ConventionalArea::open_read_only(path)?,
        Some(path) => Some(ConventionalArea::open(path)?),
        None => None,
    };
    // A read-only store writes nothing, so it needs no write buffers.
    let buffers = if config.read_only { 0 } else { config.buffers };
    let wp: Vec<u64> = report
        .iter()
        .map(|z| match z.state {
            ZoneState::Full => cap_blocks,
            _ => z.write_pointer / bs,
        })
        .collect();
    let zones = wp.len();
    let mut inner = Inner {
        device: device.clone(),
        pool: BufferPool::new(buffers, config.buffer_size),
        config,
        state,
        pending: Vec::new(),
        changes: 0,
        undurable: Default::default(),
        unsynced_writes: false,
        open: Default::default(),
        handles: Default::default(),
        next_handle: 1,
        heads: HashMap::new(),
        head_used: HashMap::new(),
        current_group: HashMap::new(),
        written: wp.clone(),
        wp,
        fault: vec![false; zones],
        seal_pending: vec![false; zones],
        free: BTreeSet::new(),
        to_reset: BTreeSet::new(),
        damaged: BTreeSet::new(),
        collecting: None,
        resetting: BTreeSet::new(),
        resets_in_flight: BTreeSet::new(),
        durable_dead: BTreeSet::new(),
        conv,
        counters: Counters::default(),
        tick: 0,
        handoff_tick: 0,
        placements,
        events: Vec::new(),
        meta_bytes: 0,
        checkpoint_len: 0,
        names_since_checkpoint: 0,
        extents_at_checkpoint: 0,
        defrag_cursor: HashMap::new(),
        defrag_quiet_below: 0,
        entry_limits: HashMap::new(),
        zone_resets: vec![0; zones],
        window_gen: 0,
        pins: (0..zones)
            .map(|_| std::sync::atomic::AtomicU32::new(0))
            .collect(),
    };
    // Windows from now on are newer than any inline piece the journal still holds.
    inner.window_gen = inner.state.inline.max_gen();
    if inner.config.read_only {
        // The device learns each zone's placement (what `fs zones` shows), in its memory.
        inner.assign_placements();
        return Ok((inner, journal));
    }
    // Settling acts on the recovered metadata: it resets zones no extent claims and frees
    // inodes no entry names. On metadata that does not hold together (a damaged or crafted
    // journal whose records still pass their checksums) that would destroy data, so such a
    // store is refused as it is, with fsck's findings (extents past write pointers or in
    // another tenant's zones, blocks claimed twice, entries naming missing inodes, cycles).
    let report = super::fsck::check(&inner)?;
    if !report.is_consistent() {
        return Err(Error::Corrupt(format!(
            "recovered metadata is inconsistent, store left as it is: {}",
            report.findings()
        )));
    }
    inner.settle_zones()?;
    inner.free_orphans()?;
    // Start from a clean checkpoint: the replayed journal (and any torn tail) is retired.
    inner.device.sync()?;
    let (snapshot, carried) = (inner.state.snapshot(), inner.state.carried_ops());
    journal.checkpoint(&snapshot, &carried, CheckpointRoom::Mount)?;
    inner.device.sync()?;
    journal.note_flushed();
    journal.retire_previous()?;
    inner.pending.clear();
    inner.unsynced_writes = false;
    // Only now that no journal names the orphans' data may their zones be reset: before,
    // a crash would replay a journal whose newest extents read back as reset zones.
    inner.reset_now()?;
    inner.meta_bytes = journal.bytes_written;
    let extents = inner.state.extents;
    inner.note_checkpoint(&journal, 0, extents);
    Ok((inner, journal))
}

/// Formats a blank device; refuses one that holds data but no journal.
fn format(device: &Arc<dyn ZonedDevice>) -> Result<(State, Journal)> {
    if let Some(z) = device.report_zones().iter().find(|z| z.write_pointer > 0) {
        return Err(Error::Corrupt(format!(
            "zone {} holds data but no valet metadata was found: not a valet store, or its \
             metadata zones are damaged",
            z.id
        )));
    }
    let mut state = State::new(device.geometry());
    for zone in journal::META_ZONES {
        state.zones.owner[zone as usize] = Some(ZoneUse::Meta);
        device.reserve(zone).map_err(|e| {
            Error::NoSpace(format!("no room on the host for the store's journal: {e}"))
        })?;
    }
    // The first checkpoint goes to zone 0.
    Ok((state, Journal::new(device.clone(), 1, 1)))
}

/// On a device with lazy write pointers, moves each data zone's write pointer to the end of
/// the data the journal maps there (synced before the crash, or the journal would not name
/// it). Zones that end full go first, so that they take no active-zone resource. A zone
/// the store had finished comes back partly written (finishing is not journaled): once
/// only one active zone is left such zones come back full, or they would leave the journal
/// none for its next checkpoint and the mount would fail.
fn restore_data_write_pointers(state: &State, device: &dyn ZonedDevice) -> Result<()> {
    let geometry = device.geometry();
    let bs = geometry.block_size as u64;
    let mut ends: HashMap<u32, u64> = HashMap::new();
    for inode in state.inodes.values() {
        for (_, ext) in inode.extents.iter() {
            let end = (ext.block as u64 + ext.len as u64) * bs;
            let known = ends.entry(ext.zone).or_default();
            *known = (*known).max(end);
        }
    }
    let mut ends: Vec<(u32, u64)> = ends.into_iter().collect();
    ends.sort_by_key(|&(zone, end)| (end != geometry.zone_capacity, zone));
    // Zones active now (the journal's among them); one more must stay free for the
    // journal's next checkpoint.
    let zones = device.report_zones();
    let mut active = zones.iter().filter(|z| z.state.is_active()).count();
    for (zone, end) in ends {
        let activates = end < geometry.zone_capacity && !zones[zone as usize].state.is_active();
        let end = match activates {
            true if active + 1 < geometry.max_active as usize => {
                active += 1;
                end
            }
            true => geometry.zone_capacity,
            false => end,
        };
        device.restore_write_pointer(zone, end)?;
    }
    Ok(())
}

/// `state` with the part of `txns` (the transactions after it not known durable, oldest
/// first, the first numbered `first_seq`) that recovery keeps applied: up to the first
/// whose new extents did not reach the device intact. That one's sync never completed (its
/// flush would have made every earlier write durable too), and none after it was
/// acknowledged either. The newest may also fail to apply (a commit whose sync never
/// completed); an older one that does not apply is damage.
///
/// An extent in a zone that holds no live data once the kept transactions are applied is
/// not checked: a later commit, or a mount that settled the same journal before a crash,
/// may have reset that zone, and nothing kept refers to its data. Dropping a transaction
/// can bring such a zone back to life, so the check starts over on the shorter prefix.
fn durable_prefix(
    state: State,
    txns: &[Vec<MetaOp>],
    first_seq: u64,
    device: &dyn ZonedDevice,
) -> Result<State> {
    let mut kept = txns.len();
    'prefix: loop {
        let mut end = state.clone();
        for (i, ops) in txns[..kept].iter().enumerate() {
            if let Err(e) = ops.iter().try_for_each(|op| end.apply(op)) {
                if i + 1 < txns.len() {
                    let seq = first_seq + i as u64;
                    return Err(Error::Corrupt(format!(
                        "journal record {seq} does not apply: {e}"
                    )));
                }
                kept = i;
                continue 'prefix;
            }
        }
        for (i, ops) in txns[..kept].iter().enumerate() {
            if !reached_device(&end, ops, device)? {
                kept = i;
                continue 'prefix;
            }
        }
        return Ok(end);
    }
}

/// Whether the new extents of a transaction reached the device intact, as far as `after`
/// (the state the recovery would keep) still needs them.
fn reached_device(after: &State, ops: &[MetaOp], device: &dyn ZonedDevice) -> Result<bool> {
    let bs = device.geometry().block_size as u64;
    for op in ops {
        let MetaOp::MapExtent { extent, crc, .. } = op else {
            continue;
        };
        // A zone whose data all died may have been reset after the commit: nothing to check.
        if after.zones.valid_blocks(extent.zone) == 0 {
            continue;
        }
        let end = (extent.block as u64 + extent.len as u64) * bs;
        let lazy = device.lazy_write_pointers();
        if !lazy && device.zone_info(extent.zone)?.write_pointer < end {
            return Ok(false);
        }
        let mut data = vec![0u8; (extent.len as u64 * bs) as usize];
        device.read_unwritten(extent.zone, extent.block as u64 * bs, &mut data)?;
        if crc32c::crc32c(&data) != *crc {
            return Ok(false);
        }
    }
    Ok(true)
}

impl Inner {
    /// Tells the device the placement of every zone that holds live data (an FDP drive
    /// writes each zone's data with its stream's placement identifier).
    fn assign_placements(&self) {
        for zone in 0..self.state.geometry.zone_count {
            if let Some(ZoneUse::Data(key)) = self.state.zones.owner[zone as usize] {
                if self.state.zones.valid_blocks(zone) > 0 {
                    let placement = ZonePlacement {
                        tenant: key.tenant,
                        stream: key.stream,
                        group: 0,
                    };
                    self.device.assign_zone(zone, &placement);
                }
            }
        }
    }

    /// Rebuilds stream heads and the free list; resets zones that hold no live data.
    fn settle_zones(&mut self) -> Result<()> {
        self.assign_placements();
        let cap = self.state.geometry.blocks_per_zone();
        for zone in 0..self.state.geometry.zone_count {
            let z = zone as usize;
            match self.state.zones.owner[z] {
                Some(ZoneUse::Meta) => {}
                Some(ZoneUse::Data(key)) if self.state.zones.valid_blocks(zone) > 0 => {
                    let partial = self.wp[z] > 0 && self.wp[z] < cap;
                    if partial && !self.heads.contains_key(&key) {
                        self.heads.insert(key, ZnsHead { zone, group: 0 });
                    } else if partial {
                        self.seal(zone)?;
                    }
                }
                Some(ZoneUse::Data(_)) | None => {
                    if self.wp[z] > 0 || self.device.zone_info(zone)?.state != ZoneState::Empty {
                        self.device.reset(zone)?;
                        self.wp[z] = 0;
                        self.written[z] = 0;
                    }
                    if self.state.zones.owner[z].is_some() {
                        self.state.apply(&MetaOp::ReleaseZone { zone })?;
                    }
                    self.free.insert(zone);
                }
            }
        }
        self.state.emptied.clear();
        Ok(())
    }

    /// Frees inodes left unlinked-but-open by a crash, and their conventional host files.
    fn free_orphans(&mut self) -> Result<()> {
        let orphans: Vec<_> = self
            .state
            .inodes
            .iter()
            .filter(|(ino, i)| i.nlink == 0 && !self.state.tenants.iter().any(|t| t.root == **ino))
            .map(|(ino, _)| *ino)
            .collect();
        for ino in orphans {
            self.state.apply(&MetaOp::FreeInode { ino })?;
        }
        self.reclaim_emptied();
        let state = &self.state;
        if let Some(conv) = &mut self.conv {
            let conventional = |i: &super::state::Inode| {
                i.kind == FileKind::File && i.hint.class == Class::Conventional
            };
            conv.remove_orphans(|ino| state.inodes.get(&ino).is_some_and(conventional))?;
            conv.trim(
                state
                    .inodes
                    .iter()
                    .filter(|(_, i)| conventional(i))
                    .map(|(ino, i)| (*ino, i.size)),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Geometry, MemoryDevice};
    use crate::store::{Ino, OpenOptions, Store};

    fn geometry() -> Geometry {
        Geometry {
            zone_count: 8,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            block_size: 4096,
            max_open: 4,
            max_active: 5,
        }
    }

    /// Two tenants, one synced file each; returns the device and the files' inodes.
    fn two_tenants() -> (Arc<dyn ZonedDevice>, Ino, Ino) {
        let device: Arc<dyn ZonedDevice> = Arc::new(MemoryDevice::new(geometry()).unwrap());
        let store = Store::open(device.clone(), StoreConfig::default()).unwrap();
        let mut files = Vec::new();
        for tenant in ["a", "b"] {
            let (_, root) = store.tenant(tenant).unwrap();
            let f = store
                .open_file(root, "data", OpenOptions::create())
                .unwrap();
            f.write_at(&[tenant.as_bytes()[0]; 100_000], 0).unwrap();
            files.push(f.ino());
            f.close().unwrap();
        }
        store.unmount().unwrap();
        (device, files[0], files[1])
    }

    /// Appends `op` to the journal as one more transaction, with valid checksums: what a
    /// damaged or crafted journal can hold. Returns its sequence number.
    fn append_transaction(device: &Arc<dyn ZonedDevice>, op: MetaOp) -> u64 {
        let rec = journal::recover(&**device).unwrap().unwrap();
        let mut journal = Journal::new(device.clone(), rec.active, rec.last_seq + 1);
        let record = journal.encode_transaction(&[op]).unwrap();
        journal.append_record(&record).unwrap();
        device.sync().unwrap();
        rec.last_seq + 1
    }

    /// [`append_transaction`], then a harmless one after it (no change to `file`), so that
    /// `op` is not the newest: the newest is dropped when its extents' checksums do not
    /// match, as a transaction whose sync never completed.
    fn append_not_newest(device: &Arc<dyn ZonedDevice>, op: MetaOp, file: Ino) -> u64 {
        let seq = append_transaction(device, op);
        let nothing = MetaOp::Extend {
            ino: file,
            size: 0,
            mtime_ns: 0,
        };
        append_transaction(device, nothing);
        seq
    }

    /// The metadata as the journal holds it now.
    fn journaled_state(device: &Arc<dyn ZonedDevice>) -> State {
        let rec = journal::recover(&**device).unwrap().unwrap();
        let mut state = State::from_snapshot(device.geometry(), rec.snapshot).unwrap();
        let ops = rec.carry.iter().chain(rec.transactions.iter().flatten());
        ops.for_each(|op| state.apply(op).unwrap());
        state
    }

    fn refused_unchanged(device: &Arc<dyn ZonedDevice>, expect: &str) {
        let zones = device.report_zones();
        let err = Store::open(device.clone(), StoreConfig::default())
            .err()
            .expect("inconsistent metadata must not mount");
        let msg = err.to_string();
        assert!(matches!(err, Error::Corrupt(_)), "{msg}");
        assert!(msg.contains(expect) && !msg.contains('\n'), "{msg}");
        assert_eq!(device.report_zones(), zones, "the refused store changed");
    }

    #[test]
    fn a_journal_linking_a_file_into_another_tenant_is_refused() {
        let (device, a_file, _) = two_tenants();
        let b_root = journaled_state(&device).tenants[1].root;
        let op = MetaOp::Link {
            dir: b_root,
            name: "stolen".into(),
            ino: a_file,
        };
        append_transaction(&device, op);
        refused_unchanged(&device, "belongs to another tenant");
    }

    /// Mounting would reset the zone of the file whose extent was displaced: refused
    /// before that, the file's data stays on the device. A read-only mount shows the
    /// problem instead (for `valet-run fs fsck`), changing nothing either.
    #[test]
    fn a_journal_mapping_one_files_blocks_into_another_is_refused() {
        let (device, a_file, b_file) = two_tenants();
        let state = journaled_state(&device);
        let first_extent = |ino: Ino| state.inodes[&ino].extents.iter().next().unwrap().1;
        let extent = first_extent(a_file);
        assert_ne!(first_extent(b_file).zone, extent.zone);
        let op = MetaOp::MapExtent {
            ino: b_file,
            file_block: 0,
            extent,
            crc: 0,
        };
        append_not_newest(&device, op, a_file);
        let zones = device.report_zones();
        let read_only = StoreConfig {
            read_only: true,
            ..Default::default()
        };
        let store = Store::open(device.clone(), read_only).unwrap();
        let findings = store.fsck().unwrap().findings();
        assert!(findings.contains("owned by two extents"), "{findings}");
        drop(store);
        assert_eq!(device.report_zones(), zones, "a read-only mount changed it");
        refused_unchanged(&device, "owned by two extents");
    }

    #[test]
    fn a_journal_naming_a_missing_inode_is_refused_by_record() {
        let (device, a_file, _) = two_tenants();
        let missing = MetaOp::SetAttr {
            ino: 999_999,
            size: 1,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        };
        let seq = append_not_newest(&device, missing, a_file);
        refused_unchanged(&device, &format!("journal record {seq} does not apply"));
    }

    /// A tenant id is an index (its byte count is kept in a vector): one past the tenants
    /// is refused, not allocated for.
    #[test]
    fn a_journal_making_an_inode_of_a_tenant_not_made_is_refused() {
        let (device, a_file, _) = two_tenants();
        let stray = MetaOp::CreateInode {
            ino: 999_999,
            kind: FileKind::File,
            tenant: u32::MAX,
            hint: crate::Hint::zoned(0),
            time_ns: 0,
            born_host_bytes: 0,
        };
        append_not_newest(&device, stray, a_file);
        refused_unchanged(&device, "inode 999999 of tenant 4294967295, not made yet");
    }

    /// Found by `metadata_damaged_behind_valid_checksums_is_refused_or_mounts_consistent`'s
    /// first version: the release of a zone past the device was looked up before its range
    /// was checked, and panicked.
    #[test]
    fn a_journal_releasing_a_zone_past_the_device_is_refused() {
        let (device, a_file, _) = two_tenants();
        append_not_newest(&device, MetaOp::ReleaseZone { zone: 20 }, a_file);
        refused_unchanged(&device, "zone 20 out of range");
    }

    /// Found by review: a release of a metadata zone passed (it holds no data blocks), and
    /// the zone went to the free list, to be handed to a stream whose data would overwrite
    /// the journal.
    #[test]
    fn a_journal_giving_away_a_metadata_zone_is_refused() {
        let (device, a_file, _) = two_tenants();
        let op = MetaOp::ReleaseZone {
            zone: journal::META_ZONES[0],
        };
        append_not_newest(&device, op, a_file);
        refused_unchanged(&device, "never changes hands");
    }

    /// Found by review: an extent mapped at the last file block wrapped its end and
    /// panicked the extent map, a read-only `fs fsck` included.
    #[test]
    fn a_journal_mapping_past_the_largest_file_is_refused() {
        let (device, a_file, _) = two_tenants();
        let state = journaled_state(&device);
        let extent = state.inodes[&a_file].extents.iter().next().unwrap().1;
        let op = MetaOp::MapExtent {
            ino: a_file,
            file_block: u64::MAX,
            extent,
            crc: 0,
        };
        append_not_newest(&device, op, a_file);
        refused_unchanged(&device, "past the largest file size");
    }

    /// Found by review: a hand-off's record written after one a power cut tore is not
    /// recovered but stays on the image. When the journal numbered its next records from
    /// the torn one on, that stale record looked newer than the mount's checkpoint, so a
    /// second power cut tearing the next checkpoint into its zone made recovery refuse a
    /// valid store ("its checkpoint is damaged and valid records follow it").
    #[test]
    fn a_record_left_by_one_crash_does_not_fail_recovery_after_the_next() {
        use crate::device::{ImageDevice, ImageOptions};
        let dir = tempfile::tempdir().unwrap();
        let image = ImageDevice::create(
            dir.path().join("zones.img"),
            geometry(),
            ImageOptions::default(),
        );
        let device: Arc<dyn ZonedDevice> = Arc::new(image.unwrap());
        let store = Store::open(device.clone(), StoreConfig::default()).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let f = store.open_file(root, "log", OpenOptions::create()).unwrap();
        f.write_at(b"acknowledged", 0).unwrap();
        f.close().unwrap();
        store.unmount().unwrap();

        // The first power cut: a torn record, then a hand-off's written before any flush
        // covered the torn one. Recovery drops both.
        let rec = journal::recover(&*device).unwrap().unwrap();
        let first_life = journal::META_ZONES[rec.active];
        let mut journal = Journal::new(device.clone(), rec.active, rec.last_seq + 1);
        journal.append_record(&[0u8; 4096]).unwrap();
        let handoff = journal.encode_transaction(&[]).unwrap();
        journal.append_record(&handoff).unwrap();
        device.sync().unwrap();
        assert_eq!(
            journal::recover(&*device).unwrap().unwrap().last_seq,
            rec.last_seq
        );

        // The mount checkpoints into the other zone and goes on there.
        let store = Store::open(device.clone(), StoreConfig::default()).unwrap();
        store.unmount().unwrap();

        // The second power cut tears the next checkpoint into the first zone: its first
        // block never arrives, and the zone's earlier bytes, the hand-off's among them,
        // are still there after the reset for rewrite.
        device.reset_for_rewrite(first_life).unwrap();
        device.write(first_life, 0, &[0u8; 4096]).unwrap();

        let store = Store::open(device.clone(), StoreConfig::default()).unwrap();
        let (_, root) = store.tenant("app").unwrap();
        let f = store.open_file(root, "log", OpenOptions::read()).unwrap();
        let mut back = [0u8; 12];
        f.read_at(&mut back, 0).unwrap();
        assert_eq!(&back, b"acknowledged");
    }
}
