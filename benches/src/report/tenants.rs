//! The multi-tenant run: the LSM guest and the cache guest at once on one device
//! (`valet-run --tenants`), against each of them alone on the same kind of device; the same
//! pair as two `valet-run` processes at once, each on a device of its own, which shows what
//! sharing the machine's cores costs Valet without any shared store; and the pair as two
//! stock wasmtime processes on host directories, at once against alone.

use std::path::Path;

use super::parse::{self, Measurement};
use super::runners::{Runner, MOUNT};
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

fn run_toml(runner: &Runner, file: &Path, text: &str, zones: u32) -> Result<String, String> {
    std::fs::write(file, text).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = runner.valet(&["--tenants".into(), file.display().to_string()], zones)?;
    if out.code != 0 {
        return Err(out.why());
    }
    Ok(out.stdout)
}

/// Runs each tenant alone, then all at once. Tenants' stdout interleaves line by line in
/// the shared run, so a workload line is credited to the tenant whose lone run printed a
/// workload of that name.
pub fn run(
    runner: &Runner,
    tenants: &[(&str, Workload)],
    zones: u32,
) -> Result<Vec<TenantResult>, String> {
    let mut results = Vec::new();
    let mut all = String::new();
    for (name, w) in tenants {
        let text = tenant_toml(name, w);
        let file = runner.work.join(format!("tenant-{name}.toml"));
        let alone = parse::parse(&run_toml(runner, &file, &text, zones)?);
        all.push_str(&text);
        results.push(TenantResult {
            tenant: name.to_string(),
            guest: w.guest,
            alone,
            together: Vec::new(),
            apart: Vec::new(),
            stock_alone: stock(runner, w),
            stock_together: Vec::new(),
        });
    }
    let together = parse::parse(&run_toml(
        runner,
        &runner.work.join("tenants.toml"),
        &all,
        zones,
    )?);
    for m in together {
        if let Some(r) = results
            .iter_mut()
            .find(|r| r.alone.iter().any(|a| a.name == m.name))
        {
            r.together.push(m);
        }
    }
    let apart: Vec<Vec<Measurement>> = std::thread::scope(|scope| {
        let runs: Vec<_> = tenants
            .iter()
            .map(|(name, w)| {
                let file = runner.work.join(format!("apart-{name}.toml"));
                let text = tenant_toml(name, w);
                scope.spawn(move || run_toml(runner, &file, &text, zones))
            })
            .collect();
        runs.into_iter()
            .map(|r| match r.join() {
                Ok(Ok(out)) => parse::parse(&out),
                Ok(Err(e)) => {
                    eprintln!("report: a tenant in its own valet-run: {e}");
                    Vec::new()
                }
                Err(_) => Vec::new(),
            })
            .collect()
    });
    for (r, m) in results.iter_mut().zip(apart) {
        r.apart = m;
    }
    let together: Vec<Vec<Measurement>> = std::thread::scope(|scope| {
        let runs: Vec<_> = tenants
            .iter()
            .map(|(_, w)| scope.spawn(|| stock(runner, w)))
            .collect();
        runs.into_iter()
            .map(|r| r.join().unwrap_or_default())
            .collect()
    });
    for (r, m) in results.iter_mut().zip(together) {
        r.stock_together = m;
    }
    Ok(results)
}

/// `w` under stock wasmtime on a fresh host directory: its measurements, none on failure.
fn stock(runner: &Runner, w: &Workload) -> Vec<Measurement> {
    let Some(wasm) = valet_guests::wasm(w.guest) else {
        return Vec::new();
    };
    match runner.stock(wasm, &w.args_for(MOUNT)) {
        Ok(out) if out.code == 0 => parse::parse(&out.stdout),
        Ok(out) => {
            eprintln!("report: stock {}: {}", w.guest, out.why());
            Vec::new()
        }
        Err(e) => {
            eprintln!("report: stock {}: {e}", w.guest);
            Vec::new()
        }
    }
}
