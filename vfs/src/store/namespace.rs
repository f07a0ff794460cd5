//! Paths and directory operations.
//!
//! Paths are relative to a directory inode and `/`-separated. Empty and `.` components are
//! skipped; `..` climbs to the parent but never above the directory the path is relative to
//! (that is an [`Error::Escape`], as WASI requires of a directory descriptor), so no path
//! reaches above its tenant's root or into another tenant. Names are at most 255 bytes and
//! contain no NUL. There are no symlinks.

use super::events::Event;
use super::state::{FileKind, Ino, MetaOp, State, TenantId};
use super::{effective_class, now_ns, DirEntry, Inner};
use crate::hint::Hint;
use crate::{Error, Result};

const NAME_MAX: usize = 255;

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

impl State {
    fn is_root(&self, ino: Ino) -> bool {
        self.inodes
            .get(&ino)
            .and_then(|i| self.tenants.get(i.tenant as usize))
            .is_some_and(|t| t.root == ino)
    }

    /// Walks `components` from `dir`, each of which must be a directory. `..` never climbs
    /// above `dir`: with no symlinks, the depth below `dir` is known from the names alone.
    fn walk<'p>(&self, mut dir: Ino, components: impl Iterator<Item = &'p str>) -> Result<Ino> {
        let mut depth = 0usize;
        for c in components {
            let inode = self.inode(dir)?;
            if inode.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            dir = match c {
                "" | "." => dir,
                ".." if depth == 0 || self.is_root(dir) => return Err(Error::Escape),
                ".." => {
                    depth -= 1;
                    inode.parent
                }
                name => {
                    check_name(name)?;
                    depth += 1;
                    *inode.entries.get(name).ok_or(Error::NotFound)?
                }
            };
        }
        Ok(dir)
    }

    /// The inode `path` names, relative to `dir`.
    pub fn lookup(&self, dir: Ino, path: &str) -> Result<Ino> {
        if path.starts_with('/') {
            return Err(Error::Escape);
        }
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        let ino = self.walk(dir, path.split('/'))?;
        if path.ends_with('/') && self.inode(ino)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(ino)
    }

    /// The directory that holds the last component of `path`, and that component.
    /// A last component of `.` or `..` is refused with `Invalid(DOT_LAST)` (after the components
    /// before it, whose errors come first): it names no entry that can be created.
    pub fn resolve_parent(&self, dir: Ino, path: &str) -> Result<(Ino, String)> {
        if path.starts_with('/') {
            return Err(Error::Escape);
        }
        let trimmed = path.trim_end_matches('/');
        let (head, last) = match trimmed.rsplit_once('/') {
            Some((head, last)) => (Some(head), last),
            None => (None, trimmed),
        };
        if last.is_empty() {
            return Err(Error::NotFound);
        }
        let parent = match head {
            Some(head) => self.walk(dir, head.split('/'))?,
            None => self.walk(dir, std::iter::empty())?,
        };
        if self.inode(parent)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        if last == "." || last == ".." {
            // A final `..` that climbs above `dir` is an escape before it is anything else.
            self.walk(dir, trimmed.split('/'))?;
            return Err(Error::Invalid(DOT_LAST));
        }
        check_name(last)?;
        Ok((parent, last.to_string()))
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
        if self.state.inode(ino)?.kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        if path.ends_with('/') {
            return Err(Error::NotDir);
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
        if inode.kind == FileKind::Dir {
            return self.record(MetaOp::FreeInode { ino });
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
        if kind == FileKind::File && (from.ends_with('/') || to.ends_with('/')) {
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
            match (kind, t_inode.kind) {
                (FileKind::File, FileKind::Dir) => return Err(Error::IsDir),
                (FileKind::Dir, FileKind::File) => return Err(Error::NotDir),
                (FileKind::Dir, FileKind::Dir) if !t_inode.entries.is_empty() => {
                    return Err(Error::NotEmpty)
                }
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
        if kind == FileKind::Dir {
            return Ok(None);
        }
        let tenant = self.state.inode(ino)?.tenant;
        Ok(Some((
            ino,
            tenant,
            self.state.path_of_new(dst_parent, &dst_name),
        )))
    }

    pub(super) fn link(&mut self, from_dir: Ino, from: &str, to_dir: Ino, to: &str) -> Result<()> {
        let ino = self.state.lookup(from_dir, from)?;
        if self.state.inode(ino)?.kind == FileKind::Dir {
            return Err(Error::NotAllowed("hard links to directories"));
        }
        let (parent, name) = self.state.resolve_parent(to_dir, to)?;
        if self.state.inode(parent)?.entries.contains_key(&name) {
            return Err(Error::Exists);
        }
        if self.state.inode(parent)?.tenant != self.state.inode(ino)?.tenant {
            return Err(Error::Escape);
        }
        self.record(MetaOp::Link {
            dir: parent,
            name,
            ino,
        })?;
        self.touch_dir(parent)?;
        Ok(())
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
