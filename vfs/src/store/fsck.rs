//! The invariant checker: extents below write pointers, validity bitmaps that agree with the
//! extent maps, no block owned twice, a namespace that is a tree per tenant, a target for every
//! symlink and nothing else in it. The deep check
//! ([`Store::fsck_deep`]) also reads every live block and verifies it against the checksum
//! of the unit it was written in.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::extent_map::Extent;
use super::state::{FileKind, Ino, TenantId};
use super::zone_map::{ZoneMap, ZoneUse};
use super::{Inner, Store};
use crate::{Error, Result};

/// What fsck counted, every problem it found in the metadata, and the files it found
/// damaged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckReport {
    pub files: u64,
    pub dirs: u64,
    #[serde(default)]
    pub symlinks: u64,
    pub extents: u64,
    pub valid_blocks: u64,
    /// Deep check only: live blocks read and found to match their checksums.
    #[serde(default)]
    pub verified_blocks: u64,
    /// Deep check only: live blocks read that have no checksum (written by a store that did
    /// not keep them).
    #[serde(default)]
    pub unverified_blocks: u64,
    /// The metadata does not hold together: a writable mount refuses such a store.
    pub problems: Vec<String>,
    /// Bytes of files found damaged while the metadata holds together: a conventional
    /// file whose host file is missing or short, and (deep check only) data that does not
    /// match its checksum or cannot be read. Their reads fail (EIO); the rest of the store
    /// reads as it is.
    #[serde(default)]
    pub damaged: Vec<String>,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.damaged.is_empty()
    }

    /// Whether the metadata holds together (the files' bytes may still be damaged).
    pub fn is_consistent(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report as a `Result`: clean, or a `Corrupt` error listing the first problems.
    pub fn into_result(self) -> Result<FsckReport> {
        match self.is_clean() {
            true => Ok(self),
            false => Err(Error::Corrupt(self.findings())),
        }
    }

    /// How many problems and damaged files, and the first few, on one line.
    pub fn findings(&self) -> String {
        let all = self.problems.iter().chain(&self.damaged);
        let shown: Vec<_> = all.take(5).cloned().collect();
        format!(
            "fsck found {} problem(s): {}",
            self.problems.len() + self.damaged.len(),
            shown.join("; ")
        )
    }
}

pub(super) fn check(inner: &Inner) -> Result<FsckReport> {
    let state = &inner.state;
    let g = state.geometry;
    let bs = g.block_size as u64;
    let mut report = FsckReport::default();
    let mut problem = |p: String| report.problems.push(p);
    let device_zones = inner.device.report_zones();

    // Extents: inside the device, below the write pointer, in a zone of the file's tenant;
    // rebuilt validity must match the live bitmaps, with no block claimed twice.
    let mut rebuilt = ZoneMap::new(g.zone_count, g.blocks_per_zone());
    let mut files = 0;
    let mut dirs = 0;
    let mut extents = 0;
    let mut symlinks = 0;
    for ino in state.symlinks.keys() {
        if state
            .inodes
            .get(ino)
            .is_none_or(|i| i.kind != FileKind::Symlink)
        {
            problem(format!(
                "a symlink target is kept for inode {ino}, not a symlink"
            ));
        }
    }
    for (&ino, inode) in &state.inodes {
        match inode.kind {
            FileKind::File => files += 1,
            FileKind::Dir => dirs += 1,
            FileKind::Symlink => {
                symlinks += 1;
                let target = state.symlinks.get(&ino);
                let fits = target.is_some_and(|t| {
                    !t.is_empty() && !t.starts_with('/') && t.len() as u64 == inode.size
                });
                if !fits || inode.extents.iter().next().is_some() || !inode.entries.is_empty() {
                    problem(format!(
                        "symlink {ino}: target {target:?}, size {}, {} entries: not a \
                         relative target of its size with nothing else",
                        inode.size,
                        inode.entries.len()
                    ));
                }
            }
        }
        let size_blocks = inode.size.div_ceil(bs);
        for (file_block, ext) in inode.extents.iter() {
            extents += 1;
            if ext.zone >= g.zone_count || ext.len == 0 {
                problem(format!("inode {ino}: extent {ext:?} outside the device"));
                continue;
            }
            let end = ext.block as u64 + ext.len as u64;
            let wp = device_zones[ext.zone as usize].write_pointer / bs;
            if end > wp {
                problem(format!(
                    "inode {ino}: extent ends at block {end} of zone {} past its write pointer {wp}",
                    ext.zone
                ));
            }
            match state.zones.owner[ext.zone as usize] {
                Some(ZoneUse::Data(key)) if key.tenant == inode.tenant => {}
                other => problem(format!(
                    "inode {ino} (tenant {}): extent in zone {} owned by {other:?}",
                    inode.tenant, ext.zone
                )),
            }
            if file_block.saturating_add(ext.len as u64) > size_blocks {
                problem(format!(
                    "inode {ino}: extent at block {file_block} past the file size"
                ));
            }
            rebuilt.mark_valid(ext.zone, ext.block, ext.len);
        }
    }
    let (mut entries_of, mut bytes_of) = (HashMap::new(), HashMap::new());
    for inode in state.inodes.values() {
        *entries_of.entry(inode.tenant).or_default() += inode.entries.len() as u64;
        if inode.kind != FileKind::Dir {
            let held: &mut u64 = bytes_of.entry(inode.tenant).or_default();
            *held = held.saturating_add(inode.size);
        }
    }
    let nonzero = |mut counts: HashMap<TenantId, u64>| {
        counts.retain(|_, n| *n > 0);
        counts
    };
    let (entries_of, counted) = (nonzero(entries_of), nonzero(state.entries_of.clone()));
    if entries_of != counted {
        problem(format!(
            "the tenants' trees hold {entries_of:?} entries, the store counts {counted:?}"
        ));
    }
    let counted = (0..state.bytes_of.len() as TenantId).map(|t| (t, state.tenant_bytes(t)));
    let (bytes_of, counted) = (nonzero(bytes_of), nonzero(counted.collect()));
    if bytes_of != counted {
        problem(format!(
            "the tenants' files hold {bytes_of:?} bytes, the store counts {counted:?}"
        ));
    }
    if extents != state.extents as u64 {
        problem(format!(
            "the files hold {extents} extents, the store counts {}",
            state.extents
        ));
    }
    if rebuilt.inconsistencies > 0 {
        problem(format!(
            "{} blocks are owned by two extents",
            rebuilt.inconsistencies
        ));
    }
    if state.zones.inconsistencies > 0 {
        problem(format!(
            "{} validity updates did not match the bitmaps",
            state.zones.inconsistencies
        ));
    }
    for zone in 0..g.zone_count {
        let (live, built) = (
            &state.zones.validity[zone as usize],
            &rebuilt.validity[zone as usize],
        );
        // Compared word by word: every mount runs this (see `mount.rs`).
        if live != built {
            problem(format!(
                "zone {zone}: validity bitmap disagrees with the extent maps"
            ));
        }
    }
    for zone in &inner.free {
        if state.zones.owner[*zone as usize].is_some()
            || device_zones[*zone as usize].write_pointer > 0
        {
            problem(format!(
                "free zone {zone} is owned or written: owner {:?}, device {:?}",
                state.zones.owner[*zone as usize], device_zones[*zone as usize]
            ));
        }
    }

    // Inline tails: each lies inside a live file, with a generation the window counter can
    // pass (a mount starts the counter at the newest one).
    for (ino, pieces) in state.inline.files() {
        let size = match state.inodes.get(&ino) {
            Some(i) if i.kind == FileKind::File => i.size,
            _ => {
                problem(format!(
                    "inline bytes are kept for inode {ino}, not a live file"
                ));
                continue;
            }
        };
        for piece in pieces {
            let (at, len) = (piece.offset, piece.data.len());
            if at.checked_add(len as u64).is_none_or(|end| end > size) {
                problem(format!(
                    "inode {ino}: inline bytes at {at} (+{len}) past its size {size}"
                ));
            }
            if piece.gen > u64::MAX / 2 {
                problem(format!(
                    "inode {ino}: inline bytes of generation {} out of range",
                    piece.gen
                ));
            }
        }
    }

    // Namespace: entries point at live inodes, link counts match, each directory has one
    // parent entry, and everything linked is reachable from its tenant's root.
    let mut links: HashMap<Ino, u32> = HashMap::new();
    for (&dir, inode) in &state.inodes {
        if inode.kind != FileKind::Dir && !inode.entries.is_empty() {
            problem(format!("inode {dir} is not a directory but holds entries"));
        }
        for (name, &child) in &inode.entries {
            match state.inodes.get(&child) {
                None => problem(format!(
                    "dir {dir}: entry {name:?} names missing inode {child}"
                )),
                Some(c) => {
                    *links.entry(child).or_default() += 1;
                    if c.kind == FileKind::Dir && c.parent != dir {
                        problem(format!(
                            "dir {child} is in dir {dir} but names {} as parent",
                            c.parent
                        ));
                    }
                    if c.tenant != inode.tenant {
                        problem(format!(
                            "dir {dir}: entry {name:?} belongs to another tenant"
                        ));
                    }
                }
            }
        }
    }
    let roots: Vec<Ino> = state.tenants.iter().map(|t| t.root).collect();
    for (&ino, inode) in &state.inodes {
        let counted = links.get(&ino).copied().unwrap_or(0) + roots.contains(&ino) as u32;
        if counted != inode.nlink {
            let open = inner.open.contains_key(&ino);
            if !(inode.nlink == 0 && counted == 0 && open) {
                problem(format!(
                    "inode {ino}: nlink {} but {counted} entries",
                    inode.nlink
                ));
            }
        }
        if inode.kind == FileKind::Dir && counted > 1 {
            problem(format!("dir {ino} has {counted} entries"));
        }
    }
    let mut reached = 0usize;
    let mut stack = roots.clone();
    let mut seen = std::collections::HashSet::new();
    while let Some(dir) = stack.pop() {
        if !seen.insert(dir) {
            problem(format!("dir {dir} reached twice: the tree has a cycle"));
            continue;
        }
        let Some(inode) = state.inodes.get(&dir) else {
            problem(format!("tenant root {dir} is missing"));
            continue;
        };
        if inode.kind != FileKind::Dir {
            problem(format!("tenant root {dir} is not a directory"));
            continue;
        }
        reached += 1;
        for &child in inode.entries.values() {
            match state.inodes.get(&child) {
                Some(c) if c.kind == FileKind::Dir => stack.push(child),
                _ => {}
            }
        }
    }
    if reached != dirs as usize {
        problem(format!(
            "{} directories are not reachable from a tenant root",
            dirs as usize - reached.min(dirs as usize)
        ));
    }
    report.files = files;
    report.dirs = dirs;
    report.symlinks = symlinks;
    report.extents = extents;
    report.valid_blocks = state.zones.total_valid();
    Ok(report)
}

/// [`check`], and the files whose bytes are found damaged without reading them (the
/// conventional area's host files): what [`Store::fsck`] reports.
pub(super) fn report(inner: &Inner) -> Result<FsckReport> {
    let mut report = check(inner)?;
    report.damaged = super::conventional::damage(inner);
    Ok(report)
}

impl Store {
    /// [`Store::fsck`], then every live block read back and checked against its unit's
    /// checksum, and the retired metadata zone read for damage (which no mount looks for).
    /// Each zone is pinned while it is read, with no lock held, so a store in use keeps
    /// going. Each planned extent is looked up again when its turn comes and read
    /// where it is mapped then: GC may have moved it and reset its old zone meanwhile.
    pub fn fsck_deep(&self) -> Result<FsckReport> {
        let (mut report, plan) = {
            let inner = self.lock()?;
            let report = report(&inner)?;
            let mut plan: Vec<(Ino, u64, Extent)> = Vec::new();
            for (&ino, inode) in &inner.state.inodes {
                for (file_block, ext) in inode.extents.iter() {
                    if ext.zone < inner.state.geometry.zone_count && ext.len > 0 {
                        plan.push((ino, file_block, ext));
                    }
                }
            }
            plan.sort_by_key(|&(_, _, e)| (e.zone, e.block));
            (report, plan)
        };
        let mut damaged_units = std::collections::BTreeSet::new();
        for (ino, file_block, planned) in plan {
            // The blocks as mapped now, pinned: the reclaimer may have moved them since the
            // plan and reset their old zone (a deleted file has nothing left to read).
            let now: Vec<_> = {
                let inner = self.lock()?;
                let Some(inode) = inner.state.inodes.get(&ino) else {
                    continue;
                };
                let end = file_block + planned.len as u64;
                inode
                    .extents
                    .pieces(file_block, end)
                    .into_iter()
                    .filter_map(|(at, ext, _)| Some((at, ext?)))
                    .map(|(at, ext)| {
                        self.shared.pins[ext.zone as usize]
                            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                        let (units, complete) =
                            inner.state.units.covering(ext.zone, ext.block, ext.len);
                        (at, ext, units, complete)
                    })
                    .collect()
            };
            for (file_block, ext, units, complete) in now {
                let read = self.read_verified(ext.zone, ext.block, ext.len, &units, complete);
                self.unpin(ext.zone);
                match read {
                    Ok(Ok((_, verified))) => {
                        report.verified_blocks += verified.blocks;
                        report.unverified_blocks += verified.unverified;
                    }
                    Ok(Err(mismatch)) => {
                        // Several extents may share the damaged unit: name it once per file.
                        if damaged_units.insert((ino, mismatch.zone, mismatch.unit.block)) {
                            report.damaged.push(format!(
                                "inode {ino}: data at file block {file_block} does not match \
                                 its checksum ({mismatch})"
                            ));
                        }
                    }
                    Err(e) => report.damaged.push(format!(
                        "inode {ino}: reading file block {file_block} ({ext:?}) failed: {e}"
                    )),
                }
            }
        }
        // The journal's lock keeps a checkpoint from swapping the zones' roles meanwhile.
        let journal = self.shared.commit.journal();
        if let Some(damage) = super::journal::retired_damage(&*self.shared.device)? {
            report.problems.push(damage);
        }
        drop(journal);
        Ok(report)
    }
}
