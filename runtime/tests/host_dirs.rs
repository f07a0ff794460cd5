//! Plain host directories (`--dir HOST::GUEST`) served by our WASIp1 layer: a guest writes,
//! renames into place and syncs the directory (a real fsync of the host directory, where
//! stock wasmtime says EBADF), and the host sees the result.

use std::process::Command;

/// In the host preopen (fd 4; the store is fd 3): create `tmp`, write "durable", close, rename `tmp` -> `final`,
/// open `.` as a directory and `fd_sync` it, `fd_datasync` the preopen itself and set its
/// times to now. Exit code:
/// the first failing step's number times 100 plus its errno, or 0.
const GUEST: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_sync" (func $sync (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_datasync" (func $datasync (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_rename"
    (func $rename (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_set_times"
    (func $times (param i32 i64 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "tmp")
  (data (i32.const 8) "final")
  (data (i32.const 16) ".")
  (data (i32.const 24) "durable")
  (func $check (param $step i32) (param $e i32)
    (if (local.get $e)
      (then (call $exit (i32.add (i32.mul (local.get $step) (i32.const 100)) (local.get $e))))))
  (func (export "_start") (local $fd i32)
    (call $check (i32.const 1) (call $open (i32.const 4) (i32.const 1) (i32.const 0) (i32.const 3)
      (i32.const 1) (i64.const 64) (i64.const 64) (i32.const 0) (i32.const 64)))
    (local.set $fd (i32.load (i32.const 64)))
    (i32.store (i32.const 72) (i32.const 24))
    (i32.store (i32.const 76) (i32.const 7))
    (call $check (i32.const 2) (call $write (local.get $fd) (i32.const 72) (i32.const 1) (i32.const 80)))
    (call $check (i32.const 3) (call $close (local.get $fd)))
    (call $check (i32.const 4) (call $rename (i32.const 4) (i32.const 0) (i32.const 3)
      (i32.const 4) (i32.const 8) (i32.const 5)))
    ;; path_open(4, follow, ".", DIRECTORY, no rights)
    (call $check (i32.const 5) (call $open (i32.const 4) (i32.const 1) (i32.const 16) (i32.const 1)
      (i32.const 2) (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 64)))
    (call $check (i32.const 6) (call $sync (i32.load (i32.const 64))))
    (call $check (i32.const 7) (call $datasync (i32.const 4)))
    ;; fd_filestat_set_times(4, 0, 0, ATIM_NOW|MTIM_NOW) on the preopen itself
    (call $check (i32.const 8) (call $times (i32.const 4) (i64.const 0) (i64.const 0) (i32.const 10)))
    (call $exit (i32.const 0))))"#;

#[test]
fn a_guest_renames_into_place_and_syncs_a_host_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let app = tmp.path().join("app.wasm");
    std::fs::write(&app, wat::parse_str(GUEST).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(tmp.path().join("dev"))
        .args([
            "--zone-size",
            "16",
            "--zones",
            "16",
            "--mount",
            "/data",
            "--dir",
        ])
        .arg(format!("{}::/h", host.display()))
        .arg(&app)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(host.join("final")).unwrap(),
        "durable"
    );
    assert!(!host.join("tmp").exists());
}

// The guests below run in this process (`host::run`), with one host directory preopened at
// fd 3 and nothing else.

use std::path::Path;
use std::sync::Arc;

use valet_runtime::host::{self, GuestExit, GuestSpec, Preopen};
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Store, StoreConfig};

/// What every guest imports, and `$check`: exit with the step's number times 100 plus its
/// errno when the errno is not 0.
const IMPORTS: &str = r#"
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_seek" (func $seek (param i32 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_allocate"
    (func $allocate (param i32 i64 i64) (result i32)))
  (import "wasi_snapshot_preview1" "fd_fdstat_get" (func $fdstat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_get"
    (func $filestat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_filestat_get"
    (func $pathstat (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func $check (param $step i32) (param $e i32)
    (if (local.get $e)
      (then (call $exit (i32.add (i32.mul (local.get $step) (i32.const 100)) (local.get $e))))))
"#;

/// Runs the guest whose data and `_start` are `rest` with `host` preopened at fd 3 (`/h`);
/// returns its exit code.
fn run_in(host: &Path, rest: &str) -> i32 {
    let geometry = Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 8,
        max_active: 8,
    };
    let device = Arc::new(MemoryDevice::new(geometry).unwrap()) as Arc<dyn ZonedDevice>;
    let store = Store::open(device, StoreConfig::default()).unwrap();
    let engine = host::engine(host::Stopping::NoChecks).unwrap();
    let wat = format!("(module {IMPORTS} {rest})");
    let module = wasmtime::Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
    let spec = GuestSpec {
        args: vec!["guest".into()],
        preopens: vec![Preopen::Host {
            host_path: host.to_path_buf(),
            guest_path: "/h".into(),
        }],
        ..GuestSpec::default()
    };
    match host::run(&engine, &module, &spec, &store).unwrap() {
        GuestExit::Code(code) => code,
        other => panic!("{other:?}"),
    }
}

/// Opens `f` (100 bytes) read-only and asks `fd_allocate` for its first 10 bytes: EBADF
/// (8), as posix_fallocate says for a descriptor not open for writing, even though the
/// file is already that large (it used to say OK).
#[test]
fn fd_allocate_on_a_read_only_host_file_is_ebadf() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), [1u8; 100]).unwrap();
    let code = run_in(
        tmp.path(),
        r#"(data (i32.const 0) "f")
  (func (export "_start")
    ;; path_open(3, follow, "f", 0, FD_READ, FD_READ, 0, &fd at 64)
    (call $check (i32.const 1) (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1)
      (i32.const 0) (i64.const 2) (i64.const 2) (i32.const 0) (i32.const 64)))
    (call $exit (call $allocate (i32.load (i32.const 64)) (i64.const 0) (i64.const 10))))"#,
    );
    assert_eq!(code, 8, "want EBADF");
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 100);
}

/// `/dev/null` in a host directory is a character device (2) to `fd_fdstat_get`,
/// `fd_filestat_get` and `path_filestat_get` alike (the first said a regular file, the
/// second unknown). Exit code: the three types as the digits of one number.
#[test]
fn a_device_in_a_host_directory_has_its_type_in_every_call() {
    let code = run_in(
        Path::new("/dev"),
        r#"(data (i32.const 0) "null")
  (func (export "_start") (local $fd i32)
    (call $check (i32.const 1) (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 4)
      (i32.const 0) (i64.const 66) (i64.const 66) (i32.const 0) (i32.const 64)))
    (local.set $fd (i32.load (i32.const 64)))
    (call $check (i32.const 2) (call $fdstat (local.get $fd) (i32.const 96)))
    (call $check (i32.const 3) (call $filestat (local.get $fd) (i32.const 128)))
    (call $check (i32.const 4) (call $pathstat (i32.const 3) (i32.const 1) (i32.const 0)
      (i32.const 4) (i32.const 256)))
    (call $exit (i32.add (i32.add
      (i32.mul (i32.load8_u (i32.const 96)) (i32.const 100))
      (i32.mul (i32.load8_u (i32.const 144)) (i32.const 10)))
      (i32.load8_u (i32.const 272)))))"#,
    );
    assert_eq!(code, 222, "fdstat, filestat, path_filestat types");
}

/// Takes the calling thread's CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER away
/// (capabilities are per thread), so that root meets file modes as any user does.
fn drop_file_capabilities_of_this_thread() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget and capset of the calling thread with a v3 header and two data.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()),
            0
        );
        data[0].effective &= !((1 << 1) | (1 << 2) | (1 << 3));
        assert_eq!(libc::syscall(libc::SYS_capset, &header, data.as_ptr()), 0);
    }
}

/// `O_RDONLY | O_CREAT` (a lock file's open) of an existing file of mode 0444 opens it, as
/// on Linux (the host file used to be opened for writing, EACCES); the descriptor still
/// cannot write (EBADF, 8, the exit code).
#[test]
fn read_only_create_opens_an_existing_read_only_file() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let ro = tmp.path().join("ro");
    std::fs::write(&ro, "x").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let host = tmp.path().to_path_buf();
    let code = std::thread::spawn(move || {
        drop_file_capabilities_of_this_thread();
        run_in(
            &host,
            r#"(data (i32.const 0) "ro")
  (data (i32.const 16) "y")
  (func (export "_start")
    ;; path_open(3, follow, "ro", CREAT, FD_READ, FD_READ, 0, &fd at 64)
    (call $check (i32.const 1) (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 2)
      (i32.const 1) (i64.const 2) (i64.const 2) (i32.const 0) (i32.const 64)))
    (i32.store (i32.const 72) (i32.const 16))
    (i32.store (i32.const 76) (i32.const 1))
    (call $exit (call $write (i32.load (i32.const 64)) (i32.const 72) (i32.const 1) (i32.const 80))))"#,
        )
    })
    .join()
    .unwrap();
    assert_eq!(
        code, 8,
        "want the open to succeed and the write to be EBADF"
    );
    assert_eq!(std::fs::read_to_string(&ro).unwrap(), "x");
}

/// Writes 16 bytes to `f` (created) at most 10 of which fit (the child's RLIMIT_FSIZE),
/// then 16 more; `fdflags` are the descriptor's (0, or APPEND). Exit code: the first
/// write's count times 10000, the position after it (fd_tell) times 100, and the second
/// write's errno.
fn partial_write_guest(fdflags: u32) -> String {
    format!(
        r#"(func (export "_start") (local $fd i32)
    ;; "f" at 0 and "0123456789abcdef" at 16, stored by the code: a data segment would
    ;; make wasmtime put the memory's image in a memfd, which the file size limit refuses
    (i32.store8 (i32.const 0) (i32.const 0x66))
    (i64.store (i32.const 16) (i64.const 0x3736353433323130))
    (i64.store (i32.const 24) (i64.const 0x6665646362613938))
    ;; path_open(3, follow, "f", CREAT|TRUNC, READ|WRITE|SEEK|TELL, fdflags, &fd at 64)
    (call $check (i32.const 1) (call $open (i32.const 3) (i32.const 1) (i32.const 0) (i32.const 1)
      (i32.const 9) (i64.const 102) (i64.const 102) (i32.const {fdflags}) (i32.const 64)))
    (local.set $fd (i32.load (i32.const 64)))
    (i32.store (i32.const 72) (i32.const 16))
    (i32.store (i32.const 76) (i32.const 16))
    (call $check (i32.const 2) (call $write (local.get $fd) (i32.const 72) (i32.const 1) (i32.const 80)))
    (call $check (i32.const 3) (call $seek (local.get $fd) (i64.const 0) (i32.const 1) (i32.const 88)))
    (call $exit (i32.add (i32.add
      (i32.mul (i32.load (i32.const 80)) (i32.const 10000))
      (i32.mul (i32.wrap_i64 (i64.load (i32.const 88))) (i32.const 100)))
      (call $write (local.get $fd) (i32.const 72) (i32.const 1) (i32.const 80)))))"#
    )
}

/// Run by [`a_host_write_out_of_room_part_way_counts_what_it_wrote`] in a child process,
/// which it limits to files of at most 10 bytes; does nothing elsewhere.
#[test]
#[ignore = "run by a_host_write_out_of_room_part_way_counts_what_it_wrote"]
fn partial_writes_under_a_file_size_limit() {
    let Some(base) = std::env::var_os("VALET_FSIZE_TEST_DIR") else {
        return;
    };
    // SAFETY: signal and setrlimit with valid arguments; this process runs this test alone.
    unsafe {
        // A write past the limit gets EFBIG instead of the signal.
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let limit = libc::rlimit {
            rlim_cur: 10,
            rlim_max: 10,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    }
    for (fdflags, name) in [(0, "plain"), (1, "append")] {
        let host = Path::new(&base).join(name);
        let code = run_in(&host, &partial_write_guest(fdflags));
        // 10 written, the position at 10, then EFBIG (22).
        assert_eq!(code, 10 * 10000 + 10 * 100 + 22, "{name}");
        assert_eq!(
            std::fs::read(host.join("f")).unwrap(),
            b"0123456789",
            "{name}"
        );
    }
}

/// A write to a host file that runs out of room part way (here EFBIG past the process's
/// RLIMIT_FSIZE; ENOSPC and EDQUOT alike) returns the bytes it wrote and moves the
/// position past them, as Linux does; the next write gets the error. It used to return
/// the error and lose the count, with the bytes on the file.
#[test]
fn a_host_write_out_of_room_part_way_counts_what_it_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["plain", "append"] {
        std::fs::create_dir(tmp.path().join(name)).unwrap();
    }
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "partial_writes_under_a_file_size_limit",
            "--ignored",
            "--test-threads=1",
        ])
        .env("VALET_FSIZE_TEST_DIR", tmp.path());
    let out = child.output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("1 passed"), "the child ran nothing: {said}");
}
