//! Positioned reads and writes (`pread`/`pwrite`) on a `std::fs::File`, for the guests that
//! also build natively: std's `FileExt` is stable on Unix but not yet on WASI, so WASI goes
//! through the raw `fd_pread`/`fd_pwrite` calls. One call each: callers loop on short counts.

// Included with `#[path]` by several programs, each using its own subset.
#![allow(dead_code)]

use std::fs::File;
use std::io;

#[cfg(unix)]
pub fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, at)
}

#[cfg(unix)]
pub fn write_at(file: &File, buf: &[u8], at: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::write_at(file, buf, at)
}

#[cfg(target_os = "wasi")]
fn wasi_error(e: wasi::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw().into())
}

#[cfg(target_os = "wasi")]
pub fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let iov = wasi::Iovec {
        buf: buf.as_mut_ptr(),
        buf_len: buf.len(),
    };
    // SAFETY: the iovec points into `buf`, which outlives the call.
    unsafe { wasi::fd_pread(file.as_raw_fd() as wasi::Fd, &[iov], at) }.map_err(wasi_error)
}

#[cfg(target_os = "wasi")]
pub fn write_at(file: &File, buf: &[u8], at: u64) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let iov = wasi::Ciovec {
        buf: buf.as_ptr(),
        buf_len: buf.len(),
    };
    // SAFETY: the iovec points into `buf`, which outlives the call.
    unsafe { wasi::fd_pwrite(file.as_raw_fd() as wasi::Fd, &[iov], at) }.map_err(wasi_error)
}
