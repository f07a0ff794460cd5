//! Valet under containerd (`containerd-shim-valet-v1` and the node agent `valet-run node`)
//! beside `valet-run` on the same kind of device, in one run:
//!
//! - LevelDB's db_bench (the `leveldb` guest, `--sync 0` and `--sync 1`) as a pod against
//!   the same arguments under `valet-run`, rounds alternating (pod, then `valet-run`), each
//!   on a fresh device of the same geometry in the same directory;
//! - synced appends (`sync_append`: 430 B records, an fsync after each, every writer
//!   starting at one agreed instant) by 1, 2 and 8 pods at once against as many tenants of
//!   one `valet-run --tenants`: aggregate syncs/s and each writer's P99.99, so that two
//!   writers together can be set against one alone;
//! - pod start: `ctr tasks start` to the guest's first instruction (the `start UNIX_NS` line
//!   of `pod_writer`), P50 and P99 over 50 starts, cold (every pod a module never compiled:
//!   the same guest with a distinct custom section) and warm (the same image again).
//!
//! It needs root and containerd (as the shim's tests do) and writes one line saying why
//! when it cannot run. `report fleet [--scale small|full] [--out DIR]` runs only this
//! section and writes `DIR/fleet.md`; the full report writes it too.

use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::markdown::in_mib;
use super::runners::{vm_hwm, Runner};
use super::workloads::Scale;
use super::{median, percentile};

/// The containerd test bed of the shim's tests (containerd of our own, the agent, OCI
/// image tars), one copy for both.
#[path = "../../../runtime/shim/tests/fleet/mod.rs"]
#[allow(dead_code, clippy::all)]
mod node;

use node::{oci, Agent, Containerd, RUNTIME};

const SHIM: &str = "containerd-shim-valet-v1";
/// 430 B records, as the write-path issue's synced appends.
const RECORD: &str = "430";

/// `report fleet` with its command line (after the subcommand); returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let usage = "usage: report fleet [--scale small|full] [--out DIR]";
    let Some((scale, out)) = super::scale_and_out(args, usage) else {
        return 2;
    };
    super::run_section(&out, "fleet", |work| {
        // What is measured is always a release build (`target/release/`), whatever the
        // profile of this executable, which only drives containerd and reads the guests'
        // own figures.
        let self_exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let target = self_exe
            .parent()
            .and_then(Path::parent)
            .ok_or("no target directory above this executable")?;
        let release_exe = target.join("release").join("report");
        let runner = Runner {
            valet_run: super::runners::find_valet_run(&release_exe)?,
            self_exe: release_exe,
            work,
            timeout: Duration::from_secs(scale.timeout_secs()),
        };
        Ok(section(&runner, scale))
    })
}

/// The section's markdown: the figures, or one line saying why there are none.
pub fn section(runner: &Runner, scale: Scale) -> String {
    let title = format!("## Valet under containerd (`--scale {}`)\n\n", scale.name());
    if let Some(why) = cannot_run() {
        eprintln!("report: fleet section skipped: {why}");
        return format!("{title}Skipped: {why}.\n");
    }
    let shim = match find_shim(&runner.self_exe) {
        Ok(p) => p,
        Err(e) => return format!("{title}Skipped: {e}.\n"),
    };
    // The test bed fails by panicking (a pod that did not run, containerd that did not
    // answer); the section then says so instead of ending the report.
    let figures = std::panic::catch_unwind(AssertUnwindSafe(|| measure(runner, &shim, scale)));
    match figures {
        Ok(f) => format!("{title}{}", markdown(&f)),
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a run failed".into());
            let line = why.lines().next().unwrap_or("").to_string();
            eprintln!("report: fleet section failed: {why}");
            format!("{title}Failed: {line}\n")
        }
    }
}

/// Why the section cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("containerd pods need root".into());
    }
    for tool in ["containerd", "ctr", "runc"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        if !found {
            return Some(format!("{tool} is not installed (bash .ci/setup-fleet)"));
        }
    }
    for guest in ["leveldb", "sync_append", "pod_writer"] {
        if valet_guests::wasm(guest).is_none() {
            return Some(format!("guest {guest} was not built"));
        }
    }
    None
}

/// The shim next to this executable, brought up to date with cargo first.
fn find_shim(self_exe: &Path) -> Result<PathBuf, String> {
    eprintln!("report: building the shim (cargo build --release -p valet-shim)");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--release", "-p", "valet-shim", "--bin", SHIM]);
    if let Some(target) = self_exe.parent().and_then(Path::parent) {
        build.arg("--target-dir").arg(target);
    }
    let status = build.status().map_err(|e| format!("running cargo: {e}"))?;
    let path = self_exe.with_file_name(SHIM);
    if !status.success() || !path.is_file() {
        return Err(format!("no {SHIM} at {}", path.display()));
    }
    Ok(path)
}

/// A node: containerd of our own and the agent, in a directory of the report's work area.
struct Node {
    dir: tempfile::TempDir,
    valet_run: PathBuf,
    agent: Option<Agent>,
    containerd: Containerd,
}

impl Node {
    fn start(runner: &Runner, shim: &Path) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("fleet-")
            .tempdir_in(&runner.work)
            .expect("a work directory");
        let socket = dir.path().join("node.sock");
        let agent = Agent::start_with(&runner.valet_run, &dir.path().join("store"), &socket, &[]);
        let containerd = Containerd::start_with(shim, &socket, "");
        Node {
            dir,
            valet_run: runner.valet_run.clone(),
            agent: Some(agent),
            containerd,
        }
    }

    /// Replaces the agent by one on a fresh device `name` (as each `valet-run` run gets).
    fn fresh_agent(&mut self, name: &str) {
        if let Some(agent) = self.agent.take() {
            agent.kill();
        }
        let socket = self.dir.path().join("node.sock");
        self.agent = Some(Agent::start_with(
            &self.valet_run,
            &self.dir.path().join(name),
            &socket,
            &[],
        ));
    }

    fn import(&self, name: &str, wasm: &[u8]) {
        self.containerd.import(&oci::image_tar(
            name,
            "wasip1",
            "wasm",
            &["/app.wasm"],
            &[oci::File {
                path: "app.wasm",
                data: wasm,
                mode: 0o755,
            }],
        ));
    }

    /// `ctr run --rm` of `image` as container `id` in `tenant`, not waited for.
    fn spawn(&self, image: &str, id: &str, tenant: &str, args: &[&str]) -> Child {
        let tenant = format!("valet.io/tenant={tenant}");
        self.containerd
            .ctr_command(&[
                "run",
                "--rm",
                "--runtime",
                RUNTIME,
                "--annotation",
                &tenant,
                image,
                id,
                "/app.wasm",
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running ctr")
    }

    /// `valet-run` on a fresh device `name` of the agent's geometry.
    fn valet_run(&self, name: &str) -> Command {
        let mut c = Command::new(&self.valet_run);
        c.arg("--device")
            .arg(self.dir.path().join(name))
            .args(["--zone-size", "64", "--zones", "64"])
            .stdin(Stdio::null());
        c
    }
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// One LevelDB benchmark's ops/s per round under each setup.
struct LevelDbRow {
    sync: bool,
    name: String,
    pod: Vec<f64>,
    valet_run: Vec<f64>,
    /// `valet-run --timeout`: compiled with epoch checks, as the agent compiles every pod
    /// (a pod must stop when it is killed while the agent goes on).
    valet_run_checks: Vec<f64>,
}
/// (writers, each round's pods, each round's tenants of one `valet-run`, each round's
/// peak resident memory of the agent that ran the pods).
type AppendRow = (usize, Vec<Vec<Writer>>, Vec<Vec<Writer>>, Vec<u64>);

/// Everything the section shows.
struct Figures {
    rounds: usize,
    leveldb_num: [String; 2],
    leveldb: Vec<LevelDbRow>,
    seconds: String,
    appends: Vec<AppendRow>,
    starts: usize,
    cold: Vec<f64>,
    warm: Vec<f64>,
    precompiled: Vec<f64>,
    /// Modules the fresh agent compiled instead of loading them from containerd.
    fresh_compiled: usize,
    /// Starts whose output had no start line (left out of the figures).
    lost_starts: usize,
}

/// One `sync_append` writer's figures.
#[derive(Clone, Copy, Debug)]
struct Writer {
    ops: f64,
    p99_us: f64,
    p9999_us: f64,
}

fn measure(runner: &Runner, shim: &Path, scale: Scale) -> Figures {
    let rounds = match scale {
        Scale::Small => 3,
        Scale::Full => 5,
    };
    let mut node = Node::start(runner, shim);
    let leveldb_num = match scale {
        Scale::Small => ["50000".to_string(), "5000".to_string()],
        Scale::Full => ["200000".to_string(), "20000".to_string()],
    };
    let leveldb = leveldb(&mut node, rounds, &leveldb_num);
    let seconds = match scale {
        Scale::Small => "3",
        Scale::Full => "10",
    };
    let appends = appends(&mut node, rounds, seconds);
    let starts = 50;
    let (cold, warm, precompiled, fresh_compiled, lost_starts) = pod_starts(&mut node, starts);
    Figures {
        rounds,
        leveldb_num,
        leveldb,
        seconds: seconds.into(),
        appends,
        starts,
        cold,
        warm,
        precompiled,
        fresh_compiled,
        lost_starts,
    }
}

/// `name : X micros/op; Y ops/sec;` lines of db_bench: (name, ops/s).
fn db_bench_lines(stdout: &str) -> Vec<(String, f64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let ops = rest
                .split(';')
                .nth(1)?
                .trim()
                .strip_suffix("ops/sec")?
                .trim()
                .parse()
                .ok()?;
            Some((name.trim().to_string(), ops))
        })
        .collect()
}

fn leveldb(node: &mut Node, rounds: usize, num: &[String; 2]) -> Vec<LevelDbRow> {
    let wasm = valet_guests::wasm("leveldb").expect("checked");
    node.import("docker.io/valet/leveldb:1", &std::fs::read(wasm).unwrap());
    let mut rows: Vec<LevelDbRow> = Vec::new();
    for (sync, num) in [(false, &num[0]), (true, &num[1])] {
        let benchmarks = if sync {
            "fillseq,fillrandom,overwrite"
        } else {
            "fillseq,fillrandom,overwrite,readrandom"
        };
        let benchmarks = format!("--benchmarks={benchmarks}");
        let args: [&str; 9] = [
            &benchmarks,
            "--num",
            num,
            "--value_size",
            "400",
            "--sync",
            if sync { "1" } else { "0" },
            "--db",
            "/data/db",
        ];
        for round in 0..rounds {
            let tag = format!("ldb-{}-{round}", u8::from(sync));
            eprintln!(
                "report: fleet: leveldb --sync {} round {round}",
                u8::from(sync)
            );
            node.fresh_agent(&format!("{tag}-pod"));
            let pod = ok(
                &node
                    .spawn("docker.io/valet/leveldb:1", &tag, "ldb", &args)
                    .wait_with_output()
                    .unwrap(),
                "leveldb pod",
            );
            let valet_run = |name: &str, timeout: &[&str]| {
                ok(
                    &node
                        .valet_run(name)
                        .args(timeout)
                        .args(["--policy", "default", wasm, "--"])
                        .args(args)
                        .output()
                        .unwrap(),
                    "valet-run leveldb",
                )
            };
            let vr = valet_run(&format!("{tag}-vr"), &[]);
            // A limit no run reaches: only for its epoch checks.
            let checks = valet_run(&format!("{tag}-vrt"), &["--timeout", "1h"]);
            let (pod, vr, checks) = (
                db_bench_lines(&pod),
                db_bench_lines(&vr),
                db_bench_lines(&checks),
            );
            assert!(
                pod.len() == vr.len() && vr.len() == checks.len(),
                "leveldb: pod and valet-run ran different benchmarks"
            );
            for (((name, p), (_, v)), (_, c)) in pod.into_iter().zip(vr).zip(checks) {
                match rows.iter_mut().find(|r| r.sync == sync && r.name == name) {
                    Some(row) => {
                        row.pod.push(p);
                        row.valet_run.push(v);
                        row.valet_run_checks.push(c);
                    }
                    None => rows.push(LevelDbRow {
                        sync,
                        name,
                        pod: vec![p],
                        valet_run: vec![v],
                        valet_run_checks: vec![c],
                    }),
                }
            }
        }
    }
    rows
}

/// The `sync_append` lines of a run.
fn writers(stdout: &str) -> Vec<Writer> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("sync_append ")?;
            let tokens: Vec<&str> = rest.split_whitespace().collect();
            let get = |k: &str| -> Option<f64> {
                let i = tokens.iter().position(|t| *t == k)?;
                tokens.get(i + 1)?.parse().ok()
            };
            Some(Writer {
                ops: get("ops_per_sec")?,
                p99_us: get("p99_us")?,
                p9999_us: get("p9999_us")?,
            })
        })
        .collect()
}

fn appends(node: &mut Node, rounds: usize, seconds: &str) -> Vec<AppendRow> {
    let wasm = valet_guests::wasm("sync_append").expect("checked");
    node.import("docker.io/valet/sync:1", &std::fs::read(wasm).unwrap());
    let mut out: Vec<AppendRow> = [1, 2, 8]
        .iter()
        .map(|&w| (w, Vec::new(), Vec::new(), Vec::new()))
        .collect();
    for round in 0..rounds {
        for row in out.iter_mut() {
            let n = row.0;
            eprintln!("report: fleet: {n} synced appenders, round {round}");
            // Pods, on a fresh device.
            node.fresh_agent(&format!("sync-{round}-{n}-pod"));
            let at = (now_ns() / 1_000_000 + 1500).to_string();
            let pods: Vec<Child> = (0..n)
                .map(|i| {
                    node.spawn(
                        "docker.io/valet/sync:1",
                        &format!("s{round}-{n}-{i}"),
                        &format!("t{i}"),
                        &[
                            "--dir",
                            "/data",
                            "--name",
                            &format!("p{i}"),
                            "--record_size",
                            RECORD,
                            "--seconds",
                            seconds,
                            "--start_at_ms",
                            &at,
                        ],
                    )
                })
                .collect();
            let mut got = Vec::new();
            for p in pods {
                got.extend(writers(&ok(
                    &p.wait_with_output().unwrap(),
                    "sync_append pod",
                )));
            }
            assert_eq!(got.len(), n, "sync_append pods: {got:?}");
            row.1.push(got);
            // A fresh agent for each row: its peak is that of n pods at once.
            if let Some(peak) = node.agent.as_ref().and_then(|a| vm_hwm(a.pid())) {
                row.3.push(peak);
            }
            // valet-run with as many tenants, on a fresh device of the same geometry.
            let at = (now_ns() / 1_000_000 + 1500).to_string();
            let mut toml = String::new();
            for i in 0..n {
                let _ = writeln!(
                    toml,
                    "[[tenant]]\nname = \"t{i}\"\napp = {wasm:?}\nargs = [\"--dir\", \"/data\", \"--name\", \"v{i}\", \"--record_size\", \"{RECORD}\", \"--seconds\", \"{seconds}\", \"--start_at_ms\", \"{at}\"]"
                );
            }
            let file = node.dir.path().join(format!("tenants-{round}-{n}.toml"));
            std::fs::write(&file, toml).unwrap();
            let vr = ok(
                &node
                    .valet_run(&format!("sync-{round}-{n}-vr"))
                    .arg("--tenants")
                    .arg(&file)
                    .output()
                    .unwrap(),
                "valet-run --tenants",
            );
            let got = writers(&vr);
            assert_eq!(got.len(), n, "valet-run tenants: {got:?}");
            row.2.push(got);
        }
    }
    out
}

/// One pod start: creates the container, then times `ctr tasks start` to the guest's
/// `start` line; ms.
fn start_once(node: &Node, image: &str, id: &str) -> Option<f64> {
    let c = &node.containerd;
    c.ctr_ok(&[
        "containers",
        "create",
        "--runtime",
        RUNTIME,
        // One tenant for all: every tenant with data holds zones of its own.
        "--annotation",
        "valet.io/tenant=starts",
        image,
        id,
        "/app.wasm",
        id,
        "/data",
        "1",
        RECORD,
    ]);
    let t0 = now_ns();
    let out = c
        .ctr_command(&["tasks", "start", id])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = ok(&out, id);
    c.ctr(&["tasks", "rm", "-f", id]);
    c.ctr(&["containers", "rm", id]);
    let t1: Option<u128> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("start "))
        .and_then(|t| t.trim().parse().ok());
    if t1.is_none() {
        eprintln!(
            "report: fleet: pod {id} exited 0 but its output had no start line (stdout {stdout:?}, stderr {:?})",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    t1.map(|t1| t1.saturating_sub(t0) as f64 / 1e6)
}

/// Pod starts: cold (modules never compiled), warm (the agent holds the module), and
/// precompiled (a fresh agent, its memory and disk cache empty, starting the cold pods'
/// images again: their compiled modules come from containerd's content store).
fn pod_starts(node: &mut Node, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>, usize, usize) {
    node.fresh_agent("starts");
    let wasm = std::fs::read(valet_guests::wasm("pod_writer").expect("checked")).unwrap();
    eprintln!("report: fleet: {n} cold pod starts");
    let mut cold = Vec::new();
    let nonce = now_ns() as u64;
    for i in 0..n {
        let image = format!("docker.io/valet/cold-{i}:1");
        node.import(&image, &oci::with_nonce(&wasm, nonce ^ i as u64));
        cold.extend(start_once(node, &image, &format!("cold{i}")));
    }
    eprintln!("report: fleet: {n} warm pod starts");
    node.import("docker.io/valet/warm:1", &wasm);
    start_once(node, "docker.io/valet/warm:1", "prime");
    let mut warm = Vec::new();
    for i in 0..n {
        warm.extend(start_once(
            node,
            "docker.io/valet/warm:1",
            &format!("warm{i}"),
        ));
    }
    eprintln!("report: fleet: {n} pod starts on a fresh agent, compiled modules from containerd");
    node.fresh_agent("starts-fresh");
    let mut precompiled = Vec::new();
    for i in 0..n {
        let image = format!("docker.io/valet/cold-{i}:1");
        precompiled.extend(start_once(node, &image, &format!("pre{i}")));
    }
    // How many the fresh agent compiled after all (each should have come from containerd).
    let log = node.agent.as_ref().map(|a| a.log_text());
    let compiled = log
        .unwrap_or_default()
        .matches("valet-run node: compiled sha256:")
        .count();
    for v in [&mut cold, &mut warm, &mut precompiled] {
        v.sort_by(f64::total_cmp);
    }
    let lost = 3 * n - cold.len() - warm.len() - precompiled.len();
    (cold, warm, precompiled, compiled, lost)
}

fn markdown(f: &Figures) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Pods run by `containerd-shim-valet-v1` on the node agent (`valet-run node`) under a \
         containerd started for the report, against `valet-run` on a fresh device of the same \
         geometry (64 zones of 64 MiB) in the same directory; release builds; {} rounds, \
         pod and `valet-run` alternating. Medians over the rounds, each round's figure in \
         brackets: mind the noise of a shared 2-core machine and of this disk's flushes.\n",
        f.rounds
    );
    let _ = writeln!(
        md,
        "### LevelDB db_bench as a pod\n\n`--value_size 400`, `--num {}` (`--sync 1`: `--num {}`), \
         the `default` policy, the database on the store. The agent compiles every pod with \
         epoch checks (a killed pod must stop while the agent goes on); `valet-run` compiles \
         its one guest without them, unless `--timeout` is given: the last columns run \
         `valet-run --timeout 1h`, the agent's code generation without the shim and agent.\n",
        f.leveldb_num[0], f.leveldb_num[1]
    );
    let _ = writeln!(md, "| sync | benchmark | pod ops/s | `valet-run` ops/s | pod / `valet-run` (≥ 0.9) | per round | `valet-run --timeout` ops/s | pod / that | per round |");
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let per_round = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| format!("{:.2}", x / y))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for row in &f.leveldb {
        let (pod, vr, checks) = (
            median(&row.pod),
            median(&row.valet_run),
            median(&row.valet_run_checks),
        );
        let _ = writeln!(
            md,
            "| {} | {} | {pod:.0} | {vr:.0} | {:.2} | {} | {checks:.0} | {:.2} | {} |",
            u8::from(row.sync),
            row.name,
            pod / vr,
            per_round(&row.pod, &row.valet_run),
            pod / checks,
            per_round(&row.pod, &row.valet_run_checks),
        );
    }
    let _ = writeln!(
        md,
        "\n### Synced appends: pods against tenants of one `valet-run`\n\n\
         {RECORD} B records, an fsync after each, {} s, every writer starting at one instant; \
         each pod (each tenant) its own tenant and file. Syncs/s are all writers' together; \
         P99.99 is the worst writer's.\n",
        f.seconds
    );
    let _ = writeln!(
        md,
        "| writers | pods syncs/s | `valet-run` syncs/s | pods / `valet-run` | pods P99 µs | pods P99.99 µs | `valet-run` P99.99 µs | per round (pods / `valet-run` syncs/s) |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    let total = |w: &Vec<Writer>| w.iter().map(|x| x.ops).sum::<f64>();
    let worst = |w: &Vec<Writer>, f: fn(&Writer) -> f64| w.iter().map(f).fold(0.0, f64::max);
    // Each writer's own P99.99, averaged: the worst of n writers' P99.99 rises with n by
    // order statistics alone, even when every writer sees the same latencies.
    let mean_tail = |w: &Vec<Writer>| w.iter().map(|x| x.p9999_us).sum::<f64>() / w.len() as f64;
    let mut tails = Vec::new();
    for (n, pods, vr, _) in &f.appends {
        let pods_total: Vec<f64> = pods.iter().map(total).collect();
        let vr_total: Vec<f64> = vr.iter().map(total).collect();
        let pods_p99: Vec<f64> = pods.iter().map(|w| worst(w, |x| x.p99_us)).collect();
        let pods_tail: Vec<f64> = pods.iter().map(|w| worst(w, |x| x.p9999_us)).collect();
        let vr_tail: Vec<f64> = vr.iter().map(|w| worst(w, |x| x.p9999_us)).collect();
        let per_round: Vec<String> = pods_total
            .iter()
            .zip(&vr_total)
            .map(|(p, v)| format!("{p:.0} / {v:.0}"))
            .collect();
        let _ = writeln!(
            md,
            "| {n} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {} |",
            median(&pods_total),
            median(&vr_total),
            median(&pods_total) / median(&vr_total),
            median(&pods_p99),
            median(&pods_tail),
            median(&vr_tail),
            per_round.join("; ")
        );
        tails.push((
            *n,
            pods.iter().map(mean_tail).collect::<Vec<f64>>(),
            vr.iter().map(mean_tail).collect::<Vec<f64>>(),
        ));
    }
    let tail = |n: usize, pods: bool| {
        tails
            .iter()
            .find(|t| t.0 == n)
            .map(|t| median(if pods { &t.1 } else { &t.2 }))
            .unwrap_or(f64::NAN)
    };
    let _ = writeln!(
        md,
        "\nTwo writers together against one alone, P99.99 (goal ≤ 1.3×; each writer's own \
         P99.99, the mean over the writers, median over the rounds: the worst writer's \
         rises with the number of writers by order statistics alone): pods {:.2}× ({:.0} µs \
         against {:.0} µs), tenants of one `valet-run` {:.2}× ({:.0} µs against {:.0} \
         µs).\n",
        tail(2, true) / tail(1, true),
        tail(2, true),
        tail(1, true),
        tail(2, false) / tail(1, false),
        tail(2, false),
        tail(1, false)
    );
    let _ = writeln!(
        md,
        "The agent's peak resident memory (`VmHWM`; a fresh agent for each number of pods, \
         so the figure is that of those pods at once, the store and the engine; MiB, median \
         over the rounds): {}.\n",
        f.appends
            .iter()
            .map(|(n, _, _, peaks)| {
                let mib: Vec<f64> = peaks.iter().map(|&b| in_mib(b)).collect();
                let pods = if *n == 1 { "pod" } else { "pods" };
                format!("{n} {pods} {:.1}", median(&mib))
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        md,
        "### Pod start\n\n`ctr tasks start` to the guest's first instruction (its first \
         line carries the time), {} starts each; the figure includes `ctr`'s own start and \
         the task's create in the shim. Cold: a module never compiled (the same guest with \
         a distinct custom section per image; the agent compiles it and the shim keeps the \
         result in containerd's content store); warm: the same image again (the agent holds \
         the module); precompiled: the cold pods' images again on a fresh agent (nothing in \
         memory, an empty wasmtime disk cache), which loads each compiled module from \
         containerd's content store.\n",
        f.starts
    );
    let _ = writeln!(md, "| start | P50 ms | P99 ms | min ms | max ms |");
    let _ = writeln!(md, "| --- | --- | --- | --- | --- |");
    for (what, v) in [
        ("cold", &f.cold),
        ("warm (goal P50 ≤ 50 ms)", &f.warm),
        ("precompiled, fresh agent", &f.precompiled),
    ] {
        let _ = writeln!(
            md,
            "| {what} | {:.1} | {:.1} | {:.1} | {:.1} |",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.first().copied().unwrap_or(f64::NAN),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    let _ = writeln!(
        md,
        "\nThe fresh agent compiled {} of the {} modules itself (0 when every one came from \
         containerd's content store). Starts whose pod exited 0 without its start line in \
         `ctr`'s output (left out above): {}.",
        f.fresh_compiled, f.starts, f.lost_starts
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_db_bench_and_sync_append_lines() {
        let db = "fillseq      :       3.021 micros/op;  331000 ops/sec;   12.6 MB/s\nnoise\n";
        assert_eq!(db_bench_lines(db), vec![("fillseq".to_string(), 331000.0)]);
        let w = writers(
            "sync_append p0-0: records 900 secs 3.0 ops_per_sec 300.5 p50_us 900.0 p99_us 2000.0 p999_us 3000.0 p9999_us 4000.5 late_ms 0\n",
        );
        assert_eq!(w.len(), 1);
        assert_eq!(
            (w[0].ops, w[0].p99_us, w[0].p9999_us),
            (300.5, 2000.0, 4000.5)
        );
    }

    #[test]
    fn nonce_changes_the_module_but_keeps_it_valid() {
        let wasm = b"\0asm\x01\0\0\0".to_vec();
        let a = oci::with_nonce(&wasm, 1);
        assert_ne!(a, oci::with_nonce(&wasm, 2));
        assert!(wasmtime::Module::validate(&wasmtime::Engine::default(), &a).is_ok());
    }
}
