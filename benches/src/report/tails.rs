//! The tails of unsynced writes, over several rounds: LevelDB's fills and overwrite and the
//! cache's sets under `valet-run` (a) and stock wasmtime (c), the two taking turns.
//!
//! Why rounds: at `--scale small` a LevelDB fill is 20,000 operations, and its P99.99 is the
//! third-worst of them. The guest has one thread, so its two memtable flushes run inline and
//! are the two worst; the third is whichever operation the machine happened to delay most
//! (a preempted thread, a page fault), 20 µs in one run and 150 µs in the next, under either
//! runtime. One run compares two such draws. The medians over rounds compare the runtimes.

use super::parse::Measurement;
use super::runners::{Config, Runner};
use super::workloads::{self, Scale, Workload};

/// The workloads whose tails are held to the target, by (workload label, benchmark name).
pub const TARGETS: &[(&str, &str)] = &[
    ("leveldb", "fillseq"),
    ("leveldb", "fillrandom"),
    ("leveldb", "overwrite"),
    ("cache", "set"),
];

/// One target benchmark: (a) and (c) of each round that gave them, with the round's
/// number, in the order run.
pub struct TailRow {
    pub label: &'static str,
    pub name: &'static str,
    pub placed: Vec<(usize, Measurement)>,
    pub stock: Vec<(usize, Measurement)>,
}

impl TailRow {
    /// The P99.99 ratio of (a) to (c) in each round where both ran.
    pub fn ratios(&self) -> Vec<f64> {
        let p9999 = |m: &Measurement| m.percentiles.map(|p| p.p9999);
        self.placed
            .iter()
            .filter_map(|(round, a)| {
                let (_, c) = self.stock.iter().find(|(r, _)| r == round)?;
                Some(p9999(a)? / p9999(c)?)
            })
            .collect()
    }
}

/// What the tail rounds gave: a row per target whose guest ran, and the runs that failed.
#[derive(Default)]
pub struct Tails {
    pub rows: Vec<TailRow>,
    pub failures: Vec<String>,
    pub rounds: usize,
}

/// Rounds of each configuration at `scale` (a full-scale fill already has 200,000
/// operations, so its P99.99 lies among the memtable flushes; fewer rounds do).
pub fn rounds(scale: Scale) -> usize {
    match scale {
        Scale::Small => 5,
        Scale::Full => 3,
    }
}

/// The report's workload of each target label, limited to the benchmarks held to the
/// target (LevelDB's reads would only add time).
fn workloads(scale: Scale) -> Vec<Workload> {
    workloads::all(scale)
        .into_iter()
        .filter(|w| TARGETS.iter().any(|(label, _)| *label == w.label))
        .map(|mut w| {
            let names: Vec<&str> = TARGETS
                .iter()
                .filter(|(label, _)| *label == w.label)
                .map(|(_, name)| *name)
                .collect();
            for arg in &mut w.args {
                if arg.starts_with("--benchmarks=") {
                    *arg = format!("--benchmarks={}", names.join(","));
                }
            }
            w
        })
        .collect()
}

/// Runs every target workload [`rounds`] times under (a) and (c), taking turns.
pub fn run(runner: &Runner, scale: Scale) -> Tails {
    let mut tails = Tails {
        rounds: rounds(scale),
        ..Tails::default()
    };
    for (label, name) in TARGETS {
        tails.rows.push(TailRow {
            label,
            name,
            placed: Vec::new(),
            stock: Vec::new(),
        });
    }
    let workloads: Vec<Workload> = workloads(scale)
        .into_iter()
        .filter(|w| valet_guests::wasm(w.guest).is_some())
        .collect();
    for round in 1..=tails.rounds {
        for w in &workloads {
            for config in [Config::Placed, Config::Stock] {
                eprintln!(
                    "report: tails, round {round}: {} under {}",
                    w.label,
                    config.short()
                );
                let measurements = match runner.run(config, w, scale.zones()) {
                    Ok(out) if out.code == 0 => super::parse::parse(&out.stdout),
                    Ok(out) => {
                        tails.failures.push(format!(
                            "{} under {}, round {round}: {}",
                            w.label,
                            config.short(),
                            out.why()
                        ));
                        continue;
                    }
                    Err(e) => {
                        tails
                            .failures
                            .push(format!("{} under {}: {e}", w.label, config.short()));
                        continue;
                    }
                };
                for row in tails.rows.iter_mut().filter(|r| r.label == w.label) {
                    let Some(m) = measurements.iter().find(|m| m.name == row.name) else {
                        continue;
                    };
                    match config {
                        Config::Placed => row.placed.push((round, m.clone())),
                        _ => row.stock.push((round, m.clone())),
                    }
                }
            }
        }
    }
    tails
        .rows
        .retain(|r| !r.placed.is_empty() && !r.stock.is_empty());
    tails
}

/// The median over `runs` of one figure, from the runs that have it.
pub fn median_of(
    runs: &[(usize, Measurement)],
    figure: impl Fn(&Measurement) -> Option<f64>,
) -> f64 {
    let values: Vec<f64> = runs.iter().filter_map(|(_, m)| figure(m)).collect();
    super::median(&values)
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse;
    use super::*;

    #[test]
    fn ratios_pair_the_rounds_where_both_ran() {
        let m = |p9999: f64| {
            let out = format!(
                "fillseq : 1.0 micros/op; 1000000 ops/sec;\n\
                 Percentiles (micros): P50: 1.00 P99: 1.00 P99.9: 1.00 P99.99: {p9999:.2}"
            );
            parse(&out).remove(0)
        };
        // Round 2 of (c) failed: round 3's (a) must meet round 3's (c), not round 2's.
        let row = TailRow {
            label: "leveldb",
            name: "fillseq",
            placed: vec![(1, m(10.0)), (2, m(40.0)), (3, m(90.0))],
            stock: vec![(1, m(20.0)), (3, m(30.0))],
        };
        assert_eq!(row.ratios(), [0.5, 3.0]);
        assert_eq!(
            median_of(&row.placed, |m| m.percentiles.map(|p| p.p9999)),
            40.0
        );
    }

    #[test]
    fn target_workloads_run_only_their_benchmarks() {
        let w = workloads(Scale::Small);
        let labels: Vec<&str> = w.iter().map(|w| w.label.as_str()).collect();
        assert_eq!(labels, ["leveldb", "cache"]);
        let benchmarks: Vec<&String> = w[0]
            .args
            .iter()
            .filter(|a| a.starts_with("--benchmarks="))
            .collect();
        assert_eq!(benchmarks, ["--benchmarks=fillseq,fillrandom,overwrite"]);
    }
}
