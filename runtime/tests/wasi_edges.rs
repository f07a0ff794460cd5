//! WASIp1 calls at their edges, as Linux answers them, on the store: a descriptor opened
//! with `O_CREAT` but no write right does not write; `fcntl(F_SETFL)` leaves `O_DSYNC` as
//! it was; a vectored write with a bad buffer after a good one fails with EFAULT and writes
//! nothing (Linux checks every buffer first). Stock wasmtime's preview1 differs on the last
//! (it writes only the first buffer), so the conformance probes cannot hold these.
//!
//! More edges, each a guest of its own below: errnos Linux gives where the store gave
//! others (negative offsets, `send` on a file, `open("file/", O_CREAT)`), `poll_oneoff`'s
//! bound on subscriptions and its report of every ready one, a directory listing at the end
//! of a 4 GiB memory, and an append of two buffers that lands whole.
//!
//! The guest is WAT and exits with 0, or with a code naming the check that failed.

use std::sync::{Arc, Mutex};

use valet_runtime::host::{self, GuestExit, GuestSpec, Preopen};
use valet_runtime::wasi::SpaceLimit;
use valet_vfs::device::{Geometry, MemoryDevice};
use valet_vfs::{FileHandle, Ino, OpenOptions, Store, StoreConfig};

/// WASI numbers the guests use: errnos BADF 8, FAULT 21; rights FD_READ 2, FD_WRITE 64;
/// fdflags APPEND 1, DSYNC 2; oflags CREAT 1.
const EDGES: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_fdstat_get" (func $fdstat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_fdstat_set_flags" (func $setfl (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_get" (func $stat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "ro")
  (data (i32.const 4) "ds")
  (data (i32.const 8) "iov")
  (data (i32.const 16) "hello")
  ;; path_open(3, follow, name, CREAT, rights, rights, fdflags, &fd at 32); exits `code`
  ;; when it fails.
  (func $create (param $name i32) (param $len i32) (param $rights i64) (param $fdflags i32)
      (param $code i32) (result i32)
    (if (call $open (i32.const 3) (i32.const 1) (local.get $name) (local.get $len)
          (i32.const 1) (local.get $rights) (local.get $rights) (local.get $fdflags)
          (i32.const 32))
      (then (call $exit (local.get $code))))
    (i32.load (i32.const 32)))
  (func (export "_start") (local $fd i32)
    ;; One good iovec at 40: "hello".
    (i32.store (i32.const 40) (i32.const 16))
    (i32.store (i32.const 44) (i32.const 5))
    ;; 1. O_RDONLY | O_CREAT: the write fails EBADF.
    (local.set $fd (call $create (i32.const 0) (i32.const 2) (i64.const 2) (i32.const 0)
      (i32.const 10)))
    (if (i32.ne (call $write (local.get $fd) (i32.const 40) (i32.const 1) (i32.const 56))
          (i32.const 8))
      (then (call $exit (i32.const 11))))
    ;; 2. Opened O_DSYNC, then F_SETFL(O_APPEND): still O_DSYNC (and now O_APPEND).
    (local.set $fd (call $create (i32.const 4) (i32.const 2) (i64.const 66) (i32.const 2)
      (i32.const 20)))
    (if (call $setfl (local.get $fd) (i32.const 1)) (then (call $exit (i32.const 21))))
    (if (call $fdstat (local.get $fd) (i32.const 64)) (then (call $exit (i32.const 22))))
    (if (i32.ne (i32.load16_u (i32.const 66)) (i32.const 3)) (then (call $exit (i32.const 23))))
    ;; 3. A good iovec, then one past the end of memory: EFAULT, and nothing written.
    (local.set $fd (call $create (i32.const 8) (i32.const 3) (i64.const 66) (i32.const 0)
      (i32.const 30)))
    (i32.store (i32.const 48) (i32.const 0xfffffff0))
    (i32.store (i32.const 52) (i32.const 100))
    (if (i32.ne (call $write (local.get $fd) (i32.const 40) (i32.const 2) (i32.const 56))
          (i32.const 21))
      (then (call $exit (i32.const 31))))
    (if (call $stat (local.get $fd) (i32.const 64)) (then (call $exit (i32.const 32))))
    (if (i64.ne (i64.load (i32.const 96)) (i64.const 0)) (then (call $exit (i32.const 33))))
    (call $exit (i32.const 0))))"#;

/// A store on a memory device, and tenant `t`'s root.
fn new_store() -> (Store, Ino) {
    let geometry = Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 4,
        max_active: 5,
    };
    let device = Arc::new(MemoryDevice::new(geometry).unwrap());
    let store = Store::open(device, StoreConfig::default()).unwrap();
    let (_, root) = store.tenant("t").unwrap();
    (store, root)
}

/// Runs the WAT guest `wat` with `root` at `/data` (fd 3); `spec` may change the rest.
fn run(wat: &str, store: &Store, root: Ino, spec: impl FnOnce(&mut GuestSpec)) -> GuestExit {
    let engine = host::engine(host::Stopping::NoChecks).unwrap();
    let module = wasmtime::Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
    let mut guest = GuestSpec {
        args: vec!["edges".into()],
        preopens: vec![Preopen::Store {
            ino: root,
            guest_path: "/data".into(),
        }],
        ..GuestSpec::default()
    };
    spec(&mut guest);
    host::run(&engine, &module, &guest, store).unwrap()
}

fn expect_zero(exit: GuestExit) {
    match exit {
        GuestExit::Code(0) => {}
        other => panic!("{other:?}: the check of that number failed (see the guest)"),
    }
}

#[test]
fn calls_at_their_edges_answer_as_linux_does() {
    let (store, root) = new_store();
    expect_zero(run(EDGES, &store, root, |_| {}));
}

/// WASI numbers: errnos INVAL 28, ISDIR 31, NOTSOCK 57. The guest creates `f` (fd 4).
const ERRNOS: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_pwrite"
    (func $pwrite (param i32 i32 i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_pread"
    (func $pread (param i32 i32 i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_send"
    (func $send (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_recv"
    (func $recv (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_get" (func $stat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "f/")
  (data (i32.const 16) "hello")
  (func (export "_start") (local $fd i32)
    ;; path_open(3, follow, "f", CREAT, READ|WRITE, same, 0, &fd at 32)
    (if (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 1)
          (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 32))
      (then (call $exit (i32.const 10))))
    (local.set $fd (i32.load (i32.const 32)))
    ;; One iovec at 40: "hello".
    (i32.store (i32.const 40) (i32.const 16))
    (i32.store (i32.const 44) (i32.const 5))
    ;; 1. pwrite and pread at a negative offset: EINVAL (pwrite used to say EFBIG, pread
    ;; to read nothing).
    (if (i32.ne (call $pwrite (local.get $fd) (i32.const 40) (i32.const 1) (i64.const -1)
          (i32.const 56)) (i32.const 28))
      (then (call $exit (i32.const 11))))
    (if (i32.ne (call $pwrite (local.get $fd) (i32.const 40) (i32.const 1)
          (i64.const 0x8000000000000000) (i32.const 56)) (i32.const 28))
      (then (call $exit (i32.const 12))))
    (if (i32.ne (call $pread (local.get $fd) (i32.const 40) (i32.const 1) (i64.const -5)
          (i32.const 56)) (i32.const 28))
      (then (call $exit (i32.const 13))))
    ;; 2. send and recv on a file: ENOTSOCK, and nothing written.
    (if (i32.ne (call $send (local.get $fd) (i32.const 40) (i32.const 1) (i32.const 0)
          (i32.const 56)) (i32.const 57))
      (then (call $exit (i32.const 20))))
    (if (i32.ne (call $recv (local.get $fd) (i32.const 40) (i32.const 1) (i32.const 0)
          (i32.const 56) (i32.const 60)) (i32.const 57))
      (then (call $exit (i32.const 21))))
    (if (call $stat (local.get $fd) (i32.const 64)) (then (call $exit (i32.const 22))))
    (if (i64.ne (i64.load (i32.const 96)) (i64.const 0)) (then (call $exit (i32.const 23))))
    ;; 3. open("f/", O_CREAT) of the existing file f: EISDIR (it was ENOTDIR).
    (if (i32.ne (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 2)
          (i32.const 1) (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 32))
          (i32.const 31))
      (then (call $exit (i32.const 30))))
    (call $exit (i32.const 0))))"#;

/// A limit that refuses every byte.
struct Full;

impl SpaceLimit for Full {
    fn charge(&self, _bytes: u64) -> bool {
        false
    }
}

#[test]
fn errnos_are_linuxs() {
    let (store, root) = new_store();
    expect_zero(run(ERRNOS, &store, root, |_| {}));
    // Under a full space limit too (a pwrite far past the end of the file used to
    // overflow the sum of its offset and length, asking what the write would grow).
    let (store, root) = new_store();
    expect_zero(run(ERRNOS, &store, root, |spec| {
        spec.space_limit = Some(Arc::new(Full))
    }));
}

/// `poll_oneoff` with `n` zeroed subscriptions (each a relative clock, due now) at 0,
/// events after them, the count at 8 MiB - 4; exits with the errno, or 100 when the count
/// is not `n`.
fn poll_many(n: u32) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 128)
  (func (export "_start") (local $e i32)
    (local.set $e (call $poll (i32.const 0) (i32.const {events}) (i32.const {n})
      (i32.const 0x7ffffc)))
    (if (local.get $e) (then (call $exit (local.get $e))))
    (if (i32.ne (i32.load (i32.const 0x7ffffc)) (i32.const {n}))
      (then (call $exit (i32.const 100))))
    (call $exit (i32.const 0))))"#,
        events = n * 48,
    )
}

/// More subscriptions than a guest may hold descriptors is EINVAL (as Linux's poll past
/// RLIMIT_NOFILE), before the host sizes anything by the count; that many is fine.
#[test]
fn poll_oneoff_takes_at_most_as_many_subscriptions_as_descriptors() {
    let (store, root) = new_store();
    expect_zero(run(&poll_many(65_536), &store, root, |_| {}));
    match run(&poll_many(65_537), &store, root, |_| {}) {
        GuestExit::Code(28) => {}
        other => panic!("{other:?} (want EINVAL, 28)"),
    }
}

/// Subscriptions (48 bytes each) at 1024: fd_read of stdin (userdata 1) and of the file
/// `p` (userdata 2), which is ready at once; events at 2048, their count at 100.
const POLL_BOTH: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "p")
  (func (export "_start") (local $e i32)
    (if (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 1)
          (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 32))
      (then (call $exit (i32.const 10))))
    (i64.store (i32.const 1024) (i64.const 1))
    (i32.store8 (i32.const 1032) (i32.const 1))
    (i32.store (i32.const 1040) (i32.const 0))
    (i64.store (i32.const 1072) (i64.const 2))
    (i32.store8 (i32.const 1080) (i32.const 1))
    (i32.store (i32.const 1088) (i32.load (i32.const 32)))
    (local.set $e (call $poll (i32.const 1024) (i32.const 2048) (i32.const 2) (i32.const 100)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 20) (local.get $e)))))
    ;; Both are ready: the file at once, stdin (a file with data) when poll(2) is asked.
    (call $exit (i32.load (i32.const 100)))))"#;

/// `poll_oneoff` reports stdin (or a socket) ready beside a subscription that is ready at
/// once: the host descriptors are still asked, without waiting (they were asked only when
/// nothing else was ready, so a guest that polls a socket and a file never saw the socket).
#[test]
fn poll_oneoff_reports_every_ready_subscription() {
    let stdin = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(stdin.path(), b"input").unwrap();
    let (store, root) = new_store();
    let exit = run(POLL_BOTH, &store, root, |spec| {
        spec.stdio[0] = Some(Arc::new(stdin.reopen().unwrap()));
    });
    match exit {
        GuestExit::Code(2) => {}
        other => panic!("{other:?} (want 2 events)"),
    }
}

/// A 4 GiB memory; fd_readdir of `/data` into its last 26 bytes: `.`'s record (25 bytes)
/// ends at the end of memory, and the next would start past it.
const READDIR_AT_THE_END: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_readdir"
    (func $readdir (param i32 i32 i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 65536)
  (func (export "_start")
    (call $exit (call $readdir (i32.const 3) (i32.const -25) (i32.const 26) (i64.const 0)
      (i32.const 8)))))"#;

/// The listing's next record past the end of a 4 GiB memory is EFAULT: its address used
/// to wrap to 0 (a host panic in a debug build, a write over the guest's address 0 in a
/// release one).
#[test]
fn a_listing_never_wraps_past_the_end_of_memory() {
    let (store, root) = new_store();
    match run(READDIR_AT_THE_END, &store, root, |_| {}) {
        GuestExit::Code(21) => {}
        other => panic!("{other:?} (want EFAULT, 21)"),
    }
}

/// Opens `log` with O_APPEND (fdflags 1) and writes "ab" and "cd" in one fd_write.
const APPEND_TWO: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "log")
  (data (i32.const 16) "abcd")
  (func (export "_start")
    (if (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 3) (i32.const 0)
          (i64.const 64) (i64.const 64) (i32.const 1) (i32.const 32))
      (then (call $exit (i32.const 10))))
    (i32.store (i32.const 40) (i32.const 16))
    (i32.store (i32.const 44) (i32.const 2))
    (i32.store (i32.const 48) (i32.const 18))
    (i32.store (i32.const 52) (i32.const 2))
    (if (call $write (i32.load (i32.const 32)) (i32.const 40) (i32.const 2) (i32.const 56))
      (then (call $exit (i32.const 11))))
    (if (i32.ne (i32.load (i32.const 56)) (i32.const 4)) (then (call $exit (i32.const 12))))
    (call $exit (i32.const 0))))"#;

/// Another appender of the same file, which appends "X" whenever the guest asks its space
/// limit for room: that is, between the store writes of one fd_write.
struct Interloper(Mutex<FileHandle>);

impl SpaceLimit for Interloper {
    fn charge(&self, _bytes: u64) -> bool {
        self.0.lock().unwrap().write_at(b"X", 0).unwrap();
        true
    }
}

/// One O_APPEND fd_write of two buffers lands whole: another appender's write comes
/// before or after it, never between its buffers (as Linux's writev holds the inode lock
/// for the whole call). Each buffer used to be a store write of its own.
#[test]
fn an_append_of_two_buffers_lands_whole() {
    let (store, root) = new_store();
    let opts = OpenOptions {
        append: true,
        ..OpenOptions::create()
    };
    let other = store.open_file(root, "log", opts).unwrap();
    let limit = Arc::new(Interloper(Mutex::new(other)));
    expect_zero(run(APPEND_TWO, &store, root, |spec| {
        spec.space_limit = Some(limit.clone())
    }));
    let f = store.open_file(root, "log", OpenOptions::read()).unwrap();
    let mut buf = [0u8; 16];
    let n = f.read_at(&mut buf, 0).unwrap();
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "Xabcd");
}
