//! What the kernel says about a block device, from sysfs: the queue limits a zoned or FDP
//! backend sizes itself by (zone size, open / active zone limits, logical block size, write
//! streams) and the device node behind a mounted file system.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One block device as sysfs shows it (`/sys/class/block/<name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDev {
    /// Kernel name, e.g. `nvme0n1`.
    pub name: String,
}

impl BlockDev {
    /// The block device `path` names: a node such as `/dev/nvme0n1`, or the generic NVMe
    /// character device `/dev/ng0n1`, whose block device is `nvme0n1`.
    pub fn of_node(path: &Path) -> io::Result<BlockDev> {
        let real = std::fs::canonicalize(path)?;
        let name = real
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::other(format!("{}: not a device node", path.display())))?;
        let name = match name.strip_prefix("ng") {
            // /dev/ngXnY is the generic char device of namespace nvmeXnY.
            Some(rest) => format!("nvme{rest}"),
            None => name.to_string(),
        };
        let dev = BlockDev { name };
        if !dev.sys().exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no block device {} in sysfs", path.display(), dev.name),
            ));
        }
        Ok(dev)
    }

    /// The block device a file system holding `path` is mounted from.
    pub fn mounted_at(path: &Path) -> io::Result<BlockDev> {
        let dev = std::fs::metadata(path)?.dev();
        let link = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
        let target = std::fs::read_link(&link)?;
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::other(format!("{link}: unexpected link")))?;
        Ok(BlockDev {
            name: name.to_string(),
        })
    }

    fn sys(&self) -> PathBuf {
        Path::new("/sys/class/block").join(&self.name)
    }

    /// The device node, `/dev/<name>`.
    pub fn node(&self) -> PathBuf {
        Path::new("/dev").join(&self.name)
    }

    /// A raw attribute, trimmed (`queue/chunk_sectors`, `nsid`, ...).
    pub fn attr(&self, name: &str) -> io::Result<String> {
        let path = self.sys().join(name);
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }

    /// A numeric attribute.
    pub fn number(&self, name: &str) -> io::Result<u64> {
        let text = self.attr(name)?;
        text.parse()
            .map_err(|_| io::Error::other(format!("{}/{name}: not a number: `{text}`", self.name)))
    }

    /// A numeric attribute, or `None` where this kernel has no such attribute.
    pub fn number_if_present(&self, name: &str) -> io::Result<Option<u64>> {
        if !self.sys().join(name).exists() {
            return Ok(None);
        }
        self.number(name).map(Some)
    }

    /// `host-managed`, `host-aware` or `none`.
    pub fn zoned_model(&self) -> io::Result<String> {
        self.attr("queue/zoned")
    }

    /// Zone size in bytes (0 for a device without zones).
    pub fn zone_size(&self) -> io::Result<u64> {
        Ok(self.number("queue/chunk_sectors")? * 512)
    }

    /// Logical block size in bytes.
    pub fn logical_block_size(&self) -> io::Result<u32> {
        Ok(self.number("queue/logical_block_size")? as u32)
    }

    /// Device size in bytes.
    pub fn size(&self) -> io::Result<u64> {
        Ok(self.number("size")? * 512)
    }

    /// Most open zones the device allows (0: no limit).
    pub fn max_open_zones(&self) -> io::Result<u32> {
        Ok(self.number("queue/max_open_zones")? as u32)
    }

    /// Most active zones the device allows (0: no limit).
    pub fn max_active_zones(&self) -> io::Result<u32> {
        Ok(self.number("queue/max_active_zones")? as u32)
    }

    /// Write streams (FDP placement handles) the block layer offers, on kernels ≥ 6.16.
    pub fn max_write_streams(&self) -> io::Result<u32> {
        Ok(self
            .number_if_present("queue/max_write_streams")?
            .unwrap_or(0) as u32)
    }

    /// The NVMe namespace id, for an NVMe namespace.
    pub fn nsid(&self) -> io::Result<u32> {
        Ok(self.number("nsid")? as u32)
    }
}
