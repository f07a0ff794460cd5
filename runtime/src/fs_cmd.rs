//! `valet-run fs`: data in and out of an existing store, without running a guest.
//!
//! ```text
//! valet-run fs ls      [--device PATH] [--tenant T] [-R] [GUEST_PATH]
//! valet-run fs cat     [--device PATH] [--tenant T] GUEST_PATH
//! valet-run fs import  [--device PATH] [--tenant T] [--zone-size MIB] [--zones N] [--max-open N] HOST_DIR GUEST_PATH
//! valet-run fs export  [--device PATH] [--tenant T] GUEST_PATH HOST_DIR
//! valet-run fs rm      [--device PATH] [--tenant T] [-r] [--force] GUEST_PATH
//! valet-run fs fsck    [--device PATH] [--deep]
//! valet-run fs tenants [--device PATH]
//! valet-run fs zones   [--device PATH]
//! ls, cat, rm, fsck, tenants, zones: also with --admin ADDR [--token-file F], on a running store
//! ```
//!
//! The Valet paper admits that files in its store are invisible to backup and copy tools;
//! these commands make ours visible. A GUEST_PATH is a path inside one tenant's namespace,
//! as a guest sees it below its mount: `/` (or an empty path) is the tenant's root, and a
//! file the guest wrote as `/data/db/000001.log` (mount `/data`) is `/db/000001.log` here.
//! Paths are resolved by the store, so `..` cannot leave the tenant.
//!
//! Symbolic links travel as links: `import` makes a store link of each host link with a
//! relative target (an absolute one would lead out of the store, which refuses it: such a
//! link is skipped with a warning), `export` makes a host link of each store link, and `ls`
//! shows them as `l ... name -> target`. Links are never followed inside a tree.
//!
//! Only `import` creates a store: into an image device that does not exist yet it creates
//! one, as the first `valet-run` does (with the same `--zone-size`, `--zones` and
//! `--max-open`); every other command fails on a device without a store. `import` and `rm`
//! are the only ones that write (`import` creates the tenant if needed, `rm` frees what a
//! tenant no longer needs without running a guest); each syncs the store before it
//! returns. Every other command mounts the store read-only: it changes nothing on the
//! device (the image file is opened for reading only, and several inspections may run at
//! once), it is refused while a `valet-run` has the store, and it sees a store after a
//! crash as the next mount would recover it. `fsck` reports whatever it finds, even
//! metadata a writable mount would refuse; `ls`, `cat`, `export` and `tenants` refuse such
//! a store, but not one whose metadata holds together with some files damaged (their reads
//! fail on their own). `fsck` exits 1 (with one error line) when it finds problems or
//! damaged files, and 125 when it cannot check at all, like every other failure of ours;
//! `export` leaves damaged files out, names them, and exits 1.
//!
//! While a `valet-run` or node agent has the store, `ls`, `cat`, `rm`, `fsck`, `tenants`
//! and `zones` with `--admin ADDR` ask it through its admin API instead of mounting the
//! store ([`crate::inspect`], [`crate::remove`]).

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use valet_vfs::device::{Geometry, ImageDevice, ImageOptions, IoMode, ZonedDevice};
use valet_vfs::{FileKind, FsckReport, Ino, OpenOptions, Store};

use crate::admin::{client, AdminAddr};
use crate::device::DeviceSpec;
use crate::inspect::{ls, print_fsck, zones, CAT_CHUNK};
use crate::remove::{existing_tenant, relative, remove, Removal, RemoveRequest, TenantUsage};

/// Copy buffer: one store write buffer's worth (the largest extent a flush writes).
const CHUNK: usize = 512 * 1024;

/// The `fs` subcommands.
#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// List a directory of the store like `ls -l`: kind (`d`, `-` or `l`), size, name (and a
    /// link's target).
    Ls {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        tenant: TenantArg,
        /// List subdirectories too, with paths relative to GUEST_PATH.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// Directory or file inside the tenant's namespace.
        #[arg(default_value = "/", value_name = "GUEST_PATH")]
        path: String,
        #[command(flatten)]
        online: OnlineArgs,
    },
    /// Write a file of the store to stdout.
    Cat {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        tenant: TenantArg,
        /// File inside the tenant's namespace.
        #[arg(value_name = "GUEST_PATH")]
        path: String,
        #[command(flatten)]
        online: OnlineArgs,
    },
    /// Copy a host directory tree (or one file) into the store, creating directories.
    Import {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        tenant: TenantArg,
        #[command(flatten)]
        geometry: NewDeviceArgs,
        /// Host directory whose contents are copied (or one host file).
        #[arg(value_name = "HOST_DIR")]
        host: PathBuf,
        /// Directory of the store the contents of HOST_DIR go into (created if missing).
        #[arg(value_name = "GUEST_PATH")]
        guest: String,
    },
    /// Copy a tree (or one file) of the store out to a host directory.
    Export {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        tenant: TenantArg,
        /// Directory whose contents are copied (or one file), inside the tenant's namespace.
        #[arg(value_name = "GUEST_PATH")]
        guest: String,
        /// Host directory the contents of GUEST_PATH go into (created if missing).
        #[arg(value_name = "HOST_DIR")]
        host: PathBuf,
    },
    /// Remove a file or link of the store, or with -r a directory and everything in it
    /// (`/` empties the tenant's namespace): frees the space of data no guest needs any
    /// more, without running one. Prints what it removed and the bytes the tenant's files
    /// held before and after. With --admin, the running valet-run or node agent that has
    /// the store removes it.
    Rm {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        tenant: TenantArg,
        /// Remove directories and their contents.
        #[arg(short = 'r', long)]
        recursive: bool,
        #[command(flatten)]
        online: OnlineArgs,
        /// With --admin: remove even while a guest of the tenant runs (its open files stay
        /// readable to it until it closes them).
        #[arg(long, requires = "admin")]
        force: bool,
        /// File, link or (with -r) directory inside the tenant's namespace.
        #[arg(value_name = "GUEST_PATH")]
        path: String,
    },
    /// Check every invariant of the store and print the report.
    Fsck {
        #[command(flatten)]
        store: StoreArgs,
        /// Also read every live block and verify it against the checksum it was written
        /// with.
        #[arg(long)]
        deep: bool,
        #[command(flatten)]
        online: OnlineArgs,
    },
    /// List the tenants of the store: id, name, the names in its tree (files, directories,
    /// links: what `valet.io/files` bounds) and the bytes its files hold (what
    /// `valet.io/quota` bounds); with --admin, also the guests of each running now.
    Tenants {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        online: OnlineArgs,
    },
    /// The store's zone map: every zone that is not empty, with its state, write pointer
    /// in bytes, owning `tenant/stream` (`-`: metadata or unowned) and, on FDP, the placement
    /// identifier its writes carry. What to compare with the drive's own report
    /// (`blkzone report`, `nvme fdp status`).
    Zones {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        online: OnlineArgs,
    },
}

/// The device holding an existing store (no geometry options: nothing is created).
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Directory of the embedded default device (holding `zones.img`).
    #[arg(long, default_value = "valet-data", value_name = "PATH")]
    device: PathBuf,

    /// Use a zonefs mount of a real zoned drive instead of the image.
    #[arg(long, value_name = "MOUNT")]
    zonefs: Option<PathBuf>,

    /// Zone capacity in bytes of an emulated zonefs layout (a real mount's comes from the
    /// drive).
    #[arg(long, value_name = "BYTES")]
    zonefs_capacity: Option<u64>,

    /// Use an NVMe namespace with FDP (`/dev/ngXnY`) instead of the image.
    #[arg(long, value_name = "DEVICE", conflicts_with = "zonefs")]
    fdp: Option<PathBuf>,

    /// Device I/O engine of the image: plain syscalls (`sync`) or io_uring for large
    /// writes (`uring`, or `auto` where the kernel allows it).
    #[arg(long, default_value = "sync", value_name = "sync|uring|auto")]
    io: IoMode,
}

/// The geometry of an image device `valet-run` or `import` creates (ignored when the device
/// exists).
#[derive(Args, Debug, Clone)]
pub struct NewDeviceArgs {
    /// Zone size in MiB, when creating the image.
    #[arg(long, value_name = "MIB")]
    zone_size: Option<u64>,

    /// Number of zones, when creating the image.
    #[arg(long)]
    zones: Option<u32>,

    /// Most open zones, when creating the image.
    #[arg(long)]
    max_open: Option<u32>,
}

impl NewDeviceArgs {
    /// The embedded default with the options applied (keeping its capacity/size ratio,
    /// 3/4, on whole blocks).
    pub fn geometry(&self) -> Result<Geometry> {
        let mut geometry = Geometry::EMBEDDED_DEFAULT;
        if let Some(mib) = self.zone_size {
            let size = mib
                .checked_mul(1 << 20)
                .context("--zone-size is too large")?;
            geometry.zone_size = size;
            geometry.zone_capacity = size / 4 * 3 / 4096 * 4096;
        }
        if let Some(zones) = self.zones {
            geometry.zone_count = zones;
        }
        if let Some(max_open) = self.max_open {
            geometry.max_open = max_open;
            geometry.max_active = geometry.max_active.max(max_open);
        }
        geometry
            .validate()
            .context("the requested device geometry")?;
        Store::check_geometry(&geometry)
            .map_err(|why| anyhow::anyhow!("the requested device geometry: {why}"))?;
        Ok(geometry)
    }

    /// Refuses flags that disagree with the image `spec` would open, when it exists: its
    /// geometry was fixed when it was made, and a run on another geometry than the one
    /// asked for would go unnoticed.
    pub fn agree_with_existing(&self, spec: &DeviceSpec) -> Result<()> {
        let asked = self.zone_size.is_some() || self.zones.is_some() || self.max_open.is_some();
        let image = spec.image_path();
        if !asked || spec.zonefs.is_some() || spec.fdp.is_some() || !image.exists() {
            return Ok(());
        }
        let options = ImageOptions {
            read_only: true,
            ..Default::default()
        };
        let have = ImageDevice::open(&image, options)
            .with_context(|| format!("opening {}", image.display()))?
            .geometry();
        let want = self.geometry()?;
        let differs = [
            (
                self.zone_size.map(|mib| format!("--zone-size {mib}")),
                want.zone_size != have.zone_size,
                format!("zones of {} MiB", have.zone_size >> 20),
            ),
            (
                self.zones.map(|n| format!("--zones {n}")),
                want.zone_count != have.zone_count,
                format!("{} zones", have.zone_count),
            ),
            (
                self.max_open.map(|n| format!("--max-open {n}")),
                want.max_open != have.max_open,
                format!("at most {} open zones", have.max_open),
            ),
        ];
        for (flag, differ, has) in differs {
            if let (Some(flag), true) = (flag, differ) {
                bail!(
                    "{flag}: the image {} has {has}; a geometry is set when the image is \
                     made (move the directory away to make another)",
                    image.display()
                );
            }
        }
        Ok(())
    }
}

/// Where a running valet-run or node agent that has the store serves its admin API.
#[derive(Args, Debug, Clone)]
pub struct OnlineArgs {
    /// Ask the valet-run or node agent serving this admin address (IP:PORT or socket
    /// path), which has the store, instead of mounting it.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// The admin token file (default: DEVICE/admin.token).
    #[arg(long, value_name = "FILE", requires = "admin")]
    token_file: Option<PathBuf>,
}

impl OnlineArgs {
    /// One admin API request; the answer's body when it is 200.
    fn request_raw(
        self,
        device: PathBuf,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Vec<u8>> {
        let addr = AdminAddr::parse(self.admin.as_deref().unwrap_or_default())?;
        let token = client::read_token(self.token_file, device)?;
        let (code, answer) = client::request(&addr, &token, method, path, body)?;
        if code != 200 {
            return Err(client::api_error(code, &answer));
        }
        Ok(answer)
    }

    /// [`OnlineArgs::request_raw`], its answer read as JSON.
    fn request<T: serde::de::DeserializeOwned>(
        self,
        device: PathBuf,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<T> {
        let answer = self.request_raw(device, method, path, body)?;
        serde_json::from_slice(&answer).context("the admin API's answer")
    }
}

/// Whose namespace a command works in.
#[derive(Args, Debug, Clone)]
pub struct TenantArg {
    /// The tenant whose namespace the path is in.
    #[arg(long, default_value = "default")]
    tenant: String,
}

impl StoreArgs {
    fn spec(&self) -> DeviceSpec {
        DeviceSpec {
            dir: self.device.clone(),
            zonefs: self.zonefs.clone(),
            zonefs_capacity: self.zonefs_capacity,
            fdp: self.fdp.clone(),
            // The image's own geometry is used; this one is never applied.
            geometry: Geometry::EMBEDDED_DEFAULT,
            io: self.io,
            writeback: None,
            handoff: None,
        }
    }

    /// Mounts the store to write it, refusing to create one.
    fn mount(&self) -> Result<Store> {
        self.spec().mount_existing()
    }

    /// Mounts the store read-only to look at it, as it is: the fsck report, whatever it
    /// finds.
    fn mount_to_check(&self) -> Result<Store> {
        self.spec().mount_read_only()
    }

    /// Mounts the store read-only to read its files, refusing one whose metadata does not
    /// hold together (a writable mount refuses it too; a namespace with a cycle would
    /// never end a recursive listing). A damaged file's reads fail on their own.
    fn mount_to_read(&self) -> Result<Store> {
        let store = self.mount_to_check()?;
        let report = store.fsck().context("checking the store")?;
        if !report.is_consistent() {
            bail!(
                "the store's metadata is inconsistent (`valet-run fs fsck` lists the \
                 problems): {}",
                report.findings()
            );
        }
        Ok(store)
    }
}

/// Runs one `fs` command, writing its output to stdout. Returns the exit code.
pub fn run(command: FsCommand) -> Result<u8> {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let result = run_to(command, &mut out);
    match result {
        // `valet-run fs cat big | head` is not a failure.
        Err(e) if is_broken_pipe(&e) => Ok(0),
        other => other,
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn run_to(command: FsCommand, out: &mut dyn Write) -> Result<u8> {
    match command {
        FsCommand::Ls {
            store,
            tenant,
            recursive,
            path,
            online,
        } if online.admin.is_some() => {
            let at = format!(
                "/tenants/{}/ls?path={}&recursive={recursive}",
                client::path_segment(&tenant.tenant),
                client::path_segment(&path)
            );
            out.write_all(&online.request_raw(store.device, "GET", &at, b"")?)?;
        }
        FsCommand::Ls {
            store,
            tenant,
            recursive,
            path,
            ..
        } => {
            let store = store.mount_to_read()?;
            let (_, root) = existing_tenant(&store, &tenant.tenant)?;
            ls(&store, root, &path, recursive, out).with_context(|| format!("ls {path}"))?;
        }
        FsCommand::Zones { store, online } if online.admin.is_some() => {
            out.write_all(&online.request_raw(store.device, "GET", "/zones", b"")?)?;
        }
        FsCommand::Zones { store, .. } => {
            let store = store.mount_to_check()?;
            zones(&store, out)?;
        }
        FsCommand::Cat {
            store,
            tenant,
            path,
            online,
        } if online.admin.is_some() => {
            // In chunks, each its own request: a file of any size, in bounded memory.
            let mut offset = 0u64;
            loop {
                let at = format!(
                    "/tenants/{}/cat?path={}&offset={offset}&len={CAT_CHUNK}",
                    client::path_segment(&tenant.tenant),
                    client::path_segment(&path)
                );
                let chunk = online
                    .clone()
                    .request_raw(store.device.clone(), "GET", &at, b"")?;
                out.write_all(&chunk)?;
                offset += chunk.len() as u64;
                if (chunk.len() as u64) < CAT_CHUNK {
                    break;
                }
            }
        }
        FsCommand::Cat {
            store,
            tenant,
            path,
            ..
        } => {
            let store = store.mount_to_read()?;
            let (_, root) = existing_tenant(&store, &tenant.tenant)?;
            cat(&store, root, &path, out).with_context(|| format!("cat {path}"))?;
        }
        FsCommand::Import {
            store,
            tenant,
            geometry,
            host,
            guest,
        } => {
            let mut spec = store.spec();
            let real = spec.zonefs.is_some() || spec.fdp.is_some();
            let store = if !real && !spec.image_path().exists() {
                // Check the source before anything is created on disk.
                fs::symlink_metadata(&host)
                    .with_context(|| format!("cannot read {}", host.display()))?;
                spec.geometry = geometry.geometry()?;
                spec.mount()?
            } else {
                geometry.agree_with_existing(&spec)?;
                store.mount()?
            };
            let (_, root) = store.tenant(&tenant.tenant)?;
            let copied = import(&store, root, &host, &guest)
                .with_context(|| format!("import {} {guest}", host.display()))?;
            store.unmount().context("syncing the store")?;
            writeln!(out, "imported {copied}")?;
        }
        FsCommand::Export {
            store,
            tenant,
            guest,
            host,
        } => {
            let store = store.mount_to_read()?;
            let (_, root) = existing_tenant(&store, &tenant.tenant)?;
            let copied = export(&store, root, &guest, &host)
                .with_context(|| format!("export {guest} {}", host.display()))?;
            writeln!(out, "exported {copied}")?;
            for damage in &copied.damaged {
                writeln!(out, "damaged, not exported: {damage}")?;
            }
            if !copied.damaged.is_empty() {
                out.flush()?;
                eprintln!(
                    "valet-run: error: export: {} damaged file(s) not exported",
                    copied.damaged.len()
                );
                return Ok(1);
            }
        }
        FsCommand::Rm {
            store,
            tenant,
            recursive,
            online,
            force,
            path,
        } if online.admin.is_some() => {
            let request = RemoveRequest {
                path,
                recursive,
                force,
            };
            let at = format!("/tenants/{}/rm", client::path_segment(&tenant.tenant));
            let body = serde_json::to_vec(&request)?;
            let removal: Removal = online.request(store.device, "POST", &at, &body)?;
            writeln!(out, "{removal}")?;
        }
        FsCommand::Rm {
            store,
            tenant,
            recursive,
            path,
            ..
        } => {
            let store = store.mount()?;
            let removal = remove(&store, &tenant.tenant, &path, recursive)
                .with_context(|| format!("rm {path}"))?;
            store.unmount().context("syncing the store")?;
            writeln!(out, "{removal}")?;
        }
        FsCommand::Fsck {
            store,
            deep,
            online,
        } => {
            let report: FsckReport = match online.admin {
                Some(_) => {
                    online.request(store.device, "GET", &format!("/fsck?deep={deep}"), b"")?
                }
                None => {
                    let store = store.mount_to_check()?;
                    match deep {
                        true => store.fsck_deep(),
                        false => store.fsck(),
                    }
                    .context("fsck")?
                }
            };
            if !print_fsck(&report, deep, out)? {
                out.flush()?;
                eprintln!(
                    "valet-run: error: fsck found {} problem(s)",
                    report.problems.len() + report.damaged.len()
                );
                return Ok(1);
            }
        }
        FsCommand::Tenants { store, online } if online.admin.is_some() => {
            let tenants: Vec<TenantUsage> = online.request(store.device, "GET", "/tenants", b"")?;
            for t in tenants {
                writeln!(out, "{t}  {} guests running", t.guests)?;
            }
        }
        FsCommand::Tenants { store, .. } => {
            let store = store.mount_to_read()?;
            for t in TenantUsage::of_store(&store)? {
                writeln!(out, "{t}")?;
            }
        }
    }
    out.flush()?;
    Ok(0)
}

/// What an import or export copied.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
    /// Files of the store left out of an export because their bytes are damaged (see
    /// [`FsckReport::damaged`]): their paths in the store, and why.
    pub damaged: Vec<String>,
}

impl std::fmt::Display for Copied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files, {} directories, {} symlinks, {} bytes",
            self.files, self.dirs, self.symlinks, self.bytes
        )
    }
}

/// Writes a file of the store to `out`.
pub fn cat(store: &Store, root: Ino, path: &str, out: &mut dyn Write) -> Result<()> {
    let file = store.open_file(root, relative(path), OpenOptions::read())?;
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n = file.read_at(&mut buf, offset)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        offset += n as u64;
    }
    file.close()?;
    Ok(())
}

/// `mkdir -p` inside the store; returns the directory.
fn make_dirs(store: &Store, root: Ino, path: &str, copied: &mut Copied) -> Result<Ino> {
    let mut dir = root;
    for name in relative(path).split('/') {
        dir = match name {
            "" | "." => dir,
            name => make_dir(store, dir, name, copied)?,
        };
    }
    Ok(dir)
}

/// The directory `name` in `dir`, created if missing.
fn make_dir(store: &Store, dir: Ino, name: &str, copied: &mut Copied) -> Result<Ino> {
    match store.lookup(dir, name) {
        Ok(ino) if store.metadata(ino)?.kind == FileKind::Dir => Ok(ino),
        Ok(_) => bail!("{name} exists in the store and is not a directory"),
        Err(valet_vfs::Error::NotFound) => {
            copied.dirs += 1;
            Ok(store.create_dir(dir, name)?)
        }
        Err(e) => Err(e.into()),
    }
}

fn mtime_ns(meta: &fs::Metadata) -> Option<u64> {
    let t = meta.modified().ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_nanos() as u64)
}

/// Copies `host` (a directory's contents, or one file) into the store directory `guest`.
/// Host symlinks become store symlinks (those with an absolute target are skipped with a
/// warning, as are special files: the store has neither).
pub fn import(store: &Store, root: Ino, host: &Path, guest: &str) -> Result<Copied> {
    let mut copied = Copied::default();
    let meta = fs::metadata(host).with_context(|| format!("cannot read {}", host.display()))?;
    let dir = make_dirs(store, root, guest, &mut copied)?;
    if meta.is_dir() {
        import_dir(store, dir, host, &mut copied)?;
    } else {
        let name = host_name(host)?;
        import_file(store, dir, &name, host, &mut copied)?;
    }
    Ok(copied)
}

fn host_name(path: &Path) -> Result<String> {
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    name.to_str()
        .map(str::to_string)
        .with_context(|| format!("{}: the store keeps UTF-8 names only", path.display()))
}

fn import_dir(store: &Store, dir: Ino, host: &Path, copied: &mut Copied) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(host)
        .with_context(|| format!("cannot list {}", host.display()))?
        .collect::<io::Result<_>>()
        .with_context(|| format!("cannot list {}", host.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = host_name(&path)?;
        let kind = entry
            .file_type()
            .with_context(|| format!("cannot stat {}", path.display()))?;
        if kind.is_dir() {
            let sub =
                make_dir(store, dir, &name, copied).with_context(|| format!("creating {name}"))?;
            import_dir(store, sub, &path, copied)?;
        } else if kind.is_file() {
            import_file(store, dir, &name, &path, copied)?;
        } else if kind.is_symlink() {
            import_symlink(store, dir, &name, &path, copied)?;
        } else {
            eprintln!(
                "valet-run: warning: skipping {} (not a file or directory)",
                path.display()
            );
        }
    }
    Ok(())
}

/// A host link as a store link (replacing a link of that name; never a file or directory).
fn import_symlink(
    store: &Store,
    dir: Ino,
    name: &str,
    host: &Path,
    copied: &mut Copied,
) -> Result<()> {
    let target = fs::read_link(host).with_context(|| format!("cannot read {}", host.display()))?;
    let Some(target) = target.to_str() else {
        bail!(
            "{}: the store keeps UTF-8 link targets only",
            host.display()
        );
    };
    if target.starts_with('/') {
        eprintln!(
            "valet-run: warning: skipping {} (a link to the absolute path {target}, which \
             would lead out of the store)",
            host.display()
        );
        return Ok(());
    }
    match store.lookup_at(dir, name, false) {
        Ok(ino) if store.metadata(ino)?.kind == FileKind::Symlink => store.unlink(dir, name)?,
        Ok(_) => bail!("{name} exists in the store and is not a symlink"),
        Err(valet_vfs::Error::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    store
        .symlink(dir, target, name)
        .with_context(|| format!("creating the link {name} in the store"))?;
    copied.symlinks += 1;
    Ok(())
}

fn import_file(
    store: &Store,
    dir: Ino,
    name: &str,
    host: &Path,
    copied: &mut Copied,
) -> Result<()> {
    let mut src =
        fs::File::open(host).with_context(|| format!("cannot open {}", host.display()))?;
    let meta = src.metadata()?;
    // Never write through a link of that name.
    let opts = OpenOptions {
        write: true,
        create: true,
        truncate: true,
        nofollow: true,
        ..Default::default()
    };
    let file = store
        .open_file(dir, name, opts)
        .with_context(|| format!("creating {name} in the store"))?;
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n =
            read_full(&mut src, &mut buf).with_context(|| format!("reading {}", host.display()))?;
        if n == 0 {
            break;
        }
        file.write_at(&buf[..n], offset)
            .with_context(|| format!("writing {name} to the store"))?;
        offset += n as u64;
    }
    if let Some(mtime) = mtime_ns(&meta) {
        file.set_times(None, Some(mtime))?;
    }
    file.close()
        .with_context(|| format!("closing {name} in the store"))?;
    copied.files += 1;
    copied.bytes += offset;
    Ok(())
}

/// Reads until `buf` is full or the file ends.
fn read_full(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match src.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Copies `guest` (a directory's contents, or one file) of the store into the host
/// directory `host`, which is created if missing. Existing host files are overwritten.
pub fn export(store: &Store, root: Ino, guest: &str, host: &Path) -> Result<Copied> {
    let mut copied = Copied::default();
    let rel = relative(guest);
    let ino = store.lookup(root, rel)?;
    fs::create_dir_all(host).with_context(|| format!("cannot create {}", host.display()))?;
    if store.metadata(ino)?.kind == FileKind::Dir {
        let at = if rel == "." { "" } else { rel };
        export_dir(store, ino, at, host, &mut copied)?;
    } else {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        let parent = match rel.rsplit_once('/') {
            Some((head, _)) => store.lookup(root, head)?,
            None => root,
        };
        let to = host.join(safe_name(name)?);
        export_file(store, parent, name, rel, &to, &mut copied)?;
    }
    Ok(copied)
}

/// A store name that is safe to join to a host path (the store never makes others).
fn safe_name(name: &str) -> Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        bail!("refusing to export an entry named {name:?}");
    }
    Ok(name)
}

/// Exports directory `dir` of the store, at `at` in it, into `host`.
fn export_dir(store: &Store, dir: Ino, at: &str, host: &Path, copied: &mut Copied) -> Result<()> {
    let mut entries = store.read_dir(dir)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let path = host.join(safe_name(&e.name)?);
        let in_store = match at {
            "" => e.name.clone(),
            _ => format!("{at}/{}", e.name),
        };
        match e.kind {
            FileKind::Dir => {
                let is_dir = |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
                match fs::create_dir(&path) {
                    Ok(()) => copied.dirs += 1,
                    // A host link to a directory is not followed out of HOST_DIR.
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists && is_dir(&path) => {}
                    Err(err) => {
                        return Err(err)
                            .with_context(|| format!("cannot create {}", path.display()))
                    }
                }
                export_dir(store, e.ino, &in_store, &path, copied)?;
            }
            FileKind::File => export_file(store, dir, &e.name, &in_store, &path, copied)?,
            FileKind::Symlink => export_symlink(store, dir, &e.name, &path, copied)?,
        }
    }
    Ok(())
}

/// A store link as a host link (replacing a host link or file of that name).
fn export_symlink(
    store: &Store,
    dir: Ino,
    name: &str,
    host: &Path,
    copied: &mut Copied,
) -> Result<()> {
    let target = store.read_link(dir, name)?;
    match fs::symlink_metadata(host) {
        Ok(m) if !m.is_dir() => {
            fs::remove_file(host).with_context(|| format!("cannot replace {}", host.display()))?
        }
        Ok(_) => bail!("{} exists and is a directory", host.display()),
        Err(_) => {}
    }
    std::os::unix::fs::symlink(&target, host)
        .with_context(|| format!("cannot create the link {}", host.display()))?;
    copied.symlinks += 1;
    Ok(())
}

/// Exports file `name` of directory `dir` (at `in_store` in the store) to `host`. A file
/// whose bytes are damaged is left out and noted in `copied`: the rest of the tree is still
/// worth having.
fn export_file(
    store: &Store,
    dir: Ino,
    name: &str,
    in_store: &str,
    host: &Path,
    copied: &mut Copied,
) -> Result<()> {
    let file = store
        .open_file(dir, name, OpenOptions::read())
        .with_context(|| format!("opening {name} in the store"))?;
    let meta = file.metadata()?;
    let mut dst =
        fs::File::create(host).with_context(|| format!("cannot create {}", host.display()))?;
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n = match file.read_at(&mut buf, offset) {
            Ok(n) => n,
            Err(e @ (valet_vfs::Error::Corrupt(_) | valet_vfs::Error::Device(_))) => {
                drop(dst);
                fs::remove_file(host)
                    .with_context(|| format!("cannot remove {}", host.display()))?;
                copied.damaged.push(format!("/{in_store}: {e}"));
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("reading {name} from the store")),
        };
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n])
            .with_context(|| format!("writing {}", host.display()))?;
        offset += n as u64;
    }
    let mtime = SystemTime::UNIX_EPOCH + Duration::from_nanos(meta.mtime_ns);
    // Keeping the time is a courtesy: a host filesystem that refuses it loses nothing.
    let _ = dst.set_modified(mtime);
    file.close()?;
    copied.files += 1;
    copied.bytes += offset;
    Ok(())
}
