//! RocksDB 11.8.1's own `db_bench` (guest `rocksdb_release`, else `rocksdb`) side by side
//! in one run: `valet-run` with the `rocks`, `default` and `one-stream` policies, the stock
//! wasmtime 36 CLI with wasi-threads (the last stock CLI that runs them; 47 removed them)
//! where one is installed, and RocksDB built natively from the same source where the guest
//! build made one.
//!
//! Then the paper's experiment (issue 14, point 4): RocksDB fills a small store to about 80 %
//! of its capacity and overwrites its keys twice (several device-fulls of writes), then reads
//! while writing, under `rocks`, `default` and `one-stream`: WAF, GC bytes moved, sustained
//! write ops/s and read P99.99 while compaction and GC run.
//!
//! `report rocksdb [--scale small|full] [--out DIR]` runs only this section and writes
//! `DIR/rocksdb.md`; the full report runs it too.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use valet_vfs::Stats;

use super::markdown::in_mib;
use super::runners::{reap, Outcome, PeakWatch, Runner, MOUNT};
use super::workloads::Scale;

/// db_bench as RocksDB's release build (`NDEBUG`), wasm and native, where
/// `.ci/setup-rocksdb-report` built it; else the tests' debug build (asserts and kill points
/// on, no native twin).
const RELEASE_GUEST: &str = "rocksdb_release";
/// The tests' db_bench, built everywhere.
const DEBUG_GUEST: &str = "rocksdb";

/// The db_bench every setup runs: the release build where there is one.
fn guest() -> Result<&'static str, String> {
    valet_guests::wasm(RELEASE_GUEST)
        .or_else(|| valet_guests::wasm(DEBUG_GUEST))
        .ok_or_else(|| "guest rocksdb not built".into())
}

/// Which build [`guest`] is, for the report's text.
fn guest_build() -> &'static str {
    if valet_guests::wasm(RELEASE_GUEST).is_some() {
        "db_bench is RocksDB's release build (`NDEBUG`), for WASI and natively."
    } else {
        "db_bench is the tests' debug build (no `NDEBUG`: asserts and kill points run; \
         `bash .ci/setup-rocksdb-report` builds the release one and native db_bench)."
    }
}

/// How to get the stock wasmtime 36 CLI (looked for at `$VALET_WASMTIME36`, then
/// `~/.cache/valet-rocksdb/wasmtime-36/bin/wasmtime`) and native db_bench.
const WASMTIME36_HINT: &str = "bash .ci/setup-rocksdb-report";

/// One configuration of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Valet(&'static str),
    /// `valet-run` with db_bench's directory a plain host directory (`--dir`): the same
    /// engine and WASI layer without the store, which tells the store's share from the
    /// engine's.
    HostFiles,
    Stock36,
    Native,
}

impl Setup {
    const ALL: [Setup; 6] = [
        Setup::Valet("rocks"),
        Setup::Valet("default"),
        Setup::Valet("one-stream"),
        Setup::HostFiles,
        Setup::Stock36,
        Setup::Native,
    ];

    fn label(self) -> String {
        match self {
            Setup::Valet(policy) => format!("valet-run --policy {policy}"),
            Setup::HostFiles => "valet-run, host files (--dir)".into(),
            Setup::Stock36 => "stock wasmtime 36 CLI".into(),
            Setup::Native => "native".into(),
        }
    }
}

/// One db_bench benchmark's figures.
#[derive(Clone, Debug, Default)]
struct Bench {
    name: String,
    ops: f64,
    p50: f64,
    p99: f64,
    p9999: f64,
}

/// One db_bench invocation under one setup.
struct Run {
    setup: Setup,
    pass: Pass,
    /// Which round of its pass (from 0).
    round: usize,
    result: Result<Measured, String>,
}

/// What one db_bench invocation that ran to its end gave.
struct Measured {
    benches: Vec<Bench>,
    /// The store's accounting (the policies' setups only).
    stats: Option<Stats>,
    /// The process's peak resident memory in bytes, as sampled.
    peak_rss: Option<u64>,
}

/// The db_bench invocations every setup runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Unsynced,
    Synced,
    /// `readwhilewriting` with its writer held to [`PACED_WRITE_RATE`]. Unpaced, the writer
    /// writes as fast as it can while the reader reads, and the two share the cores: a setup
    /// whose writes are cheaper writes more in the same time, which makes the reader's work
    /// larger (bigger memtables, more level-0 tables) and its share of the cores smaller, so
    /// the reads' rate there says as much about the writer as about the reads. With the
    /// writer paced, every setup reads under the same write load.
    PacedWriter,
}

impl Pass {
    const ALL: [Pass; 3] = [Pass::Unsynced, Pass::Synced, Pass::PacedWriter];

    /// The table's first column.
    fn label(self) -> String {
        match self {
            Pass::Unsynced => "0".into(),
            Pass::Synced => "1".into(),
            Pass::PacedWriter => format!("0, writer at {} MiB/s", PACED_WRITE_RATE >> 20),
        }
    }

    fn sync(self) -> bool {
        self == Pass::Synced
    }

    /// Rounds of this pass, every setup once a round. The unsynced pass swings most between
    /// runs (RocksDB's compaction timing decides how many levels a write or read meets: one
    /// full run saw stock's own fillrandom at 93,616 and then 138,457 ops/s), so it runs
    /// three times and the table shows medians; the synced and paced passes hold steady.
    fn rounds(self) -> usize {
        match self {
            Pass::Unsynced => 3,
            Pass::Synced | Pass::PacedWriter => 1,
        }
    }
}

/// Bytes per second of keys and values the paced writer may write (about 20,000 puts a
/// second of 420 bytes: a load every setup sustains, stock's unpaced writer reaches 90,000).
const PACED_WRITE_RATE: u64 = 8 << 20;

/// db_bench's arguments (the data directory as given) for one pass at `scale`.
fn args(scale: Scale, pass: Pass, data: &str) -> Vec<String> {
    // `readrandom` reads a settled database: a setup that overwrote faster would otherwise
    // leave more compaction to run during its reads, and its read tail would pay for that.
    let unsynced = "fillseq,fillrandom,overwrite,waitforcompaction,readrandom,readwhilewriting";
    let (benchmarks, num) = match (pass, scale) {
        (Pass::Unsynced, Scale::Small) => (unsynced, 50_000),
        (Pass::Unsynced, Scale::Full) => (unsynced, 500_000),
        (Pass::Synced, Scale::Small) => ("fillseq,fillrandom,overwrite", 5_000),
        (Pass::Synced, Scale::Full) => ("fillseq,fillrandom,overwrite", 50_000),
        // The limit paces fillseq too (db_bench has one limit for every writer).
        (Pass::PacedWriter, Scale::Small) => ("fillseq,readwhilewriting", 50_000),
        (Pass::PacedWriter, Scale::Full) => ("fillseq,readwhilewriting", 500_000),
    };
    let mut paced = Vec::new();
    if pass == Pass::PacedWriter {
        paced.push(format!("--benchmark_write_rate_limit={PACED_WRITE_RATE}"));
    }
    [
        format!("--db={data}/db"),
        format!("--benchmarks={benchmarks}"),
        format!("--num={num}"),
        // The paper's shape: 20 B keys, 400 B values.
        "--key_size=20".into(),
        "--value_size=400".into(),
        "--compression_type=none".into(),
        "--write_buffer_size=4194304".into(),
        "--histogram=1".into(),
        format!("--sync={}", u8::from(pass.sync())),
        "--seed=1".into(),
    ]
    .into_iter()
    .chain(paced)
    .collect()
}

/// The benchmarks of db_bench's output: each `name : X micros/op Y ops/sec ...` line and the
/// histogram after it: the reads' where there is one (`readwhilewriting` has reads and
/// writes, in no fixed order), else the first.
///
/// `readwhilewriting`'s rate is its reader's, from the reader's own time per operation:
/// db_bench divides by the time until its writer stopped too, and a paced writer notices the
/// end up to one rate-limiter period (100 ms) late. This report runs one reader thread.
fn parse(stdout: &str) -> Vec<Bench> {
    let mut out: Vec<Bench> = Vec::new();
    // Whether the last benchmark has percentiles yet, and which histogram follows.
    let mut have_percentiles = true;
    let mut op = "";
    for line in stdout.lines() {
        if let Some((name, rest)) = line.split_once(" : ") {
            let name = name.trim();
            let figures = rest.split_once(" micros/op ").and_then(|(micros, r)| {
                let micros = micros.trim().parse::<f64>().ok()?;
                let ops = r.split_once(" ops/sec")?.0.trim().parse::<f64>().ok()?;
                Some((micros, ops))
            });
            if let Some((micros, ops)) = figures {
                let ops = if name == "readwhilewriting" && micros > 0.0 {
                    1e6 / micros
                } else {
                    ops
                };
                // Percentiles stay unknown (NaN) until a histogram follows.
                out.push(Bench {
                    name: name.to_string(),
                    ops,
                    p50: f64::NAN,
                    p99: f64::NAN,
                    p9999: f64::NAN,
                });
                have_percentiles = false;
                op = "";
                continue;
            }
        }
        if let Some(rest) = line.strip_prefix("Microseconds per ") {
            op = rest.trim_end_matches(':');
        } else if let Some(rest) = line.strip_prefix("Percentiles: ") {
            let Some(last) = out.last_mut() else {
                continue;
            };
            if have_percentiles && op != "read" {
                continue;
            }
            let value = |key: &str| {
                rest.split_once(key)
                    .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok())
                    .unwrap_or(f64::NAN)
            };
            last.p50 = value("P50: ");
            last.p99 = value("P99: ");
            last.p9999 = value("P99.99: ");
            have_percentiles = true;
        }
    }
    out
}

/// The stock wasmtime 36 CLI, if one is installed.
pub(super) fn wasmtime36() -> Option<PathBuf> {
    let candidates = std::env::var_os("VALET_WASMTIME36")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/valet-rocksdb/wasmtime-36/bin/wasmtime")),
        );
    candidates.into_iter().find(|p| {
        Command::new(p).arg("--version").output().is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains(" 36.")
        })
    })
}

/// How one command of this section ended.
struct Finished {
    code: i32,
    stdout: String,
    stderr: String,
    /// The process's peak resident memory in bytes, as sampled.
    peak_rss: Option<u64>,
}

impl Finished {
    fn from(out: &Outcome) -> Finished {
        Finished {
            code: out.code,
            stdout: out.stdout.clone(),
            stderr: out.stderr.clone(),
            peak_rss: out.peak_rss,
        }
    }

    /// `Err` with the last line of its stderr unless it exited with 0.
    fn check(&self) -> Result<(), String> {
        if self.code == 0 {
            return Ok(());
        }
        let last = self
            .stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        Err(format!("exit {}: {}", self.code, last.trim()))
    }
}

/// Runs `cmd` to its end or `timeout`.
fn run_command(cmd: Command, timeout: Duration) -> Result<Finished, String> {
    run_polling(cmd, timeout, || {})
}

/// How often the fill experiment samples the store's live data. RocksDB's release build
/// runs the small experiment in about 2 s a policy, so the peak lasts well under a second.
const LIVE_POLL: Duration = Duration::from_millis(50);

/// [`run_command`], calling `poll` about every [`LIVE_POLL`] while `cmd` runs.
fn run_polling(
    mut cmd: Command,
    timeout: Duration,
    mut poll: impl FnMut(),
) -> Result<Finished, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| e.to_string());
    cmd.stdin(Stdio::null())
        .stdout(file(&out)?)
        .stderr(file(&err)?);
    let mut child = cmd.spawn().map_err(|e| format!("{cmd:?}: {e}"))?;
    let start = Instant::now();
    let mut last_poll = start;
    let mut peak = PeakWatch::default();
    let ended = loop {
        peak.sample(child.id());
        if let Some(ended) = reap(&child)? {
            break ended;
        }
        if start.elapsed() > timeout {
            // Our own child, by its id.
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("killed after {} s", timeout.as_secs()));
        }
        if last_poll.elapsed() >= LIVE_POLL {
            poll();
            last_poll = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Ok(Finished {
        code: ended.code,
        stdout: read(&out),
        stderr: read(&err),
        peak_rss: peak.peak(),
    })
}

fn one(runner: &Runner, scale: Scale, setup: Setup, pass: Pass, round: usize) -> Run {
    let result = (|| {
        let wasm = guest()?;
        let (finished, stats) = match setup {
            Setup::Valet(policy) => {
                let out = runner.guest(wasm, policy, args(scale, pass, MOUNT), scale.zones())?;
                (Finished::from(&out), out.stats.clone())
            }
            Setup::HostFiles => {
                let dir = tempfile::Builder::new()
                    .prefix("rocksdb-host-")
                    .tempdir_in(&runner.work)
                    .map_err(|e| e.to_string())?;
                let mut all = vec![
                    "--dir".to_string(),
                    format!("{}::{MOUNT}", dir.path().display()),
                    // The store, unused, out of the way of the host directory.
                    "--mount".into(),
                    "/valet-store".into(),
                    wasm.into(),
                    "--".into(),
                ];
                all.extend(args(scale, pass, MOUNT));
                let out = runner.valet(&all, scale.zones())?;
                (Finished::from(&out), None)
            }
            Setup::Stock36 => {
                let wasmtime = wasmtime36()
                    .ok_or_else(|| format!("no wasmtime 36 CLI ({WASMTIME36_HINT})"))?;
                let dir = tempfile::Builder::new()
                    .prefix("rocksdb-stock-")
                    .tempdir_in(&runner.work)
                    .map_err(|e| e.to_string())?;
                let mut cmd = Command::new(wasmtime);
                cmd.args(["run", "-W", "threads=y", "-S", "threads=y", "--dir"])
                    .arg(format!("{}::{MOUNT}", dir.path().display()))
                    .arg(wasm)
                    .args(args(scale, pass, MOUNT));
                (run_command(cmd, runner.timeout)?, None)
            }
            Setup::Native => {
                let exe = valet_guests::native(RELEASE_GUEST)
                    .ok_or("no native build of RocksDB here (bash .ci/setup-rocksdb-report)")?;
                let dir = tempfile::Builder::new()
                    .prefix("rocksdb-native-")
                    .tempdir_in(&runner.work)
                    .map_err(|e| e.to_string())?;
                let mut cmd = Command::new(exe);
                cmd.args(args(scale, pass, &dir.path().to_string_lossy()));
                (run_command(cmd, runner.timeout)?, None)
            }
        };
        finished.check()?;
        let benches = parse(&finished.stdout);
        if benches.is_empty() {
            return Err("no benchmark lines in db_bench's output".into());
        }
        Ok(Measured {
            benches,
            stats,
            peak_rss: finished.peak_rss,
        })
    })();
    Run {
        setup,
        pass,
        round,
        result,
    }
}

/// One benchmark of one setup and pass: its medians over the rounds that gave it, and the
/// ops/s of each of those rounds in order.
fn median_bench(runs: &[Run], setup: Setup, pass: Pass, name: &str) -> Option<(Bench, Vec<f64>)> {
    let all: Vec<&Bench> = runs
        .iter()
        .filter(|r| r.setup == setup && r.pass == pass)
        .filter_map(|r| r.result.as_ref().ok())
        .filter_map(|m| m.benches.iter().find(|b| b.name == name))
        .collect();
    if all.is_empty() {
        return None;
    }
    let of = |f: fn(&Bench) -> f64| super::median(&all.iter().map(|b| f(b)).collect::<Vec<_>>());
    let bench = Bench {
        name: name.to_string(),
        ops: of(|b| b.ops),
        p50: of(|b| b.p50),
        p99: of(|b| b.p99),
        p9999: of(|b| b.p9999),
    };
    Some((bench, all.iter().map(|b| b.ops).collect()))
}

/// Runs every setup (every pass), then the fill experiment, and returns the section's
/// markdown.
pub fn section(runner: &Runner, scale: Scale) -> String {
    let mut runs = Vec::new();
    let mut first = 0;
    for pass in Pass::ALL {
        for round in 0..pass.rounds() {
            // Each round starts with the next setup, so that whatever the machine carries
            // over from one run to the next does not always land on the same setup.
            let order = Setup::ALL.iter().cycle().skip(first).take(Setup::ALL.len());
            first = (first + 1) % Setup::ALL.len();
            for &setup in order {
                eprintln!(
                    "report: rocksdb db_bench ({pass:?}, round {}) under {}",
                    round + 1,
                    setup.label()
                );
                runs.push(one(runner, scale, setup, pass, round));
            }
        }
    }
    let mut md = markdown(scale, &runs);
    let fills: Vec<(&str, FillResult)> = FILL_POLICIES
        .iter()
        .map(|&policy| {
            eprintln!("report: rocksdb fill experiment under valet-run --policy {policy}");
            (policy, fill_run(runner, scale, policy))
        })
        .collect();
    md.push('\n');
    md.push_str(&fill_markdown(scale, &fills));
    md
}

/// Policies the fill experiment compares.
const FILL_POLICIES: [&str; 3] = ["rocks", "default", "one-stream"];

/// Zone size of the fill experiment's device: small zones, so that a few minutes of RocksDB
/// fill dozens of them.
const FILL_ZONE_MIB: u64 = 4;

/// (zones, keys) of the fill experiment: RocksDB's files peak at 80 % of the device's
/// capacity (3 MiB a zone) and more with this many 420-byte entries (at 52 zones for
/// 150,000 they reached 93 % and RocksDB failed with ENOSPC). A larger database carries
/// less space overhead, so `full` has fewer zones per key: at 180 zones its files peaked at
/// 75–81 %, where `rocks` and `default` both moved almost nothing; at 160 they peaked at
/// 83–89 % and the policies parted (GC 12–42 MiB under `rocks` against 176–216 MiB under
/// `default`, over six runs).
fn fill_shape(scale: Scale) -> (u32, u64) {
    match scale {
        Scale::Small => (60, 150_000),
        Scale::Full => (160, 750_000),
    }
}

/// db_bench's arguments for the fill experiment: fill, overwrite every key twice, then read
/// while one thread keeps writing. Levels scaled down (16 MiB level 1, 2 MiB tables) so the
/// small tree has the shape of a big one: several levels, compactions all the time. Level 0
/// slows writes at 8 tables and stops them at 12 (RocksDB's defaults are 20 and 36): a
/// backlog of level-0 tables, which grows with CPU contention, would otherwise decide how
/// full the device gets.
fn fill_args(scale: Scale, data: &str) -> Vec<String> {
    let (_, num) = fill_shape(scale);
    [
        format!("--db={data}/db"),
        "--benchmarks=fillrandom,overwrite,overwrite,readwhilewriting".into(),
        format!("--num={num}"),
        format!("--reads={}", num / 8),
        "--key_size=20".into(),
        "--value_size=400".into(),
        "--compression_type=none".into(),
        "--write_buffer_size=4194304".into(),
        "--target_file_size_base=2097152".into(),
        "--max_bytes_for_level_base=16777216".into(),
        "--level0_slowdown_writes_trigger=8".into(),
        "--level0_stop_writes_trigger=12".into(),
        "--histogram=1".into(),
        "--seed=1".into(),
    ]
    .to_vec()
}

/// One fill experiment run: db_bench's figures, the store's accounting at exit, the most
/// live data the store held while it ran (sampled every [`LIVE_POLL`]), and the wall time.
struct Fill {
    benches: Vec<Bench>,
    stats: Stats,
    peak_live: u64,
    wall: Duration,
}

type FillResult = Result<Fill, String>;

/// One fill experiment run under `valet-run --policy policy` on a fresh device.
fn fill_run(runner: &Runner, scale: Scale, policy: &str) -> FillResult {
    let wasm = guest()?;
    let dir = tempfile::Builder::new()
        .prefix("rocksdb-fill-")
        .tempdir_in(&runner.work)
        .map_err(|e| e.to_string())?;
    let stats_path = dir.path().join("stats.json");
    let device = dir.path().join("device");
    let socket = dir.path().join("admin.sock");
    let (zones, _) = fill_shape(scale);
    let mut cmd = Command::new(&runner.valet_run);
    cmd.arg("--device")
        .arg(&device)
        .arg("--admin")
        .arg(&socket)
        .args(["--zone-size", &FILL_ZONE_MIB.to_string()])
        .args(["--zones", &zones.to_string()])
        .arg("--stats-json")
        .arg(&stats_path)
        .args(["--policy", policy])
        .arg(wasm)
        .arg("--")
        .args(fill_args(scale, MOUNT));
    let start = Instant::now();
    // The peak of live data, from the admin API's stats while RocksDB runs.
    let mut peak = 0u64;
    let finished = run_polling(cmd, runner.timeout, || {
        if let Some(stats) = admin_stats(&socket, &device.join("admin.token")) {
            peak = peak.max(stats.live_bytes);
        }
    })?;
    let wall = start.elapsed();
    finished.check()?;
    let stats: Stats = std::fs::read_to_string(&stats_path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .ok_or("no --stats-json output")?;
    let benches = parse(&finished.stdout);
    if benches.len() < 4 {
        return Err(format!(
            "{} of 4 benchmark lines in db_bench's output",
            benches.len()
        ));
    }
    Ok(Fill {
        benches,
        peak_live: peak.max(stats.live_bytes),
        stats,
        wall,
    })
}

/// `GET /stats` from a running valet-run's admin API on Unix socket `socket` (HTTP/1.1, one
/// request per connection); None until it answers.
fn admin_stats(socket: &Path, token_file: &Path) -> Option<Stats> {
    use std::io::{Read, Write};
    let token = std::fs::read_to_string(token_file).ok()?;
    let mut conn = std::os::unix::net::UnixStream::connect(socket).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        conn,
        "GET /stats HTTP/1.1\r\nHost: valet\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        token.trim()
    )
    .ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

fn fill_markdown(scale: Scale, fills: &[(&str, FillResult)]) -> String {
    let mut md = String::new();
    let (zones, num) = fill_shape(scale);
    let capacity = |s: &Stats| s.zones as f64 * s.zone_capacity as f64;
    let _ = writeln!(
        md,
        "### RocksDB filling the store (`--scale {}`)\n\nThe paper's experiment: {zones} zones \
         of {FILL_ZONE_MIB} MiB ({} MiB of capacity), {num} keys of 20 + 400 B, `fillrandom`, \
         two `overwrite` passes, then `readwhilewriting` (one writer, reads meanwhile) with \
         compaction and GC running; 16 MiB level 1, 2 MiB tables, 4 MiB memtables, level-0 \
         stops at 12 tables, no compression. Device-fulls: bytes RocksDB wrote / capacity; \
         peak live: the most live data the store held (its stats sampled every 50 ms), of \
         the capacity. One run per policy: mind the noise.\n",
        scale.name(),
        zones as u64 * FILL_ZONE_MIB * 3 / 4,
    );
    let _ = writeln!(md, "| policy | WAF | WAF with metadata | GC MiB moved | host MiB (device-fulls) | peak live | live at exit | fillrandom ops/s | overwrite ops/s (1st, 2nd) | overwrite P99.99 µs | readwhilewriting ops/s | read P99.99 µs | time s |");
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (policy, result) in fills {
        match result {
            Ok(Fill {
                benches,
                stats: s,
                peak_live,
                wall,
            }) => {
                let named = |name: &'static str| benches.iter().filter(move |b| b.name == name);
                let fill = named("fillrandom").next();
                let overwrites: Vec<&Bench> = named("overwrite").collect();
                let rww = named("readwhilewriting").next();
                let ops =
                    |b: Option<&Bench>| b.map_or("-".to_string(), |b| format!("{:.0}", b.ops));
                let _ = writeln!(
                    md,
                    "| {policy} | {:.3} | {:.3} | {:.1} | {:.0} ({:.1}) | {:.0} % | {:.0} % | {} | {} | {} | {} | {} | {:.0} |",
                    s.waf,
                    s.waf_with_meta,
                    in_mib(s.gc_bytes_moved),
                    in_mib(s.host_bytes),
                    s.host_bytes as f64 / capacity(s),
                    100.0 * *peak_live as f64 / capacity(s),
                    100.0 * s.live_bytes as f64 / capacity(s),
                    ops(fill),
                    overwrites
                        .iter()
                        .map(|b| format!("{:.0}", b.ops))
                        .collect::<Vec<_>>()
                        .join(", "),
                    overwrites
                        .iter()
                        .map(|b| format!("{:.0}", b.p9999))
                        .collect::<Vec<_>>()
                        .join(", "),
                    ops(rww),
                    rww.map_or("-".to_string(), |b| format!("{:.1}", b.p9999)),
                    wall.as_secs_f64(),
                );
            }
            Err(e) => {
                let _ = writeln!(md, "| {policy} | {e} | | | | | | | | | | | |");
            }
        }
    }
    md
}

fn markdown(scale: Scale, runs: &[Run]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## RocksDB 11.8.1 db_bench (`--scale {}`)\n\n20 B keys, 400 B values, no compression, \
         4 MiB memtables, one thread; ops/s and latency percentiles in µs as db_bench reports \
         them. The unsynced pass runs {} times, the setups taking turns in each round (each round \
         starting with the next setup), and \
         its cells are medians over the rounds (each round's ops/s in the last column); the \
         other passes run once: mind the noise. The stock wasmtime 36 CLI is the last stock \
         CLI with wasi-threads (47 removed them; RocksDB cannot run without threads). \
         \"host files\" is `valet-run` (engine, WASI layer, threads) with db_bench's directory \
         a plain host directory instead of the store: what the store adds is the difference \
         between it and the policies' rows. `readrandom` follows db_bench's \
         `waitforcompaction`, so every setup reads the same settled database (a setup that \
         overwrote faster would otherwise read while more compaction runs). \
         `readwhilewriting`'s figures are its reader's \
         (one thread): unpaced, its writer writes as fast as it can and takes its share of \
         the cores, so a setup whose writes are cheaper writes more and reads less; the rows \
         \"{}\" run it again (after a `fillseq` at that rate) with the writer paced, the \
         same write load under every setup. {}\n",
        scale.name(),
        Pass::Unsynced.rounds(),
        Pass::PacedWriter.label(),
        guest_build()
    );
    let _ = writeln!(
        md,
        "| sync | benchmark | setup | ops/s | P50 | P99 | P99.99 | ops/s / stock 36 | time / native | ops/s per round |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for pass in Pass::ALL {
        let names: Vec<String> = runs
            .iter()
            .filter(|r| r.pass == pass)
            .find_map(|r| r.result.as_ref().ok())
            .map(|m| m.benches.iter().map(|b| b.name.clone()).collect())
            .unwrap_or_default();
        // The paced pass's fillseq only sets the database up.
        let shown = names
            .iter()
            .filter(|n| pass != Pass::PacedWriter || n.as_str() == "readwhilewriting");
        for (i, name) in shown.enumerate() {
            for setup in Setup::ALL {
                let failed = runs
                    .iter()
                    .filter(|r| r.setup == setup && r.pass == pass)
                    .find_map(|r| r.result.as_ref().err());
                match (median_bench(runs, setup, pass, name), failed) {
                    (Some((b, rounds)), _) => {
                        let ratio = |other: Option<(Bench, Vec<f64>)>, inverse: bool| {
                            other
                                .filter(|(o, _)| o.ops > 0.0)
                                .map_or("-".to_string(), |(o, _)| {
                                    format!(
                                        "{:.2}×",
                                        if inverse {
                                            o.ops / b.ops
                                        } else {
                                            b.ops / o.ops
                                        }
                                    )
                                })
                        };
                        let rounds: Vec<String> =
                            rounds.iter().map(|o| format!("{o:.0}")).collect();
                        let _ = writeln!(
                            md,
                            "| {} | {name} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
                            pass.label(),
                            setup.label(),
                            b.ops,
                            b.p50,
                            b.p99,
                            b.p9999,
                            ratio(median_bench(runs, Setup::Stock36, pass, name), false),
                            ratio(median_bench(runs, Setup::Native, pass, name), true),
                            rounds.join(", "),
                        );
                    }
                    (None, Some(e)) if i == 0 => {
                        let _ = writeln!(
                            md,
                            "| {} | all | {} | {e} | | | | | | |",
                            pass.label(),
                            setup.label()
                        );
                    }
                    _ => {}
                }
            }
        }
    }
    let _ = writeln!(
        md,
        "\nThe store under each policy, per db_bench invocation (all its benchmarks): bytes the \
         guest wrote to zoned files, bytes the device wrote for them (WAF), GC copies, and the \
         device flushes. For `--sync=1`, what a flush costs: how many syncs carried their tail \
         inline in the journal record (no data block), the metadata bytes per flush (journal \
         records and checkpoints; one 4 KiB page is the target), and the data bytes per \
         flush, which are mostly RocksDB's memtable flushes and compactions writing tables, \
         not the syncs; the unsynced pass's first round.\n"
    );
    let _ = writeln!(md, "| sync | policy | host MiB | device MiB | WAF | WAF with metadata | GC MiB | device syncs | inline syncs | metadata bytes / sync | data bytes / sync |");
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for run in runs.iter().filter(|r| r.round == 0) {
        let (Setup::Valet(policy), Ok(Measured { stats: Some(s), .. })) = (run.setup, &run.result)
        else {
            continue;
        };
        let per_sync = |bytes: u64| match (run.pass, s.device_syncs) {
            (Pass::Synced, syncs) if syncs > 0 => format!("{:.0}", bytes as f64 / syncs as f64),
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {policy} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1} | {} | {} | {} | {} |",
            run.pass.label(),
            in_mib(s.host_bytes),
            in_mib(s.device_bytes),
            s.waf,
            s.waf_with_meta,
            in_mib(s.gc_bytes_moved),
            s.device_syncs,
            s.inline_syncs,
            per_sync(s.meta_bytes),
            per_sync(s.device_bytes),
        );
    }
    memory_markdown(&mut md, runs);
    md
}

/// Each setup's peak resident memory per pass, the median over the rounds that ran.
fn memory_markdown(md: &mut String, runs: &[Run]) {
    let _ = writeln!(
        md,
        "\nPeak resident memory of each db_bench process (MiB, its `VmHWM` sampled every \
         20 ms while it runs; medians over the rounds): RocksDB's memtables, block cache and tables' buffers in \
         every setup; under WebAssembly the guest's linear memory as far as it touched it and \
         the engine; under `valet-run` with a policy, the store (write buffers, journal).\n"
    );
    let _ = writeln!(md, "| sync | setup | peak MiB | rounds |");
    let _ = writeln!(md, "| --- | --- | --- | --- |");
    for pass in Pass::ALL {
        for setup in Setup::ALL {
            let peaks: Vec<f64> = runs
                .iter()
                .filter(|r| r.setup == setup && r.pass == pass)
                .filter_map(|r| r.result.as_ref().ok()?.peak_rss)
                .map(in_mib)
                .collect();
            if peaks.is_empty() {
                continue;
            }
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {} |",
                pass.label(),
                setup.label(),
                super::median(&peaks),
                peaks.len()
            );
        }
    }
}

/// `report rocksdb [--scale small|full] [--out DIR]`.
pub fn main(args: &[String]) -> i32 {
    super::section_main(args, "rocksdb", |runner, scale| Ok(section(runner, scale)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_medians_over_the_rounds_that_ran() {
        let run = |round: usize, ops: Option<f64>| Run {
            setup: Setup::HostFiles,
            pass: Pass::Unsynced,
            round,
            result: ops
                .map(|ops| {
                    let b = Bench {
                        name: "fillrandom".into(),
                        ops,
                        p50: ops / 1000.0,
                        p99: 1.0,
                        p9999: 2.0,
                    };
                    Measured {
                        benches: vec![b],
                        stats: None,
                        peak_rss: None,
                    }
                })
                .ok_or_else(|| "killed".to_string()),
        };
        let runs = [
            run(0, Some(300.0)),
            run(1, None),
            run(2, Some(100.0)),
            run(3, Some(200.0)),
        ];
        let (b, rounds) =
            median_bench(&runs, Setup::HostFiles, Pass::Unsynced, "fillrandom").unwrap();
        assert_eq!(rounds, [300.0, 100.0, 200.0]);
        assert_eq!((b.ops, b.p50), (200.0, 0.2));
        assert!(median_bench(&runs, Setup::Stock36, Pass::Unsynced, "fillrandom").is_none());
        assert!(median_bench(&runs, Setup::HostFiles, Pass::Unsynced, "readrandom").is_none());
    }

    #[test]
    fn parses_db_bench_lines_and_their_percentiles() {
        let out = "fillseq      :       2.500 micros/op 400000 ops/sec 0.125 seconds 50000 operations;  160.2 MB/s\n\
                   Microseconds per write:\nCount: 50000 Average: 2.5000  StdDev: 1.00\n\
                   Percentiles: P50: 1.50 P75: 2.00 P99: 9.80 P99.9: 20.00 P99.99: 120.50\n\
                   readrandom   :       4.000 micros/op 250000 ops/sec 0.200 seconds 50000 operations; (50000 of 50000 found)\n";
        let b = parse(out);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].name, "fillseq");
        assert_eq!(b[0].ops, 400000.0);
        assert_eq!((b[0].p50, b[0].p99, b[0].p9999), (1.5, 9.8, 120.5));
        assert_eq!(b[1].name, "readrandom");
        assert!(b[1].p50.is_nan(), "no histogram after readrandom");
    }

    #[test]
    fn readwhilewriting_rate_is_the_readers_own() {
        // A paced writer stopped 40 ms after the reader: db_bench's 164,473 ops/s counts
        // that wait, the reader's 5.000 µs per read do not.
        let out = "fillseq      :      50.117 micros/op 19952 ops/sec 2.506 seconds 50000 operations;    8.0 MB/s\n\
                   readwhilewriting :       5.000 micros/op 164473 ops/sec 0.304 seconds 50000 operations;   65.8 MB/s (50000 of 50000 found)\n";
        let b = parse(out);
        assert_eq!(b[0].ops, 19952.0, "other benchmarks keep db_bench's rate");
        assert_eq!(b[1].ops, 200_000.0);
    }

    #[test]
    fn readrandom_reads_a_settled_database() {
        let unsynced = args(Scale::Small, Pass::Unsynced, "/d");
        let benchmarks = unsynced
            .iter()
            .find_map(|a| a.strip_prefix("--benchmarks="))
            .expect("a benchmark list");
        assert!(
            benchmarks.contains("overwrite,waitforcompaction,readrandom"),
            "{benchmarks}"
        );
        // db_bench prints no rate for the wait: it adds no row.
        let out = "overwrite    :       9.000 micros/op 111111 ops/sec 0.450 seconds 50000 operations;   44.5 MB/s\n\
                   waitforcompaction(/d/db): started\n\
                   waitforcompaction(/d/db): finished with status (OK)\n\
                   readrandom   :       4.000 micros/op 250000 ops/sec 0.200 seconds 50000 operations; (50000 of 50000 found)\n";
        let names: Vec<String> = parse(out).into_iter().map(|b| b.name).collect();
        assert_eq!(names, ["overwrite", "readrandom"]);
    }

    #[test]
    fn paced_pass_limits_the_writer_and_only_it() {
        let paced = args(Scale::Small, Pass::PacedWriter, "/d");
        assert!(paced.contains(&format!("--benchmark_write_rate_limit={PACED_WRITE_RATE}")));
        assert!(paced.contains(&"--benchmarks=fillseq,readwhilewriting".to_string()));
        assert!(paced.contains(&"--sync=0".to_string()));
        for pass in [Pass::Unsynced, Pass::Synced] {
            let a = args(Scale::Small, pass, "/d");
            assert!(!a
                .iter()
                .any(|a| a.starts_with("--benchmark_write_rate_limit")));
            assert!(a.contains(&format!("--sync={}", u8::from(pass == Pass::Synced))));
        }
    }

    #[test]
    fn readwhilewriting_takes_the_reads_histogram_in_either_order() {
        for (first, second) in [("write", "read"), ("read", "write")] {
            let p = |op: &str| {
                if op == "read" {
                    "P50: 3.00 P99: 9.00 P99.99: 30.00"
                } else {
                    "P50: 5.00 P99: 50.00 P99.99: 500.00"
                }
            };
            let out = format!(
                "readwhilewriting :       2.000 micros/op 500000 ops/sec 1.0 seconds 500000 operations; (1000 of 1000 found)\n\
                 Microseconds per {first}:\nCount: 10\nPercentiles: {}\n\
                 Microseconds per {second}:\nCount: 10\nPercentiles: {}\n",
                p(first),
                p(second)
            );
            let b = parse(&out);
            assert_eq!(b.len(), 1);
            assert_eq!(
                (b[0].p50, b[0].p99, b[0].p9999),
                (3.0, 9.0, 30.0),
                "{first} first"
            );
        }
    }
}
