//! The multi-tenant run: the LSM guest and the cache guest at once on one device
//! (`valet-run --tenants`), against each of them alone on the same kind of device.

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
    Ok(results)
}
