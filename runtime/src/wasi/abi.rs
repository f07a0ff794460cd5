//! The numbers of the WASIp1 ABI (`wasi_snapshot_preview1`): errno values, flags, file
//! types, rights, and the layouts of the structures passed by pointer. Written from the
//! preview1 witx; only what this host uses.

/// A WASI errno: a plain number, cheap to make and to return (no allocation, no backtrace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub u16);

macro_rules! errnos {
    ($($name:ident = $v:expr),* $(,)?) => {
        impl Errno { $(pub const $name: Errno = Errno($v);)* }
    };
}

errnos! {
    SUCCESS = 0, TOOBIG = 1, ACCES = 2, ADDRINUSE = 3, ADDRNOTAVAIL = 4, AFNOSUPPORT = 5,
    AGAIN = 6, ALREADY = 7, BADF = 8, BADMSG = 9, BUSY = 10, CANCELED = 11, CHILD = 12,
    CONNABORTED = 13, CONNREFUSED = 14, CONNRESET = 15, DEADLK = 16, DESTADDRREQ = 17,
    DOM = 18, DQUOT = 19, EXIST = 20, FAULT = 21, FBIG = 22, HOSTUNREACH = 23, IDRM = 24,
    ILSEQ = 25, INPROGRESS = 26, INTR = 27, INVAL = 28, IO = 29, ISCONN = 30, ISDIR = 31,
    LOOP = 32, MFILE = 33, MLINK = 34, MSGSIZE = 35, MULTIHOP = 36, NAMETOOLONG = 37,
    NETDOWN = 38, NETRESET = 39, NETUNREACH = 40, NFILE = 41, NOBUFS = 42, NODEV = 43,
    NOENT = 44, NOEXEC = 45, NOLCK = 46, NOLINK = 47, NOMEM = 48, NOMSG = 49,
    NOPROTOOPT = 50, NOSPC = 51, NOSYS = 52, NOTCONN = 53, NOTDIR = 54, NOTEMPTY = 55,
    NOTRECOVERABLE = 56, NOTSOCK = 57, NOTSUP = 58, NOTTY = 59, NXIO = 60, OVERFLOW = 61,
    OWNERDEAD = 62, PERM = 63, PIPE = 64, PROTO = 65, PROTONOSUPPORT = 66, PROTOTYPE = 67,
    RANGE = 68, ROFS = 69, SPIPE = 70, SRCH = 71, STALE = 72, TIMEDOUT = 73, TXTBSY = 74,
    XDEV = 75, NOTCAPABLE = 76,
}

impl Errno {
    /// The WASI errno for a Linux errno (EIO for one WASI has no name for).
    pub fn from_os(e: i32) -> Errno {
        use libc::*;
        match e {
            E2BIG => Errno::TOOBIG,
            EACCES => Errno::ACCES,
            EADDRINUSE => Errno::ADDRINUSE,
            EADDRNOTAVAIL => Errno::ADDRNOTAVAIL,
            EAFNOSUPPORT => Errno::AFNOSUPPORT,
            EAGAIN => Errno::AGAIN,
            EALREADY => Errno::ALREADY,
            EBADF => Errno::BADF,
            EBADMSG => Errno::BADMSG,
            EBUSY => Errno::BUSY,
            ECANCELED => Errno::CANCELED,
            ECHILD => Errno::CHILD,
            ECONNABORTED => Errno::CONNABORTED,
            ECONNREFUSED => Errno::CONNREFUSED,
            ECONNRESET => Errno::CONNRESET,
            EDEADLK => Errno::DEADLK,
            EDESTADDRREQ => Errno::DESTADDRREQ,
            EDOM => Errno::DOM,
            EDQUOT => Errno::DQUOT,
            EEXIST => Errno::EXIST,
            EFAULT => Errno::FAULT,
            EFBIG => Errno::FBIG,
            EHOSTUNREACH => Errno::HOSTUNREACH,
            EIDRM => Errno::IDRM,
            EILSEQ => Errno::ILSEQ,
            EINPROGRESS => Errno::INPROGRESS,
            EINTR => Errno::INTR,
            EINVAL => Errno::INVAL,
            EIO => Errno::IO,
            EISCONN => Errno::ISCONN,
            EISDIR => Errno::ISDIR,
            ELOOP => Errno::LOOP,
            EMFILE => Errno::MFILE,
            EMLINK => Errno::MLINK,
            EMSGSIZE => Errno::MSGSIZE,
            EMULTIHOP => Errno::MULTIHOP,
            ENAMETOOLONG => Errno::NAMETOOLONG,
            ENETDOWN => Errno::NETDOWN,
            ENETRESET => Errno::NETRESET,
            ENETUNREACH => Errno::NETUNREACH,
            ENFILE => Errno::NFILE,
            ENOBUFS => Errno::NOBUFS,
            ENODEV => Errno::NODEV,
            ENOENT => Errno::NOENT,
            ENOEXEC => Errno::NOEXEC,
            ENOLCK => Errno::NOLCK,
            ENOLINK => Errno::NOLINK,
            ENOMEM => Errno::NOMEM,
            ENOMSG => Errno::NOMSG,
            ENOPROTOOPT => Errno::NOPROTOOPT,
            ENOSPC => Errno::NOSPC,
            ENOSYS => Errno::NOSYS,
            ENOTCONN => Errno::NOTCONN,
            ENOTDIR => Errno::NOTDIR,
            ENOTEMPTY => Errno::NOTEMPTY,
            ENOTRECOVERABLE => Errno::NOTRECOVERABLE,
            ENOTSOCK => Errno::NOTSOCK,
            ENOTSUP => Errno::NOTSUP,
            ENOTTY => Errno::NOTTY,
            ENXIO => Errno::NXIO,
            EOVERFLOW => Errno::OVERFLOW,
            EOWNERDEAD => Errno::OWNERDEAD,
            EPERM => Errno::PERM,
            EPIPE => Errno::PIPE,
            EPROTO => Errno::PROTO,
            EPROTONOSUPPORT => Errno::PROTONOSUPPORT,
            EPROTOTYPE => Errno::PROTOTYPE,
            ERANGE => Errno::RANGE,
            EROFS => Errno::ROFS,
            ESPIPE => Errno::SPIPE,
            ESRCH => Errno::SRCH,
            ESTALE => Errno::STALE,
            ETIMEDOUT => Errno::TIMEDOUT,
            ETXTBSY => Errno::TXTBSY,
            EXDEV => Errno::XDEV,
            _ => Errno::IO,
        }
    }
}

impl From<valet_vfs::Error> for Errno {
    fn from(e: valet_vfs::Error) -> Errno {
        Errno::from_os(e.errno())
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        match e.raw_os_error() {
            Some(code) => Errno::from_os(code),
            None => match e.kind() {
                std::io::ErrorKind::NotFound => Errno::NOENT,
                std::io::ErrorKind::PermissionDenied => Errno::PERM,
                std::io::ErrorKind::AlreadyExists => Errno::EXIST,
                std::io::ErrorKind::InvalidInput => Errno::INVAL,
                std::io::ErrorKind::WouldBlock => Errno::AGAIN,
                std::io::ErrorKind::Unsupported => Errno::NOTSUP,
                _ => Errno::IO,
            },
        }
    }
}

/// `filetype`.
pub mod filetype {
    pub const UNKNOWN: u8 = 0;
    pub const BLOCK_DEVICE: u8 = 1;
    pub const CHARACTER_DEVICE: u8 = 2;
    pub const DIRECTORY: u8 = 3;
    pub const REGULAR_FILE: u8 = 4;
    pub const SOCKET_STREAM: u8 = 6;
    pub const SYMBOLIC_LINK: u8 = 7;
}

/// `fdflags`.
pub mod fdflags {
    pub const APPEND: u16 = 1;
    pub const DSYNC: u16 = 2;
    pub const NONBLOCK: u16 = 4;
    pub const RSYNC: u16 = 8;
    pub const SYNC: u16 = 16;
    pub const ALL: u16 = 31;
}

/// `oflags`.
pub mod oflags {
    pub const CREAT: u16 = 1;
    pub const DIRECTORY: u16 = 2;
    pub const EXCL: u16 = 4;
    pub const TRUNC: u16 = 8;
}

/// `lookupflags`.
pub const SYMLINK_FOLLOW: u32 = 1;

/// `fstflags`.
pub mod fstflags {
    pub const ATIM: u16 = 1;
    pub const ATIM_NOW: u16 = 2;
    pub const MTIM: u16 = 4;
    pub const MTIM_NOW: u16 = 8;
}

/// `rights` (only the bits this host looks at or reports).
pub mod rights {
    pub const FD_DATASYNC: u64 = 1;
    pub const FD_READ: u64 = 1 << 1;
    pub const FD_WRITE: u64 = 1 << 6;
    pub const FD_ALLOCATE: u64 = 1 << 8;
    pub const FD_FILESTAT_SET_SIZE: u64 = 1 << 22;
    /// The rights any one of which makes an opened file writable, as wasmtime's preview1
    /// decides (wasi-libc gives all four for `O_WRONLY` and `O_RDWR`, none for `O_RDONLY`).
    pub const WRITES: u64 = FD_DATASYNC | FD_WRITE | FD_ALLOCATE | FD_FILESTAT_SET_SIZE;
    /// Every right defined by preview1 (bits 0..=29).
    pub const ALL: u64 = (1 << 30) - 1;
}

/// `whence`.
pub mod whence {
    pub const SET: u8 = 0;
    pub const CUR: u8 = 1;
    pub const END: u8 = 2;
}

/// `clockid`.
pub mod clock {
    pub const REALTIME: u32 = 0;
    pub const MONOTONIC: u32 = 1;
    pub const PROCESS_CPUTIME: u32 = 2;
    pub const THREAD_CPUTIME: u32 = 3;
}

/// `advice`.
pub const ADVICE_WILLNEED: u8 = 3;
/// The highest `advice` value.
pub const ADVICE_MAX: u8 = 5;

/// `preopentype`: a directory.
pub const PREOPEN_DIR: u8 = 0;

/// `filestat` (64 bytes) as the host fills it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Filestat {
    pub dev: u64,
    pub ino: u64,
    pub filetype: u8,
    pub nlink: u64,
    pub size: u64,
    pub atim: u64,
    pub mtim: u64,
    pub ctim: u64,
}

/// `dirent` header size; the name follows it.
pub const DIRENT_SIZE: usize = 24;
/// `subscription` size.
pub const SUBSCRIPTION_SIZE: u32 = 48;
/// `event` size.
pub const EVENT_SIZE: u32 = 32;
