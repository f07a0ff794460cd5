//! Hostile and broken policy modules are refused at load with a one-line message naming the
//! problem, or contained at run time: the store keeps placing (with the default decision)
//! and the data written stays intact.

use std::sync::Arc;

use valet_runtime::policy::{self, Limits, PolicyModule, WasmPlacement};
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Class, DefaultPlacement, OpenOptions, Placement, Store, StoreConfig};

/// A well-formed policy whose `valet_place` body is `$body` (an i32 on the stack is the
/// return value); it decides zoned stream 3, group 7 when it returns 0.
fn policy_wat(start: &str, body: &str) -> Vec<u8> {
    let text = format!(
        r#"(module
          (memory (export "memory") 1)
          {start}
          (func (export "valet_abi_version") (result i32) i32.const 1)
          (func (export "valet_buffer") (result i32) i32.const 1024)
          (func (export "valet_place") (param i32) (result i32)
            ;; the whole 24-byte decision: class 0 (zoned), stream 3, group 7
            (memory.fill (i32.const 1024) (i32.const 0) (i32.const 24))
            (i32.store (i32.const 1028) (i32.const 3))
            (i32.store (i32.const 1032) (i32.const 7))
            {body})
        )"#
    );
    wat::parse_str(text).expect("test module assembles")
}

fn load(name: &str, bytes: &[u8]) -> anyhow::Result<PolicyModule> {
    PolicyModule::new(&policy::engine()?, name, bytes, Limits::default())
}

fn refusal(name: &str, bytes: &[u8]) -> String {
    let msg = load(name, bytes)
        .err()
        .expect("must be refused")
        .to_string();
    assert!(!msg.contains('\n'), "one line: {msg}");
    assert!(msg.contains(name), "names the policy: {msg}");
    msg
}

#[test]
fn well_formed_policy_decides() {
    let module = Arc::new(load("good", &policy_wat("", "i32.const 0")).unwrap());
    assert_eq!(module.sha256.len(), 64);
    let p = WasmPlacement::new(module, 8).unwrap();
    let hint = p.place(&request("db/1.log"));
    assert_eq!((hint.class, hint.stream, hint.group), (Class::Zoned, 3, 7));
    assert_eq!(p.faults(), 0);
}

#[test]
fn refused_at_load() {
    let wasi = wat::parse_str(
        r#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32))))"#,
    )
    .unwrap();
    assert!(refusal("wasi", &wasi).contains("wasi_snapshot_preview1::fd_write"));

    let wrong_sig = wat::parse_str(
        r#"(module (memory (export "memory") 1)
            (func (export "valet_abi_version") (result i32) i32.const 1)
            (func (export "valet_buffer") (result i32) i32.const 0)
            (func (export "valet_place") (param i64) (result i32) i32.const 0))"#,
    )
    .unwrap();
    assert!(refusal("sig", &wrong_sig).contains("valet_place"));

    let looping_start = policy_wat("(start $s) (func $s (loop $l (br $l)))", "i32.const 0");
    assert!(refusal("spin", &looping_start).contains("start"));

    let mut random = vec![0u8; 4096];
    let mut x = 0x2545_f491u32;
    for b in &mut random {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    assert!(refusal("noise", &random).contains("not a valid WebAssembly module"));

    let mut huge = b"\0asm\x01\0\0\0".to_vec();
    huge.resize(100 << 20, 0);
    assert!(refusal("huge", &huge).contains("limit"));

    let big_memory = wat::parse_str(
        r#"(module (memory (export "memory") 2000)
            (func (export "valet_abi_version") (result i32) i32.const 1)
            (func (export "valet_buffer") (result i32) i32.const 0)
            (func (export "valet_place") (param i32) (result i32) i32.const 0))"#,
    )
    .unwrap();
    assert!(refusal("fat", &big_memory).contains("cap"));
}

fn request(path: &str) -> valet_vfs::PlacementRequest<'_> {
    valet_vfs::PlacementRequest {
        tenant: 0,
        path,
        reason: valet_vfs::OpenReason::Create,
        size: 0,
    }
}

fn store() -> Store {
    let g = Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 8,
        max_active: 10,
    };
    let dev = Arc::new(MemoryDevice::new(g).unwrap()) as Arc<dyn ZonedDevice>;
    Store::open(dev, StoreConfig::default()).unwrap()
}

#[test]
fn misbehaving_policies_are_contained_while_data_stays_intact() {
    let cases = [
        ("loop", policy_wat("", "(loop $l (br $l)) i32.const 0")),
        ("trap", policy_wat("", "unreachable")),
        (
            "grow",
            // Grows until refused, then traps.
            policy_wat(
                "",
                "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) unreachable",
            ),
        ),
        (
            "nonsense",
            // Stream 9999 is past any device's streams.
            policy_wat("", "(i32.store (i32.const 1028) (i32.const 9999)) i32.const 0"),
        ),
    ];
    for (name, bytes) in cases {
        let module = Arc::new(load(name, &bytes).unwrap());
        let placement = Arc::new(WasmPlacement::new(module, 8).unwrap());
        let store = store();
        let (t, root) = store.tenant("app").unwrap();
        store.set_placement(t, placement.clone());
        for i in 0..3 {
            let path = format!("{i}.log");
            let f = store.open_file(root, &path, OpenOptions::create()).unwrap();
            f.write_at(&vec![i as u8; 10_000], 0).unwrap();
            f.close().unwrap();
            let hint = store
                .metadata(store.lookup(root, &path).unwrap())
                .unwrap()
                .hint;
            assert_eq!(hint, DefaultPlacement.place(&request(&path)), "{name}");
        }
        assert!(
            placement.faults() >= 3,
            "{name}: {} faults",
            placement.faults()
        );
        for i in 0..3u8 {
            let f = store
                .open_file(root, &format!("{i}.log"), OpenOptions::read())
                .unwrap();
            let mut buf = vec![0u8; 10_000];
            assert_eq!(f.read_at(&mut buf, 0).unwrap(), 10_000);
            assert!(buf.iter().all(|&b| b == i), "{name}");
        }
        assert!(store.fsck().unwrap().is_clean());
        let stats = store.stats();
        assert_eq!(stats.policies[0].name, name);
        assert!(stats.policies[0].faults >= 3);
    }
}

#[test]
fn a_call_that_outlives_its_deadline_faults_even_with_fuel_to_spare() {
    // Fuel is no bound here: the wall-clock deadline must end the spinning call.
    let limits = Limits {
        fuel_per_call: u64::MAX / 4,
        deadline_ms: 20,
        ..Limits::default()
    };
    let bytes = policy_wat("", "(loop $l (br $l)) i32.const 0");
    let module = PolicyModule::new(&policy::engine().unwrap(), "slow", &bytes, limits).unwrap();
    let p = WasmPlacement::new(Arc::new(module), 8).unwrap();
    let started = std::time::Instant::now();
    let hint = p.place(&request("db/1.log"));
    let took = started.elapsed();
    assert_eq!(hint, DefaultPlacement.place(&request("db/1.log")));
    assert_eq!(p.faults(), 1);
    // A loose bound (shared machines): far below what the fuel would have allowed.
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
}

/// A call that waits for a core is not slow. Its thread, pinned to one CPU at the lowest
/// priority beside two busy threads, needs far longer than its 20 ms deadline in wall-clock
/// time for 8,000,000 rounds of a loop (about 5 ms of CPU), and still answers: the deadline
/// counts the thread's CPU time. (A fault would throw the instance's state away, as it did
/// for `rocks` under a slow emulated CPU.)
#[test]
fn a_call_that_waits_for_a_core_is_not_a_fault() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let limits = Limits {
        fuel_per_call: u64::MAX / 4,
        deadline_ms: 20,
        ..Limits::default()
    };
    let bytes = policy_wat(
        "",
        "(local.set 0 (i32.const 8000000))
         (loop $l
           (local.set 0 (i32.sub (local.get 0) (i32.const 1)))
           (br_if $l (local.get 0)))
         i32.const 0",
    );
    let module = PolicyModule::new(&policy::engine().unwrap(), "patient", &bytes, limits).unwrap();
    let p = Arc::new(WasmPlacement::new(Arc::new(module), 8).unwrap());
    // Warm up: the first call may allocate and fault in pages.
    let decided = p.place(&request("db/0.log"));
    assert_ne!(decided, DefaultPlacement.place(&request("db/0.log")));
    // SAFETY: sched_getcpu only reads.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
    let pin = move || {
        // SAFETY: a zeroed cpu_set_t with one CPU set, applied to the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let spinning = Arc::new(std::sync::Barrier::new(3));
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let (stop, spinning) = (stop.clone(), spinning.clone());
            std::thread::spawn(move || {
                pin();
                spinning.wait();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    spinning.wait();
    let caller = {
        let p = p.clone();
        std::thread::spawn(move || {
            pin();
            // SAFETY: lowers the calling thread's own priority.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
            // The scheduler may still run a call in one go (a thread that just woke or
            // moved gets its turn first): try until one call had to wait.
            let mut calls = Vec::new();
            for _ in 0..10 {
                let started = Instant::now();
                let hint = p.place(&request("db/1.log"));
                calls.push((hint, started.elapsed()));
                if started.elapsed() > Duration::from_millis(60) {
                    break;
                }
            }
            calls
        })
    };
    let calls = caller.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    let took: Vec<Duration> = calls.iter().map(|c| c.1).collect();
    assert_eq!(
        p.faults(),
        0,
        "calls that took {took:?} of wall-clock time faulted"
    );
    assert!(calls.iter().all(|c| c.0 == decided));
    assert!(
        took.iter().any(|t| *t > Duration::from_millis(60)),
        "no call had to wait for a core ({took:?}): the test proves nothing"
    );
}

#[test]
fn fuel_used_per_call_is_counted() {
    let module = Arc::new(load("good", &policy_wat("", "i32.const 0")).unwrap());
    let p = WasmPlacement::new(module, 8).unwrap();
    p.place(&request("db/1.log"));
    let used = p
        .counters
        .max_fuel_place
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(used > 0 && used < 1_000, "{used}");
}
