//! The multi-tenant run: the LSM guest and the cache guest at once on one device
//! (`valet-run --tenants`), against each of them alone on the same kind of device; the same
//! pair as two `valet-run` processes at once, each on a device of its own, which shows what
//! sharing the machine's cores costs Valet without any shared store; and the pair as two
//! stock wasmtime processes on host directories, at once against alone; and that stock pair
//! again on a memory file system (`/dev/shm`), where no disk is involved at all: what two busy
//! guests cost each other on this machine's cores alone; and the `valet-run` pair, alone and
//! together, on that memory file system too, which tells what the store's sharing costs
//! from what the disk does. Each run's CPU time over its wall time says how many cores it
//! kept busy, alone and together. The whole comparison runs several rounds, and every
//! figure is its median over them.

use std::path::Path;
use std::time::Duration;

use tempfile::TempDir;

use super::parse::{self, Measurement};
use super::runners::{Outcome, Runner, MOUNT};
use super::workloads::Workload;

/// One tenant's workloads alone and together.
pub struct TenantResult {
    pub tenant: String,
    pub guest: &'static str,
    pub alone: Vec<Measurement>,
    pub together: Vec<Measurement>,
    /// Its own `valet-run` process and device, while the other tenant runs in another
    /// (empty when that run failed).
    pub apart: Vec<Measurement>,
    /// The same guest under stock wasmtime, alone and beside the other stock process (empty
    /// when a stock run failed).
    pub stock_alone: Vec<Measurement>,
    pub stock_together: Vec<Measurement>,
    /// The stock pair on a memory file system (empty where there is none or a run failed).
    pub memory_alone: Vec<Measurement>,
    pub memory_together: Vec<Measurement>,
    /// The `valet-run` pair with its device on that memory file system, alone and as two
    /// tenants of one process (empty where there is none or a run failed).
    pub valet_memory_alone: Vec<Measurement>,
    pub valet_memory_together: Vec<Measurement>,
    /// Cores this tenant's run kept busy alone (CPU time over wall time), under
    /// `valet-run` and under stock.
    pub cores_alone: Option<f64>,
    pub stock_cores_alone: Option<f64>,
}

/// Cores the runs together kept busy (all processes' CPU time over the longest wall time).
pub struct PairCores {
    pub valet: Option<f64>,
    pub stock: Option<f64>,
}

/// The pair's results: medians over `rounds` rounds.
pub struct Pair {
    pub tenants: Vec<TenantResult>,
    pub together_cores: PairCores,
    pub rounds: usize,
}

/// A memory file system to put the memory runs' directories in, if this machine has one.
const MEMORY_FS: &str = "/dev/shm";

/// Cores kept busy by runs that took `cpu` in all over `wall`.
fn cores(cpu: Option<Duration>, wall: Duration) -> Option<f64> {
    cpu.map(|c| c.as_secs_f64() / wall.as_secs_f64().max(1e-9))
}

/// One run's measurements and the cores it kept busy.
struct Run {
    measurements: Vec<Measurement>,
    cpu: Option<Duration>,
    wall: Duration,
}

/// The `[[tenant]]` table of `w` named `name`.
fn tenant_toml(name: &str, w: &Workload) -> String {
    let wasm = valet_guests::wasm(w.guest).unwrap_or_default();
    let args: Vec<String> = w.args_for(MOUNT).iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[[tenant]]\nname = {name:?}\napp = {wasm:?}\nargs = [{}]\npolicy = {:?}\nmount = {MOUNT:?}\n\n",
        args.join(", "),
        w.policy
    )
}

fn run_toml(runner: &Runner, file: &Path, text: &str, zones: u32) -> Result<Run, String> {
    std::fs::write(file, text).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = runner.valet(&["--tenants".into(), file.display().to_string()], zones)?;
    if out.code != 0 {
        return Err(out.why());
    }
    Ok(Run::of(&out))
}

/// [`run_toml`], whose failure is reported on stderr as `what` and leaves the run's
/// figures empty (the rest of the comparison goes on).
fn run_toml_or_failed(runner: &Runner, file: &Path, text: &str, zones: u32, what: &str) -> Run {
    run_toml(runner, file, text, zones).unwrap_or_else(|e| {
        eprintln!("report: {what}: {e}");
        Run::failed()
    })
}

impl Run {
    fn of(out: &Outcome) -> Run {
        Run {
            measurements: parse::parse(&out.stdout),
            cpu: out.cpu,
            wall: out.wall,
        }
    }

    fn failed() -> Run {
        Run {
            measurements: Vec::new(),
            cpu: None,
            wall: Duration::ZERO,
        }
    }

    fn cores(&self) -> Option<f64> {
        cores(self.cpu, self.wall)
    }
}

/// Cores kept busy by runs made at once.
fn cores_together(runs: &[Run]) -> Option<f64> {
    let cpu = runs.iter().map(|r| r.cpu).sum::<Option<Duration>>();
    cores(cpu, runs.iter().map(|r| r.wall).max()?)
}

/// Runs the whole comparison `rounds` times and gives each figure's median over the rounds
/// (a tail of one run says little on a shared machine).
pub fn run(
    runner: &Runner,
    tenants: &[(&str, Workload)],
    zones: u32,
    rounds: usize,
) -> Result<Pair, String> {
    let rounds = rounds.max(1);
    let pairs = (0..rounds)
        .map(|round| {
            eprintln!("report: multi-tenant, round {} of {rounds}", round + 1);
            run_round(runner, tenants, zones)
        })
        .collect::<Result<Vec<Pair>, String>>()?;
    let median_of = |f: &dyn Fn(&Pair) -> Option<f64>| {
        let v: Vec<f64> = pairs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| super::median(&v))
    };
    let tenants = (0..pairs[0].tenants.len())
        .map(|i| {
            let of = |f: fn(&TenantResult) -> &Vec<Measurement>| {
                parse::medians(
                    &pairs
                        .iter()
                        .map(|p| f(&p.tenants[i]).as_slice())
                        .collect::<Vec<_>>(),
                )
            };
            TenantResult {
                tenant: pairs[0].tenants[i].tenant.clone(),
                guest: pairs[0].tenants[i].guest,
                alone: of(|t| &t.alone),
                together: of(|t| &t.together),
                apart: of(|t| &t.apart),
                stock_alone: of(|t| &t.stock_alone),
                stock_together: of(|t| &t.stock_together),
                memory_alone: of(|t| &t.memory_alone),
                memory_together: of(|t| &t.memory_together),
                valet_memory_alone: of(|t| &t.valet_memory_alone),
                valet_memory_together: of(|t| &t.valet_memory_together),
                cores_alone: median_of(&|p| p.tenants[i].cores_alone),
                stock_cores_alone: median_of(&|p| p.tenants[i].stock_cores_alone),
            }
        })
        .collect();
    Ok(Pair {
        tenants,
        together_cores: PairCores {
            valet: median_of(&|p| p.together_cores.valet),
            stock: median_of(&|p| p.together_cores.stock),
        },
        rounds: pairs.len(),
    })
}

/// Runs each tenant alone, then all at once. Tenants' stdout interleaves line by line in
/// the shared run, so a workload line is credited to the tenant whose lone run printed a
/// workload of that name.
fn run_round(runner: &Runner, tenants: &[(&str, Workload)], zones: u32) -> Result<Pair, String> {
    let memory = memory_runner(runner);
    let memory = memory.as_ref().map(|(_, r)| r);
    let mut results = Vec::new();
    let mut all = String::new();
    for (name, w) in tenants {
        let text = tenant_toml(name, w);
        let file = runner.work.join(format!("tenant-{name}.toml"));
        let alone = run_toml(runner, &file, &text, zones)?;
        all.push_str(&text);
        let stock_alone = stock(runner, w);
        let memory_alone = memory.map_or_else(Run::failed, |m| stock(m, w));
        let valet_memory_alone = memory.map_or_else(Run::failed, |m| {
            let file = m.work.join(format!("tenant-{name}.toml"));
            run_toml_or_failed(
                m,
                &file,
                &text,
                zones,
                "a tenant alone with its device in memory",
            )
        });
        results.push(TenantResult {
            tenant: name.to_string(),
            guest: w.guest,
            cores_alone: alone.cores(),
            alone: alone.measurements,
            together: Vec::new(),
            apart: Vec::new(),
            stock_cores_alone: stock_alone.cores(),
            stock_alone: stock_alone.measurements,
            stock_together: Vec::new(),
            memory_alone: memory_alone.measurements,
            memory_together: Vec::new(),
            valet_memory_alone: valet_memory_alone.measurements,
            valet_memory_together: Vec::new(),
        });
    }
    let together = run_toml(runner, &runner.work.join("tenants.toml"), &all, zones)?;
    credit(&mut results, &together.measurements, |r| &mut r.together);
    if let Some(m) = memory {
        match run_toml(m, &m.work.join("tenants.toml"), &all, zones) {
            Ok(run) => credit(&mut results, &run.measurements, |r| {
                &mut r.valet_memory_together
            }),
            Err(e) => eprintln!("report: the tenants together with their device in memory: {e}"),
        }
    }
    let apart: Vec<Run> = at_once(tenants, |(name, w)| {
        let file = runner.work.join(format!("apart-{name}.toml"));
        run_toml_or_failed(
            runner,
            &file,
            &tenant_toml(name, w),
            zones,
            "a tenant in its own valet-run",
        )
    });
    for (r, m) in results.iter_mut().zip(apart) {
        r.apart = m.measurements;
    }
    let stock_together = at_once(tenants, |(_, w)| stock(runner, w));
    let stock_cores = cores_together(&stock_together);
    for (r, m) in results.iter_mut().zip(stock_together) {
        r.stock_together = m.measurements;
    }
    if let Some(memory) = memory {
        for (r, m) in results
            .iter_mut()
            .zip(at_once(tenants, |(_, w)| stock(memory, w)))
        {
            r.memory_together = m.measurements;
        }
    }
    Ok(Pair {
        tenants: results,
        together_cores: PairCores {
            valet: together.cores(),
            stock: stock_cores,
        },
        rounds: 1,
    })
}

/// Gives each measurement of a run of several tenants to the tenant whose lone run printed
/// a workload of that name, in the list `to` picks.
fn credit(
    results: &mut [TenantResult],
    measurements: &[Measurement],
    to: fn(&mut TenantResult) -> &mut Vec<Measurement>,
) {
    for m in measurements {
        if let Some(r) = results
            .iter_mut()
            .find(|r| r.alone.iter().any(|a| a.name == m.name))
        {
            to(r).push(m.clone());
        }
    }
}

/// `f` for every tenant, each on a thread of its own, all at once.
fn at_once<'a>(
    tenants: &'a [(&'a str, Workload)],
    f: impl Fn(&'a (&'a str, Workload)) -> Run + Sync,
) -> Vec<Run> {
    std::thread::scope(|scope| {
        let runs: Vec<_> = tenants.iter().map(|t| scope.spawn(|| f(t))).collect();
        runs.into_iter()
            .map(|r| r.join().unwrap_or_else(|_| Run::failed()))
            .collect()
    })
}

/// A runner like `runner` whose scratch directories go in a new directory on
/// [`MEMORY_FS`] (removed with the returned guard), if there is one.
fn memory_runner(runner: &Runner) -> Option<(TempDir, Runner)> {
    let dir = tempfile::Builder::new()
        .prefix("valet-report-")
        .tempdir_in(MEMORY_FS)
        .ok()?;
    let memory = Runner {
        valet_run: runner.valet_run.clone(),
        self_exe: runner.self_exe.clone(),
        work: dir.path().to_path_buf(),
        timeout: runner.timeout,
    };
    Some((dir, memory))
}

/// `w` under stock wasmtime on a fresh host directory of `runner`'s; no measurements on
/// failure.
fn stock(runner: &Runner, w: &Workload) -> Run {
    let Some(wasm) = valet_guests::wasm(w.guest) else {
        return Run::failed();
    };
    match runner.stock(wasm, &w.args_for(MOUNT)) {
        Ok(out) if out.code == 0 => Run::of(&out),
        Ok(out) => {
            eprintln!("report: stock {}: {}", w.guest, out.why());
            Run::failed()
        }
        Err(e) => {
            eprintln!("report: stock {}: {e}", w.guest);
            Run::failed()
        }
    }
}
