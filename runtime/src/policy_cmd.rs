//! `valet-run policy check|push|list`: validate a policy and see what it decides, or manage
//! the policies of a running `valet-run` through its admin API.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Subcommand;
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Class, Placement, Store, StoreConfig};

use crate::admin::{client, AdminAddr, Registry};
use crate::policy::{Limits, WasmPlacement};
use crate::trace;

/// The `policy` commands.
#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy; with a trace, print the decision for every placement in it.
    Check {
        /// A policy module, or the name of a built-in.
        #[arg(value_name = "FILE.wasm|NAME")]
        policy: String,
        /// A trace recorded with `--record-trace`.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Also replay the trace's files on a store and print the accounting as JSON.
        #[arg(long, requires = "trace")]
        replay: bool,
        /// Streams the device keeps apart (what `valet_init` is told).
        #[arg(long, default_value_t = 12)]
        streams: u32,
        /// Zone size of the replay device in MiB (default: about 64 zones); the device is
        /// sized so the trace's peak of live data fills it to about 80 %.
        #[arg(long, value_name = "MIB", requires = "replay")]
        zone_mib: Option<u64>,
    },
    /// Upload a policy to a running valet-run and make it a tenant's policy.
    Push {
        /// The policy module.
        #[arg(value_name = "FILE.wasm")]
        module: PathBuf,
        /// The admin address valet-run was started with.
        #[arg(long, value_name = "ADDR")]
        admin: String,
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Name to load it under (default: the file's stem).
        #[arg(long)]
        name: Option<String>,
        /// The admin token file (default: DEVICE/admin.token).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        #[arg(long, default_value = "valet-data", value_name = "PATH")]
        device: PathBuf,
    },
    /// List the policies a running valet-run has loaded.
    List {
        #[arg(long, value_name = "ADDR")]
        admin: String,
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        #[arg(long, default_value = "valet-data", value_name = "PATH")]
        device: PathBuf,
    },
}

fn describe(hint: &valet_vfs::Hint) -> String {
    match hint.class {
        Class::Conventional => "conventional".into(),
        Class::Zoned => {
            let mut s = format!("stream {} group {}", hint.stream, hint.group);
            if hint.group_starts_zone {
                s.push_str(" new-zone-per-group");
            }
            if hint.rotate_mib > 0 {
                s.push_str(&format!(" rotate {} MiB", hint.rotate_mib));
            }
            if hint.rotate_secs > 0 {
                s.push_str(&format!(" rotate {} s", hint.rotate_secs));
            }
            s
        }
    }
}

/// Runs a `policy` command; returns the exit code.
pub fn run(command: PolicyCommand) -> Result<u8> {
    match command {
        PolicyCommand::Check {
            policy,
            trace: trace_file,
            replay,
            streams,
            zone_mib,
        } => {
            // A scratch store only hosts the registry; checks never touch a real device.
            let scratch = scratch_store(Geometry {
                zone_count: 8,
                zone_size: 1 << 20,
                zone_capacity: 1 << 20,
                block_size: 4096,
                max_open: 4,
                max_active: 4,
            })?;
            let registry = Registry::with_builtins(scratch, streams, Limits::default())?;
            let name = registry.resolve(&policy)?;
            let info = registry
                .list()
                .into_iter()
                .find(|p| p.name == name)
                .context("policy vanished")?;
            println!("policy {name}: ok (sha256 {})", info.sha256);
            let Some(trace_file) = trace_file else {
                return Ok(0);
            };
            let records = trace::read(&trace_file)?;
            let module = registry.module(&name)?;
            let placement = Arc::new(WasmPlacement::new(module.clone(), streams)?);
            let decisions = trace::decisions(&records, placement.as_ref());
            let mut per: BTreeMap<String, usize> = BTreeMap::new();
            for (path, hint) in &decisions {
                let d = describe(hint);
                println!("{path}\t{d}");
                *per.entry(d).or_default() += 1;
            }
            for (d, n) in &per {
                println!("# {n} file(s): {d}");
            }
            let counters = &placement.counters;
            println!(
                "# fuel per call: valet_place at most {}, valet_event at most {} (budget {})",
                counters
                    .max_fuel_place
                    .load(std::sync::atomic::Ordering::Relaxed),
                counters
                    .max_fuel_event
                    .load(std::sync::atomic::Ordering::Relaxed),
                Limits::default().fuel_per_call
            );
            if placement.faults() > 0 {
                println!(
                    "# {} fault(s): the default decided those",
                    placement.faults()
                );
            }
            if replay {
                let fresh = Arc::new(WasmPlacement::new(module, streams)?);
                let geometry = replay_geometry(&records, zone_mib);
                let stats = trace::replay_on_store(&records, fresh, geometry)?;
                println!("{}", serde_json::to_string(&stats)?);
            }
            Ok(0)
        }
        PolicyCommand::Push {
            module,
            admin,
            tenant,
            name,
            token_file,
            device,
        } => {
            let addr = AdminAddr::parse(&admin)?;
            let token = client::read_token(token_file, device)?;
            let bytes = std::fs::read(&module)
                .with_context(|| format!("cannot read {}", module.display()))?;
            let name = name.unwrap_or_else(|| {
                module
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "policy".into())
            });
            let (code, body) =
                client::request(&addr, &token, "PUT", &format!("/policies/{name}"), &bytes)?;
            if code != 201 {
                return Err(client::api_error(code, &body));
            }
            let (code, body) = client::request(
                &addr,
                &token,
                "PUT",
                &format!("/tenants/{}/policy", client::path_segment(&tenant)),
                name.as_bytes(),
            )?;
            if code != 200 {
                return Err(client::api_error(code, &body));
            }
            println!("policy {name} is now tenant {tenant}'s");
            Ok(0)
        }
        PolicyCommand::List {
            admin,
            token_file,
            device,
        } => {
            let addr = AdminAddr::parse(&admin)?;
            let token = client::read_token(token_file, device)?;
            let (code, body) = client::request(&addr, &token, "GET", "/policies", b"")?;
            if code != 200 {
                return Err(client::api_error(code, &body));
            }
            let list: Vec<crate::admin::PolicyInfo> = serde_json::from_slice(&body)?;
            for p in list {
                println!("{}\t{}\t{}", p.name, p.sha256, p.tenants.join(","));
            }
            Ok(0)
        }
    }
}

fn scratch_store(geometry: Geometry) -> Result<Store> {
    let device = Arc::new(MemoryDevice::new(geometry)?) as Arc<dyn ZonedDevice>;
    Ok(Store::open(device, StoreConfig::default())?)
}

/// A device the trace's peak of live data fills to about 80 %, in zones of `zone_mib` (or
/// about 64 zones of 1 MiB or more), plus the two metadata zones and GC's reserve.
fn replay_geometry(records: &[trace::Record], zone_mib: Option<u64>) -> Geometry {
    let mut live: BTreeMap<&str, u64> = BTreeMap::new();
    let mut peak = 0u64;
    for r in records {
        match r {
            trace::Record::Written { path, bytes, .. } => {
                *live.entry(path).or_default() += bytes;
            }
            trace::Record::Deleted { path, .. } => {
                live.remove(path.as_str());
            }
            _ => {}
        }
        peak = peak.max(live.values().sum());
    }
    let mib = 1u64 << 20;
    let zone = zone_mib.map_or((peak / 64).div_ceil(mib).max(1), |z| z.max(1)) * mib;
    let zones = (((peak as f64 / 0.8) as u64).div_ceil(zone) as u32 + 2 + 1).max(8);
    Geometry {
        zone_count: zones,
        zone_size: zone,
        zone_capacity: zone,
        block_size: 4096,
        max_open: 14,
        max_active: 14,
    }
}
