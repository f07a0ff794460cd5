//! The wire between a container's shim and the node agent: one Unix stream connection per
//! container, messages as a 4-byte big-endian length and JSON, and file descriptors passed
//! with a message (SCM_RIGHTS), so the agent gets the container's rootfs and stdio as open
//! files and never needs to see the shim's paths.
//!
//! A container's conversation: the shim sends [`ToAgent::Create`] with the rootfs directory
//! and the stdio files; the agent answers [`FromAgent::Created`] (module compiled, tenant,
//! policy and quota in place) or [`FromAgent::Failed`]. Then [`ToAgent::Start`]: the agent
//! answers [`FromAgent::Started`] and runs the guest, and later [`FromAgent::Exited`] (or
//! `Failed` for a failure of ours). [`ToAgent::Kill`] may come at any time. The connection
//! closing on the shim's side stops the guest, as a kill does.
//!
//! Compiled modules: a shim that can reach containerd's content store says so
//! ([`Create::content_store`]). Then, before `Created`, an agent that does not hold the
//! module compiled asks for it ([`FromAgent::Lookup`]; the shim answers
//! [`ToAgent::Precompiled`] with the compiled module as a descriptor, or without one), and
//! one that had to compile it hands the result over to be kept ([`FromAgent::Compiled`]).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Largest message either side accepts.
pub const MAX_MESSAGE: usize = 4 << 20;
/// Most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// Where the agent listens unless told otherwise (the shim reads `VALET_NODE_SOCKET`).
pub const DEFAULT_SOCKET: &str = "/run/valet/node.sock";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ToAgent {
    /// Prepare a container. Descriptors: the rootfs directory, then those of stdin,
    /// stdout and stderr that `stdio` marks present, in that order, then the module when
    /// [`Create::module_fd`] says so.
    Create(Create),
    Start,
    /// The answer to [`FromAgent::Lookup`]: one descriptor with the module as the agent's
    /// engine serialized it, or none when the content store has none.
    Precompiled,
    /// Stop the guest as this signal would stop a process.
    Kill {
        signal: i32,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Create {
    /// The container id (for messages and the default tenant).
    pub id: String,
    /// The module's path inside the rootfs (the OCI process's first argument).
    pub module: String,
    /// The guest's argv (the OCI process args).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The container's annotations (the agent reads the `valet.io/*` ones and the CRI's
    /// pod name).
    pub annotations: BTreeMap<String, String>,
    /// Which of stdin, stdout and stderr come as descriptors after the rootfs.
    pub stdio: [bool; 3],
    /// The shim fetches and keeps compiled modules in containerd's content store.
    #[serde(default)]
    pub content_store: bool,
    /// The module comes as the last descriptor (the image's wasm layer, OCI media type
    /// `application/wasm`), not from the rootfs; `module` then only names it.
    #[serde(default)]
    pub module_fd: bool,
    /// The container's memory limit in bytes (the OCI spec's
    /// `linux.resources.memory.limit`, from the pod's `resources.limits.memory`): the most
    /// linear memory its guest may have (see [`crate::host::GuestSpec::memory_limit`]).
    #[serde(default)]
    pub memory_limit: Option<u64>,
    /// The container's pids limit (the OCI spec's `linux.resources.pids.limit`, from
    /// kubelet's pod pids limit): the most threads its guest may run at once (see
    /// [`crate::host::GuestSpec::thread_limit`]).
    #[serde(default)]
    pub pids_limit: Option<u32>,
    /// The container's CPU limit (the OCI spec's `linux.resources.cpu`, from the pod's
    /// `resources.limits.cpu`): the most CPU time its guest may use per period (see
    /// [`crate::cpu_limit`]).
    #[serde(default)]
    pub cpu_limit: Option<CpuQuota>,
}

/// A CPU quota as the OCI spec gives it: `quota_us` of CPU time in every `period_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuQuota {
    pub quota_us: u64,
    pub period_us: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FromAgent {
    /// Is the module whose source has this digest (`sha256:HEX`) kept compiled by an
    /// engine of this tag? (Answered with [`ToAgent::Precompiled`].)
    Lookup {
        source: String,
        engine: String,
    },
    /// The module was compiled here: one descriptor with it serialized, to keep.
    Compiled {
        source: String,
        engine: String,
    },
    Created,
    Started,
    Exited {
        code: i32,
    },
    /// One line saying what went wrong (our failure, not the guest's).
    Failed {
        message: String,
    },
}

/// An anonymous in-memory file holding `data`, to pass as a descriptor.
pub fn memfd_with(data: &[u8]) -> io::Result<std::fs::File> {
    // SAFETY: a valid C string; the returned descriptor is checked and then owned.
    let fd = unsafe { libc::memfd_create(c"valet-module".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(data)?;
    Ok(file)
}

/// Largest module (WebAssembly) the agent reads, from the rootfs or the shim: far above
/// any real guest (a Go or LevelDB guest is tens of MiB), and a bound on what one pod's
/// image makes the agent hold in memory.
pub const MAX_MODULE: u64 = 512 << 20;
/// Largest compiled module either side reads (compiled code is a few times its source).
pub const MAX_COMPILED: u64 = 2 << 30;

/// All bytes of a passed file, from its start whatever its offset: a regular file (a
/// memfd) of at most [`MAX_COMPILED`] bytes.
pub fn read_all(file: &std::fs::File) -> io::Result<Vec<u8>> {
    read_at_most(file, MAX_COMPILED)
}

/// All bytes of a passed file, which must be a regular file of at most `limit` bytes: a
/// pipe or a device would block the reader or never end, and its length is not trusted
/// past `limit` (the memory it would take).
pub fn read_at_most(file: &std::fs::File, limit: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.len() > limit {
        return Err(io::Error::other(format!(
            "{} bytes, over the agent's limit of {} MiB",
            meta.len(),
            limit >> 20
        )));
    }
    let mut data = vec![0; meta.len() as usize];
    file.read_exact_at(&mut data, 0)?;
    Ok(data)
}

/// Sends one message with `fds` attached.
pub fn send<T: Serialize>(sock: &UnixStream, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS, "too many descriptors for one message");
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_MESSAGE {
        return Err(io::Error::other("message too large"));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(&body);
    // The descriptors ride on the first sendmsg; whatever it did not take follows plainly.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if !fds.is_empty() {
        let data_len = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_* compute sizes and walk the control buffer we own, which is large
        // enough for MAX_FDS descriptors and aligned for cmsghdr.
        unsafe {
            hdr.msg_control = control.as_mut_ptr().cast();
            hdr.msg_controllen = libc::CMSG_SPACE(data_len) as _;
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_len) as _;
            let data = libc::CMSG_DATA(c) as *mut RawFd;
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    let sent = loop {
        // SAFETY: hdr points at live buffers.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    (&*sock).write_all(&buf[sent..])
}

/// Receives one message and the descriptors sent with it; `None` when the other side closed
/// the connection between messages.
pub fn recv<T: DeserializeOwned>(sock: &UnixStream) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut len = [0u8; 4];
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: len.as_mut_ptr().cast(),
        iov_len: len.len(),
    };
    // SAFETY: as in `send`.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of_val(&control) as _;
    let got = loop {
        // SAFETY: hdr points at live buffers.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Take ownership of every descriptor first, so none leaks on an error below.
    let mut fds = Vec::new();
    // SAFETY: the kernel filled the control buffer; CMSG_* walk it within its length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c) as *const RawFd;
                for i in 0..n {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    if hdr.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("too many descriptors with one message"));
    }
    if got == 0 {
        return Ok(None);
    }
    (&*sock).read_exact(&mut len[got..])?;
    let size = u32::from_be_bytes(len) as usize;
    if size > MAX_MESSAGE {
        return Err(io::Error::other(format!(
            "message of {size} bytes is too large"
        )));
    }
    let mut body = vec![0; size];
    (&*sock).read_exact(&mut body)?;
    let msg = serde_json::from_slice(&body).map_err(io::Error::other)?;
    Ok(Some((msg, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn messages_carry_their_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = UnixStream::pair().unwrap();
        let msg = ToAgent::Create(Create {
            id: "c1".into(),
            module: "/app.wasm".into(),
            args: vec!["/app.wasm".into(), "x".into()],
            env: vec![("K".into(), "V".into())],
            annotations: [("valet.io/tenant".to_string(), "t".to_string())].into(),
            stdio: [false, true, false],
            content_store: false,
            module_fd: false,
            memory_limit: Some(64 << 20),
            pids_limit: Some(32),
            cpu_limit: Some(CpuQuota {
                quota_us: 50_000,
                period_us: 100_000,
            }),
        });
        send(&a, &msg, &[w.as_fd()]).unwrap();
        send(&a, &ToAgent::Kill { signal: 9 }, &[]).unwrap();
        drop(a);
        let (got, fds) = recv::<ToAgent>(&b).unwrap().unwrap();
        assert_eq!(got, msg);
        assert_eq!(fds.len(), 1);
        // The received descriptor is the same socket: what we write through it arrives.
        let passed = UnixStream::from(fds.into_iter().next().unwrap());
        drop(w);
        (&passed).write_all(b"hi").unwrap();
        drop(passed);
        let mut text = String::new();
        (&r).read_to_string(&mut text).unwrap();
        assert_eq!(text, "hi");
        let (got, fds) = recv::<ToAgent>(&b).unwrap().unwrap();
        assert_eq!(got, ToAgent::Kill { signal: 9 });
        assert!(fds.is_empty());
        assert!(recv::<ToAgent>(&b).unwrap().is_none());
    }

    #[test]
    fn a_memfd_carries_bytes_whatever_its_offset() {
        let f = memfd_with(b"compiled").unwrap();
        assert_eq!(read_all(&f).unwrap(), b"compiled");
        // Past the limit, or not a regular file (a pipe would block the agent): refused.
        let err = read_at_most(&f, 7).unwrap_err().to_string();
        assert!(err.contains("over the agent's limit"), "{err}");
        let (r, _w) = UnixStream::pair().unwrap();
        let pipe = std::fs::File::from(OwnedFd::from(r));
        let err = read_at_most(&pipe, MAX_MODULE).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        // A create from an older shim (no content_store field) still parses.
        let old = r#"{"Create":{"id":"c","module":"/m","args":[],"env":[],"annotations":{},"stdio":[false,false,false]}}"#;
        let ToAgent::Create(c) = serde_json::from_str::<ToAgent>(old).unwrap() else {
            panic!("not a create");
        };
        assert!(!c.content_store && !c.module_fd);
    }

    #[test]
    fn a_torn_or_oversized_message_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[0, 0]).unwrap();
        drop(a);
        assert!(recv::<ToAgent>(&b).is_err());
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(recv::<ToAgent>(&b).is_err());
    }
}
