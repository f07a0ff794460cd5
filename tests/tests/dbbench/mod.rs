//! Reading the output of the db_bench-shaped guests (`leveldb`, `sqlite_bench`,
//! `rusty_leveldb`): one `name : X micros/op; Y ops/sec;[ extras]` line per workload followed
//! by its percentiles, and a `verify: N ... ok` line after the database was reopened.

// Shared by several test binaries, each using its own subset.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// Asserts that workload `name` reported a positive time, its rate and its percentiles;
/// returns its line.
pub fn assert_workload<'a>(stdout: &'a str, name: &str) -> &'a str {
    let mut lines = stdout.lines();
    let line = lines
        .find(|l| l.split(" : ").next().map(str::trim_end) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{stdout}"));
    let rest = line.split_once(" : ").unwrap().1;
    let micros: f64 = rest
        .split_once(" micros/op;")
        .and_then(|(m, _)| m.trim().parse().ok())
        .unwrap_or_else(|| panic!("bad micros/op in {line:?}"));
    assert!(micros > 0.0, "{line}");
    assert!(rest.contains(" ops/sec;"), "{line}");
    let percentiles = lines.next().unwrap_or_default();
    let values: Vec<f64> = ["P50: ", "P99: ", "P99.9: ", "P99.99: "]
        .iter()
        .map(|p| {
            percentiles
                .strip_prefix("Percentiles (micros): ")
                .and_then(|s| s.split_once(p))
                .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {p} after {line:?}: {percentiles:?}"))
        })
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]),
        "percentiles out of order: {percentiles}"
    );
    line
}

/// Asserts that the output holds the line `expected` on its own.
pub fn assert_line(stdout: &str, expected: &str) {
    assert!(
        stdout.lines().any(|l| l == expected),
        "no line {expected:?} in:\n{stdout}"
    );
}

/// Runs the host build of guest `name` with `args`; None (after saying why) where the
/// guest was not built here.
pub fn run_native(name: &str, args: &[&str]) -> Option<String> {
    valet_guests::require(name)?;
    let native: &Path = valet_guests::native(name)
        .unwrap_or_else(|| panic!("{name} is built natively too"))
        .as_ref();
    let out = Command::new(native)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("starting the native {name}: {e}"));
    Some(valet_tests::check(&out, &format!("native {name}")))
}

/// `valet-run fs ls` of `path` in the store on `device`.
pub fn ls(device: &Path, path: &str) -> String {
    let out = Command::new(valet_tests::valet_run_path())
        .args(["fs", "ls", "--device"])
        .arg(device)
        .arg(path)
        .output()
        .expect("starting valet-run fs ls");
    valet_tests::check(&out, "valet-run fs ls")
}
