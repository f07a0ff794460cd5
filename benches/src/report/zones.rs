//! Which stream owns each zone of a finished run's device, read from the store itself
//! ([`valet_vfs::Store::zone_owners`]) once `valet-run` has exited.

use std::path::Path;
use std::sync::Arc;

use valet_vfs::device::{Geometry, ImageDevice, ImageOptions, IoMode, ZonedDevice};
use valet_vfs::{Store, StoreConfig};

/// Every zone of a device and, for data zones, the stream that owns it.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneMap {
    pub zones: u32,
    /// (zone, owner label such as `default/stream 2`), by zone.
    pub owners: Vec<(u32, String)>,
}

/// Mounts the store in `device_dir` (as `valet-run --device` left it) and reads its owners.
pub fn read(device_dir: &Path) -> Result<ZoneMap, String> {
    let options = ImageOptions {
        io: IoMode::Sync,
        accept_existing_geometry: true,
        read_only: false,
    };
    let image = device_dir.join("zones.img");
    if !image.exists() {
        return Err(format!("no image at {}", image.display()));
    }
    let device = ImageDevice::open_or_create(&image, Geometry::EMBEDDED_DEFAULT, options)
        .map_err(|e| e.to_string())?;
    let zones = device.geometry().zone_count;
    let config = StoreConfig {
        conventional_dir: Some(device_dir.join("conventional")),
        ..Default::default()
    };
    let store =
        Store::open(Arc::new(device) as Arc<dyn ZonedDevice>, config).map_err(|e| e.to_string())?;
    let tenants = store.tenants();
    let name = |id| {
        tenants
            .iter()
            .find(|(t, _, _)| *t == id)
            .map_or_else(|| format!("tenant {id}"), |(_, n, _)| n.clone())
    };
    let owners = store
        .zone_owners()
        .into_iter()
        .map(|(zone, tenant, stream)| (zone, format!("{}/stream {stream}", name(tenant))))
        .collect();
    Ok(ZoneMap { zones, owners })
}
