//! Paths and directory operations, symbolic links included.
//!
//! Paths are relative to a directory inode and `/`-separated. Empty and `.` components are
//! skipped; `..` climbs to the parent but never above the directory the path is relative to
//! (that is an [`Error::Escape`], as WASI requires of a directory descriptor), so no path
//! reaches above its tenant's root or into another tenant. Names are at most 255 bytes and
//! contain no NUL.
//!
//! A symbolic link holds a relative path. Every component but the last is followed, and the
//! last when the caller asks (or a trailing slash does); the target is walked from the
//! directory holding the link under the same rule, so a link cannot lead above the
//! directory the walk started from, and an absolute target is refused (when made and when
//! followed). Following more than [`MAX_LINKS`] links in one walk is [`Error::Loop`], as on
//! Linux. A link may dangle; it names no host path, so nothing outside the store is touched.

use super::events::Event;
use super::state::{FileKind, Ino, MetaOp, State, TenantId};
use super::{effective_class, now_ns, DirEntry, Inner};
use crate::hint::Hint;
use crate::{Error, Result};

const NAME_MAX: usize = 255;

/// Links one walk may follow (Linux's `MAXSYMLINKS`).
pub const MAX_LINKS: u32 = 40;

/// The longest symlink target, as Linux bounds it (`PATH_MAX` less the NUL).
const TARGET_MAX: usize = 4095;

/// Why [`State::resolve_parent`] refused a path ending in `.` or `..`.
const DOT_LAST: &str = "path ends in . or ..";

fn check_name(name: &str) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.contains('\0') {
        return Err(Error::Invalid("NUL in a file name"));
    }
    Ok(())
}

/// Checks a new link's target, in the order Linux and wasmtime check it.
fn check_target(target: &str) -> Result<()> {
    if target.is_empty() {
        return Err(Error::NotFound);
    }
    if target.starts_with('/') {
        return Err(Error::Escape);
    }
    if target.len() > TARGET_MAX {
        return Err(Error::NameTooLong);
    }
    if target.contains('\0') {
        return Err(Error::Invalid("NUL in a symlink target"));
    }
    Ok(())
}

/// Where a path leads (see [`State::resolve`]).
pub(super) struct Resolved<'a> {
    /// The directory that holds the last component, and that component; `None` when the
    /// path (or the link it ends in) ends in `.` or `..`.
    pub last: Option<(Ino, &'a str)>,
    /// What the path names, if that exists.
    pub ino: Option<Ino>,
    /// The path (or the last link followed) ends in `/`: it must name a directory.
    pub slash: bool,
}

impl State {
    fn is_root(&self, ino: Ino) -> bool {
        self.inodes
            .get(&ino)
            .and_then(|i| self.tenants.get(i.tenant as usize))
            .is_some_and(|t| t.root == ino)
    }

    /// Walks `path` from the directory `base`, following every link on the way and the
    /// last component too when `follow`. The last component need not exist. `..` never
    /// climbs above `base`: the walk counts its depth below it, and a link's target goes on
    /// from the link's directory at that depth.
    pub(super) fn resolve<'a>(
        &'a self,
        base: Ino,
        path: &'a str,
        follow: bool,
    ) -> Result<Resolved<'a>> {
        if path.starts_with('/') {
            return Err(Error::Escape);
        }
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        if self.inode(base)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        let trimmed = path.trim_end_matches('/');
        let mut slash = trimmed.len() < path.len();
        // The path's components, and those of the links followed that are still to walk
        // (next one at the end; empty, so allocated only once a link is followed).
        let mut components = trimmed.split('/').peekable();
        let mut todo: Vec<&'a str> = Vec::new();
        let (mut dir, mut depth, mut links) = (base, 0usize, 0u32);
        while let Some(c) = todo.pop().or_else(|| components.next()) {
            let last = todo.is_empty() && components.peek().is_none();
            match c {
                "" | "." => {}
                ".." if depth == 0 || self.is_root(dir) => return Err(Error::Escape),
                ".." => {
                    depth -= 1;
                    dir = self.inode(dir)?.parent;
                }
                name => {
                    check_name(name)?;
                    let entry = self.inode(dir)?.entries.get(name).copied();
                    let kind = entry
                        .map(|ino| self.inode(ino).map(|i| i.kind))
                        .transpose()?;
                    let expand = kind == Some(FileKind::Symlink) && (follow || !last);
                    if last && !expand {
                        return Ok(Resolved {
                            last: Some((dir, name)),
                            ino: entry,
                            slash,
                        });
                    }
                    let ino = entry.ok_or(Error::NotFound)?;
                    match kind {
                        Some(FileKind::Dir) => {
                            dir = ino;
                            depth += 1;
                        }
                        Some(FileKind::Symlink) => {
                            links += 1;
                            if links > MAX_LINKS {
                                return Err(Error::Loop);
                            }
                            let target = self.symlinks.get(&ino).ok_or_else(|| {
                                Error::Corrupt(format!("symlink {ino} has no target"))
                            })?;
                            if target.starts_with('/') {
                                return Err(Error::Escape);
                            }
                            let t = target.trim_end_matches('/');
                            slash |= last && t.len() < target.len();
                            todo.extend(t.rsplit('/'));
                        }
                        _ => return Err(Error::NotDir),
                    }
                }
            }
        }
        Ok(Resolved {
            last: None,
            ino: Some(dir),
            slash,
        })
    }

    /// The inode `path` names, relative to `dir`, following a final symlink.
    pub fn lookup(&self, dir: Ino, path: &str) -> Result<Ino> {
        self.lookup_at(dir, path, true)
    }

    /// The inode `path` names; a final symlink is followed only if `follow` (or if the path
    /// ends in `/`, as POSIX says).
    pub fn lookup_at(&self, dir: Ino, path: &str, follow: bool) -> Result<Ino> {
        let r = self.resolve(dir, path, follow || path.ends_with('/'))?;
        let ino = r.ino.ok_or(Error::NotFound)?;
        if r.slash && self.inode(ino)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(ino)
    }

    /// The directory that holds the last component of `path`, and that component (not
    /// followed if it is a link: the entry itself is what a create, unlink or rename
    /// changes). A last component of `.` or `..` is refused with `Invalid(DOT_LAST)` (after
    /// the components before it, whose errors come first): it names no entry that can be
    /// created.
    pub fn resolve_parent(&self, dir: Ino, path: &str) -> Result<(Ino, String)> {
        match self.resolve(dir, path, false)?.last {
            Some((parent, name)) => Ok((parent, name.to_string())),
            None => Err(Error::Invalid(DOT_LAST)),
        }
    }

    /// The target of the link `path` names.
    pub fn read_link(&self, dir: Ino, path: &str) -> Result<String> {
        let ino = self.lookup_at(dir, path, false)?;
        match self.symlinks.get(&ino) {
            Some(target) => Ok(target.clone()),
            None => Err(Error::Invalid("not a symbolic link")),
        }
    }

    pub fn read_dir(&self, dir: Ino) -> Result<Vec<DirEntry>> {
        let inode = self.inode(dir)?;
        if inode.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(inode
            .entries
            .iter()
            .map(|(name, &ino)| DirEntry {
                name: name.clone(),
                ino,
                kind: self.inodes.get(&ino).map_or(FileKind::File, |i| i.kind),
            })
            .collect())
    }

    /// Path of a directory from its tenant's root ("" for the root).
    fn dir_path(&self, mut dir: Ino) -> String {
        let mut parts = Vec::new();
        while !self.is_root(dir) {
            let Some((parent, name)) = self.names.get(&dir) else {
                break;
            };
            parts.push(name.as_str());
            dir = *parent;
        }
        parts.reverse();
        parts.join("/")
    }

    /// Path from the tenant root of a new entry `name` in `parent`.
    pub fn path_of_new(&self, parent: Ino, name: &str) -> String {
        let dir = self.dir_path(parent);
        if dir.is_empty() {
            name.to_string()
        } else {
            format!("{dir}/{name}")
        }
    }

    /// One path of an inode (the last name it was linked under), or "" if it has none.
    pub fn any_path(&self, ino: Ino) -> String {
        match self.names.get(&ino) {
            Some((parent, name)) => self.path_of_new(*parent, name),
            None => String::new(),
        }
    }

    /// Whether `dir` is `ancestor` or lies below it.
    fn is_within(&self, mut dir: Ino, ancestor: Ino) -> bool {
        loop {
            if dir == ancestor {
                return true;
            }
            if self.is_root(dir) {
                return false;
            }
            match self.inodes.get(&dir) {
                Some(inode) if inode.parent != dir => dir = inode.parent,
                _ => return false,
            }
        }
    }
}

impl Inner {
    /// Creates an empty file named `name` in `parent`.
    pub(super) fn create_file(&mut self, parent: Ino, name: &str, mut hint: Hint) -> Result<Ino> {
        let tenant = self.state.inode(parent)?.tenant;
        self.metadata_room(tenant, name.len())?;
        hint.class = effective_class(&hint, &self.conv);
        let ino = self.state.next_ino;
        let born = self.counters.tenant_host.get(&tenant).copied().unwrap_or(0);
        self.record(MetaOp::CreateInode {
            ino,
            kind: FileKind::File,
            tenant,
            hint,
            time_ns: now_ns(),
            born_host_bytes: born,
        })?;
        self.record(MetaOp::Link {
            dir: parent,
            name: name.to_string(),
            ino,
        })?;
        self.touch_dir(parent)?;
        Ok(ino)
    }

    pub(super) fn create_dir(&mut self, dir: Ino, path: &str) -> Result<Ino> {
        let (parent, name) = match self.state.resolve_parent(dir, path) {
            // `mkdir .` or `mkdir d/..` names a directory that exists (POSIX: EEXIST).
            Err(Error::Invalid(DOT_LAST)) => {
                self.state.lookup(dir, path)?;
                return Err(Error::Exists);
            }
            r => r?,
        };
        let p = self.state.inode(parent)?;
        if p.entries.contains_key(&name) {
            return Err(Error::Exists);
        }
        let tenant = p.tenant;
        self.metadata_room(tenant, name.len())?;
        let ino = self.state.next_ino;
        self.record(MetaOp::CreateInode {
            ino,
            kind: FileKind::Dir,
            tenant,
            hint: Hint::zoned(0),
            time_ns: now_ns(),
            born_host_bytes: 0,
        })?;
        self.record(MetaOp::Link {
            dir: parent,
            name,
            ino,
        })?;
        self.touch_dir(parent)?;
        Ok(ino)
    }

    pub(super) fn remove_dir(&mut self, dir: Ino, path: &str) -> Result<()> {
        let (parent, name) = self.state.resolve_parent(dir, path)?;
        let ino = *self
            .state
            .inode(parent)?
            .entries
            .get(&name)
            .ok_or(Error::NotFound)?;
        let inode = self.state.inode(ino)?;
        if inode.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        if !inode.entries.is_empty() {
            return Err(Error::NotEmpty);
        }
        self.record(MetaOp::Unlink { dir: parent, name })?;
        self.record(MetaOp::FreeInode { ino })?;
        self.touch_dir(parent)?;
        Ok(())
    }

    pub(super) fn unlink(&mut self, dir: Ino, path: &str) -> Result<()> {
        let (parent, name) = match self.state.resolve_parent(dir, path) {
            // `unlink .` names a directory (Linux: EISDIR, as for any directory here).
            Err(Error::Invalid(DOT_LAST)) => {
                self.state.lookup(dir, path)?;
                return Err(Error::IsDir);
            }
            r => r?,
        };
        let ino = *self
            .state
            .inode(parent)?
            .entries
            .get(&name)
            .ok_or(Error::NotFound)?;
        let kind = self.state.inode(ino)?.kind;
        if kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        if path.ends_with('/') {
            // `unlink link/` names what the link leads to (as wasmtime answers).
            let to_dir = kind == FileKind::Symlink
                && self
                    .state
                    .lookup(dir, path)
                    .is_ok_and(|i| self.state.inode(i).is_ok_and(|i| i.kind == FileKind::Dir));
            return Err(if to_dir { Error::IsDir } else { Error::NotDir });
        }
        let full = self.state.path_of_new(parent, &name);
        self.drop_link(parent, &name, ino, &full)?;
        self.touch_dir(parent)?;
        Ok(())
    }

    /// Removes one entry; frees the file if that was its last link and nobody has it open.
    fn drop_link(&mut self, parent: Ino, name: &str, ino: Ino, path: &str) -> Result<()> {
        self.record(MetaOp::Unlink {
            dir: parent,
            name: name.to_string(),
        })?;
        let inode = self.state.inode(ino)?;
        match inode.kind {
            FileKind::Dir => return self.record(MetaOp::FreeInode { ino }),
            // A link has no data and no placement: it just goes.
            FileKind::Symlink if inode.nlink == 0 => return self.record(MetaOp::FreeInode { ino }),
            _ => {}
        }
        if inode.nlink == 0 {
            match self.open.get(&ino) {
                None => self.free_inode(ino, path)?,
                // Held only for data whose write failed: with the last name gone, that
                // data has no reader left.
                Some(of) if of.refs == 0 => {
                    self.settle_closed(ino)?;
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Frees a file with no links and no handles, telling its policy how long it lived.
    pub(super) fn free_inode(&mut self, ino: Ino, path: &str) -> Result<()> {
        let inode = self.state.inode(ino)?;
        let tenant = inode.tenant;
        let hint = inode.hint;
        let now = self.counters.tenant_host.get(&tenant).copied().unwrap_or(0);
        let lifetime_bytes = now.saturating_sub(inode.born_host_bytes);
        let lifetime_secs =
            now_ns().saturating_sub(inode.ctime_ns.min(inode.mtime_ns)) as f64 / 1e9;
        if let Some(conv) = &mut self.conv {
            if self.state.is_conventional(ino) {
                conv.forget(ino);
            }
        }
        self.record(MetaOp::FreeInode { ino })?;
        self.events.push(Event::Deleted {
            tenant,
            path: path.to_string(),
            hint,
            lifetime_bytes,
            lifetime_secs,
        });
        Ok(())
    }

    /// Renames; returns the moved file (inode, tenant, new path) so it can be placed anew.
    pub(super) fn rename(
        &mut self,
        from_dir: Ino,
        from: &str,
        to_dir: Ino,
        to: &str,
    ) -> Result<Option<(Ino, TenantId, String)>> {
        let (src_parent, src_name) = self.state.resolve_parent(from_dir, from)?;
        let (dst_parent, dst_name) = self.state.resolve_parent(to_dir, to)?;
        let ino = *self
            .state
            .inode(src_parent)?
            .entries
            .get(&src_name)
            .ok_or(Error::NotFound)?;
        let kind = self.state.inode(ino)?.kind;
        if self.state.inode(src_parent)?.tenant != self.state.inode(dst_parent)?.tenant {
            return Err(Error::Escape);
        }
        let is_dir = kind == FileKind::Dir;
        if !is_dir && (from.ends_with('/') || to.ends_with('/')) {
            return Err(Error::NotDir);
        }
        if kind == FileKind::Dir && self.state.is_within(dst_parent, ino) {
            return Err(Error::Invalid("a directory cannot move below itself"));
        }
        let target = self
            .state
            .inode(dst_parent)?
            .entries
            .get(&dst_name)
            .copied();
        if let Some(t) = target {
            if t == ino {
                return Ok(None);
            }
            let t_inode = self.state.inode(t)?;
            // Linux refuses to replace a directory that holds the source before it looks
            // at the source's kind.
            if t_inode.kind == FileKind::Dir && self.state.is_within(src_parent, t) {
                return Err(Error::NotEmpty);
            }
            match (is_dir, t_inode.kind == FileKind::Dir) {
                (false, true) => return Err(Error::IsDir),
                (true, false) => return Err(Error::NotDir),
                (true, true) if !t_inode.entries.is_empty() => return Err(Error::NotEmpty),
                _ => {}
            }
            let t_path = self.state.path_of_new(dst_parent, &dst_name);
            self.drop_link(dst_parent, &dst_name, t, &t_path)?;
        }
        self.record(MetaOp::Unlink {
            dir: src_parent,
            name: src_name,
        })?;
        self.record(MetaOp::Link {
            dir: dst_parent,
            name: dst_name.clone(),
            ino,
        })?;
        self.touch_dir(src_parent)?;
        self.touch_dir(dst_parent)?;
        // Only a file has data to place anew.
        if kind != FileKind::File {
            return Ok(None);
        }
        let tenant = self.state.inode(ino)?.tenant;
        Ok(Some((
            ino,
            tenant,
            self.state.path_of_new(dst_parent, &dst_name),
        )))
    }

    /// `linkat`: a second name for `from` (for a link named by `from`, the link itself
    /// unless `follow`).
    pub(super) fn link(
        &mut self,
        from_dir: Ino,
        from: &str,
        follow: bool,
        to_dir: Ino,
        to: &str,
    ) -> Result<()> {
        // Linux's order of checks: the old name, the new one, then what may be linked.
        let ino = self.state.lookup_at(from_dir, from, follow)?;
        let (parent, name) = self.state.resolve_parent(to_dir, to)?;
        if self.state.inode(parent)?.entries.contains_key(&name) {
            return Err(Error::Exists);
        }
        // A trailing slash asks for a directory, which a new link is not (Linux: ENOENT).
        if to.ends_with('/') {
            return Err(Error::NotFound);
        }
        if self.state.inode(parent)?.tenant != self.state.inode(ino)?.tenant {
            return Err(Error::Escape);
        }
        if self.state.inode(ino)?.kind == FileKind::Dir {
            return Err(Error::NotAllowed("hard links to directories"));
        }
        self.metadata_room(self.state.inode(parent)?.tenant, name.len())?;
        self.record(MetaOp::Link {
            dir: parent,
            name,
            ino,
        })?;
        self.touch_dir(parent)?;
        Ok(())
    }

    /// `symlinkat`: a link named `path` whose content is `target` (a relative path that
    /// need not exist; it is resolved each time the link is followed).
    pub(super) fn symlink(&mut self, dir: Ino, target: &str, path: &str) -> Result<Ino> {
        check_target(target)?;
        let (parent, name) = match self.state.resolve_parent(dir, path) {
            // `symlink x .` names a directory that exists (Linux: EEXIST).
            Err(Error::Invalid(DOT_LAST)) => {
                self.state.lookup(dir, path)?;
                return Err(Error::Exists);
            }
            r => r?,
        };
        let p = self.state.inode(parent)?;
        if p.entries.contains_key(&name) {
            return Err(Error::Exists);
        }
        // A trailing slash asks for a directory, which a new link is not (Linux: ENOENT).
        if path.ends_with('/') {
            return Err(Error::NotFound);
        }
        let tenant = p.tenant;
        self.metadata_room(tenant, name.len() + target.len())?;
        let ino = self.state.next_ino;
        self.record(MetaOp::CreateInode {
            ino,
            kind: FileKind::Symlink,
            tenant,
            hint: Hint::zoned(0),
            time_ns: now_ns(),
            born_host_bytes: 0,
        })?;
        self.record(MetaOp::Symlink {
            ino,
            target: target.to_string(),
        })?;
        self.record(MetaOp::Link {
            dir: parent,
            name,
            ino,
        })?;
        self.touch_dir(parent)?;
        Ok(ino)
    }

    /// A directory changed: its mtime and ctime move.
    fn touch_dir(&mut self, dir: Ino) -> Result<()> {
        let inode = self.state.inode(dir)?;
        let now = now_ns();
        let op = MetaOp::SetAttr {
            ino: dir,
            size: 0,
            atime_ns: inode.atime_ns,
            mtime_ns: now,
            ctime_ns: now,
        };
        self.record(op)
    }
}
