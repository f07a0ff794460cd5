//! NVMe passthrough: the commands the FDP backend sends around the block layer.
//!
//! - Writes tagged with a placement identifier (Write with DTYPE = 2, data placement, and
//!   DSPEC = the identifier) through io_uring `IORING_OP_URING_CMD` on the namespace's
//!   generic character device `/dev/ngXnY`, the way FDPFS writes; where io_uring is refused,
//!   the same command through the synchronous `NVME_IOCTL_IO_CMD`. On kernels that offer
//!   the placement handles as block-layer write streams (6.16+), an ordinary io_uring write
//!   to the block device carrying the stream instead ([`PlacementWriter::with_streams`]).
//! - I/O Management Receive (Reclaim Unit Handle Status): the placement identifiers the
//!   namespace may use.
//! - Identify Namespace and Get Log Page (FDP Configurations) through the controller's
//!   admin queue: the endurance group and the reclaim unit size.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// `_IO('N', 0x40)`: the namespace id of a namespace device.
const NVME_IOCTL_ID: u64 = 0x4E40;
/// `_IOWR('N', 0x41, struct nvme_passthru_cmd)`.
const NVME_IOCTL_ADMIN_CMD: u64 = 0xC048_4E41;
/// `_IOWR('N', 0x43, struct nvme_passthru_cmd)`.
const NVME_IOCTL_IO_CMD: u64 = 0xC048_4E43;
/// `_IOWR('N', 0x80, struct nvme_uring_cmd)`.
const NVME_URING_CMD_IO: u32 = 0xC048_4E80;

const OP_WRITE: u8 = 0x01;
const OP_IO_MGMT_RECV: u8 = 0x12;
const ADMIN_GET_LOG_PAGE: u8 = 0x02;
const ADMIN_IDENTIFY: u8 = 0x06;
const LOG_FDP_CONFIGS: u32 = 0x20;
/// Directive type "data placement" in a write's CDW12.
const DTYPE_PLACEMENT: u32 = 2;

/// `struct nvme_passthru_cmd` / `struct nvme_uring_cmd` (the same 72 bytes, except that the
/// ioctl form returns the completion's result in the last word).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct Command {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

impl Command {
    fn bytes(&self) -> [u8; 72] {
        // SAFETY: Command is repr(C), 72 bytes of plain integers without padding.
        unsafe { std::mem::transmute(*self) }
    }
}

fn status_error(what: &str, status: i32) -> io::Error {
    io::Error::other(format!("{what}: NVMe status {status:#x}"))
}

/// Issues `cmd` through a passthrough ioctl; a positive return is an NVMe status.
fn ioctl(file: &File, request: u64, cmd: &mut Command, what: &str) -> io::Result<()> {
    // SAFETY: `cmd` is a valid nvme_passthru_cmd whose buffer (if any) outlives the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request as _, cmd as *mut Command) };
    match rc {
        0 => Ok(()),
        rc if rc < 0 => Err(io::Error::new(
            io::Error::last_os_error().kind(),
            format!("{what}: {}", io::Error::last_os_error()),
        )),
        status => Err(status_error(what, status)),
    }
}

/// The namespace id of `/dev/nvmeXnY` or `/dev/ngXnY`.
pub fn namespace_id(file: &File) -> io::Result<u32> {
    // SAFETY: NVME_IOCTL_ID takes no argument.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), NVME_IOCTL_ID as _) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as u32)
}

/// The placement identifiers namespace `nsid` may use, from I/O Management Receive
/// (Reclaim Unit Handle Status), in the order the drive lists them. Fails on a drive or
/// namespace without FDP.
pub fn placement_ids(generic: &File, nsid: u32) -> io::Result<Vec<u16>> {
    let mut buf = AlignedBuffer::zeroed(4096);
    let mut cmd = Command {
        opcode: OP_IO_MGMT_RECV,
        nsid,
        addr: buf.as_mut_ptr() as u64,
        data_len: buf.len() as u32,
        // Management operation 1: reclaim unit handle status.
        cdw10: 1,
        cdw11: (buf.len() as u32 / 4) - 1,
        ..Command::default()
    };
    ioctl(
        generic,
        NVME_IOCTL_IO_CMD,
        &mut cmd,
        "I/O Management Receive (FDP placement handles)",
    )?;
    let data = buf.as_slice();
    let count = u16::from_le_bytes([data[14], data[15]]) as usize;
    let count = count.min((data.len() - 16) / 32);
    Ok((0..count)
        .map(|i| {
            let d = 16 + 32 * i;
            u16::from_le_bytes([data[d], data[d + 1]])
        })
        .collect())
}

/// The reclaim unit size in bytes of the FDP configuration the namespace's endurance group
/// runs (the first configuration; QEMU and most drives offer one).
pub fn reclaim_unit_size(controller: &File, nsid: u32) -> io::Result<u64> {
    // Identify Namespace: ENDGID at bytes 102..104.
    let mut id = AlignedBuffer::zeroed(4096);
    let mut cmd = Command {
        opcode: ADMIN_IDENTIFY,
        nsid,
        addr: id.as_mut_ptr() as u64,
        data_len: 4096,
        cdw10: 0,
        ..Command::default()
    };
    ioctl(
        controller,
        NVME_IOCTL_ADMIN_CMD,
        &mut cmd,
        "Identify Namespace",
    )?;
    let endgid = u16::from_le_bytes([id.as_slice()[102], id.as_slice()[103]]) as u32;
    let mut log = AlignedBuffer::zeroed(4096);
    let dwords = (log.len() / 4 - 1) as u32;
    let mut cmd = Command {
        opcode: ADMIN_GET_LOG_PAGE,
        nsid: 0xFFFF_FFFF,
        addr: log.as_mut_ptr() as u64,
        data_len: log.len() as u32,
        cdw10: LOG_FDP_CONFIGS | ((dwords & 0xFFFF) << 16),
        cdw11: (dwords >> 16) | (endgid << 16),
        ..Command::default()
    };
    ioctl(
        controller,
        NVME_IOCTL_ADMIN_CMD,
        &mut cmd,
        "Get Log Page (FDP configurations)",
    )?;
    // Header of 16 bytes, then the first configuration descriptor: RUNS at bytes 16..24.
    let d = &log.as_slice()[16..];
    let runs = u64::from_le_bytes(d[16..24].try_into().unwrap());
    if runs == 0 {
        return Err(io::Error::other(
            "the FDP configuration reports no reclaim unit size",
        ));
    }
    Ok(runs)
}

/// Builds the write command: `blocks` logical blocks at `lba` from `addr`, tagged with
/// placement identifier `pid`.
fn write_command(nsid: u32, lba: u64, blocks: u32, addr: u64, len: u32, pid: u16) -> Command {
    Command {
        opcode: OP_WRITE,
        nsid,
        addr,
        data_len: len,
        cdw10: lba as u32,
        cdw11: (lba >> 32) as u32,
        cdw12: (blocks - 1) | (DTYPE_PLACEMENT << 20),
        cdw13: (pid as u32) << 16,
        ..Command::default()
    }
}

/// Placement-tagged writes to one namespace: NVMe passthrough on its generic character
/// device, or block-layer write streams on its block device.
pub struct PlacementWriter {
    generic: File,
    nsid: u32,
    block_size: u32,
    /// Largest write one command may carry (the controller's transfer limit).
    max_transfer: u64,
    /// io_uring with 128-byte submissions and 32-byte completions (as `URING_CMD` needs);
    /// `None` where the kernel refuses io_uring: the ioctl then writes.
    ring: Option<Mutex<IoUring<squeue::Entry128, cqueue::Entry32>>>,
    /// Write streams: the block device (`O_DIRECT`) and a plain ring.
    streams: Option<(File, Mutex<IoUring>)>,
}

/// Where a write's placement goes: the identifier (passthrough) and the handle's index in
/// the namespace's list (write stream `index + 1`).
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    pub pid: u16,
    pub index: u16,
}

impl PlacementWriter {
    pub fn new(generic: File, nsid: u32, block_size: u32, max_transfer: u64) -> PlacementWriter {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry32>::builder()
            .build(8)
            .ok()
            .map(Mutex::new);
        let bs = block_size as u64;
        PlacementWriter {
            generic,
            nsid,
            block_size,
            max_transfer: (max_transfer / bs).clamp(1, 1 << 16) * bs,
            ring,
            streams: None,
        }
    }

    /// Writes through the block layer's write streams on `block` (opened `O_DIRECT`)
    /// instead of passthrough; fails where io_uring is refused.
    pub fn with_streams(mut self, block: File) -> io::Result<PlacementWriter> {
        let ring = IoUring::new(8)?;
        self.streams = Some((block, Mutex::new(ring)));
        Ok(self)
    }

    /// `"io_uring write streams"`, `"io_uring passthrough"` or `"ioctl passthrough"`.
    pub fn kind(&self) -> &'static str {
        if self.streams.is_some() {
            "io_uring write streams"
        } else if self.ring.is_some() {
            "io_uring passthrough"
        } else {
            "ioctl passthrough"
        }
    }

    /// Writes `data` (block aligned in memory and length) at byte `offset` of the namespace
    /// with `placement`, in commands of at most the transfer limit.
    pub fn write(&self, offset: u64, data: &[u8], placement: Placement) -> io::Result<()> {
        let bs = self.block_size as u64;
        let pid = placement.pid;
        debug_assert!(offset % bs == 0 && data.len() as u64 % bs == 0);
        for (i, chunk) in data.chunks(self.max_transfer as usize).enumerate() {
            let at = offset + i as u64 * self.max_transfer;
            if let Some((block, ring)) = &self.streams {
                self.write_stream(block, ring, at, chunk, placement.index + 1)?;
                continue;
            }
            let cmd = write_command(
                self.nsid,
                at / bs,
                (chunk.len() as u64 / bs) as u32,
                chunk.as_ptr() as u64,
                chunk.len() as u32,
                pid,
            );
            match &self.ring {
                Some(ring) => self.submit(ring, cmd)?,
                None => {
                    let mut cmd = cmd;
                    ioctl(&self.generic, NVME_IOCTL_IO_CMD, &mut cmd, "NVMe write")?
                }
            }
        }
        Ok(())
    }

    /// One io_uring write to the block device carrying write stream `stream`.
    fn write_stream(
        &self,
        block: &File,
        ring: &Mutex<IoUring>,
        offset: u64,
        data: &[u8],
        stream: u16,
    ) -> io::Result<()> {
        let stream = u8::try_from(stream).map_err(|_| io::Error::other("write stream > 255"))?;
        let sqe = opcode::Write::new(
            types::Fd(block.as_raw_fd()),
            data.as_ptr(),
            data.len() as u32,
        )
        .offset(offset)
        .build()
        .user_data(2);
        // `sqe->write_stream` (byte 44, where `splice_fd_in` sits) is newer than this crate's
        // builder. SAFETY: `squeue::Entry` is a repr(C) wrapper of the 64-byte SQE.
        let mut bytes: [u8; 64] = unsafe { std::mem::transmute(sqe) };
        bytes[44] = stream;
        let sqe: squeue::Entry = unsafe { std::mem::transmute(bytes) };
        let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `data` outlives the wait below.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        ring.submit_and_wait(1)?;
        let cqe = ring
            .completion()
            .next()
            .ok_or_else(|| io::Error::other("io_uring: no completion"))?;
        match cqe.result() {
            n if n < 0 => Err(io::Error::from_raw_os_error(-n)),
            n if n as usize != data.len() => Err(io::Error::other(format!(
                "short write of {n} of {} bytes",
                data.len()
            ))),
            _ => Ok(()),
        }
    }

    fn submit(
        &self,
        ring: &Mutex<IoUring<squeue::Entry128, cqueue::Entry32>>,
        cmd: Command,
    ) -> io::Result<()> {
        let mut bytes = [0u8; 80];
        bytes[..72].copy_from_slice(&cmd.bytes());
        let sqe = opcode::UringCmd80::new(types::Fd(self.generic.as_raw_fd()), NVME_URING_CMD_IO)
            .cmd(bytes)
            .build()
            .user_data(1);
        let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the command's buffer (`data` of `write`) outlives the wait below.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        ring.submit_and_wait(1)?;
        let cqe = ring
            .completion()
            .next()
            .ok_or_else(|| io::Error::other("io_uring: no completion"))?;
        match cqe.result() {
            0 => Ok(()),
            rc if rc < 0 => Err(io::Error::from_raw_os_error(-rc)),
            status => Err(status_error("NVMe write", status)),
        }
    }
}

/// A zeroed heap buffer aligned to 4 KiB (for `O_DIRECT` and passthrough data).
pub struct AlignedBuffer {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain owned memory.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    pub fn zeroed(len: usize) -> AlignedBuffer {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).expect("layout");
        // SAFETY: non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuffer { ptr, layout }
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
