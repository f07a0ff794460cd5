//! The I/O engine under the image device: plain pread / pwrite / fdatasync by default, or
//! io_uring for large writes where asked for (`auto`, `uring`; containers often refuse
//! io_uring). Reads and syncs are plain syscalls in every mode. The ring carries one write
//! at a time; a thread that finds it taken writes with pwrite rather than queue behind it.
//!
//! Why plain writes by default: the image is a file in the host's page cache, so a write
//! is a copy into it. Through the ring the kernel may hand that copy to a worker thread
//! while the writer sleeps until it is done: two threads to schedule where one would do,
//! and on a machine whose cores are all busy with guests each waits for a core (in one
//! full-size run of the LevelDB + cache pair, `perf trace` saw the background writer's
//! `io_uring_enter` take over 1.5 ms 386 times in 12 s). Eight alternating rounds of that
//! pair: the cache's set P99.99 2.0–3.5 ms with plain writes against 2.7–3.8 ms through
//! the ring, LevelDB's fillrandom 4.8–6.2 against 5.5–6.7 ms, but the cache's gets
//! 0.40–0.57 against 0.39–0.43 ms. RocksDB's unsynced fills and overwrite (500,000 keys,
//! four rounds each): 165–180k and 136–140k ops/s against 147–169k and 88–137k, P99.99
//! level. The cost: the same pair as two `valet-run` processes, each on an image of its
//! own, gave the cache's gets a P99.99 of 1.8–2.3 ms with plain writes against 0.61–0.76
//! ms through the ring. A scheduler trace showed why: with plain writes each process's
//! writer took its own guest's core for over a millisecond 70-odd times a run to copy
//! buffers, where the ring's workers ran while the guests slept. In one process (tenants)
//! guests lost their core that way 16–27 times a run in either mode, so `--io uring` is the
//! choice only for several `valet-run` processes sharing a machine's cores.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::str::FromStr;
use std::sync::{Mutex, TryLockError};

use io_uring::{opcode, squeue, types, IoUring, Probe};

/// Which I/O engine a device uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IoMode {
    /// io_uring for large writes if the kernel allows it, otherwise pwrite.
    Auto,
    /// io_uring for large writes; opening fails if it is unavailable.
    Uring,
    /// pread / pwrite / fdatasync (the default, see the module docs).
    #[default]
    Sync,
}

impl FromStr for IoMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(IoMode::Auto),
            "uring" | "io_uring" => Ok(IoMode::Uring),
            "sync" => Ok(IoMode::Sync),
            _ => Err(format!(
                "unknown I/O mode `{s}` (expected auto, uring or sync)"
            )),
        }
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoMode::Auto => "auto",
            IoMode::Uring => "uring",
            IoMode::Sync => "sync",
        })
    }
}

/// Largest single request; longer transfers are split.
const MAX_CHUNK: usize = 1 << 30;
/// Smallest write sent through the ring, where copying it overlaps useful work.
const OVERLAP_MIN: usize = 64 << 10;
/// Ring depth: one request is in flight at a time (a thread that finds the ring taken
/// writes with `pwrite`), a few slots spare.
const RING_ENTRIES: u32 = 8;

struct Ring {
    ring: IoUring,
    next_id: u64,
    /// Set when the kernel refused a submission in a way that may leave our request queued;
    /// the ring is never entered again, so a stale request can never run.
    broken: bool,
}

/// Positional I/O on one file, through io_uring or the plain system calls.
pub(crate) struct IoEngine {
    file: File,
    ring: Option<Mutex<Ring>>,
}

impl IoEngine {
    /// Wraps `file` with the engine `mode` asks for.
    pub(crate) fn new(file: File, mode: IoMode) -> io::Result<Self> {
        let ring =
            match mode {
                IoMode::Sync => None,
                IoMode::Auto => setup_ring().ok(),
                IoMode::Uring => Some(setup_ring().map_err(|e| {
                    io::Error::new(e.kind(), format!("io_uring is unavailable: {e}"))
                })?),
            };
        Ok(IoEngine {
            file,
            ring: ring.map(|ring| {
                Mutex::new(Ring {
                    ring,
                    next_id: 0,
                    broken: false,
                })
            }),
        })
    }

    /// `"io_uring"` or `"sync"`, for stats and logs.
    pub(crate) fn kind(&self) -> &'static str {
        if self.ring.is_some() {
            "io_uring"
        } else {
            "sync"
        }
    }

    /// The file underneath, for metadata calls (flock, fallocate, set_len).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Reads exactly `buf.len()` bytes at `pos`; running into the end of the file is an error.
    ///
    /// Always plain `pread`, in either mode: the reads a store serves are mostly small and
    /// hit the host's page cache, where one syscall beats a ring round trip (LevelDB's
    /// readrandom ran about 10 % faster), and they need no ring lock, so readers on other
    /// threads (tenants) never queue behind a write.
    pub(crate) fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, pos)
    }

    /// Writes all of `data` at `pos`.
    pub(crate) fn write_at(&self, data: &[u8], pos: u64) -> io::Result<()> {
        self.write_at_while(data, pos, &mut || {})
    }

    /// Writes like [`IoEngine::write_at`], running `during` once while the first request is
    /// in flight (with io_uring the kernel copies the data meanwhile). Writes smaller than
    /// [`OVERLAP_MIN`] are plain `pwrite`s: too little to overlap, and a ring round trip
    /// costs more than the syscall. So is a write that finds the ring taken: the ring
    /// carries one request at a time, and its owner (the background writer, at nice 10) may
    /// be waiting for a core, so a guest's write or sync queued behind it would wait too.
    pub(crate) fn write_at_while(
        &self,
        data: &[u8],
        pos: u64,
        during: &mut dyn FnMut(),
    ) -> io::Result<()> {
        let ring = match &self.ring {
            Some(ring) if data.len() >= OVERLAP_MIN => match ring.try_lock() {
                Ok(r) => Some(r),
                // The ring holds no invariant a panicking holder could break halfway (see
                // `broken`).
                Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            },
            _ => None,
        };
        let Some(mut ring) = ring else {
            during();
            return self.file.write_all_at(data, pos);
        };
        let fd = types::Fd(self.file.as_raw_fd());
        let mut done = 0;
        let mut during = Some(during);
        while done < data.len() {
            let chunk = &data[done..];
            let len = chunk.len().min(MAX_CHUNK);
            let entry = opcode::Write::new(fd, chunk.as_ptr(), len as u32)
                .offset(pos + done as u64)
                .build();
            // SAFETY: `chunk` stays borrowed and alive until `submit` has seen the completion.
            let n = unsafe { submit_while(&mut ring, entry, during.take())? };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("write at {} made no progress", pos + done as u64),
                ));
            }
            done += n;
        }
        Ok(())
    }

    /// fdatasync: written data (and the size needed to find it) is durable on return.
    ///
    /// The plain syscall in both modes: through the ring the kernel runs it on a worker
    /// thread, and the extra hand-off cost ~40 µs per synced LevelDB write here.
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// A ring that can do what we need, or the reason it cannot.
fn setup_ring() -> io::Result<IoUring> {
    let ring = IoUring::new(RING_ENTRIES)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in [(opcode::Write::CODE, "write")] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("kernel io_uring lacks the {name} operation"),
            ));
        }
    }
    Ok(ring)
}

/// Submits one request, runs `during` after it went to the kernel, waits for its
/// completion and returns its (non-negative) result. Retries requests the kernel bounces
/// with EINTR / EAGAIN.
///
/// # Safety
/// Memory the entry points to must stay valid until this returns.
unsafe fn submit_while(
    r: &mut Ring,
    entry: squeue::Entry,
    mut during: Option<&mut dyn FnMut()>,
) -> io::Result<usize> {
    if r.broken {
        return Err(io::Error::other("io_uring failed earlier on this device"));
    }
    loop {
        r.next_id += 1;
        let id = r.next_id;
        let entry = entry.clone().user_data(id);
        // SAFETY: the caller keeps the buffers alive; we wait for the completion below.
        if unsafe { r.ring.submission().push(&entry) }.is_err() {
            return Err(io::Error::other("io_uring submission queue is full"));
        }
        if let Some(during) = during.take() {
            // Hand the request over without waiting; a refusal here is retried by the
            // waiting loop below, which submits what is still queued.
            let _ = r.ring.submit();
            during();
        }
        let res = loop {
            if let Some(res) = r
                .ring
                .completion()
                .find(|cqe| cqe.user_data() == id)
                .map(|cqe| cqe.result())
            {
                break res;
            }
            match r.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    // Our request may still sit in the queue pointing at the caller's
                    // buffer; never enter this ring again.
                    r.broken = true;
                    return Err(e);
                }
            }
        };
        if res >= 0 {
            return Ok(res as usize);
        }
        if res != -libc::EINTR && res != -libc::EAGAIN {
            return Err(io::Error::from_raw_os_error(-res));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn engine(dir: &tempfile::TempDir, mode: IoMode) -> io::Result<IoEngine> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join("f"))?;
        IoEngine::new(file, mode)
    }

    fn exercise(e: &IoEngine) {
        let a = pattern(3 * 4096 + 17, 1);
        e.write_at(&a, 4096).unwrap();
        e.write_at(&pattern(100, 2), 1).unwrap();
        e.sync_data().unwrap();
        let mut buf = vec![0; a.len()];
        e.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, a);
        let mut small = vec![0; 100];
        e.read_at(&mut small, 1).unwrap();
        assert_eq!(small, pattern(100, 2));
        let mut past = vec![0; 10];
        let err = e.read_at(&mut past, 4 * 4096 + 10).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        e.read_at(&mut [], 1 << 40).unwrap();
    }

    #[test]
    fn sync_engine_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(&dir, IoMode::Sync).unwrap();
        assert_eq!(e.kind(), "sync");
        exercise(&e);
    }

    #[test]
    fn uring_engine_roundtrip_matches_sync() {
        let dir = tempfile::tempdir().unwrap();
        let e = match engine(&dir, IoMode::Uring) {
            Ok(e) => e,
            Err(err) => {
                eprintln!("io_uring unavailable here, skipping: {err}");
                return;
            }
        };
        assert_eq!(e.kind(), "io_uring");
        exercise(&e);
        // Both engines see the same bytes.
        let s = engine(&dir, IoMode::Sync).unwrap();
        let len = 4 * 4096 + 17; // the whole file
        let (mut a, mut b) = (vec![0; len], vec![1; len]);
        e.read_at(&mut a, 0).unwrap();
        s.read_at(&mut b, 0).unwrap();
        assert_eq!(a, b);
        s.write_at(&pattern(4096, 9), 8192).unwrap();
        e.read_at(&mut a[..4096], 8192).unwrap();
        assert_eq!(&a[..4096], &pattern(4096, 9)[..]);
    }

    #[test]
    fn a_write_that_finds_the_ring_taken_does_not_wait_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = match engine(&dir, IoMode::Uring) {
            Ok(e) => std::sync::Arc::new(e),
            Err(err) => {
                eprintln!("io_uring unavailable here, skipping: {err}");
                return;
            }
        };
        let data = pattern(OVERLAP_MIN * 2, 5);
        // Another request holds the ring for as long as this test likes.
        let taken = e.ring.as_ref().unwrap().lock().unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let writer = {
            let (e, data) = (e.clone(), data.clone());
            std::thread::spawn(move || {
                e.write_at(&data, 4096).unwrap();
                done_tx.send(()).unwrap();
            })
        };
        let finished = done_rx.recv_timeout(std::time::Duration::from_secs(30));
        drop(taken);
        writer.join().unwrap();
        assert!(finished.is_ok(), "the write waited for the ring");
        let mut back = vec![0; data.len()];
        e.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn auto_picks_an_engine() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(&dir, IoMode::Auto).unwrap();
        assert!(["io_uring", "sync"].contains(&e.kind()));
        exercise(&e);
    }

    #[test]
    fn uring_errors_map_to_io_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap(); // read only
        let Ok(e) = IoEngine::new(file, IoMode::Uring) else {
            eprintln!("io_uring unavailable here, skipping");
            return;
        };
        let err = e.write_at(b"y", 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        // The ring is still usable after a failed request.
        let mut b = [0u8];
        e.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"x");
    }

    #[test]
    fn io_mode_parses_and_prints() {
        for m in [IoMode::Auto, IoMode::Uring, IoMode::Sync] {
            assert_eq!(m.to_string().parse::<IoMode>().unwrap(), m);
        }
        assert_eq!(" SYNC ".parse::<IoMode>().unwrap(), IoMode::Sync);
        assert_eq!("io_uring".parse::<IoMode>().unwrap(), IoMode::Uring);
        let err = "fast".parse::<IoMode>().unwrap_err();
        assert!(err.contains("fast"), "{err}");
        assert_eq!(IoMode::default(), IoMode::Sync);
    }
}
