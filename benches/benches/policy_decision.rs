//! One placement decision through the policy sandbox (fuel metering, memory cap, the ABI's
//! request and decision encoding), for the built-ins `default` and `learn` (trained first on
//! an LSM-shaped stream of opens and deletes).
//!
//!     cargo bench -p valet-benches --bench policy_decision
//!
//! Criterion reports the mean and median; the tail is measured separately, call by call,
//! and printed as p50 / p99 / p99.9 (targets: median < 1 µs, p99.9 < 10 µs).

use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use valet_runtime::policy::{self, Limits, PolicyModule, WasmPlacement};
use valet_vfs::{FileEvent, Hint, OpenReason, Placement, PlacementRequest};

fn placement(name: &str) -> WasmPlacement {
    let engine = policy::engine().expect("engine");
    let bytes = valet_policies::builtin(name).expect("built-in");
    let module = PolicyModule::new(&engine, name, bytes, Limits::default()).expect("loads");
    WasmPlacement::new(Arc::new(module), 12).expect("instance")
}

fn request(path: &str) -> PlacementRequest<'_> {
    PlacementRequest {
        tenant: 0,
        path,
        reason: OpenReason::Create,
        size: 0,
    }
}

/// Opens and deletes of WAL-like and table-like files, so `learn` has clusters to use.
fn train(p: &dyn Placement) {
    for i in 0..400u64 {
        let wal = format!("db/{i:06}.log");
        let table = format!("db/{:06}.ldb", i + 100_000);
        p.place(&request(&wal));
        p.place(&request(&table));
        p.event(&FileEvent::Deleted {
            tenant: 0,
            path: &wal,
            hint: Hint::zoned(0),
            lifetime_bytes: 4 << 20,
            lifetime_secs: 1.0,
        });
        if i >= 40 {
            let old = format!("db/{:06}.ldb", i + 100_000 - 40);
            p.event(&FileEvent::Deleted {
                tenant: 0,
                path: &old,
                hint: Hint::zoned(0),
                lifetime_bytes: 200 << 20,
                lifetime_secs: 60.0,
            });
        }
    }
}

fn percentiles(p: &dyn Placement, paths: &[String]) -> (f64, f64, f64) {
    let mut ns: Vec<f64> = Vec::with_capacity(200_000);
    for i in 0..200_000 {
        let path = &paths[i % paths.len()];
        let t = Instant::now();
        std::hint::black_box(p.place(&request(path)));
        ns.push(t.elapsed().as_nanos() as f64);
    }
    ns.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)];
    (at(0.5), at(0.99), at(0.999))
}

fn decisions(c: &mut Criterion) {
    let paths: Vec<String> = (0..64)
        .map(|i| {
            if i % 2 == 0 {
                format!("db/{i:06}.log")
            } else {
                format!("db/{i:06}.ldb")
            }
        })
        .collect();
    let mut group = c.benchmark_group("placement_decision");
    for name in ["default", "learn"] {
        let p = placement(name);
        train(&p);
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % paths.len();
                std::hint::black_box(p.place(&request(&paths[i])))
            })
        });
        let (p50, p99, p999) = percentiles(&p, &paths);
        println!("{name}: p50 {p50:.0} ns, p99 {p99:.0} ns, p99.9 {p999:.0} ns (200,000 calls)");
        assert_eq!(p.faults(), 0, "{name} faulted");
    }
    group.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
