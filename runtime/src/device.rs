//! Opening the device a run stores its files on: the embedded default (an emulated ZNS image
//! in a directory, created on first use), a zonefs mount of a real ZNS drive, or an NVMe
//! namespace with FDP. The real devices' geometry is read from the devices themselves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use valet_vfs::device::{
    DeviceError, FdpDevice, FdpOptions, Geometry, ImageDevice, ImageOptions, IoMode, ZonedDevice,
    ZonefsDevice, ZonefsOptions,
};
use valet_vfs::{Store, StoreConfig};

/// How often a writable mount makes what guests wrote and did not sync durable
/// (`StoreConfig::writeback`): the age at which the kernel writes dirty data back
/// (`vm.dirty_expire_centisecs`). Every 5 s (ext4's journal commit) cost a write-heavy
/// unsynced guest its tail: the cache's sets' P99.99 1.4 ms → 2.4 ms (medians of seven
/// pairs, 500,000 sets).
pub const DEFAULT_WRITEBACK: Duration = Duration::from_secs(30);

/// How often a writable mount hands what guests wrote and did not sync to the host
/// (`StoreConfig::handoff`: written and journaled, no flush), so that a killed process
/// loses at most about this much, where a native program loses nothing its writes handed
/// to the kernel.
pub const DEFAULT_HANDOFF: Duration = Duration::from_secs(5);

/// Where the store lives and how to create it.
#[derive(Clone, Debug)]
pub struct DeviceSpec {
    /// A directory holding `zones.img` and the conventional area `conventional/`.
    pub dir: PathBuf,
    /// A zonefs mount to use instead of the image (its conventional area stays in `dir`).
    pub zonefs: Option<PathBuf>,
    /// Zone capacity of an emulated zonefs layout, when it does not say (a real mount's
    /// capacity comes from the drive's zone report and must agree).
    pub zonefs_capacity: Option<u64>,
    /// An NVMe namespace with FDP (`/dev/ngXnY` or `/dev/nvmeXnY`) to use instead of the
    /// image (its conventional area stays in `dir`). A blank namespace is formatted.
    pub fdp: Option<PathBuf>,
    /// Geometry for a new image (ignored when the image exists).
    pub geometry: Geometry,
    pub io: IoMode,
    /// How often a writable mount writes back what was not synced; None: never (only
    /// syncs, closes and the unmount make it durable).
    pub writeback: Option<Duration>,
    /// How often a writable mount hands what was not synced to the host, without a flush;
    /// None: never.
    pub handoff: Option<Duration>,
}

impl DeviceSpec {
    /// The embedded default device in `dir` (an image of `geometry` when it is created),
    /// with the I/O engine the kernel allows.
    pub fn image(dir: impl Into<PathBuf>, geometry: Geometry) -> DeviceSpec {
        DeviceSpec {
            dir: dir.into(),
            zonefs: None,
            zonefs_capacity: None,
            fdp: None,
            geometry,
            io: IoMode::Auto,
            writeback: Some(DEFAULT_WRITEBACK),
            handoff: Some(DEFAULT_HANDOFF),
        }
    }

    pub fn image_path(&self) -> PathBuf {
        self.dir.join("zones.img")
    }

    fn conventional_dir(&self) -> PathBuf {
        self.dir.join("conventional")
    }

    /// Opens (creating on first use) the device.
    pub fn open_device(&self) -> Result<Arc<dyn ZonedDevice>> {
        self.open_device_as(false, false)
    }

    /// Opens the device; `existing` refuses a blank FDP namespace instead of formatting it,
    /// and `read_only` (which implies it) opens it for reading only: nothing is written.
    fn open_device_as(&self, read_only: bool, existing: bool) -> Result<Arc<dyn ZonedDevice>> {
        if let Some(root) = &self.zonefs {
            let options = ZonefsOptions {
                zone_capacity: self.zonefs_capacity,
                read_only,
                ..Default::default()
            };
            let dev = ZonefsDevice::open(root, options)
                .with_context(|| format!("opening zonefs at {}", root.display()))?;
            return Ok(Arc::new(dev));
        }
        if let Some(node) = &self.fdp {
            let options = FdpOptions {
                read_only,
                existing,
                ..Default::default()
            };
            let dev = match FdpDevice::open(node, options) {
                Err(DeviceError::Blank) => bail!("no store on the drive at {}", node.display()),
                opened => opened
                    .with_context(|| format!("opening the FDP namespace {}", node.display()))?,
            };
            return Ok(Arc::new(dev));
        }
        if self.dir.exists() && !self.dir.is_dir() {
            bail!(
                "--device {}: not a directory (the device is a directory holding zones.img)",
                self.dir.display()
            );
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let options = ImageOptions {
            io: self.io,
            accept_existing_geometry: true,
            read_only,
        };
        let dev = ImageDevice::open_or_create(self.image_path(), self.geometry, options)?;
        Ok(Arc::new(dev))
    }

    /// Mounts the store on the device.
    pub fn mount(&self) -> Result<Store> {
        self.mount_on(self.open_device()?)
    }

    fn mount_on(&self, device: Arc<dyn ZonedDevice>) -> Result<Store> {
        let config = StoreConfig {
            conventional_dir: Some(self.conventional_dir()),
            writeback: self.writeback,
            handoff: self.handoff,
            ..Default::default()
        };
        Store::open(device, config).context("mounting the store")
    }

    /// Mounts an existing store only: tools that inspect must not create one (a blank
    /// drive would be formatted by a mount).
    pub fn mount_existing(&self) -> Result<Store> {
        let device = self.existing_device(false)?;
        self.mount_on(device)
    }

    /// Mounts an existing store read-only ([`StoreConfig::read_only`]): nothing on the
    /// device or in the conventional area changes, and a store in use by a running
    /// `valet-run` is refused (its image is locked).
    pub fn mount_read_only(&self) -> Result<Store> {
        let device = self.existing_device(true)?;
        let config = StoreConfig {
            conventional_dir: Some(self.conventional_dir()),
            read_only: true,
            ..Default::default()
        };
        Store::open(device, config).context("mounting the store read-only")
    }

    /// The device of an existing store: refuses a missing image and a blank drive.
    fn existing_device(&self, read_only: bool) -> Result<Arc<dyn ZonedDevice>> {
        if self.zonefs.is_none() && self.fdp.is_none() && !self.image_path().exists() {
            bail!("no store at {}", Path::new(&self.dir).display());
        }
        let device = self.open_device_as(read_only, true)?;
        if let Some(root) = self.zonefs.as_ref().or(self.fdp.as_ref()) {
            if device.report_zones().iter().all(|z| z.write_pointer == 0) {
                bail!("no store on the drive at {}", root.display());
            }
        }
        Ok(device)
    }
}
