//! Replays an LSM-shaped trace on the store and prints its write amplification as JSON.
//!
//!     cargo run --release -p valet-vfs --example waf -- [--single-stream] \
//!         [--utilization 0.8] [--ftl-op 0.07] [--fdp-ruhs N] [--passes 3] [--seed 1]
//!
//! The trace and both layouts are [`valet_vfs::workload`]'s: by default WAL and tables go
//! to separate streams; `--single-stream` puts everything in one, so zones mix short- and
//! long-lived data and GC has to move the survivors. The same trace laid out as a
//! conventional filesystem would, on the conventional-SSD model with `--ftl-op`
//! over-provisioning, gives `ftl_waf`; with `--fdp-ruhs N` that SSD is an FDP drive with N
//! reclaim-unit handles.

pub(crate) use valet_vfs::workload::LsmTrace as Args;

/// The run's JSON line.
pub(crate) fn run(args: &Args) -> Result<String, Box<dyn std::error::Error>> {
    Ok(args.run()?.to_json())
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .parse::<f64>()
                .map_err(|e| format!("{name}: {e}"))
        };
        match flag.as_str() {
            "--single-stream" => args.single_stream = true,
            "--utilization" => args.utilization = value("--utilization")?,
            "--ftl-op" => args.ftl_op = value("--ftl-op")?,
            "--passes" => args.passes = value("--passes")?,
            "--seed" => args.seed = value("--seed")? as u64,
            "--fdp-ruhs" => args.fdp_ruhs = value("--fdp-ruhs")?.max(1.0) as u32,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    args.validate().map_err(|e| format!("--{e}"))?;
    Ok(args)
}

fn main() {
    let result = parse_args()
        .map_err(|e| e.into())
        .and_then(|args| run(&args));
    match result {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("waf: {e}");
            std::process::exit(1);
        }
    }
}
