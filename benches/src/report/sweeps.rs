//! The two sweeps: WAF and GC bytes moved against device utilization (the LSM trace of
//! [`valet_vfs::workload`] on the store, WAL and tables apart or in one stream, and on the
//! conventional-SSD model at 7 % and 28 % OP), and the cache guest's WAF and hit ratio
//! against over-provisioning.

use valet_vfs::workload::{LsmTrace, LsmTraceResult};

use super::parse;
use super::runners::{Runner, MOUNT};
use super::workloads::{self, Scale, Workload, META_ZONES, ZONE_CAPACITY};

/// Over-provisioning of the two conventional SSDs.
pub const FTL_OPS: [f64; 2] = [0.07, 0.28];

/// One utilization: the store with WAL and tables apart (and the 7 % SSD), and everything in
/// one stream (and the 28 % SSD). The SSD sees the same blocks either way.
pub struct WafPoint {
    pub target: f64,
    pub apart: LsmTraceResult,
    pub mixed: LsmTraceResult,
}

/// Runs the LSM trace at each utilization of the sweep.
pub fn waf_sweep(scale: Scale) -> Result<Vec<WafPoint>, String> {
    let (targets, data_zones, passes): (&[f64], u32, f64) = match scale {
        Scale::Small => (&[0.5, 0.7, 0.8, 0.9], 32, 2.0),
        Scale::Full => (&[0.5, 0.6, 0.7, 0.8, 0.85, 0.9], 64, 3.0),
    };
    targets
        .iter()
        .map(|&target| {
            let run = |single_stream: bool, ftl_op: f64| {
                LsmTrace {
                    single_stream,
                    utilization: target,
                    ftl_op,
                    passes,
                    data_zones,
                    ..Default::default()
                }
                .run()
                .map_err(|e| format!("trace at {target}: {e}"))
            };
            Ok(WafPoint {
                target,
                apart: run(false, FTL_OPS[0])?,
                mixed: run(true, FTL_OPS[1])?,
            })
        })
        .collect()
}

/// The cache guest at one over-provisioning.
pub struct CachePoint {
    pub op: f64,
    pub flash_mib: u64,
    pub waf: Option<f64>,
    pub gc_bytes_moved: Option<u64>,
    pub hit_ratio: Option<f64>,
    /// Why the run gave nothing, if it failed.
    pub failure: Option<String>,
}

/// Over-provisioning levels, as in the ZNS cache paper's Table 1.
pub const CACHE_OPS: [f64; 3] = [0.10, 0.15, 0.20];

/// Runs `guest` (`cache`, or `cache_sim` before it lands) under `cachelib` with its flash
/// set to leave each over-provisioning free on the device.
pub fn cache_sweep(runner: &Runner, scale: Scale, guest: &'static str) -> Vec<CachePoint> {
    let data_zones = workloads::cache_sweep_zones(scale);
    let capacity_mib = (data_zones as u64 * ZONE_CAPACITY) >> 20;
    let (ops, keys) = workloads::cache_sweep_size(scale);
    CACHE_OPS
        .iter()
        .map(|&op| {
            let flash_mib = ((1.0 - op) * capacity_mib as f64).floor() as u64;
            let args = if guest == "cache" {
                workloads::cache_args(&ops.to_string(), &keys.to_string(), flash_mib)
            } else {
                // cache_sim: 2 MiB regions, as many as the flash holds.
                let regions = (flash_mib / 2).to_string();
                ["--dir", "{data}/cache", "--ops", &ops.to_string()]
                    .into_iter()
                    .chain(["--regions", &regions])
                    .map(str::to_string)
                    .collect()
            };
            let w = Workload {
                guest,
                label: format!("{guest} op {op}"),
                policy: "cachelib",
                args,
                sync: false,
            };
            let mut point = CachePoint {
                op,
                flash_mib,
                waf: None,
                gc_bytes_moved: None,
                hit_ratio: None,
                failure: None,
            };
            let wasm = valet_guests::wasm(guest).unwrap_or_default();
            match runner.guest(wasm, w.policy, w.args_for(MOUNT), data_zones + META_ZONES) {
                Ok(out) if out.code == 0 => {
                    point.waf = out.stats.as_ref().map(|s| s.waf);
                    point.gc_bytes_moved = out.stats.as_ref().map(|s| s.gc_bytes_moved);
                    point.hit_ratio = parse::find_value(&out.stdout, "hit_ratio")
                        .or_else(|| parse::find_value(&out.stdout, "hit ratio"));
                }
                Ok(out) => point.failure = Some(out.why()),
                Err(e) => point.failure = Some(e),
            }
            point
        })
        .collect()
}
