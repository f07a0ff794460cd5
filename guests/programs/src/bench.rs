//! What the db_bench-like guests share: flags, deterministic keys and values, per-operation
//! timing and the report. A program includes it next to `content.rs`:
//!
//! ```ignore
//! #[path = "../content.rs"]
//! mod content;
//! #[path = "../bench.rs"]
//! mod bench;
//! ```
//!
//! A workload's report is two lines, in the shape the comparison report parses:
//!
//! ```text
//! insert_txn   :       3.123 micros/op;  320204 ops/sec;
//! Percentiles (micros): P50: 2.10 P99: 10.50 P99.9: 40.00 P99.99: 120.00
//! ```

use std::fmt::Display;
use std::str::FromStr;
use std::time::Instant;

/// Prints `error: MSG` and exits 1.
pub fn die(msg: impl Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}

/// Prints `verify: MSG` and exits 2: the data is not what the workloads wrote.
pub fn mismatch(msg: impl Display) -> ! {
    println!("verify: FAILED: {msg}");
    std::process::exit(2)
}

/// `r`'s value, or exit 1 saying what failed.
pub fn check<T, E: Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| die(format!("{what}: {e}")))
}

/// Command-line flags, all of the form `--name value` or `--name=value`.
pub struct Flags(Vec<(String, String)>);

impl Flags {
    pub fn from_env() -> Flags {
        let mut pairs = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                die(format!("unexpected argument {arg}"));
            };
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name.to_string(), value.to_string()),
                None => {
                    let value = args
                        .next()
                        .unwrap_or_else(|| die(format!("--{flag} needs a value")));
                    (flag.to_string(), value)
                }
            };
            pairs.push((name.replace('_', "-"), value));
        }
        Flags(pairs)
    }

    /// The last value given for `--name`, removed from the flags left to check.
    fn take(&mut self, name: &str) -> Option<String> {
        let mut found = None;
        self.0.retain(|(n, v)| {
            if n == name {
                found = Some(v.clone());
            }
            n != name
        });
        found
    }

    pub fn string(&mut self, name: &str, default: &str) -> String {
        self.take(name).unwrap_or_else(|| default.to_string())
    }

    pub fn number<T: FromStr>(&mut self, name: &str, default: T) -> T {
        match self.take(name) {
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| die(format!("--{name}: not a number: {v}"))),
            None => default,
        }
    }

    /// `--name 1|0|true|false`.
    pub fn boolean(&mut self, name: &str) -> bool {
        match self.take(name).as_deref() {
            None | Some("0" | "false") => false,
            Some("1" | "true") => true,
            Some(v) => die(format!("--{name}: expected 1 or 0, got {v}")),
        }
    }

    /// `--name a,b,c`, each one of `known` (`default` when absent).
    pub fn list(&mut self, name: &str, default: &[&str], known: &[&str]) -> Vec<String> {
        let Some(v) = self.take(name) else {
            return default.iter().map(|s| s.to_string()).collect();
        };
        let items: Vec<String> = v
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        for item in &items {
            if !known.contains(&item.as_str()) {
                die(format!(
                    "--{name}: unknown {item} (known: {})",
                    known.join(",")
                ));
            }
        }
        items
    }

    /// Fails on any flag nobody asked for.
    pub fn finish(self) {
        if let Some((name, _)) = self.0.first() {
            die(format!("unknown flag --{name}"));
        }
    }
}

/// The value of record `id` as written by its `version`-th write: `len` deterministic bytes.
pub fn value(id: u64, version: u64, len: usize) -> Vec<u8> {
    crate::content::durable_record(0x5eed_0000 + version, id, len)
}

/// `0..n` in a fixed pseudo-random order (a different one per `salt`).
pub fn shuffled(n: u64, salt: u64) -> Vec<u64> {
    let mut ids: Vec<u64> = (0..n).collect();
    ids.sort_by_key(|&i| crate::content::mix(i ^ crate::content::mix(salt)));
    ids
}

/// One workload's timing: wall time of the whole run and each operation's nanoseconds.
pub struct Workload {
    name: &'static str,
    start: Instant,
    nanos: Vec<u64>,
}

impl Workload {
    pub fn start(name: &'static str) -> Workload {
        Workload {
            name,
            start: Instant::now(),
            nanos: Vec::new(),
        }
    }

    /// Runs and times one operation.
    pub fn op<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.nanos.push(t.elapsed().as_nanos() as u64);
        out
    }

    /// Prints the two report lines.
    pub fn report(mut self) {
        print_report(self.name, self.start.elapsed().as_secs_f64(), &mut self.nanos, "");
    }

}

/// Prints a workload's two report lines: its operations took `elapsed` seconds in all,
/// `nanos` each (sorted here); `extra` follows the rate on the first line.
pub fn print_report(name: &str, elapsed: f64, nanos: &mut [u64], extra: &str) {
    let ops = nanos.len().max(1) as f64;
    let micros = elapsed * 1e6 / ops;
    let rate = if elapsed > 0.0 { ops / elapsed } else { 0.0 };
    println!("{name:<12} : {micros:>11.3} micros/op; {rate:>7.0} ops/sec;{extra}");
    nanos.sort_unstable();
    let pct = |p: f64| percentile(nanos, p) as f64 / 1000.0;
    println!(
        "Percentiles (micros): P50: {:.2} P99: {:.2} P99.9: {:.2} P99.99: {:.2}",
        pct(50.0),
        pct(99.0),
        pct(99.9),
        pct(99.99)
    );
}

/// The nearest-rank `p`th percentile of `sorted`, 0 when empty.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
