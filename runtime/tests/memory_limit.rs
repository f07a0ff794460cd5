//! A guest's memory limit (a pod's `resources.limits.memory`): `memory.grow` past it fails
//! with -1, as an allocation fails in a process at its cgroup's limit, for a plain memory
//! (bounded by the store's limiter) and for a wasi-threads shared memory (bounded by its
//! type); a module that needs more than the limit at start is refused with one line.

use std::sync::Arc;

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
    let spec = GuestSpec {
        args: vec!["grower".into()],
        memory_limit,
        ..Default::default()
    };
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
