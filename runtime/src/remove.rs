//! A tenant's files without a guest: what each tenant holds (`valet-run fs tenants`), and
//! removing what it no longer needs (`valet-run fs rm`), on a store no process has mounted
//! or through the admin API of the running `valet-run` or node agent that has it (a
//! departed pod's data, freed while the other pods run).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use valet_vfs::{FileKind, Ino, Store, TenantId};

/// A removal asked through the admin API (`POST /tenants/TENANT/rm`, this as its JSON
/// body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    /// A GUEST_PATH: inside the tenant's namespace, `/` its root.
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    /// Remove even while a guest of the tenant runs.
    #[serde(default)]
    pub force: bool,
}

/// A removal refused because guests of the tenant are running.
#[derive(Debug)]
pub struct TenantBusy {
    pub tenant: String,
    pub guests: usize,
}

impl std::fmt::Display for TenantBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant {:?} has {} guest(s) running; stop them first, or force the removal",
            self.tenant, self.guests
        )
    }
}

impl std::error::Error for TenantBusy {}

/// What a removal did to one tenant.
#[derive(Default, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    pub tenant: String,
    pub files: u64,
    pub links: u64,
    pub dirs: u64,
    /// Bytes the tenant's files held before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "removed {} files, {} links, {} directories; tenant {} holds {} bytes (was {})",
            self.files, self.links, self.dirs, self.tenant, self.bytes_after, self.bytes_before
        )
    }
}

/// One tenant's use of the store, as `fs tenants` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantUsage {
    pub id: TenantId,
    pub name: String,
    /// Names in its tree (files, directories, links).
    pub names: u64,
    /// Bytes its files hold.
    pub bytes: u64,
    /// Its guests running now (known to a running `valet-run` or node agent only).
    #[serde(default)]
    pub guests: usize,
    /// Its quota in bytes, if its guests have one (known to a running process only).
    #[serde(default)]
    pub quota: Option<u64>,
}

impl TenantUsage {
    /// Every tenant of `store`, by id (`guests` left at 0).
    pub fn of_store(store: &Store) -> Result<Vec<TenantUsage>> {
        let mut all = Vec::new();
        for (id, name, _) in store.tenants() {
            all.push(TenantUsage {
                id,
                name,
                names: store.tenant_entries(id)?,
                bytes: store.tenant_bytes(id)?,
                guests: 0,
                quota: None,
            });
        }
        Ok(all)
    }
}

impl std::fmt::Display for TenantUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let TenantUsage {
            id,
            name,
            names,
            bytes,
            ..
        } = self;
        write!(f, "{id:>4}  {name}  {names} names  {bytes} bytes")?;
        match self.quota {
            Some(quota) => write!(f, " of a {quota}-byte quota"),
            None => Ok(()),
        }
    }
}

/// A tenant the store does not have.
#[derive(Debug)]
pub struct NoTenant(pub String);

impl std::fmt::Display for NoTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no tenant {:?} in this store", self.0)
    }
}

impl std::error::Error for NoTenant {}

/// The tenant named `name`, which must already be on the store (inspecting or removing
/// must not create one).
pub fn existing_tenant(store: &Store, name: &str) -> Result<(TenantId, Ino)> {
    store
        .tenants()
        .into_iter()
        .find(|(_, n, _)| n == name)
        .map(|(id, _, root)| (id, root))
        .ok_or_else(|| NoTenant(name.to_string()).into())
}

/// A GUEST_PATH as the store resolves it: relative to the tenant's root.
pub fn relative(path: &str) -> &str {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        "."
    } else {
        rel
    }
}

/// Removes `path` in `tenant`'s namespace: a file or link, or with `recursive` a directory
/// and everything below it (`/` empties the namespace; the root itself stays). A link is
/// removed, never followed. The caller makes it durable (a sync, or the unmount).
pub fn remove(store: &Store, tenant: &str, path: &str, recursive: bool) -> Result<Removal> {
    let (id, root) = existing_tenant(store, tenant)?;
    let mut removal = Removal {
        tenant: tenant.to_string(),
        bytes_before: store.tenant_bytes(id)?,
        ..Removal::default()
    };
    let rel = relative(path);
    let ino = store.lookup_at(root, rel, false)?;
    match store.metadata(ino)?.kind {
        FileKind::Dir if !recursive => bail!("is a directory (rm -r removes it)"),
        FileKind::Dir => {
            empty_dir(store, ino, &mut removal)?;
            if rel != "." {
                store.remove_dir(root, rel)?;
                removal.dirs += 1;
            }
        }
        kind => {
            store.unlink(root, rel)?;
            removal.count(kind);
        }
    }
    removal.bytes_after = store.tenant_bytes(id)?;
    Ok(removal)
}

/// Removes everything below `dir`, depth first.
fn empty_dir(store: &Store, dir: Ino, removal: &mut Removal) -> Result<()> {
    for e in store.read_dir(dir)? {
        if e.kind == FileKind::Dir {
            empty_dir(store, e.ino, removal)?;
            store.remove_dir(dir, &e.name)?;
            removal.dirs += 1;
        } else {
            store.unlink(dir, &e.name)?;
            removal.count(e.kind);
        }
    }
    Ok(())
}

impl Removal {
    fn count(&mut self, kind: FileKind) {
        match kind {
            FileKind::Symlink => self.links += 1,
            _ => self.files += 1,
        }
    }
}
