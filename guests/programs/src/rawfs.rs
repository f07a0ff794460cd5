//! Shared by the `fsprobe` and `escape` guests: finding a preopened directory, printing one
//! transcript line per call, and the WASIp1 path calls made with raw byte paths (which std
//! and the `wasi` crate only take as UTF-8 `&str`).

#![allow(dead_code)]

use wasi::{Errno, Fd};

pub type R<T> = Result<T, Errno>;

/// Every right a descriptor can have (valet-run and stock wasmtime read only `FD_READ` and
/// `FD_WRITE` from them).
pub const ALL: wasi::Rights = (1 << 30) - 1;
pub const RO: wasi::Rights = ALL & !wasi::RIGHTS_FD_WRITE;
pub const WO: wasi::Rights = ALL & !wasi::RIGHTS_FD_READ;
pub const FOLLOW: wasi::Lookupflags = wasi::LOOKUPFLAGS_SYMLINK_FOLLOW;

/// `ENOENT`-style name of an errno.
pub fn errno_name(e: Errno) -> String {
    format!("E{}", e.name())
}

/// Prints `label -> ok[ detail]` or `label -> ENAME`.
pub fn show(label: &str, r: R<String>) {
    match r {
        Ok(s) if s.is_empty() => println!("{label} -> ok"),
        Ok(s) => println!("{label} -> ok {s}"),
        Err(e) => println!("{label} -> {}", errno_name(e)),
    }
}

/// The descriptor of the preopened directory called `name`.
pub fn find_preopen(name: &str) -> Option<Fd> {
    for fd in 3..64 {
        let Ok(st) = (unsafe { wasi::fd_prestat_get(fd) }) else {
            continue;
        };
        if st.tag != wasi::PREOPENTYPE_DIR.raw() {
            continue;
        }
        let len = unsafe { st.u.dir.pr_name_len };
        let mut buf = vec![0u8; len];
        if unsafe { wasi::fd_prestat_dir_name(fd, buf.as_mut_ptr(), len) }.is_err() {
            continue;
        }
        if buf == name.as_bytes() {
            return Some(fd);
        }
    }
    None
}

fn result(ret: i32) -> R<()> {
    match ret {
        0 => Ok(()),
        // `Errno` is a transparent u16 whose constructor is private; hosts only return
        // errnos that preview1 defines (0..=76).
        1..=76 => Err(unsafe { std::mem::transmute::<u16, Errno>(ret as u16) }),
        other => panic!("host returned errno {other}, which preview1 does not define"),
    }
}

/// `path_open` with a byte path.
pub fn open_raw(
    dir: Fd,
    lookup: wasi::Lookupflags,
    path: &[u8],
    oflags: wasi::Oflags,
    rights: wasi::Rights,
    fdflags: wasi::Fdflags,
) -> R<Fd> {
    let mut fd: Fd = 0;
    let ret = unsafe {
        wasi::wasi_snapshot_preview1::path_open(
            dir as i32,
            lookup as i32,
            path.as_ptr() as i32,
            path.len() as i32,
            oflags as i32,
            rights as i64,
            rights as i64,
            fdflags as i32,
            &mut fd as *mut Fd as i32,
        )
    };
    result(ret).map(|()| fd)
}

/// `path_create_directory` with a byte path.
pub fn mkdir_raw(dir: Fd, path: &[u8]) -> R<()> {
    result(unsafe {
        wasi::wasi_snapshot_preview1::path_create_directory(
            dir as i32,
            path.as_ptr() as i32,
            path.len() as i32,
        )
    })
}

/// `path_filestat_get` with a byte path; returns the file type's name.
pub fn stat_raw(dir: Fd, path: &[u8]) -> R<String> {
    let mut st = std::mem::MaybeUninit::<wasi::Filestat>::uninit();
    result(unsafe {
        wasi::wasi_snapshot_preview1::path_filestat_get(
            dir as i32,
            FOLLOW as i32,
            path.as_ptr() as i32,
            path.len() as i32,
            st.as_mut_ptr() as i32,
        )
    })?;
    Ok(unsafe { st.assume_init() }.filetype.name().to_string())
}

/// `path_rename` with byte paths.
pub fn rename_raw(from_dir: Fd, from: &[u8], to_dir: Fd, to: &[u8]) -> R<()> {
    result(unsafe {
        wasi::wasi_snapshot_preview1::path_rename(
            from_dir as i32,
            from.as_ptr() as i32,
            from.len() as i32,
            to_dir as i32,
            to.as_ptr() as i32,
            to.len() as i32,
        )
    })
}

/// `path_unlink_file` with a byte path.
pub fn unlink_raw(dir: Fd, path: &[u8]) -> R<()> {
    result(unsafe {
        wasi::wasi_snapshot_preview1::path_unlink_file(
            dir as i32,
            path.as_ptr() as i32,
            path.len() as i32,
        )
    })
}

/// Writes all of `data` at the descriptor's position.
pub fn write_all(fd: Fd, mut data: &[u8]) -> R<()> {
    while !data.is_empty() {
        let iov = [wasi::Ciovec {
            buf: data.as_ptr(),
            buf_len: data.len(),
        }];
        let n = unsafe { wasi::fd_write(fd, &iov) }?;
        data = &data[n..];
    }
    Ok(())
}

/// One directory entry as `fd_readdir` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub kind: wasi::Filetype,
    pub next: u64,
}

/// Every entry from `cookie` on, read with `fd_readdir` into a buffer of `buf_len` bytes
/// (grown when not even one entry fits), resuming from the cookie of the last whole entry.
pub fn readdir(fd: Fd, buf_len: usize, cookie: u64) -> R<Vec<Entry>> {
    let mut out = Vec::new();
    let mut cookie = cookie;
    let mut size = buf_len;
    loop {
        let mut buf = vec![0u8; size];
        let n = unsafe { wasi::fd_readdir(fd, buf.as_mut_ptr(), size, cookie) }?;
        let mut at = 0;
        let mut whole = 0;
        while at + 24 <= n {
            let next = u64::from_le_bytes(buf[at..at + 8].try_into().unwrap());
            let namlen = u32::from_le_bytes(buf[at + 16..at + 20].try_into().unwrap()) as usize;
            let kind = buf[at + 20];
            if at + 24 + namlen > n {
                break;
            }
            out.push(Entry {
                name: buf[at + 24..at + 24 + namlen].to_vec(),
                kind: match kind {
                    3 => wasi::FILETYPE_DIRECTORY,
                    4 => wasi::FILETYPE_REGULAR_FILE,
                    7 => wasi::FILETYPE_SYMBOLIC_LINK,
                    _ => wasi::FILETYPE_UNKNOWN,
                },
                next,
            });
            cookie = next;
            at += 24 + namlen;
            whole += 1;
        }
        if n < size {
            return Ok(out);
        }
        if whole == 0 {
            size *= 2;
        }
    }
}
