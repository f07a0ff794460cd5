//! One writer per device. A device opened for writing holds an exclusive `flock` on what
//! stores it (the image file, an FDP namespace's block device, a zonefs mount's root); one
//! opened to be read holds a shared one. Two writers would overwrite each other's zones, and
//! a reader beside a writer would see the metadata change under it, so both are refused
//! with one line naming what is in use.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::DeviceError;

/// How long a refused lock is retried: a process killed a moment ago may still hold it for
/// a few milliseconds while the kernel tears down its io_uring, and a supervisor restarting
/// it at once must not fail for that.
const PATIENCE: Duration = Duration::from_millis(500);

/// Locks `file`, which opens the device at `path`: shared to read it, exclusive to write it.
/// `what` names the device in the error ("image", "namespace", "zonefs mount").
pub(super) fn lock(
    path: &Path,
    file: &File,
    read_only: bool,
    what: &str,
) -> Result<(), DeviceError> {
    let mode = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    let start = Instant::now();
    loop {
        // SAFETY: a plain syscall on a descriptor the caller owns.
        if unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        let why = if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            format!("cannot lock: {err}")
        } else if start.elapsed() >= PATIENCE {
            format!("{what} is in use by another process")
        } else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        return Err(DeviceError::BadImage {
            path: path.display().to_string(),
            why,
        });
    }
}
