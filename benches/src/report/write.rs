//! Turning [`Results`] into `report.md` and its SVG figures.

use std::path::Path;

use super::markdown::{in_mib, mib, num, ratio, verdict, Doc, Table};
use super::parse::{Measurement, Percentiles};
use super::plots::{self, Bars, Line};
use super::runners::Config;
use super::sweeps::{CACHE_OPS, FTL_OPS};
use super::synced::{self, Kind};
use super::tails::{self, Tails};
use super::workloads::Scale;
use super::{Results, Row};

/// The multi-tenant target: p99.99 together at most this many times alone.
const TENANT_P9999: f64 = 1.3;

/// LevelDB `--sync 1` P50 at most this many times the one-flush limit's P50.
const LIMIT_P50: f64 = 1.1;
/// Grouped syncs: valet's aggregate at least this many times stock's.
const GROUPED: f64 = 2.0;

/// Writes `out/report.md` and the figures it links.
pub fn report(r: &Results, out: &Path) -> Result<(), String> {
    let mut doc = Doc::default();
    let mut figures: Vec<(String, String)> = Vec::new();
    doc.heading(1, "Valet comparison report");
    doc.paragraph(&format!(
        "Scale `{}`, one run per cell, {} s in all, on a machine with {} cores. Made by \
         `cargo run --release -p valet-benches --bin report -- --scale {} --out DIR`. \
         Rates and percentiles are the guests' own; (a) and (b) run under `valet-run` on a \
         fresh image of 16 MiB zones, (c) under stock wasmtime-wasi and (d) natively, both \
         on a host directory of the same disk.",
        r.scale.name(),
        r.wall.as_secs(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        r.scale.name()
    ));
    guests(r, &mut doc);
    throughput(r, &mut doc, &mut figures);
    latency(r, &mut doc, &mut figures);
    memory(r, &mut doc);
    tails(&r.tails, &mut doc);
    synced(&r.rows, &r.synced, r.scale, &mut doc);
    device(r, &mut doc);
    waf_sweep(r, &mut doc, &mut figures);
    cache_sweep(r, &mut doc, &mut figures);
    tenants(&r.tenants, &mut doc);
    zone_maps(r, &mut doc, &mut figures);
    for (file, svg) in &figures {
        std::fs::write(out.join(file), svg).map_err(|e| format!("{file}: {e}"))?;
    }
    std::fs::write(out.join("report.md"), doc.render()).map_err(|e| e.to_string())
}

fn guests(r: &Results, doc: &mut Doc) {
    doc.heading(2, "Guests");
    let mut lines: Vec<String> = r
        .rows
        .iter()
        .map(|row| {
            let failed: Vec<String> = row
                .results
                .iter()
                .filter_map(|(c, res)| res.as_ref().err().map(|e| format!("{}: {e}", c.short())))
                .collect();
            if failed.is_empty() {
                format!("{}: included", row.workload.label)
            } else {
                format!(
                    "{}: included; no result for {}",
                    row.workload.label,
                    failed.join("; ")
                )
            }
        })
        .collect();
    lines.extend(r.skipped.iter().map(|s| format!("{s}: skipped")));
    doc.list(&lines);
}

/// Every (row, workload name) in the order printed.
fn workload_names(row: &Row) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for (_, res) in &row.results {
        for m in res.iter().flat_map(|d| &d.measurements) {
            if !names.contains(&m.name.as_str()) {
                names.push(&m.name);
            }
        }
    }
    names
}

fn measurement<'a>(row: &'a Row, config: Config, name: &str) -> Option<&'a Measurement> {
    row.get(config)?
        .measurements
        .iter()
        .find(|m| m.name == name)
}

/// The target of one workload line and whether (a) meets it.
fn target(
    row: &Row,
    name: &str,
    a: f64,
    stock: Option<f64>,
    native: Option<f64>,
) -> (String, Option<bool>) {
    let vs_stock = stock.map(|s| a / s);
    if row.workload.sync && (name.starts_with("fill") || name == "overwrite") {
        return ("≥ 1.4× stock".into(), vs_stock.map(|v| v >= 1.4));
    }
    // Time ratio against native: native ops/s over ours.
    let vs_native = native.map(|n| n / a);
    let met = match (vs_stock, vs_native) {
        (None, None) => None,
        (s, n) => Some(s.is_none_or(|s| s >= 1.0) && n.is_none_or(|n| n <= 1.3)),
    };
    ("≥ 1.0× stock, ≤ 1.3× native time".into(), met)
}

/// One empty bar series per configuration.
fn config_series() -> Vec<Bars> {
    Config::ALL
        .iter()
        .map(|c| Bars {
            name: c.short().into(),
            values: Vec::new(),
        })
        .collect()
}

fn throughput(r: &Results, doc: &mut Doc, figures: &mut Vec<(String, String)>) {
    doc.heading(2, "Throughput (ops/s)");
    let mut headers: Vec<&str> = vec!["guest", "workload"];
    headers.extend(Config::ALL.map(Config::label));
    headers.extend(["(a)/(c)", "(a) time / (d) time", "target", "verdict"]);
    let mut t = Table::new(&headers);
    let mut categories = Vec::new();
    let mut series = config_series();
    for row in &r.rows {
        for name in workload_names(row) {
            let ops = Config::ALL.map(|c| measurement(row, c, name).map(Measurement::ops_per_sec));
            let mut cells = vec![row.workload.label.clone(), name.to_string()];
            cells.extend(ops.iter().map(|v| num(*v)));
            let [a, _, stock, native] = ops;
            if let Some(a) = a.filter(|a| *a > 0.0) {
                let (goal, met) = target(row, name, a, stock, native);
                cells.push(ratio(stock.map(|s| a / s)));
                cells.push(ratio(native.map(|n| n / a)));
                cells.push(goal);
                cells.push(verdict(met).into());
            }
            t.row(cells);
            categories.push(format!("{} {name}", row.workload.label));
            for (s, v) in series.iter_mut().zip(ops) {
                s.values.push(v);
            }
        }
    }
    if t.is_empty() {
        doc.paragraph("No guest gave workload lines.");
        return;
    }
    doc.table(&t);
    let svg = plots::bars(
        "Throughput per workload and configuration",
        "ops/s (log)",
        &categories,
        &series,
        true,
    );
    figures.push(("ops.svg".into(), svg));
    doc.figure("ops/s per workload and configuration", "ops.svg");
}

fn latency(r: &Results, doc: &mut Doc, figures: &mut Vec<(String, String)>) {
    doc.heading(2, "Latency percentiles (µs)");
    let mut t = Table::new(&[
        "guest",
        "workload",
        "configuration",
        "P50",
        "P99",
        "P99.9",
        "P99.99",
    ]);
    let mut categories = Vec::new();
    let mut series = config_series();
    for row in &r.rows {
        for name in workload_names(row) {
            let mut any = false;
            for (i, c) in Config::ALL.iter().enumerate() {
                let p = measurement(row, *c, name).and_then(|m| m.percentiles);
                series[i].values.push(p.map(|p| p.p99));
                let Some(p) = p else { continue };
                any = true;
                t.row(vec![
                    row.workload.label.clone(),
                    name.to_string(),
                    c.short().into(),
                    num(Some(p.p50)),
                    num(Some(p.p99)),
                    num(Some(p.p999)),
                    num(Some(p.p9999)),
                ]);
            }
            if any {
                categories.push(format!("{} {name}", row.workload.label));
            } else {
                series.iter_mut().for_each(|s| {
                    s.values.pop();
                });
            }
        }
    }
    if t.is_empty() {
        doc.paragraph("No guest printed percentiles (`lsm_sim` does not).");
        return;
    }
    doc.table(&t);
    let svg = plots::bars(
        "P99 latency per workload and configuration",
        "µs (log)",
        &categories,
        &series,
        true,
    );
    figures.push(("latency_p99.svg".into(), svg));
    doc.figure(
        "P99 latency per workload and configuration",
        "latency_p99.svg",
    );
}

/// Each run's peak resident memory: what `valet-run` (the store's buffers, the engine, the
/// guest's memory) holds against stock wasmtime and the native build of the same program.
fn memory(r: &Results, doc: &mut Doc) {
    let mut headers: Vec<&str> = vec!["guest"];
    headers.extend(Config::ALL.map(Config::label));
    headers.push("(a) − (c)");
    let mut t = Table::new(&headers);
    for row in &r.rows {
        let peak = Config::ALL.map(|c| row.get(c).and_then(|d| d.peak_rss).map(in_mib));
        if peak.iter().all(Option::is_none) {
            continue;
        }
        let mut cells = vec![row.workload.label.clone()];
        cells.extend(peak.iter().map(|v| num(*v)));
        let [a, _, stock, _] = peak;
        cells.push(num(a.zip(stock).map(|(a, c)| a - c)));
        t.row(cells);
    }
    if t.is_empty() {
        return;
    }
    doc.heading(2, "Peak memory (MiB)");
    doc.paragraph(
        "The peak resident memory of each run's process (its `VmHWM`, sampled every 20 ms \
         while it runs): the guest's linear memory as far as it touched it, the engine and its compiled code, and \
         under `valet-run` the store (its write buffers, the journal, the policy's instance). \
         (c) is the report's own stock runner (wasmtime 48 and wasmtime-wasi), (d) the \
         native program. A workload line of several benchmarks runs in one process, so its \
         figure is the peak over all of them.",
    );
    doc.table(&t);
}

/// The write path's tail targets over [`tails::rounds`] rounds: medians of (a) and (c).
fn tails(t: &Tails, doc: &mut Doc) {
    if t.rows.is_empty() && t.failures.is_empty() {
        return;
    }
    doc.heading(2, "Tails of unsynced writes against stock");
    doc.paragraph(&format!(
        "Target: (a) at least stock's ops/s, and P99.99 (for the cache's sets P99.9 too) \
         within 1.5× of stock's. Each configuration ran {} times in runs of their own, (a) \
         and (c) taking turns; the figures are medians over those rounds, and the last \
         column lists each round's P99.99 ratio. At `--scale small` a fill's P99.99 is its \
         third-worst operation of 20,000: the two worst are LevelDB's memtable flushes (one \
         thread, so they run inline) and the third is whichever operation the machine \
         delayed most, which one run alone cannot tell apart from the runtime's own cost.",
        t.rounds
    ));
    let mut table = Table::new(&[
        "guest",
        "workload",
        "(a) ops/s",
        "(c) ops/s",
        "(a) P99.9",
        "(c) P99.9",
        "(a) P99.99",
        "(c) P99.99",
        "P99.99 (a)/(c)",
        "verdict",
        "P99.99 (a)/(c) per round",
    ]);
    let ops = |runs: &[(usize, Measurement)]| tails::median_of(runs, |m| Some(m.ops_per_sec()));
    let pct = |runs: &[(usize, Measurement)], f: fn(&Percentiles) -> f64| {
        tails::median_of(runs, |m| m.percentiles.as_ref().map(f))
    };
    for row in &t.rows {
        let (a_ops, c_ops) = (ops(&row.placed), ops(&row.stock));
        let (a_999, c_999) = (pct(&row.placed, |p| p.p999), pct(&row.stock, |p| p.p999));
        let (a_9999, c_9999) = (pct(&row.placed, |p| p.p9999), pct(&row.stock, |p| p.p9999));
        // The cache's P99.9 is held to the same bound (its sets' tail starts there).
        let p999_met = row.label != "cache" || a_999 <= 1.5 * c_999;
        let met = a_ops >= c_ops && a_9999 <= 1.5 * c_9999 && p999_met;
        let per_round: Vec<String> = row.ratios().into_iter().map(|r| ratio(Some(r))).collect();
        table.row(vec![
            row.label.into(),
            row.name.into(),
            num(Some(a_ops)),
            num(Some(c_ops)),
            num(Some(a_999)),
            num(Some(c_999)),
            num(Some(a_9999)),
            num(Some(c_9999)),
            ratio(Some(a_9999 / c_9999)),
            verdict(Some(met)).into(),
            per_round.join(", "),
        ]);
    }
    if !table.is_empty() {
        doc.table(&table);
    }
    if !t.failures.is_empty() {
        doc.paragraph("Runs that gave no result:");
        doc.list(&t.failures);
    }
}

/// `report tails`: the tails section alone.
pub fn tails_section(t: &Tails, scale: Scale) -> String {
    let mut doc = section_doc("Tails of unsynced writes", "tails", scale);
    tails(t, &mut doc);
    doc.render().to_string()
}

/// A section run on its own (`report NAME`): its title and how it was made.
fn section_doc(title: &str, name: &str, scale: Scale) -> Doc {
    let mut doc = Doc::default();
    doc.heading(1, title);
    doc.paragraph(&format!(
        "Scale `{}`, on a machine with {} cores. Made by `cargo run --release -p \
         valet-benches --bin report -- {name} --scale {} --out DIR`.",
        scale.name(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        scale.name()
    ));
    doc
}

/// `report synced`: the synced-write section on its own (the LevelDB `--sync 1` rows, the
/// probes and the grouped syncs), as markdown.
pub fn synced_section(rows: &[Row], s: &synced::Synced, scale: Scale) -> String {
    let mut doc = section_doc("Valet synced writes", "synced", scale);
    synced(rows, s, scale, &mut doc);
    doc.render().to_string()
}

fn synced(rows: &[Row], s: &synced::Synced, scale: Scale, doc: &mut Doc) {
    doc.heading(2, "Synced writes: the one-flush limit and grouped syncs");
    doc.paragraph(&format!(
        "Native loops of this process on the disk of the report's data directory, right \
         after the LevelDB `--sync 1` runs: the **one-flush limit** (a 4 KiB `pwrite` over an \
         already written and synced block of a 1 MiB file, then `fdatasync`: one data write \
         and one device flush, no allocation) and what stock pays per synced record (a \
         {} B append, then `fdatasync`, so ext4 commits its journal each time); then the \
         same appends through the store alone, on an image file in the same directory (a \
         small synced tail travels inline in one journal page). {} timed operations each \
         after {} untimed; latency in µs.",
        synced::RECORD,
        synced::probe_ops(scale),
        synced::WARMUP
    ));
    let mut t = Table::new(&["native loop", "ops/s", "P50", "P99", "P99.99"]);
    let probe_row = |t: &mut Table, what: &str, p: &Result<synced::Probe, String>| match p {
        Ok(p) => t.row(vec![
            what.into(),
            num(Some(p.ops_per_sec)),
            num(Some(p.p50)),
            num(Some(p.p99)),
            num(Some(p.p9999)),
        ]),
        Err(e) => t.row(vec![what.into(), format!("failed: {e}")]),
    };
    probe_row(
        &mut t,
        "4 KiB overwrite of a written block + fdatasync (one-flush limit)",
        &s.limit,
    );
    probe_row(
        &mut t,
        &format!("{} B append + fdatasync", synced::RECORD),
        &s.append,
    );
    probe_row(
        &mut t,
        &format!(
            "the store alone (no guest): {} B append + `sync_data` on an image here",
            synced::RECORD
        ),
        &s.store,
    );
    probe_row(
        &mut t,
        "one-flush limit again, before the grouped syncs",
        &s.limit_again,
    );
    probe_row(
        &mut t,
        &format!(
            "{} B append + fdatasync again, before the grouped syncs",
            synced::RECORD
        ),
        &s.append_again,
    );
    doc.table(&t);

    let limit = s.limit.as_ref().ok().map(|p| p.p50);
    let mut t = Table::new(&[
        "workload",
        "(a) valet ops/s",
        "(c) stock ops/s",
        "(a)/(c)",
        "(a) P50",
        "(c) P50",
        "(d) native P50",
        "limit P50",
        "(a) P50 / limit",
        "target",
        "verdict",
    ]);
    let mut lines = Vec::new();
    for row in rows
        .iter()
        .filter(|row| row.workload.label == "leveldb sync")
    {
        for name in workload_names(row) {
            let m = |c| measurement(row, c, name);
            let ops = |c| m(c).map(Measurement::ops_per_sec);
            let p50 = |c| m(c).and_then(|m| m.percentiles).map(|p| p.p50);
            let (a, stock) = (ops(Config::Placed), ops(Config::Stock));
            let vs_stock = a.zip(stock).map(|(a, s)| a / s);
            let vs_limit = p50(Config::Placed).zip(limit).map(|(a, l)| a / l);
            let met = vs_stock
                .zip(vs_limit)
                .map(|(s, l)| s >= 1.0 && l <= LIMIT_P50);
            t.row(vec![
                name.to_string(),
                num(a),
                num(stock),
                ratio(vs_stock),
                num(p50(Config::Placed)),
                num(p50(Config::Stock)),
                num(p50(Config::Native)),
                num(limit),
                ratio(vs_limit),
                format!("≥ 1.0× stock ops/s, P50 ≤ {LIMIT_P50}× limit"),
                verdict(met).into(),
            ]);
            lines.push(format!(
                "LevelDB `--sync 1` {name}: {} stock's ops/s ({}) and P50 {} the one-flush \
                 limit ({}): {}.",
                if vs_stock.is_some_and(|v| v >= 1.0) {
                    "at least"
                } else {
                    "below"
                },
                ratio(vs_stock),
                if vs_limit.is_some_and(|v| v <= LIMIT_P50) {
                    format!("within {:.0} % of", (LIMIT_P50 - 1.0) * 100.0)
                } else {
                    format!("more than {:.0} % above", (LIMIT_P50 - 1.0) * 100.0)
                },
                ratio(vs_limit),
                verdict(met)
            ));
        }
    }
    if t.is_empty() {
        doc.paragraph("No LevelDB `--sync 1` rows to compare with the limit.");
    } else {
        doc.table(&t);
        doc.list(&lines);
    }

    doc.paragraph(&format!(
        "Grouped syncs: {w} writers, each appending {rec} B records to its own file with an \
         fsync after each (`{g}`; `{tg}` for the threads), all started at the same wall-clock \
         instant and run for {secs} s; {rounds} rounds of every run, the runs taking turns, \
         and the round with the median aggregate shown (all rounds' aggregates in the last \
         column). Aggregate = the sum of the writers' own rates. Stock \
         wasmtime 48 has no wasi-threads, so the threaded guest is held against the same {w} \
         writers as stock processes. The store alone runs the same appends from threads of \
         the report itself on a store of its own (no guest, no WASI): what group commit \
         gives before any guest's cost. The ideal group commit is the least work any group \
         commit does: {w} native threads each copy a record into one shared page, and the \
         last to arrive writes the page over a written block and `fdatasync`s it, then wakes \
         the others. The native threads use `fdatasync`; latencies in µs (P50: median of the \
         writers'; P99, P99.99: the worst writer's).",
        w = synced::WRITERS,
        rec = synced::RECORD,
        g = synced::GUEST,
        tg = synced::THREADS_GUEST,
        secs = synced::seconds(scale),
        rounds = synced::rounds(scale),
    ));
    let mut t = Table::new(&[
        "run",
        "aggregate syncs/s",
        "per writer (min–max)",
        "P50",
        "P99",
        "P99.99",
        "latest start (ms)",
        "every round's aggregate",
    ]);
    for (kind, g) in &s.groups {
        match g.as_ref().map(|r| (r.median(), r)) {
            Ok((Some(g), rounds)) => {
                let all: Vec<String> = rounds.0.iter().map(|g| num(Some(g.aggregate()))).collect();
                let (lo, hi) = g.spread();
                t.row(vec![
                    kind.label(),
                    num(Some(g.aggregate())),
                    format!("{}–{}", num(Some(lo)), num(Some(hi))),
                    num(Some(g.p50())),
                    num(Some(g.p99())),
                    num(Some(g.p9999())),
                    num(Some(g.late_ms())),
                    all.join(", "),
                ]);
            }
            Ok((None, _)) => t.row(vec![kind.label(), "no round".into()]),
            Err(e) => t.row(vec![kind.label(), format!("failed: {e}")]),
        }
    }
    doc.table(&t);
    let agg = |k| s.group(k).map(synced::Group::aggregate);
    let stock = agg(Kind::StockProcesses);
    let native = agg(Kind::NativeThreads);
    let ideal = agg(Kind::IdealSleeping);
    let lines: Vec<String> = [Kind::ValetTenants, Kind::ValetThreads, Kind::StoreThreads]
        .into_iter()
        .map(|k| {
            let v = agg(k).zip(stock).map(|(v, s)| v / s);
            format!(
                "{}: {} stock's {} processes' aggregate ({} native threads', {} the ideal \
                 group commit's with sleeping waits); target ≥ {GROUPED}×: {}.",
                k.label(),
                ratio(v),
                synced::WRITERS,
                ratio(agg(k).zip(native).map(|(v, n)| v / n)),
                ratio(agg(k).zip(ideal).map(|(v, i)| v / i)),
                verdict(v.map(|v| v >= GROUPED))
            )
        })
        .collect();
    doc.list(&lines);
    let bound = s
        .limit_again
        .as_ref()
        .ok()
        .map(|p| p.ops_per_sec * synced::WRITERS as f64);
    let vs_stock = |v: Option<f64>| ratio(v.zip(stock).map(|(v, s)| v / s));
    doc.paragraph(&format!(
        "What a group commit can reach on this disk, in the same run: the ideal group \
         commit (every flush carries all {w} writers and nothing else is done) reached {} \
         syncs/s with sleeping waits ({} stock's {w} processes) and {} with yielding waits \
         ({}; yielding hands a core to whichever thread is runnable for a whole slice, so \
         its rounds swing widely); {w} syncs per one-flush limit (the limit's rate before the \
         grouped syncs, times {w}), with no time at all between one flush and the next, \
         would be {} ({}).",
        num(agg(Kind::IdealSleeping)),
        vs_stock(agg(Kind::IdealSleeping)),
        num(agg(Kind::IdealYielding)),
        vs_stock(agg(Kind::IdealYielding)),
        num(bound),
        vs_stock(bound),
        w = synced::WRITERS,
    ));
}

fn device(r: &Results, doc: &mut Doc) {
    doc.heading(2, "Device writes of the store runs");
    let mut t = Table::new(&[
        "guest",
        "configuration",
        "host MiB",
        "device MiB",
        "WAF",
        "GC MiB moved",
        "zones used",
        "wall s",
    ]);
    for row in &r.rows {
        for c in [Config::Placed, Config::OneStream] {
            let Some(data) = row.get(c) else { continue };
            let Some(s) = &data.stats else { continue };
            t.row(vec![
                row.workload.label.clone(),
                format!(
                    "{} ({})",
                    c.short(),
                    if c == Config::Placed {
                        row.workload.policy
                    } else {
                        "one-stream"
                    }
                ),
                mib(s.host_bytes),
                mib(s.device_bytes),
                format!("{:.3}", s.waf),
                mib(s.gc_bytes_moved),
                (s.zones - s.free_zones).to_string(),
                format!("{:.1}", data.wall.as_secs_f64()),
            ]);
        }
    }
    if t.is_empty() {
        doc.paragraph("No store run wrote stats.");
    } else {
        doc.paragraph(
            "These devices are far larger than the data, so GC rarely runs: the WAF targets \
             are measured at a fixed utilization in the next section.",
        );
        doc.table(&t);
    }
}

fn waf_sweep(r: &Results, doc: &mut Doc, figures: &mut Vec<(String, String)>) {
    doc.heading(2, "WAF and GC bytes moved against device utilization");
    let points = match &r.waf {
        Ok(p) => p,
        Err(e) => {
            doc.paragraph(&format!("The sweep failed: {e}"));
            return;
        }
    };
    doc.paragraph(&format!(
        "The LSM-shaped trace of `valet_vfs::workload` (the `waf` example: WAL appended in \
         4,000-byte records, tables written once, FIFO compaction) on the store with WAL and \
         tables in separate streams (what `rocks` does) and in one stream, and laid out as a \
         conventional filesystem would on the SSD model at {:.0} % and {:.0} % OP.",
        FTL_OPS[0] * 100.0,
        FTL_OPS[1] * 100.0
    ));
    let mut t = Table::new(&[
        "utilization",
        "store WAF, streams apart",
        "store WAF, one stream",
        "GC GB moved, apart",
        "GC GB moved, one stream",
        &format!("SSD WAF {:.0} % OP", FTL_OPS[0] * 100.0),
        &format!("SSD WAF {:.0} % OP", FTL_OPS[1] * 100.0),
    ]);
    let gb = |b: u64| format!("{:.3}", b as f64 / 1e9);
    for p in points {
        t.row(vec![
            format!("{:.2}", p.apart.utilization),
            format!("{:.4}", p.apart.waf),
            format!("{:.4}", p.mixed.waf),
            gb(p.apart.gc_bytes_moved),
            gb(p.mixed.gc_bytes_moved),
            format!("{:.3}", p.apart.ftl_waf),
            format!("{:.3}", p.mixed.ftl_waf),
        ]);
    }
    doc.table(&t);
    let util = |p: &super::sweeps::WafPoint| p.apart.utilization;
    let line = |name: &str, dashed: bool, f: &dyn Fn(&super::sweeps::WafPoint) -> f64| Line {
        name: name.into(),
        points: points.iter().map(|p| (util(p), f(p))).collect(),
        dashed,
    };
    let waf = plots::lines(
        "WAF against device utilization",
        "peak live data / device capacity",
        "WAF",
        &[
            line("store, streams apart", false, &|p| p.apart.waf),
            line("store, one stream", false, &|p| p.mixed.waf),
            line("SSD 7 % OP", true, &|p| p.apart.ftl_waf),
            line("SSD 28 % OP", true, &|p| p.mixed.ftl_waf),
        ],
    );
    let gc = plots::lines(
        "GC bytes moved against device utilization",
        "peak live data / device capacity",
        "GB moved",
        &[
            line("store, streams apart", false, &|p| {
                p.apart.gc_bytes_moved as f64 / 1e9
            }),
            line("store, one stream", false, &|p| {
                p.mixed.gc_bytes_moved as f64 / 1e9
            }),
            line("SSD 7 % OP", true, &|p| {
                p.apart.ftl_gc_bytes_moved as f64 / 1e9
            }),
            line("SSD 28 % OP", true, &|p| {
                p.mixed.ftl_gc_bytes_moved as f64 / 1e9
            }),
        ],
    );
    figures.push(("waf_utilization.svg".into(), waf));
    figures.push(("gc_utilization.svg".into(), gc));
    doc.figure("WAF against utilization", "waf_utilization.svg");
    doc.figure("GC bytes moved against utilization", "gc_utilization.svg");
    // The target: at the point nearest 80 %, WAF ≤ 1.05 and GC moved at most half of one stream's.
    if let Some(p) = points
        .iter()
        .min_by(|a, b| (a.target - 0.8).abs().total_cmp(&(b.target - 0.8).abs()))
    {
        let halved = p.apart.gc_bytes_moved * 2 <= p.mixed.gc_bytes_moved;
        doc.paragraph(&format!(
            "Target at {:.0} % utilization: WAF ≤ 1.05 ({:.4}: {}) and GC bytes moved at least \
             halved against one stream ({} against {} bytes: {}).",
            p.apart.utilization * 100.0,
            p.apart.waf,
            verdict(Some(p.apart.waf <= 1.05)),
            p.apart.gc_bytes_moved,
            p.mixed.gc_bytes_moved,
            verdict(Some(halved && p.mixed.gc_bytes_moved > 0)),
        ));
    }
}

fn cache_sweep(r: &Results, doc: &mut Doc, figures: &mut Vec<(String, String)>) {
    doc.heading(2, "Cache: WAF and hit ratio against over-provisioning");
    let Some(guest) = r.cache_guest else {
        doc.paragraph("Skipped: no cache guest was built.");
        return;
    };
    doc.paragraph(&format!(
        "`{guest}` under `valet-run --policy cachelib`, its flash sized to leave each \
         over-provisioning of the device's data capacity free (as in the ZNS cache paper's \
         Table 1). Targets: WAF ≤ 1.2, 1.1 and 1.05 at 10, 15 and 20 % OP."
    ));
    let goals = [1.2, 1.1, 1.05];
    let mut t = Table::new(&[
        "OP",
        "flash MiB",
        "WAF",
        "GC MiB moved",
        "hit ratio",
        "target",
        "verdict",
    ]);
    for (p, goal) in r.cache.iter().zip(goals) {
        t.row(vec![
            format!("{:.0} %", p.op * 100.0),
            p.flash_mib.to_string(),
            p.waf.map_or_else(
                || p.failure.clone().unwrap_or("-".into()),
                |w| format!("{w:.4}"),
            ),
            p.gc_bytes_moved.map_or("-".into(), mib),
            num(p.hit_ratio),
            format!("≤ {goal}"),
            verdict(p.waf.map(|w| w <= goal)).into(),
        ]);
    }
    doc.table(&t);
    let pts = |f: &dyn Fn(&super::sweeps::CachePoint) -> Option<f64>| -> Vec<(f64, f64)> {
        r.cache
            .iter()
            .filter_map(|p| Some((p.op * 100.0, f(p)?)))
            .collect()
    };
    let svg = plots::lines(
        "Cache guest against over-provisioning",
        "over-provisioning (%)",
        "WAF / hit ratio",
        &[
            Line {
                name: "WAF".into(),
                points: pts(&|p| p.waf),
                dashed: false,
            },
            Line {
                name: "hit ratio".into(),
                points: pts(&|p| p.hit_ratio),
                dashed: false,
            },
            Line {
                name: "WAF target".into(),
                points: CACHE_OPS
                    .iter()
                    .zip(goals)
                    .map(|(o, g)| (o * 100.0, g))
                    .collect(),
                dashed: true,
            },
        ],
    );
    figures.push(("cache_op.svg".into(), svg));
    doc.figure("cache WAF and hit ratio against OP", "cache_op.svg");
}

/// `report tenants`: the multi-tenant section on its own, as markdown.
pub fn tenants_section(results: &Result<super::tenants::Pair, String>, scale: Scale) -> String {
    let mut doc = section_doc("Valet tenants", "tenants", scale);
    tenants(results, &mut doc);
    doc.render().to_string()
}

fn tenants(pair: &Result<super::tenants::Pair, String>, doc: &mut Doc) {
    doc.heading(2, "Multi-tenant: LSM and cache guests on one device");
    let pair = match pair {
        Ok(t) => t,
        Err(e) => {
            doc.paragraph(&format!("Skipped: {e}"));
            return;
        }
    };
    doc.paragraph(&format!(
        "Both guests as tenants of one `valet-run --tenants` process on one device, against \
         each alone (a one-tenant file on the same geometry). Every figure is the median over \
         {} rounds of the whole comparison. Target: P99.99 together ≤ {TENANT_P9999}× alone. \
         Tenants' stdout interleaves line by line, so a percentile line could in principle \
         be credited to the other tenant's workload line. \"Apart\" runs the two tenants at \
         once as two `valet-run` processes, each on a device of its own: nothing of the store \
         is shared, so its ratio to alone is what sharing this machine's cores and disk costs \
         Valet. The stock columns run the same two guests as two stock wasmtime processes, \
         each on its own host directory, alone and then at once; \"stock on memory\" does \
         the same with the directories on a memory file system (`/dev/shm`): no disk at all, \
         so its ratio is what two busy guests cost each other on this machine's cores alone. \
         \"Valet on memory\" runs the `valet-run` pair, alone and together, with its device \
         image on that memory file system: its ratio against the disk's tells what the \
         disk's flushes cost the pair from what the store's sharing and the cores do. \
         The last ratio is Valet's P99.99 together over stock's together: the two guests \
         side by side under either.",
        pair.rounds
    ));
    let mut t = Table::new(&[
        "tenant",
        "workload",
        "ops/s alone",
        "ops/s together",
        "P99.99 alone",
        "P99.99 together",
        "P99.99 ratio",
        "P99.99 apart",
        "apart ratio",
        "stock P99.99 alone",
        "stock P99.99 together",
        "stock ratio",
        "stock on memory ratio",
        "valet on memory ratio",
        "together against stock together",
        "verdict",
    ]);
    let p9999 = |ms: &[Measurement], name: &str| {
        ms.iter()
            .find(|m| m.name == name)
            .and_then(|m| m.percentiles)
            .map(|p| p.p9999)
    };
    for tr in &pair.tenants {
        for alone in &tr.alone {
            let together = tr.together.iter().find(|m| m.name == alone.name);
            let (pa, pt) = (
                p9999(&tr.alone, &alone.name),
                p9999(&tr.together, &alone.name),
            );
            let rel = pa.zip(pt).map(|(a, t)| t / a);
            let apart = p9999(&tr.apart, &alone.name);
            let (sa, st) = (
                p9999(&tr.stock_alone, &alone.name),
                p9999(&tr.stock_together, &alone.name),
            );
            // P99.99 together over alone, for runs that show no figures of their own.
            let together_over_alone =
                |alone_runs: &[Measurement], together_runs: &[Measurement]| {
                    let a = p9999(alone_runs, &alone.name);
                    ratio(a.zip(p9999(together_runs, &alone.name)).map(|(a, t)| t / a))
                };
            t.row(vec![
                format!("{} ({})", tr.tenant, tr.guest),
                alone.name.clone(),
                num(Some(alone.ops_per_sec())),
                num(together.map(Measurement::ops_per_sec)),
                num(pa),
                num(pt),
                ratio(rel),
                num(apart),
                ratio(pa.zip(apart).map(|(a, p)| p / a)),
                num(sa),
                num(st),
                ratio(sa.zip(st).map(|(a, t)| t / a)),
                together_over_alone(&tr.memory_alone, &tr.memory_together),
                together_over_alone(&tr.valet_memory_alone, &tr.valet_memory_together),
                ratio(pt.zip(st).map(|(t, s)| t / s)),
                verdict(rel.map(|x| x <= TENANT_P9999)).into(),
            ]);
        }
    }
    doc.table(&t);
    tenant_cores(pair, doc);
}

/// How many cores each tenant kept busy alone, and the pair together, against the
/// machine's: a pair that asks for more cores than there are must wait for them.
fn tenant_cores(pair: &super::tenants::Pair, doc: &mut Doc) {
    let cores = |c: Option<f64>| c.map_or("–".to_string(), |c| format!("{c:.2}"));
    let sum = |f: fn(&super::tenants::TenantResult) -> Option<f64>| {
        pair.tenants.iter().map(f).sum::<Option<f64>>()
    };
    let machine = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut t = Table::new(&["run", "valet-run", "stock"]);
    for tr in &pair.tenants {
        t.row(vec![
            format!("{} alone", tr.tenant),
            cores(tr.cores_alone),
            cores(tr.stock_cores_alone),
        ]);
    }
    t.row(vec![
        "sum of the two alone".into(),
        cores(sum(|tr| tr.cores_alone)),
        cores(sum(|tr| tr.stock_cores_alone)),
    ]);
    t.row(vec![
        "together".into(),
        cores(pair.together_cores.valet),
        cores(pair.together_cores.stock),
    ]);
    let asked = |c: Option<f64>| match c {
        Some(c) if c > machine as f64 => format!("{c:.2} cores (more than the machine's)"),
        Some(c) => format!("{c:.2} cores"),
        None => "an unmeasured number of cores".into(),
    };
    doc.paragraph(&format!(
        "Cores kept busy (CPU time, user and system, over wall time) on this {machine}-core \
         machine. Under `valet-run` a guest's full buffers are copied into the device by the \
         store's writer thread, which can run on another core; under stock the guest copies \
         them itself. The two tenants alone add up to {} under `valet-run` and {} under \
         stock: what the pair asks for while both run. The together row averages over \
         the whole run, the time after the shorter tenant ended included.",
        asked(sum(|tr| tr.cores_alone)),
        asked(sum(|tr| tr.stock_cores_alone)),
    ));
    doc.table(&t);
}

fn zone_maps(r: &Results, doc: &mut Doc, figures: &mut Vec<(String, String)>) {
    doc.heading(2, "Zone maps");
    if r.zone_maps.is_empty() {
        doc.paragraph("None taken (no LSM guest ran under valet-run).");
        return;
    }
    for (i, (label, map)) in r.zone_maps.iter().enumerate() {
        let file = format!("zones_{i}.svg");
        figures.push((
            file.clone(),
            plots::zone_grid(&format!("Zones after {label}"), map),
        ));
        doc.figure(&format!("zones after {label}"), &file);
    }
}
