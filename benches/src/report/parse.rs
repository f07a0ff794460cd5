//! Reading what a bench guest prints: db_bench's line per workload and the percentile line
//! after it.
//!
//! ```text
//! fillseq      :       3.123 micros/op;  320204 ops/sec; 58.3 MB/s
//! Percentiles (micros): P50: 2.10 P99: 10.50 P99.9: 40.00 P99.99: 120.00
//! ```
//!
//! Anything after `ops/sec;` is a list of `;`-separated extras, each a number and a unit
//! (`58.3 MB/s`) or a name and a number (`hit_ratio 0.8731`). A guest that prints no
//! `ops/sec` (our `lsm_sim`) still gives its rate through `micros/op`.

/// Latency percentiles of one workload, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub p9999: f64,
}

/// One workload's line (and the percentile line that followed it, if any).
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    pub name: String,
    pub micros_per_op: f64,
    ops_per_sec: Option<f64>,
    /// (name or unit, value), in the order printed.
    pub extras: Vec<(String, f64)>,
    pub percentiles: Option<Percentiles>,
}

impl Measurement {
    /// Operations per second: as printed, or from `micros/op`.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops_per_sec.unwrap_or(if self.micros_per_op > 0.0 {
            1e6 / self.micros_per_op
        } else {
            0.0
        })
    }

    /// The extra named `key` (`hit_ratio`, `MB/s`).
    pub fn extra(&self, key: &str) -> Option<f64> {
        self.extras.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

/// Every workload line of a guest's stdout, in order.
pub fn parse(stdout: &str) -> Vec<Measurement> {
    let mut out: Vec<Measurement> = Vec::new();
    for line in stdout.lines() {
        if let Some(p) = percentiles(line) {
            // A percentile line belongs to the workload line before it.
            if let Some(last) = out.last_mut().filter(|m| m.percentiles.is_none()) {
                last.percentiles = Some(p);
            }
        } else if let Some(m) = workload_line(line) {
            out.push(m);
        }
    }
    out
}

fn workload_line(line: &str) -> Option<Measurement> {
    let (name, rest) = line.split_once(':')?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let mut parts = rest.split(';').map(str::trim);
    let micros_per_op = parts
        .next()?
        .strip_suffix("micros/op")?
        .trim()
        .parse()
        .ok()?;
    let mut ops_per_sec = None;
    let mut extras = Vec::new();
    for part in parts.filter(|p| !p.is_empty()) {
        if let Some(ops) = part.strip_suffix("ops/sec") {
            ops_per_sec = ops.trim().parse().ok();
        } else if let Some(extra) = extra(part) {
            extras.push(extra);
        }
    }
    Some(Measurement {
        name: name.to_string(),
        micros_per_op,
        ops_per_sec,
        extras,
        percentiles: None,
    })
}

/// `58.3 MB/s` → ("MB/s", 58.3); `hit_ratio 0.87` → ("hit_ratio", 0.87).
fn extra(part: &str) -> Option<(String, f64)> {
    let (a, b) = part.split_once(char::is_whitespace)?;
    let b = b.trim();
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(v), _) => Some((b.to_string(), v)),
        (_, Ok(v)) => Some((a.to_string(), v)),
        _ => None,
    }
}

fn percentiles(line: &str) -> Option<Percentiles> {
    let rest = line.trim().strip_prefix("Percentiles (micros):")?;
    let mut tokens = rest.split_whitespace();
    let mut get = |label: &str| -> Option<f64> {
        (tokens.next()? == label).then_some(())?;
        tokens.next()?.parse().ok()
    };
    Some(Percentiles {
        p50: get("P50:")?,
        p99: get("P99:")?,
        p999: get("P99.9:")?,
        p9999: get("P99.99:")?,
    })
}

/// The number after `key` anywhere in `text` (`bytes_written 123`, `hit ratio 0.87`); the
/// last occurrence wins.
pub fn find_value(text: &str, key: &str) -> Option<f64> {
    text.rmatch_indices(key).find_map(|(at, _)| {
        let after = text[at + key.len()..].trim_start_matches([' ', ':', '=']);
        let end = after
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
            .unwrap_or(after.len());
        after[..end].trim_end_matches('.').parse().ok()
    })
}

/// Each workload of `rounds` (one guest's measurements per round, workloads named alike)
/// with its rate and each percentile the median over the rounds that ran it (the upper one
/// of an even count), in the order of the first round that has them.
pub fn medians(rounds: &[&[Measurement]]) -> Vec<Measurement> {
    let Some(first) = rounds.iter().find(|r| !r.is_empty()) else {
        return Vec::new();
    };
    first
        .iter()
        .map(|m| {
            let same: Vec<&Measurement> = rounds
                .iter()
                .filter_map(|r| r.iter().find(|o| o.name == m.name))
                .collect();
            let of = |f: &dyn Fn(&Measurement) -> Option<f64>| {
                let v: Vec<f64> = same.iter().filter_map(|o| f(o)).collect();
                (!v.is_empty()).then(|| super::median(&v))
            };
            let pct = |f: fn(&Percentiles) -> f64| of(&|o| o.percentiles.as_ref().map(f));
            let percentiles = match (
                pct(|p| p.p50),
                pct(|p| p.p99),
                pct(|p| p.p999),
                pct(|p| p.p9999),
            ) {
                (Some(p50), Some(p99), Some(p999), Some(p9999)) => Some(Percentiles {
                    p50,
                    p99,
                    p999,
                    p9999,
                }),
                _ => None,
            };
            Measurement {
                name: m.name.clone(),
                micros_per_op: of(&|o| Some(o.micros_per_op)).unwrap_or(m.micros_per_op),
                ops_per_sec: of(&|o| Some(o.ops_per_sec())),
                extras: m.extras.clone(),
                percentiles,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_take_each_workload_over_the_rounds_that_ran_it() {
        let round = |p9999: f64, ops: u32, with_get: bool| {
            let mut text = format!(
                "fillseq : 3.0 micros/op; {ops} ops/sec;\n\
                 Percentiles (micros): P50: 2 P99: 10 P99.9: 40 P99.99: {p9999}\n"
            );
            if with_get {
                text.push_str("get : 9.0 micros/op; 1000 ops/sec;\n");
            }
            parse(&text)
        };
        let rounds = [
            round(300.0, 100, true),
            Vec::new(),
            round(100.0, 300, false),
            round(200.0, 200, true),
        ];
        let got = medians(&rounds.iter().map(Vec::as_slice).collect::<Vec<_>>());
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].name, "fillseq");
        assert_eq!(got[0].percentiles.unwrap().p9999, 200.0);
        assert_eq!(got[0].ops_per_sec(), 200.0);
        assert_eq!(got[1].name, "get");
        assert_eq!(got[1].percentiles, None);
        assert_eq!(got[1].ops_per_sec(), 1000.0);
        assert!(medians(&[&[]]).is_empty());
    }

    const OUT: &str = "\
LevelDB:    version 1.22
fillseq      :       3.123 micros/op;  320204 ops/sec; 58.3 MB/s
Percentiles (micros): P50: 2.10 P99: 10.50 P99.9: 40.00 P99.99: 120.00
readrandom   :       5.000 micros/op;  200000 ops/sec;
Percentiles (micros): P50: 4.00 P99: 9.00 P99.9: 30.00 P99.99: 99.50
get          :      12.500 micros/op;   80000 ops/sec; hit_ratio 0.8731
bytes_written 1048576
";

    #[test]
    fn reads_workload_and_percentile_lines() {
        let got = parse(OUT);
        assert_eq!(got.len(), 3);
        let fill = &got[0];
        assert_eq!(fill.name, "fillseq");
        assert_eq!(fill.micros_per_op, 3.123);
        assert_eq!(fill.ops_per_sec(), 320204.0);
        assert_eq!(fill.extra("MB/s"), Some(58.3));
        assert_eq!(
            fill.percentiles,
            Some(Percentiles {
                p50: 2.10,
                p99: 10.50,
                p999: 40.0,
                p9999: 120.0
            })
        );
        assert_eq!(got[1].name, "readrandom");
        assert!(got[1].extras.is_empty());
        assert_eq!(got[1].percentiles.unwrap().p9999, 99.5);
        assert_eq!(got[2].extra("hit_ratio"), Some(0.8731));
        assert_eq!(got[2].percentiles, None);
    }

    #[test]
    fn rate_from_micros_when_ops_per_sec_is_missing() {
        let got = parse("fillrandom   :       4.000 micros/op;   58.3 MB/s\n");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].ops_per_sec(), 250_000.0);
        assert_eq!(got[0].extra("MB/s"), Some(58.3));
    }

    #[test]
    fn ignores_other_lines_and_orphan_percentiles() {
        let text = "Percentiles (micros): P50: 1 P99: 2 P99.9: 3 P99.99: 4\n\
                    readrandom   : (40000 of 40000 found)\n\
                    verified 40000 keys; 12 tables\n\
                    Keys:       16 bytes each\n";
        assert!(parse(text).is_empty());
    }

    #[test]
    fn finds_named_values() {
        assert_eq!(find_value(OUT, "bytes_written"), Some(1048576.0));
        assert_eq!(find_value(OUT, "hit_ratio"), Some(0.8731));
        let sim = "cache: 2000 ops, hit ratio 0.412, 88 large objects verified, 6 regions";
        assert_eq!(find_value(sim, "hit ratio"), Some(0.412));
        assert_eq!(find_value(sim, "missing"), None);
    }
}
