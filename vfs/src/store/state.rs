//! The store's metadata as one value, changed only by [`MetaOp`]s.
//!
//! The live path and recovery share [`State::apply`]: an operation is journaled and applied
//! in the same form, so replaying the journal rebuilds exactly the state that was
//! acknowledged. Zone validity is derived from extents and never journaled.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::checksum::{Unit, Units};
use super::extent_map::{Extent, ExtentMap};
use super::inline::InlineTails;
use super::zone_map::{ZoneMap, ZoneUse};
use crate::device::{Geometry, ZoneId};
use crate::hint::{Class, Hint};
use crate::{Error, Result};

/// Inode number.
pub type Ino = u64;

/// Identifies a tenant: an application with its own namespace and streams.
pub type TenantId = u32;

/// File, directory or symbolic link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    /// Its target is in [`State::symlinks`] (set by [`MetaOp::Symlink`]); its size is the
    /// target's length.
    Symlink,
}

/// A file, directory or symbolic link.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Inode {
    pub kind: FileKind,
    pub tenant: TenantId,
    /// Directory entries naming this inode (1 for a linked directory).
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub hint: Hint,
    pub extents: ExtentMap,
    pub entries: BTreeMap<String, Ino>,
    /// Parent directory (directories only; a tenant root is its own parent).
    pub parent: Ino,
    /// Tenant host bytes written when the file was created (for lifetime events).
    pub born_host_bytes: u64,
}

/// A tenant's name and root directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tenant {
    pub name: String,
    pub root: Ino,
}

/// One journaled change.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MetaOp {
    CreateInode {
        ino: Ino,
        kind: FileKind,
        tenant: TenantId,
        hint: Hint,
        time_ns: u64,
        born_host_bytes: u64,
    },
    NewTenant {
        id: TenantId,
        name: String,
        root: Ino,
    },
    Link {
        dir: Ino,
        name: String,
        ino: Ino,
    },
    Unlink {
        dir: Ino,
        name: String,
    },
    FreeInode {
        ino: Ino,
    },
    /// Maps `extent` at `file_block`; `crc` covers the extent's blocks as written, so
    /// recovery can tell whether the data of the transactions no flush is known to cover
    /// reached the device.
    MapExtent {
        ino: Ino,
        file_block: u64,
        extent: Extent,
        crc: u32,
    },
    SetAttr {
        ino: Ino,
        size: u64,
        atime_ns: u64,
        mtime_ns: u64,
        ctime_ns: u64,
    },
    SetHint {
        ino: Ino,
        hint: Hint,
    },
    AssignZone {
        zone: ZoneId,
        owner: ZoneUse,
    },
    ReleaseZone {
        zone: ZoneId,
    },
    /// A flush of bytes written before the file reached `size`: the size grows to it (and
    /// never shrinks, since later writes may already have grown it further).
    Extend {
        ino: Ino,
        size: u64,
        mtime_ns: u64,
    },
    /// A small synced tail carried in the journal record itself instead of a data block
    /// (one page per small sync, see [`super::inline`]): `data` is the file's content at
    /// `offset` in the window of generation `gen`, newer than any extent, until an
    /// [`MetaOp::InlineDone`] retires it. The size grows as with `Extend`.
    Inline {
        ino: Ino,
        gen: u64,
        offset: u64,
        data: Vec<u8>,
        size: u64,
        mtime_ns: u64,
    },
    /// The windows of the file up to generation `gen` reached data zones (in the extents
    /// mapped before this): their inline pieces retire.
    InlineDone {
        ino: Ino,
        gen: u64,
    },
    /// The written units of a zone with their checksums, carried by a checkpoint (the live
    /// path records each with its [`MetaOp::MapExtent`]); see [`super::checksum`].
    Units {
        zone: ZoneId,
        units: Vec<Unit>,
    },
    /// Sets the target of a symbolic link made by `CreateInode` (a checkpoint carries one
    /// per link, since a [`Snapshot`] holds no targets).
    Symlink {
        ino: Ino,
        target: String,
    },
}

impl MetaOp {
    /// The size this operation claims for a file, if it claims one.
    pub fn claimed_size(&self) -> Option<(Ino, u64)> {
        match self {
            MetaOp::Extend { ino, size, .. }
            | MetaOp::Inline { ino, size, .. }
            | MetaOp::SetAttr { ino, size, .. } => Some((*ino, *size)),
            _ => None,
        }
    }

    /// The inodes whose contents, attributes or entries this operation changes (a link
    /// changes both the directory and the file it names). Operations on zones and tenants
    /// change none: the operations that depend on them follow them in the journal.
    pub fn inodes(&self) -> [Option<Ino>; 2] {
        match *self {
            MetaOp::Link { dir, ino, .. } => [Some(dir), Some(ino)],
            MetaOp::Unlink { dir, .. } => [Some(dir), None],
            MetaOp::CreateInode { ino, .. }
            | MetaOp::FreeInode { ino }
            | MetaOp::MapExtent { ino, .. }
            | MetaOp::SetAttr { ino, .. }
            | MetaOp::SetHint { ino, .. }
            | MetaOp::Extend { ino, .. }
            | MetaOp::Inline { ino, .. }
            | MetaOp::InlineDone { ino, .. }
            | MetaOp::Symlink { ino, .. } => [Some(ino), None],
            MetaOp::NewTenant { .. }
            | MetaOp::AssignZone { .. }
            | MetaOp::ReleaseZone { .. }
            | MetaOp::Units { .. } => [None, None],
        }
    }
}

/// What a checkpoint holds: everything but the derived zone validity.
#[derive(Serialize, Deserialize)]
pub struct Snapshot {
    pub next_ino: Ino,
    pub tenants: Vec<Tenant>,
    pub inodes: Vec<(Ino, Inode)>,
    pub zone_owner: Vec<Option<ZoneUse>>,
}

/// The whole metadata of a store.
#[derive(Clone)]
pub struct State {
    pub geometry: Geometry,
    pub next_ino: Ino,
    pub tenants: Vec<Tenant>,
    pub inodes: super::IntMap<Ino, Inode>,
    pub zones: ZoneMap,
    /// Zones whose last valid block died since the list was last drained.
    pub emptied: Vec<ZoneId>,
    /// A name of each linked inode: (directory, entry). Derived, for the paths policies see.
    pub names: HashMap<Ino, (Ino, String)>,
    /// Synced bytes that live only in the journal (see [`MetaOp::Inline`]). A running store
    /// holds the same bytes in the files' windows; after a crash, mount writes them back.
    pub inline: InlineTails,
    /// The checksum of every written unit that still holds live blocks.
    pub units: Units,
    /// The target of each symbolic link.
    pub symlinks: HashMap<Ino, String>,
    /// Extents of all files together: what a checkpoint of a fragmented store is mostly
    /// made of (see [`super::defrag`]).
    pub extents: usize,
    /// Directory entries (files, directories, links) in each tenant's tree.
    pub entries_of: HashMap<TenantId, u64>,
    /// The sizes of each tenant's files and links summed, each inode once (open files
    /// already unlinked included), indexed by tenant id. Kept as sizes change
    /// ([`State::set_size`], on every write: an index, not a hash), so a quota or a scrape
    /// reads it without walking the inodes.
    pub bytes_of: Vec<u64>,
    /// Files grown in memory past what a record may claim yet, with the most it may: a
    /// zoned file's bytes in its write buffers, not on the device, or a conventional file's
    /// not synced on the host. Checkpoints and time changes record at most this size, so a
    /// crash never leaves a size whose tail reads as zeros (for a conventional file, one
    /// past its host file's end, which is damage, see [`super::conventional`]). A record
    /// that claims more (a flush's `Extend`, an `Inline` sync, a truncation) moves it up,
    /// and one that claims the whole size ends it (see [`State::size_recorded`]).
    pub recorded_sizes: super::IntMap<Ino, u64>,
    /// How many times each conventional file was truncated to a smaller size while
    /// mounted: a sync that a truncation overtook records nothing of its own.
    pub host_shrinks: super::IntMap<Ino, u64>,
}

fn corrupt<T>(why: String) -> Result<T> {
    Err(Error::Corrupt(why))
}

/// `tenant`'s count in `bytes_of`, the vector grown to hold it.
fn held_by(bytes_of: &mut Vec<u64>, tenant: TenantId) -> &mut u64 {
    let tenant = tenant as usize;
    if tenant >= bytes_of.len() {
        bytes_of.resize(tenant + 1, 0);
    }
    &mut bytes_of[tenant]
}

/// Sets `inode`'s size to `size`, moving its tenant's count in `bytes_of` by as much.
fn resize(bytes_of: &mut Vec<u64>, inode: &mut Inode, size: u64) {
    if inode.kind != FileKind::Dir && inode.size != size {
        let held = held_by(bytes_of, inode.tenant);
        *held = (*held - inode.size.min(*held)).saturating_add(size);
    }
    inode.size = size;
}

impl State {
    pub fn new(geometry: Geometry) -> Self {
        State {
            geometry,
            next_ino: 1,
            tenants: Vec::new(),
            inodes: Default::default(),
            zones: ZoneMap::new(geometry.zone_count, geometry.blocks_per_zone()),
            emptied: Vec::new(),
            names: HashMap::new(),
            inline: InlineTails::default(),
            units: Units::new(geometry.zone_count),
            symlinks: HashMap::new(),
            extents: 0,
            entries_of: HashMap::new(),
            bytes_of: Vec::new(),
            recorded_sizes: Default::default(),
            host_shrinks: Default::default(),
        }
    }

    pub fn block_size(&self) -> u64 {
        self.geometry.block_size as u64
    }

    pub fn inode(&self, ino: Ino) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(Error::NotFound)
    }

    pub fn inode_mut(&mut self, ino: Ino) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Error::NotFound)
    }

    /// Sets an inode's size, keeping its tenant's [`State::bytes_of`]; returns the inode
    /// for its other fields. Every change of a size goes through here or [`State::grow`].
    pub fn set_size(&mut self, ino: Ino, size: u64) -> Result<&mut Inode> {
        let inode = self.inodes.get_mut(&ino).ok_or(Error::NotFound)?;
        resize(&mut self.bytes_of, inode, size);
        Ok(inode)
    }

    /// Makes an inode at least `end` bytes long (a write ending there): one lookup, as
    /// every write to a store file makes it under the store's lock.
    pub fn grow(&mut self, ino: Ino, end: u64) -> Result<&mut Inode> {
        let inode = self.inodes.get_mut(&ino).ok_or(Error::NotFound)?;
        if end > inode.size {
            resize(&mut self.bytes_of, inode, end);
        }
        Ok(inode)
    }

    /// The bytes `tenant`'s files hold (see [`State::bytes_of`]).
    pub fn tenant_bytes(&self, tenant: TenantId) -> u64 {
        self.bytes_of.get(tenant as usize).copied().unwrap_or(0)
    }

    /// Applies one operation. Fails only on an operation that does not fit the state, which
    /// during replay means a corrupt journal.
    pub fn apply(&mut self, op: &MetaOp) -> Result<()> {
        match op {
            MetaOp::CreateInode {
                ino,
                kind,
                tenant,
                hint,
                time_ns,
                born_host_bytes,
            } => {
                if self.inodes.contains_key(ino) {
                    return corrupt(format!("inode {ino} created twice"));
                }
                // A tenant's root is made just before the tenant; nothing after its tenant.
                if *tenant as usize > self.tenants.len() {
                    return corrupt(format!("inode {ino} of tenant {tenant}, not made yet"));
                }
                let inode = Inode {
                    kind: *kind,
                    tenant: *tenant,
                    nlink: 0,
                    size: 0,
                    atime_ns: *time_ns,
                    mtime_ns: *time_ns,
                    ctime_ns: *time_ns,
                    hint: *hint,
                    extents: ExtentMap::default(),
                    entries: BTreeMap::new(),
                    parent: *ino,
                    born_host_bytes: *born_host_bytes,
                };
                self.inodes.insert(*ino, inode);
                self.next_ino = self.next_ino.max(ino.saturating_add(1));
            }
            MetaOp::NewTenant { id, name, root } => {
                if *id as usize != self.tenants.len() {
                    return corrupt(format!("tenant {id} out of order"));
                }
                self.inode_mut(*root)?.nlink = 1;
                self.tenants.push(Tenant {
                    name: name.clone(),
                    root: *root,
                });
            }
            MetaOp::Link { dir, name, ino } => {
                let target_kind = self.inode(*ino)?.kind;
                let d = self.inode_mut(*dir)?;
                if d.kind != FileKind::Dir || d.entries.contains_key(name) {
                    return corrupt(format!("link of {name:?} into inode {dir}"));
                }
                d.entries.insert(name.clone(), *ino);
                let tenant = d.tenant;
                *self.entries_of.entry(tenant).or_default() += 1;
                self.names.insert(*ino, (*dir, name.clone()));
                let target = self.inode_mut(*ino)?;
                target.nlink += 1;
                if target_kind == FileKind::Dir {
                    target.parent = *dir;
                }
            }
            MetaOp::Unlink { dir, name } => {
                let d = self.inode_mut(*dir)?;
                let Some(ino) = d.entries.remove(name) else {
                    return corrupt(format!("unlink of missing {name:?} in inode {dir}"));
                };
                let tenant = d.tenant;
                if let Some(n) = self.entries_of.get_mut(&tenant) {
                    *n = n.saturating_sub(1);
                }
                if self.names.get(&ino) == Some(&(*dir, name.clone())) {
                    self.names.remove(&ino);
                }
                let target = self.inode_mut(ino)?;
                target.nlink = target.nlink.saturating_sub(1);
            }
            MetaOp::FreeInode { ino } => {
                let Some(inode) = self.inodes.remove(ino) else {
                    return corrupt(format!("free of missing inode {ino}"));
                };
                if let Some(held) = self.bytes_of.get_mut(inode.tenant as usize) {
                    *held -= inode.size.min(*held);
                }
                self.names.remove(ino);
                self.inline.remove(*ino);
                self.symlinks.remove(ino);
                self.recorded_sizes.remove(ino);
                self.host_shrinks.remove(ino);
                self.extents -= inode.extents.len();
                for (_, ext) in inode.extents.iter() {
                    self.invalidate(ext);
                }
            }
            MetaOp::MapExtent {
                ino,
                file_block,
                extent,
                crc,
            } => {
                if extent.zone >= self.geometry.zone_count
                    || extent.block as u64 + extent.len as u64 > self.geometry.blocks_per_zone()
                {
                    return corrupt(format!("inode {ino} maps outside the device"));
                }
                let file_blocks = super::data::MAX_FILE_SIZE / self.block_size();
                if file_block.saturating_add(extent.len as u64) > file_blocks {
                    return corrupt(format!("inode {ino} maps past the largest file size"));
                }
                let extents = &mut self.inode_mut(*ino)?.extents;
                let before = extents.len();
                let displaced = extents.insert(*file_block, *extent);
                let after = extents.len();
                self.extents = self.extents + after - before;
                for ext in displaced {
                    self.invalidate(ext);
                }
                self.zones.mark_valid(extent.zone, extent.block, extent.len);
                let unit = Unit {
                    block: extent.block,
                    len: extent.len,
                    crc: *crc,
                };
                self.units.add(extent.zone, unit);
            }
            MetaOp::SetAttr {
                ino,
                size,
                atime_ns,
                mtime_ns,
                ctime_ns,
            } => {
                let bs = self.block_size();
                let inode = self.set_size(*ino, *size)?;
                inode.atime_ns = *atime_ns;
                inode.mtime_ns = *mtime_ns;
                inode.ctime_ns = *ctime_ns;
                let before = inode.extents.len();
                let dropped = inode.extents.truncate(size.div_ceil(bs));
                let after = inode.extents.len();
                self.extents = self.extents + after - before;
                for ext in dropped {
                    self.invalidate(ext);
                }
                self.inline.clip(*ino, *size);
            }
            MetaOp::Inline {
                ino,
                gen,
                offset,
                data,
                size,
                mtime_ns,
            } => {
                let inode = self.inode(*ino)?;
                if inode.kind != FileKind::File {
                    return corrupt(format!("inline data for inode {ino}, not a file"));
                }
                let inode = self.grow(*ino, *size)?;
                inode.mtime_ns = inode.mtime_ns.max(*mtime_ns);
                inode.ctime_ns = inode.ctime_ns.max(*mtime_ns);
                self.inline.add(*ino, *gen, *offset, data);
            }
            MetaOp::InlineDone { ino, gen } => self.inline.done(*ino, *gen),
            MetaOp::Units { zone, units } => {
                let blocks = self.geometry.blocks_per_zone();
                self.zone_slot(*zone)?;
                for unit in units {
                    if unit.block as u64 + unit.len as u64 > blocks {
                        return corrupt(format!("checksum unit outside zone {zone}"));
                    }
                    self.units.add(*zone, *unit);
                }
            }
            MetaOp::Symlink { ino, target } => {
                if self.inode(*ino)?.kind != FileKind::Symlink {
                    return corrupt(format!("symlink target for inode {ino}, not a symlink"));
                }
                self.set_size(*ino, target.len() as u64)?;
                self.symlinks.insert(*ino, target.clone());
            }
            MetaOp::Extend {
                ino,
                size,
                mtime_ns,
            } => {
                let inode = self.grow(*ino, *size)?;
                inode.mtime_ns = inode.mtime_ns.max(*mtime_ns);
                inode.ctime_ns = inode.ctime_ns.max(*mtime_ns);
            }
            MetaOp::SetHint { ino, hint } => {
                let inode = self.inode_mut(*ino)?;
                if inode.hint.class != hint.class {
                    return corrupt(format!("class change of inode {ino}"));
                }
                inode.hint = *hint;
            }
            MetaOp::AssignZone { zone, owner } => {
                let slot = self.zone_slot(*zone)?;
                if *owner == ZoneUse::Meta {
                    return corrupt(format!("zone {zone} assigned to the journal"));
                }
                *slot = Some(*owner);
            }
            MetaOp::ReleaseZone { zone } => {
                self.zone_slot(*zone)?;
                if self.zones.valid_blocks(*zone) != 0 {
                    return corrupt(format!("release of zone {zone} that holds data"));
                }
                *self.zone_slot(*zone)? = None;
                self.units.clear(*zone);
            }
        }
        Ok(())
    }

    /// The owner of data zone `zone`: the journal's zones never change hands (a record that
    /// handed one to a stream would have GC reset it and data overwrite the journal).
    fn zone_slot(&mut self, zone: ZoneId) -> Result<&mut Option<ZoneUse>> {
        if super::journal::META_ZONES.contains(&zone) {
            return corrupt(format!(
                "zone {zone} is the journal's and never changes hands"
            ));
        }
        match self.zones.owner.get_mut(zone as usize) {
            Some(slot) => Ok(slot),
            None => corrupt(format!("zone {zone} out of range")),
        }
    }

    fn invalidate(&mut self, ext: Extent) {
        self.zones.mark_invalid(ext.zone, ext.block, ext.len);
        self.units.prune(ext.zone, ext.block, ext.len, &self.zones);
        if self.zones.valid_blocks(ext.zone) == 0 {
            self.emptied.push(ext.zone);
        }
    }

    /// What a checkpoint carries besides its snapshot, as operations: the inline bytes (a
    /// snapshot holds inodes, not the journal's inline bytes), the checksum units of the
    /// zones that hold data, and the symlink targets.
    pub fn carried_ops(&self) -> Vec<MetaOp> {
        let mut ops = Vec::new();
        for zone in 0..self.geometry.zone_count {
            let units = self.units.of_zone(zone);
            if !units.is_empty() {
                ops.push(MetaOp::Units { zone, units });
            }
        }
        for (ino, pieces) in self.inline.files() {
            let Some(inode) = self.inodes.get(&ino) else {
                continue;
            };
            for p in pieces {
                ops.push(MetaOp::Inline {
                    ino,
                    gen: p.gen,
                    offset: p.offset,
                    data: p.data.clone(),
                    size: self.recordable_size(ino, inode),
                    mtime_ns: inode.mtime_ns,
                });
            }
        }
        let mut links: Vec<(&Ino, &String)> = self.symlinks.iter().collect();
        links.sort();
        ops.extend(links.into_iter().map(|(&ino, target)| MetaOp::Symlink {
            ino,
            target: target.clone(),
        }));
        ops
    }

    /// The size a journal record may give `inode` (see [`State::recorded_sizes`]).
    pub fn recordable_size(&self, ino: Ino, inode: &Inode) -> u64 {
        match self.recorded_sizes.get(&ino) {
            Some(&recordable) => inode.size.min(recordable),
            None => inode.size,
        }
    }

    /// Grows `ino` to at least `end` by bytes no record covers yet: records claim at most
    /// the size before until one covers them (see [`State::recorded_sizes`]).
    pub fn grow_unrecorded(&mut self, ino: Ino, end: u64) -> Result<&mut Inode> {
        let size = self.inode(ino)?.size;
        if end > size {
            self.recorded_sizes.entry(ino).or_insert(size);
        }
        self.grow(ino, end)
    }

    /// A record claimed `size` for `ino`, applied already. Records of one file may come out
    /// of the order their bytes were written in (a sync that began earlier finishing
    /// later), so the recordable size only grows; with no entry the whole size is
    /// recordable already.
    pub fn size_recorded(&mut self, ino: Ino, size: u64) {
        let Some(&recordable) = self.recorded_sizes.get(&ino) else {
            return;
        };
        let recordable = recordable.max(size);
        match self.inodes.get(&ino) {
            Some(inode) if recordable < inode.size => {
                self.recorded_sizes.insert(ino, recordable);
            }
            _ => {
                self.recorded_sizes.remove(&ino);
            }
        }
    }

    /// The checkpoint image of this state, each size as [`State::recordable_size`] gives it.
    pub fn snapshot(&self) -> Snapshot {
        let recorded = |ino: Ino, inode: &Inode| Inode {
            size: self.recordable_size(ino, inode),
            ..inode.clone()
        };
        let mut inodes: Vec<(Ino, Inode)> = self
            .inodes
            .iter()
            .map(|(&i, n)| (i, recorded(i, n)))
            .collect();
        inodes.sort_by_key(|(i, _)| *i);
        Snapshot {
            next_ino: self.next_ino,
            tenants: self.tenants.clone(),
            inodes,
            zone_owner: self.zones.owner.clone(),
        }
    }

    /// Rebuilds a state from a checkpoint, deriving zone validity from the extents.
    pub fn from_snapshot(geometry: Geometry, snap: Snapshot) -> Result<Self> {
        let mut state = State::new(geometry);
        if snap.zone_owner.len() != geometry.zone_count as usize {
            return corrupt("checkpoint zone table does not match the device".into());
        }
        for (zone, owner) in snap.zone_owner.iter().enumerate() {
            let meta = super::journal::META_ZONES.contains(&(zone as ZoneId));
            if meta != (*owner == Some(ZoneUse::Meta)) {
                return corrupt(format!("checkpoint gives zone {zone} to {owner:?}"));
            }
        }
        state.next_ino = snap.next_ino;
        state.tenants = snap.tenants;
        state.zones.owner = snap.zone_owner;
        let blocks = geometry.blocks_per_zone();
        let file_blocks = super::data::MAX_FILE_SIZE / geometry.block_size as u64;
        for (ino, inode) in snap.inodes {
            state.extents += inode.extents.len();
            *state.entries_of.entry(inode.tenant).or_default() += inode.entries.len() as u64;
            if inode.tenant as usize > state.tenants.len() {
                return corrupt(format!("inode {ino} of tenant {}, not made", inode.tenant));
            }
            if inode.kind != FileKind::Dir {
                let held = held_by(&mut state.bytes_of, inode.tenant);
                *held = held.saturating_add(inode.size);
            }
            for (file_block, ext) in inode.extents.iter() {
                if ext.zone >= geometry.zone_count || ext.block as u64 + ext.len as u64 > blocks {
                    return corrupt(format!("inode {ino} maps outside the device"));
                }
                if file_block.saturating_add(ext.len as u64) > file_blocks {
                    return corrupt(format!("inode {ino} maps past the largest file size"));
                }
                state.zones.mark_valid(ext.zone, ext.block, ext.len);
            }
            for (name, child) in &inode.entries {
                state.names.insert(*child, (ino, name.clone()));
            }
            state.inodes.insert(ino, inode);
        }
        Ok(state)
    }

    /// Whether the class of an inode is conventional.
    pub fn is_conventional(&self, ino: Ino) -> bool {
        self.inodes
            .get(&ino)
            .is_some_and(|i| i.hint.class == Class::Conventional)
    }
}
