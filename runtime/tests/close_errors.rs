//! fsync is a promise: when the flush a close makes fails, the guest's `fd_close` returns
//! the error (EIO) instead of success. The device under the store fails every write and
//! sync on demand; the guest (WAT) opens a file, writes to it, closes it, and exits with
//! the errno `fd_close` gave it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use valet_runtime::host::{self, GuestExit, GuestSpec, Preopen};
use valet_vfs::device::{DeviceError, Geometry, MemoryDevice, ZoneId, ZoneInfo, ZonedDevice};
use valet_vfs::{Ino, OpenOptions, Store, StoreConfig};

/// A memory device whose writes and syncs fail with EIO while `failing` is set.
struct FailingDevice {
    inner: MemoryDevice,
    failing: AtomicBool,
}

impl FailingDevice {
    fn check(&self) -> Result<(), DeviceError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(DeviceError::Io(std::io::Error::from_raw_os_error(
                libc::EIO,
            )));
        }
        Ok(())
    }
}

impl ZonedDevice for FailingDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn report_zones(&self) -> Vec<ZoneInfo> {
        self.inner.report_zones()
    }
    fn zone_info(&self, zone: ZoneId) -> Result<ZoneInfo, DeviceError> {
        self.inner.zone_info(zone)
    }
    fn write(&self, zone: ZoneId, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.write(zone, offset, data)
    }
    fn append(&self, zone: ZoneId, data: &[u8]) -> Result<u64, DeviceError> {
        self.check()?;
        self.inner.append(zone, data)
    }
    fn read(&self, zone: ZoneId, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read(zone, offset, buf)
    }
    fn reset(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.inner.reset(zone)
    }
    fn finish(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.inner.finish(zone)
    }
    fn open(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.inner.open(zone)
    }
    fn close(&self, zone: ZoneId) -> Result<(), DeviceError> {
        self.inner.close(zone)
    }
    fn sync(&self) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.sync()
    }
}

/// A store on a [`FailingDevice`], healthy for now, and tenant `t`'s root.
fn failing_store() -> (Arc<FailingDevice>, Store, Ino) {
    let geometry = Geometry {
        zone_count: 16,
        zone_size: 4 << 20,
        zone_capacity: 4 << 20,
        block_size: 4096,
        max_open: 8,
        max_active: 8,
    };
    let device = Arc::new(FailingDevice {
        inner: MemoryDevice::new(geometry).unwrap(),
        failing: AtomicBool::new(false),
    });
    let store = Store::open(device.clone(), StoreConfig::default()).unwrap();
    let (_, root) = store.tenant("t").unwrap();
    (device, store, root)
}

/// Guest `program` with the store's `root` at `/data` (fd 3).
fn spec(program: &str, root: Ino) -> GuestSpec {
    GuestSpec {
        args: vec![program.into()],
        preopens: vec![Preopen::Store {
            ino: root,
            guest_path: "/data".into(),
        }],
        ..GuestSpec::default()
    }
}

/// Opens `/data/f` (fd 3 is the store), writes "hello", closes it. Exit code: 100 + errno
/// when the open fails, 150 + errno when the write does, else `fd_close`'s errno.
const GUEST: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "f")
  (data (i32.const 16) "hello")
  (func (export "_start") (local $e i32) (local $fd i32)
    ;; path_open(3, follow, "f", CREAT|TRUNC, READ|WRITE, same, 0, &fd at 32)
    (local.set $e (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1)
      (i32.const 9) (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 32)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 100) (local.get $e)))))
    (local.set $fd (i32.load (i32.const 32)))
    ;; one iovec at 40: "hello"
    (i32.store (i32.const 40) (i32.const 16))
    (i32.store (i32.const 44) (i32.const 5))
    (local.set $e (call $write (local.get $fd) (i32.const 40) (i32.const 1) (i32.const 48)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 150) (local.get $e)))))
    (call $exit (call $close (local.get $fd)))))"#;

#[test]
fn a_close_whose_flush_fails_returns_eio_to_the_guest() {
    let (device, store, root) = failing_store();
    let engine = host::engine(host::Stopping::EpochChecks).unwrap();
    let module = wasmtime::Module::new(&engine, wat::parse_str(GUEST).unwrap()).unwrap();
    let spec = spec("close", root);

    // A healthy device: the close succeeds.
    match host::run(&engine, &module, &spec, &store).unwrap() {
        GuestExit::Code(0) => {}
        other => panic!("healthy close: {other:?}"),
    }
    store.sync().unwrap();

    // A device that fails every write and sync: the close reports EIO (29).
    device.failing.store(true, Ordering::SeqCst);
    match host::run(&engine, &module, &spec, &store).unwrap() {
        GuestExit::Code(29) => {}
        other => panic!("failing close: {other:?} (want EIO, 29)"),
    }
}

/// Opens `/data/f`, writes "hello" and exits 1 with the file still open.
const LEAVES_OPEN: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "f")
  (data (i32.const 16) "hello")
  (func (export "_start")
    (drop (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1)
      (i32.const 9) (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 32)))
    (i32.store (i32.const 40) (i32.const 16))
    (i32.store (i32.const 44) (i32.const 5))
    (drop (call $write (i32.load (i32.const 32)) (i32.const 40) (i32.const 1) (i32.const 48)))
    (call $exit (i32.const 1))))"#;

/// A guest that exits with an error code leaving a file open whose close fails keeps its
/// exit code, and its stderr says what was lost (the failure used to go unreported
/// whenever the guest's own exit was not 0; under the node agent no later unmount says it
/// either).
#[test]
fn a_failed_close_at_a_guests_failing_exit_is_on_its_stderr() {
    let (device, store, root) = failing_store();
    store.sync().unwrap();
    device.failing.store(true, Ordering::SeqCst);
    let engine = host::engine(host::Stopping::NoChecks).unwrap();
    let module = wasmtime::Module::new(&engine, wat::parse_str(LEAVES_OPEN).unwrap()).unwrap();
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let spec = GuestSpec {
        stdio: [None, None, Some(Arc::new(stderr.reopen().unwrap()))],
        ..spec("leaves-open", root)
    };
    match host::run(&engine, &module, &spec, &store).unwrap() {
        GuestExit::Code(1) => {}
        other => panic!("{other:?} (want the guest's own exit code, 1)"),
    }
    let said = std::fs::read_to_string(stderr.path()).unwrap();
    assert!(
        said.contains("closing the files the guest left open: errno 29"),
        "stderr: {said:?}"
    );
}

/// Opens `/data/f` with O_DSYNC (fdflags 2) and writes "hello", whose sync fails. Exit
/// code: 100 + errno when the open fails, 150 + errno when the write does not fail with
/// EIO, 200 + errno when fd_tell fails, else the position (which must not have moved).
const SYNC_WRITE: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_tell" (func $tell (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "f")
  (data (i32.const 16) "hello")
  (func (export "_start") (local $e i32) (local $fd i32)
    (local.set $e (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1)
      (i32.const 9) (i64.const 66) (i64.const 66) (i32.const 2) (i32.const 32)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 100) (local.get $e)))))
    (local.set $fd (i32.load (i32.const 32)))
    (i32.store (i32.const 40) (i32.const 16))
    (i32.store (i32.const 44) (i32.const 5))
    (local.set $e (call $write (local.get $fd) (i32.const 40) (i32.const 1) (i32.const 48)))
    (if (i32.ne (local.get $e) (i32.const 29))
      (then (call $exit (i32.add (i32.const 150) (local.get $e)))))
    (local.set $e (call $tell (local.get $fd) (i32.const 56)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 200) (local.get $e)))))
    (drop (call $close (local.get $fd)))
    (call $exit (i32.load (i32.const 56)))))"#;

/// A write on an O_DSYNC descriptor whose sync fails returns EIO and leaves the position
/// where it was, as Linux moves `f_pos` only for a write that returns a count (it used to
/// move, so a retry wrote the record again further on).
#[test]
fn a_sync_write_that_fails_leaves_the_position() {
    let (device, store, root) = failing_store();
    store.sync().unwrap();
    device.failing.store(true, Ordering::SeqCst);
    let engine = host::engine(host::Stopping::NoChecks).unwrap();
    let module = wasmtime::Module::new(&engine, wat::parse_str(SYNC_WRITE).unwrap()).unwrap();
    match host::run(&engine, &module, &spec("sync-write", root), &store).unwrap() {
        GuestExit::Code(0) => {}
        other => panic!("{other:?} (want 0: the position after the failed write)"),
    }
}

/// Opens `/data/f` (fd 4) and writes "hello" to it, opens `/data/g` (fd 5), then
/// fd_renumber(5, 4), which closes f. Exit code: 100 + errno when an open or the write
/// fails, else fd_renumber's errno.
const RENUMBER: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_renumber" (func $renumber (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "f")
  (data (i32.const 4) "g")
  (data (i32.const 16) "hello")
  (func (export "_start") (local $e i32)
    (local.set $e (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1)
      (i32.const 9) (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 32)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 100) (local.get $e)))))
    (i32.store (i32.const 40) (i32.const 16))
    (i32.store (i32.const 44) (i32.const 5))
    (local.set $e (call $write (i32.load (i32.const 32)) (i32.const 40) (i32.const 1)
      (i32.const 48)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 100) (local.get $e)))))
    (local.set $e (call $open (i32.const 3) (i32.const 1) (i32.const 4) (i32.const 1)
      (i32.const 9) (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 36)))
    (if (local.get $e) (then (call $exit (i32.add (i32.const 100) (local.get $e)))))
    (local.set $e (call $renumber (i32.load (i32.const 36)) (i32.load (i32.const 32))))
    (drop (call $close (i32.load (i32.const 32))))
    (call $exit (local.get $e))))"#;

/// fd_renumber, as Linux's dup2, does not report the close of the descriptor it replaces:
/// the renumber has happened (the call used to return that close's EIO). The close still
/// makes the replaced file durable: on a healthy device, f's data is on it afterwards.
#[test]
fn fd_renumber_does_not_report_the_replaced_close() {
    let engine = host::engine(host::Stopping::NoChecks).unwrap();
    let module = wasmtime::Module::new(&engine, wat::parse_str(RENUMBER).unwrap()).unwrap();
    for failing in [true, false] {
        let (device, store, root) = failing_store();
        store.sync().unwrap();
        device.failing.store(failing, Ordering::SeqCst);
        match host::run(&engine, &module, &spec("renumber", root), &store).unwrap() {
            GuestExit::Code(0) => {}
            other => panic!("failing {failing}: {other:?} (want 0)"),
        }
        if !failing {
            let copy = Arc::new(device.inner.durable_copy());
            let store = Store::open(copy, StoreConfig::default()).unwrap();
            let (_, root) = store.tenant("t").unwrap();
            let f = store.open_file(root, "f", OpenOptions::read()).unwrap();
            let mut buf = [0u8; 8];
            assert_eq!(f.read_at(&mut buf, 0).unwrap(), 5);
            assert_eq!(&buf[..5], b"hello");
        }
    }
}
