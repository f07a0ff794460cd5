//! The store's error type, with the errno a POSIX filesystem would give for each case.

use crate::device::DeviceError;

/// Result of store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name too long")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("path leaves its mount")]
    Escape,
    #[error("operation not permitted: {0}")]
    NotAllowed(&'static str),
    #[error("bad file handle")]
    BadHandle,
    #[error("file not open for {0}")]
    NotPermitted(&'static str),
    #[error("file too large")]
    TooLarge,
    #[error("no space left on device: {0}")]
    NoSpace(String),
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// A device flush or a store operation failed in a way that may have lost acknowledged
    /// state; the store refuses further changes until it is mounted again.
    #[error("store stopped after a failure: {0}")]
    Stopped(String),
    /// A change asked of a store mounted read-only ([`crate::StoreConfig::read_only`]).
    #[error("read-only store")]
    ReadOnly,
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The I/O error is in the message, not its source: one line shows it once.
    #[error("host I/O: {0}")]
    Io(std::io::Error),
    #[error("too many levels of symbolic links")]
    Loop,
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl Error {
    /// The errno (Linux numbering) a POSIX filesystem would return.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Invalid(_) => libc::EINVAL,
            Error::Escape | Error::NotAllowed(_) => libc::EPERM,
            Error::BadHandle | Error::NotPermitted(_) => libc::EBADF,
            Error::TooLarge => libc::EFBIG,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::Unsupported(_) => libc::ENOTSUP,
            Error::ReadOnly | Error::Device(DeviceError::ReadOnly(_)) => libc::EROFS,
            // The host's file system under the image is full: nothing was lost, there is
            // no room (and a later sync may succeed), as a native write or fsync says.
            Error::Device(DeviceError::Io(e)) => match e.raw_os_error() {
                Some(full @ (libc::ENOSPC | libc::EDQUOT)) => full,
                _ => libc::EIO,
            },
            Error::Corrupt(_) | Error::Stopped(_) | Error::Device(_) => libc::EIO,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Loop => libc::ELOOP,
        }
    }
}
