//! A guest's memory limit (a pod's `resources.limits.memory`): `memory.grow` past it fails
//! with -1, as an allocation fails in a process at its cgroup's limit, for a plain memory
//! (bounded by the store's limiter) and for a wasi-threads shared memory (bounded by its
//! type); a module that needs more than the limit at start is refused with one line; and a
//! running guest's memory is counted in its tenant's account, which the metrics serve.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use valet_runtime::guest_memory::MemoryAccount;
use valet_runtime::host::{self, GuestExit, GuestSpec, Stopping};
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Store, StoreConfig};

const MIB: u64 = 1 << 20;

/// A module whose memory is declared by `memory` (an import for threaded ones) and whose
/// `_start` grows it by 100 pages (6.25 MiB), then by 16 (1 MiB), and exits with 1 if the
/// first failed plus 2 if the second worked.
fn grower(memory: &str, threaded: bool) -> Vec<u8> {
    let spawn = match threaded {
        true => r#"(import "wasi" "thread-spawn" (func (param i32) (result i32)))"#,
        false => "",
    };
    wat::parse_str(format!(
        r#"(module
             (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
             {spawn}
             {memory}
             (func (export "_start")
               (call $exit (i32.add
                 (i32.eq (memory.grow (i32.const 100)) (i32.const -1))
                 (i32.mul (i32.const 2)
                   (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))))))"#
    ))
    .unwrap()
}

fn run(bytes: &[u8], memory_limit: Option<u64>) -> anyhow::Result<GuestExit> {
    run_spec(
        bytes,
        GuestSpec {
            args: vec!["grower".into()],
            memory_limit,
            ..Default::default()
        },
    )
}

fn run_spec(bytes: &[u8], spec: GuestSpec) -> anyhow::Result<GuestExit> {
    let engine = host::engine(Stopping::NoChecks).unwrap();
    let module = wasmtime::Module::new(&engine, bytes).unwrap();
    let geometry = Geometry {
        zone_count: 8,
        zone_size: MIB,
        zone_capacity: MIB,
        block_size: 4096,
        max_open: 4,
        max_active: 5,
    };
    let device = Arc::new(MemoryDevice::new(geometry).unwrap()) as Arc<dyn ZonedDevice>;
    let store = Store::open(device, StoreConfig::default()).unwrap();
    host::run(&engine, &module, &spec, &store)
}

fn exit_code(result: anyhow::Result<GuestExit>) -> i32 {
    match result {
        Ok(GuestExit::Code(code)) => code,
        other => panic!("expected an exit code, got {other:?}"),
    }
}

#[test]
fn memory_grows_up_to_the_limit_and_no_further() {
    for (memory, threaded) in [
        ("(memory (export \"memory\") 1)", false),
        ("(import \"env\" \"memory\" (memory 1 1000 shared))", true),
    ] {
        let bytes = grower(memory, threaded);
        // 2 MiB: the 100 pages do not fit, the 16 do.
        assert_eq!(exit_code(run(&bytes, Some(2 * MIB))), 3, "{memory}");
        // No limit: both grow.
        assert_eq!(exit_code(run(&bytes, None)), 2, "{memory}");
    }
}

#[test]
fn a_module_that_starts_over_the_limit_is_refused_with_one_line() {
    for (memory, threaded) in [
        ("(memory (export \"memory\") 64)", false),
        ("(import \"env\" \"memory\" (memory 64 1000 shared))", true),
    ] {
        let err = run(&grower(memory, threaded), Some(2 * MIB))
            .err()
            .unwrap_or_else(|| panic!("{memory}: a 4 MiB memory ran under a 2 MiB limit"));
        let msg = format!("{err:#}");
        assert!(msg.contains("limit") && !msg.contains('\n'), "{msg}");
    }
}

#[test]
fn a_running_guests_memory_is_its_tenants_until_it_ends() {
    const PAGE: u64 = 64 << 10;
    for (memory, threaded) in [
        ("(memory (export \"memory\") 1)", false),
        ("(import \"env\" \"memory\" (memory 1 1000 shared))", true),
    ] {
        let spawn = match threaded {
            true => r#"(import "wasi" "thread-spawn" (func (param i32) (result i32)))"#,
            false => "",
        };
        // Grows to 100 pages, writes to every 4 KiB of pages 50 to 59, then waits for a
        // byte on stdin (an iovec of one byte at 16).
        let bytes = wat::parse_str(format!(
            r#"(module
                 (import "wasi_snapshot_preview1" "fd_read"
                   (func $read (param i32 i32 i32 i32) (result i32)))
                 (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
                 {spawn}
                 {memory}
                 (data (i32.const 0) "\10\00\00\00\01\00\00\00")
                 (func (export "_start") (local $at i32)
                   (drop (memory.grow (i32.const 99)))
                   (local.set $at (i32.const 3276800))
                   (block $done
                     (loop $touch
                       (br_if $done (i32.ge_u (local.get $at) (i32.const 3932160)))
                       (i32.store (local.get $at) (i32.const 1))
                       (local.set $at (i32.add (local.get $at) (i32.const 4096)))
                       (br $touch)))
                   (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
                   (call $exit (i32.const 0))))"#
        ))
        .unwrap();
        let (stdin, mut writer) = std::io::pipe().unwrap();
        let account = Arc::new(MemoryAccount::default());
        let spec = GuestSpec {
            args: vec!["waiter".into()],
            stdio: [
                Some(Arc::new(std::fs::File::from(std::os::fd::OwnedFd::from(
                    stdin,
                )))),
                None,
                None,
            ],
            memory: Some(account.clone()),
            ..Default::default()
        };
        let guest = std::thread::spawn(move || run_spec(&bytes, spec));
        let start = Instant::now();
        // In RAM once the guest waits: the ten pages written and the first one's data (a
        // host with transparent huge pages always on may hold up to two 2 MiB pages for
        // them), not the 100 pages it grew to.
        while account.bytes() != 100 * PAGE || account.resident() < 10 * PAGE {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{memory}: {} bytes counted, {} resident",
                account.bytes(),
                account.resident()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let resident = account.resident();
        assert!(
            resident <= 10 * PAGE + (4 << 20),
            "{memory}: {resident} bytes resident"
        );
        writer.write_all(b"x").unwrap();
        assert_eq!(exit_code(guest.join().unwrap()), 0, "{memory}");
        assert_eq!(account.bytes(), 0, "{memory}: counted after its end");
        assert_eq!(account.resident(), 0, "{memory}: counted after its end");
    }
}
