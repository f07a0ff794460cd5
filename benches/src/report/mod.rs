//! The comparison report: `report --scale small|full --out DIR` runs every bench guest under
//! each configuration ([`runners`]), sweeps WAF against utilization and over-provisioning
//! ([`sweeps`]), runs two guests as tenants of one device ([`tenants`]), measures synced
//! small writes against the disk's one-flush limit and several synced writers at once
//! ([`synced`]), repeats the unsynced tail targets in rounds ([`tails`]), and writes
//! `DIR/report.md` ([`markdown`], [`write`]) with SVG figures ([`plots`]).

pub mod devices;
pub mod fleet;
pub mod markdown;
pub mod parse;
pub mod plots;
pub mod rocksdb;
pub mod runners;
pub mod startup;
pub mod sweeps;
pub mod synced;
pub mod tails;
pub mod tenants;
pub mod workloads;
mod write;
pub mod zones;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use parse::Measurement;
use runners::{Config, Outcome, Runner};
use valet_vfs::Stats;
use workloads::{Scale, Workload};

/// The workload after whose runs the one-flush limit is measured.
const SYNC_ROW: &str = "leveldb sync";
/// Rounds of the multi-tenant comparison; its figures are medians over them.
const TENANT_ROUNDS: usize = 3;

/// What one configuration of one workload gave.
pub struct RunData {
    pub measurements: Vec<Measurement>,
    pub stats: Option<Stats>,
    pub wall: Duration,
    /// The process's peak resident memory in bytes.
    pub peak_rss: Option<u64>,
}

/// One workload under every configuration: `None` where it does not apply.
pub struct Row {
    pub workload: Workload,
    pub results: Vec<(Config, Result<RunData, String>)>,
}

impl Row {
    pub fn get(&self, config: Config) -> Option<&RunData> {
        self.results
            .iter()
            .find(|(c, _)| *c == config)
            .and_then(|(_, r)| r.as_ref().ok())
    }
}

/// Everything the report shows.
pub struct Results {
    pub scale: Scale,
    pub rows: Vec<Row>,
    /// Guests or runs left out, one line each.
    pub skipped: Vec<String>,
    pub waf: Result<Vec<sweeps::WafPoint>, String>,
    pub cache_guest: Option<&'static str>,
    pub cache: Vec<sweeps::CachePoint>,
    pub tenants: Result<tenants::Pair, String>,
    /// The one-flush limit and the grouped-sync runs.
    pub synced: synced::Synced,
    /// The unsynced tail targets over several rounds.
    pub tails: tails::Tails,
    /// (label, map) of the zone maps taken.
    pub zone_maps: Vec<(String, zones::ZoneMap)>,
    pub wall: Duration,
}

/// `report` with its command line (without the program name); returns the exit code.
pub fn main(args: &[String]) -> i32 {
    if args.first().map(String::as_str) == Some(runners::STOCK_SUBCOMMAND) {
        return runners::stock_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("rocksdb") {
        return rocksdb::main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("fleet") {
        return fleet::main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("probes") {
        return probes_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("synced") {
        return synced_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("tenants") {
        return tenants_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("startup") {
        return startup::main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("tails") {
        return section_main(&args[1..], "tails", |runner, scale| {
            Ok(write::tails_section(&tails::run(runner, scale), scale))
        });
    }
    let usage = "usage: report [--scale small|full] [--out DIR] | report probes [DIR] [ROUNDS] \
                 | report synced|tenants|tails|rocksdb|fleet|startup [--scale small|full] [--out DIR]";
    let Some((scale, out)) = scale_and_out(args, usage) else {
        return 2;
    };
    match run(scale, &out) {
        Ok(()) => {
            eprintln!("report: wrote {}", out.join("report.md").display());
            0
        }
        Err(e) => {
            eprintln!("report: {e}");
            1
        }
    }
}

/// Runs one section on its own (`report NAME`): `section` gets a fresh work directory under
/// `out` and returns the markdown, written to `out/NAME.md`. Returns the exit code.
pub(super) fn run_section(
    out: &std::path::Path,
    name: &str,
    section: impl FnOnce(PathBuf) -> Result<String, String>,
) -> i32 {
    let result = (|| -> Result<PathBuf, String> {
        let work = out.join(format!(".work-{name}"));
        std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
        let md = section(work.canonicalize().map_err(|e| e.to_string())?)?;
        let path = out.join(format!("{name}.md"));
        std::fs::write(&path, md).map_err(|e| format!("{}: {e}", path.display()))?;
        let _ = std::fs::remove_dir_all(&work);
        Ok(path)
    })();
    match result {
        Ok(path) => {
            eprintln!("report: wrote {}", path.display());
            0
        }
        Err(e) => {
            eprintln!("report: {e}");
            1
        }
    }
}

/// The flags of the report and of its sections, `[--scale small|full] [--out DIR]`; None,
/// once `usage` is printed, on anything else.
pub(super) fn scale_and_out(args: &[String], usage: &str) -> Option<(Scale, PathBuf)> {
    let mut scale = Scale::Small;
    let mut out = PathBuf::from("bench-report");
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next().map(String::as_str)) {
            ("--scale", Some(s)) if Scale::parse(s).is_some() => scale = Scale::parse(s)?,
            ("--out", Some(dir)) => out = PathBuf::from(dir),
            _ => {
                eprintln!("{usage}");
                return None;
            }
        }
    }
    Some((scale, out))
}

/// `report probes [DIR] [ROUNDS]`: only the synced-write probes (the one-flush limit, the
/// native 430 B append, the store alone), in alternating rounds in DIR (default `.`), for a
/// quick look at what the store adds to a synced write.
fn probes_main(args: &[String]) -> i32 {
    let dir = PathBuf::from(args.first().map_or(".", String::as_str));
    let rounds: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(3);
    let show = |what: &str, p: &Result<synced::Probe, String>| match p {
        Ok(p) => println!(
            "{what:<12} {:>9.0} ops/s  P50 {:>7.1} µs  P99 {:>7.1} µs  P99.99 {:>8.1} µs",
            p.ops_per_sec, p.p50, p.p99, p.p9999
        ),
        Err(e) => println!("{what:<12} failed: {e}"),
    };
    for round in 1..=rounds {
        println!("round {round}");
        let p = synced::probes(&dir, Scale::Small);
        show("limit", &p.limit);
        show("append", &p.append);
        show("store", &p.store);
    }
    0
}

/// `report NAME [--scale small|full] [--out DIR]` for a section that `body` measures with a
/// runner of its own and returns as markdown, written to `DIR/NAME.md`.
pub(super) fn section_main(
    args: &[String],
    name: &str,
    body: impl FnOnce(&Runner, Scale) -> Result<String, String>,
) -> i32 {
    let usage = format!("usage: report {name} [--scale small|full] [--out DIR]");
    let Some((scale, out)) = scale_and_out(args, &usage) else {
        return 2;
    };
    run_section(&out, name, |work| body(&runner_in(work, scale)?, scale))
}

/// `report synced`: the synced-write section alone, in the order of the full report
/// (LevelDB `--sync 1` under valet, stock and native, the probes, the grouped syncs).
fn synced_main(args: &[String]) -> i32 {
    section_main(args, "synced", |runner, scale| {
        let mut rows = Vec::new();
        for w in workloads::all(scale)
            .into_iter()
            .filter(|w| w.label == SYNC_ROW)
        {
            let mut results = Vec::new();
            for config in [Config::Placed, Config::Stock, Config::Native] {
                eprintln!("report: {} under {}", w.label, config.short());
                let outcome = runner.run(config, &w, scale.zones());
                results.push((config, outcome.and_then(into_data)));
            }
            rows.push(Row {
                workload: w,
                results,
            });
        }
        eprintln!("report: one-flush limit and 430 B append + fdatasync");
        let probes = synced::probes(&runner.work, scale);
        let again = synced::probes(&runner.work, scale);
        let s = synced::Synced::new(probes, again, synced::groups(runner, scale));
        Ok(write::synced_section(&rows, &s, scale))
    })
}

/// `report tenants`: the multi-tenant section alone (valet tenants and stock processes,
/// each alone and together).
fn tenants_main(args: &[String]) -> i32 {
    section_main(args, "tenants", |runner, scale| {
        let results = tenant_pair(scale)
            .ok_or_else(|| "no LSM guest or no cache guest built".to_string())
            .and_then(|pair| tenants::run(runner, &pair, scale.zones(), TENANT_ROUNDS));
        Ok(write::tenants_section(&results, scale))
    })
}

/// A runner whose scratch directories go under `work`.
fn runner_in(work: PathBuf, scale: Scale) -> Result<Runner, String> {
    let self_exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Ok(Runner {
        valet_run: runners::find_valet_run(&self_exe)?,
        self_exe,
        work,
        timeout: Duration::from_secs(scale.timeout_secs()),
    })
}

fn run(scale: Scale, out: &std::path::Path) -> Result<(), String> {
    let start = Instant::now();
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let work = out.join(".work");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let runner = runner_in(work.canonicalize().map_err(|e| e.to_string())?, scale)?;
    let mut skipped = Vec::new();
    let mut rows = Vec::new();
    let mut zone_maps = Vec::new();
    let mut probes = None;
    for w in workloads::all(scale) {
        if valet_guests::wasm(w.guest).is_none() {
            let why = valet_guests::SKIPPED
                .iter()
                .find(|(n, _)| *n == w.guest)
                .map_or("not in this checkout", |(_, why)| *why);
            skipped.push(format!(
                "{}: guest `{}` not built ({why})",
                w.label, w.guest
            ));
            continue;
        }
        let map_this =
            zone_maps.is_empty() && workloads::ZONE_MAP_LABELS.contains(&w.label.as_str());
        let mut results = Vec::new();
        for config in Config::ALL {
            eprintln!("report: {} under {}", w.label, config.short());
            let outcome = runner.run(config, &w, scale.zones());
            if map_this && matches!(config, Config::Placed | Config::OneStream) {
                if let Some(map) = outcome.as_ref().ok().and_then(zone_map) {
                    let label = format!("{} under {}", w.label, config.short());
                    zone_maps.push((label, map));
                }
            }
            results.push((config, outcome.and_then(into_data)));
        }
        let sync_rows = w.label == SYNC_ROW;
        rows.push(Row {
            workload: w,
            results,
        });
        if sync_rows {
            // On the same disk, right after the runs it is compared with.
            eprintln!("report: one-flush limit and 430 B append + fdatasync");
            probes = Some(synced::probes(&runner.work, scale));
        }
    }
    let tails = tails::run(&runner, scale);
    let probes = probes.unwrap_or_else(|| {
        eprintln!("report: one-flush limit and 430 B append + fdatasync");
        synced::probes(&runner.work, scale)
    });
    eprintln!("report: WAF against utilization");
    let waf = sweeps::waf_sweep(scale);
    let cache_guest = ["cache", "cache_sim"]
        .into_iter()
        .find(|g| valet_guests::wasm(g).is_some());
    let cache = cache_guest.map_or_else(Vec::new, |g| {
        eprintln!("report: {g} against over-provisioning");
        sweeps::cache_sweep(&runner, scale, g)
    });
    eprintln!("report: multi-tenant");
    let tenants = tenant_pair(scale)
        .ok_or_else(|| "no LSM guest or no cache guest built".to_string())
        .and_then(|pair| tenants::run(&runner, &pair, scale.zones(), TENANT_ROUNDS));
    eprintln!("report: one-flush limit and 430 B append + fdatasync, again");
    let again = synced::probes(&runner.work, scale);
    let groups = synced::groups(&runner, scale);
    let results = Results {
        scale,
        rows,
        skipped,
        waf,
        cache_guest,
        cache,
        tenants,
        synced: synced::Synced::new(probes, again, groups),
        tails,
        zone_maps,
        wall: start.elapsed(),
    };
    write::report(&results, out)?;
    std::fs::write(out.join("rocksdb.md"), rocksdb::section(&runner, scale))
        .map_err(|e| e.to_string())?;
    std::fs::write(out.join("fleet.md"), fleet::section(&runner, scale))
        .map_err(|e| e.to_string())?;
    std::fs::write(out.join("startup.md"), startup::section(&runner, scale))
        .map_err(|e| e.to_string())?;
    devices::append(out)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// Nearest-rank percentile of sorted values; NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median of `values` (the upper one of an even count); NaN when there are none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// A finished run's measurements, or why it has none.
fn into_data(out: Outcome) -> Result<RunData, String> {
    let measurements = parse::parse(&out.stdout);
    if out.code != 0 {
        return Err(out.why());
    }
    if measurements.is_empty() {
        return Err("no workload lines in its output".into());
    }
    Ok(RunData {
        measurements,
        stats: out.stats,
        wall: out.wall,
        peak_rss: out.peak_rss,
    })
}

fn zone_map(out: &Outcome) -> Option<zones::ZoneMap> {
    let device = out.device.as_ref()?;
    zones::read(device)
        .map_err(|e| eprintln!("report: zone map of {}: {e}", device.display()))
        .ok()
}

/// The LSM guest (rocks) and the cache guest (cachelib) of the multi-tenant run.
fn tenant_pair(scale: Scale) -> Option<Vec<(&'static str, Workload)>> {
    let all = workloads::all(scale);
    let first_built = |guests: &[&str]| {
        guests.iter().find_map(|g| {
            valet_guests::wasm(g)?;
            all.iter().find(|w| w.guest == *g && !w.sync).cloned()
        })
    };
    let db = first_built(workloads::TENANT_DB)?;
    let cache = first_built(workloads::TENANT_CACHE).or_else(|| {
        let sim = "cache_sim";
        valet_guests::wasm(sim)?;
        Some(Workload {
            guest: sim,
            label: sim.into(),
            policy: "cachelib",
            args: ["--dir", "{data}/cache", "--ops", "20000"]
                .map(String::from)
                .to_vec(),
            sync: false,
        })
    })?;
    Some(vec![("db", db), ("cache", cache)])
}
