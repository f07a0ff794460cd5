//! How long a short program takes from `exec` to exit: `valet-run` on the embedded default
//! device (an existing store, and a new one each start), beside the stock wasmtime 36 CLI
//! on a host directory where one is installed. The program is `hello_store` (create, write,
//! fsync, read back, list and remove one file), so what is timed is the start-up: loading
//! the guest and the policies, mounting the store, and unmounting it.
//!
//! One warm-up run of each setup first: every later start finds the compiled guest (and,
//! under `valet-run`, the compiled built-in policies) in wasmtime's cache, as a user's
//! second run does. The setups take turns within each round, so the machine's noise falls
//! on all of them alike.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::markdown::{num, Doc, Table};
use super::runners::{Runner, MOUNT};
use super::workloads::Scale;
use super::{percentile, rocksdb};

const GUEST: &str = "hello_store";

/// `report startup [--scale small|full] [--out DIR]`.
pub fn main(args: &[String]) -> i32 {
    super::section_main(args, "startup", |runner, scale| Ok(section(runner, scale)))
}

/// One way of starting the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// `valet-run` on a store made by the warm-up run.
    ExistingStore,
    /// `valet-run` on a directory with no store yet: the image is created.
    NewStore,
    /// The stock wasmtime 36 CLI with a host directory preopened.
    Stock36,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::ExistingStore => "`valet-run`, existing store",
            Setup::NewStore => "`valet-run`, new store",
            Setup::Stock36 => "stock wasmtime 36 CLI, host directory",
        }
    }
}

/// The section's markdown.
pub fn section(runner: &Runner, scale: Scale) -> String {
    let mut doc = Doc::default();
    doc.heading(2, &format!("Start-up (`--scale {}`)", scale.name()));
    let Some(wasm) = valet_guests::wasm(GUEST) else {
        doc.paragraph(&format!("Skipped: guest `{GUEST}` not built."));
        return doc.render().to_string();
    };
    let stock = rocksdb::wasmtime36();
    let mut setups = vec![Setup::ExistingStore, Setup::NewStore];
    if stock.is_some() {
        setups.push(Setup::Stock36);
    }
    let starts = match scale {
        Scale::Small => 20,
        Scale::Full => 100,
    };
    let result = measure(runner, Path::new(wasm), stock.as_deref(), &setups, starts);
    doc.paragraph(&format!(
        "Wall time from `exec` to exit of `{GUEST}` (create, write, fsync, read back, list and \
         remove one file), {starts} starts of each setup taking turns, after one warm-up \
         start each (the compiled guest and policies are then in wasmtime's cache). \
         `valet-run` uses the embedded default device with its default geometry, as a user's \
         `valet-run app.wasm` does.{}",
        if stock.is_none() {
            " No stock wasmtime 36 CLI here (`bash .ci/setup-rocksdb-report` installs it)."
        } else {
            ""
        }
    ));
    match result {
        Err(e) => doc.paragraph(&format!("Failed: {e}")),
        Ok(times) => {
            let mut table =
                Table::new(&["setup", "starts", "P50 ms", "P90 ms", "P99 ms", "max ms"]);
            for (setup, mut ms) in times {
                ms.sort_by(f64::total_cmp);
                let at = |p: f64| num(Some(percentile(&ms, p)));
                table.row(vec![
                    setup.label().into(),
                    ms.len().to_string(),
                    at(0.5),
                    at(0.9),
                    at(0.99),
                    num(ms.last().copied()),
                ]);
            }
            doc.table(&table);
        }
    }
    doc.render().to_string()
}

/// Each setup's start times in milliseconds.
fn measure(
    runner: &Runner,
    wasm: &Path,
    stock: Option<&Path>,
    setups: &[Setup],
    starts: usize,
) -> Result<Vec<(Setup, Vec<f64>)>, String> {
    let work = tempfile::Builder::new()
        .prefix("startup-")
        .tempdir_in(&runner.work)
        .map_err(|e| e.to_string())?;
    let existing = work.path().join("store");
    let host_dir = work.path().join("host");
    std::fs::create_dir_all(&host_dir).map_err(|e| e.to_string())?;
    let command = |setup: Setup, round: usize| -> Command {
        match setup {
            Setup::ExistingStore => valet(runner, wasm, &existing),
            Setup::NewStore => valet(runner, wasm, &work.path().join(format!("new-{round}"))),
            Setup::Stock36 => {
                let mut cmd = Command::new(stock.expect("only with a stock CLI"));
                cmd.args(["run", "--dir"])
                    .arg(format!("{}::{MOUNT}", host_dir.display()))
                    .arg(wasm)
                    .arg(MOUNT);
                cmd
            }
        }
    };
    let mut times: Vec<(Setup, Vec<f64>)> = setups.iter().map(|&s| (s, Vec::new())).collect();
    for round in 0..=starts {
        for (setup, ms) in &mut times {
            eprintln!("report: start-up, {} ({round} of {starts})", setup.label());
            let took =
                time(command(*setup, round)).map_err(|e| format!("{}: {e}", setup.label()))?;
            // Round 0 is the warm-up.
            if round > 0 {
                ms.push(took);
            }
            if *setup == Setup::NewStore {
                let _ = std::fs::remove_dir_all(work.path().join(format!("new-{round}")));
            }
        }
    }
    Ok(times)
}

/// `valet-run` of the guest on the default device in `device`.
fn valet(runner: &Runner, wasm: &Path, device: &Path) -> Command {
    let mut cmd = Command::new(&runner.valet_run);
    cmd.arg("--device").arg(device).arg(wasm).arg(MOUNT);
    cmd
}

/// Runs `cmd` to its end; its wall time in milliseconds, or why it failed.
fn time(mut cmd: Command) -> Result<f64, String> {
    let start = Instant::now();
    let out = cmd.output().map_err(|e| e.to_string())?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains("hello, zones") {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{}: {}",
            out.status,
            err.lines().last().unwrap_or("no output")
        ));
    }
    Ok(ms)
}
