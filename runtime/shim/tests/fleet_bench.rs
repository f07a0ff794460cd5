//! Figures for Valet under containerd, measured beside `valet-run` on the same kind of
//! device in one run (ignored: run by hand, as root, on a quiet machine):
//!
//!     cargo test --release -p valet-shim --test fleet_bench -- --ignored --nocapture --test-threads 1
//!
//! - pod start: `ctr tasks start` to the guest's first instruction (its `start UNIX_NS`
//!   line), P50 and P99 over `VALET_FLEET_STARTS` starts (default 50), cold (each pod a new
//!   image, so a module never compiled: the same guest with a distinct custom section) and
//!   warm (the same image again). The figure includes `ctr`'s own start and its round trips.
//! - synced appends: 1, 2 and 8 pods appending 430 B records with an fsync after each
//!   (`sync_append`, all starting at one agreed instant), against 1, 2 and 8 tenants of one
//!   `valet-run --tenants`.
//! - LevelDB (`--sync 0` and `--sync 1`) as a pod against `valet-run`.

mod fleet;

use std::process::{Child, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use fleet::{oci, Agent, Containerd, RUNTIME};

struct Bench {
    dir: tempfile::TempDir,
    _agent: Agent,
    containerd: Containerd,
}

impl Bench {
    fn start() -> Bench {
        let dir = tempfile::Builder::new()
            .prefix("valet-bench")
            .tempdir_in("/tmp")
            .unwrap();
        let socket = dir.path().join("node.sock");
        let agent = Agent::start(&dir.path().join("store"), &socket);
        let containerd = Containerd::start(&socket, "");
        Bench {
            dir,
            _agent: agent,
            containerd,
        }
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
            .unwrap()
    }
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The module with a custom section `nonce` appended: the same program, a new digest.
fn with_nonce(wasm: &[u8], nonce: u64) -> Vec<u8> {
    let name = b"valet-nonce";
    let payload = nonce.to_le_bytes();
    let mut out = wasm.to_vec();
    out.push(0);
    out.push((1 + name.len() + payload.len()) as u8);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[test]
#[ignore]
fn pod_start() {
    if !fleet::available() {
        return;
    }
    let n: usize = std::env::var("VALET_FLEET_STARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let b = Bench::start();
    let wasm = std::fs::read(valet_guests::POD_WRITER).unwrap();
    let c = &b.containerd;
    // One start: create the container, then time `ctr tasks start` to the guest's line.
    let start_once = |image: &str, id: &str| -> f64 {
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
            "430",
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
        let t1: u128 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("start "))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("no start line: {stdout}"));
        (t1.saturating_sub(t0)) as f64 / 1e6
    };
    let mut cold = Vec::new();
    for i in 0..n {
        let image = format!("docker.io/valet/cold-{i}:1");
        b.import(&image, &with_nonce(&wasm, i as u64));
        cold.push(start_once(&image, &format!("cold{i}")));
    }
    b.import("docker.io/valet/warm:1", &wasm);
    start_once("docker.io/valet/warm:1", "prime");
    let mut warm = Vec::new();
    for i in 0..n {
        warm.push(start_once("docker.io/valet/warm:1", &format!("warm{i}")));
    }
    for (what, v) in [("cold", &mut cold), ("warm", &mut warm)] {
        v.sort_by(f64::total_cmp);
        println!(
            "pod start {what}: P50 {:.1} ms  P99 {:.1} ms  min {:.1}  max {:.1}  ({} starts)",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v[0],
            v[v.len() - 1],
            v.len()
        );
    }
}

/// A `sync_append` line: (ops/s, P99.99 µs).
fn writer_figures(stdout: &str) -> Vec<(f64, f64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("sync_append ")?;
            let tokens: Vec<&str> = rest.split_whitespace().collect();
            let get = |k: &str| -> Option<f64> {
                let i = tokens.iter().position(|t| *t == k)?;
                tokens.get(i + 1)?.parse().ok()
            };
            Some((get("ops_per_sec")?, get("p9999_us")?))
        })
        .collect()
}

fn summary(what: &str, w: &[(f64, f64)]) {
    let total: f64 = w.iter().map(|x| x.0).sum();
    let worst = w.iter().map(|x| x.1).fold(0.0, f64::max);
    println!(
        "{what}: {} writers, {total:.0} syncs/s in all, worst P99.99 {worst:.0} µs",
        w.len()
    );
}

#[test]
#[ignore]
fn synced_appends_pods_against_tenants() {
    if !fleet::available() {
        return;
    }
    let secs = "3";
    let b = Bench::start();
    let wasm = std::fs::read(valet_guests::SYNC_APPEND).unwrap();
    b.import("docker.io/valet/sync:1", &wasm);
    for round in 0..2 {
        for writers in [1usize, 2, 8] {
            // Pods.
            let at = (now_ns() / 1_000_000 + 1500).to_string();
            let pods: Vec<Child> = (0..writers)
                .map(|i| {
                    let id = format!("s{round}-{writers}-{i}");
                    b.spawn(
                        "docker.io/valet/sync:1",
                        &id,
                        &format!("t{i}"),
                        &[
                            "--dir",
                            "/data",
                            "--name",
                            &format!("p{i}"),
                            "--seconds",
                            secs,
                            "--start_at_ms",
                            &at,
                        ],
                    )
                })
                .collect();
            let mut figures = Vec::new();
            for p in pods {
                figures.extend(writer_figures(&ok(&p.wait_with_output().unwrap(), "pod")));
            }
            summary(&format!("round {round}: {writers} pods"), &figures);
            // valet-run with as many tenants, on a device of the same geometry.
            let device = b.dir.path().join(format!("vr-{round}-{writers}"));
            let at = (now_ns() / 1_000_000 + 1500).to_string();
            let mut toml = String::new();
            for i in 0..writers {
                toml.push_str(&format!(
                    "[[tenant]]\nname = \"t{i}\"\napp = {:?}\nargs = [\"--dir\", \"/data\", \"--name\", \"v{i}\", \"--seconds\", \"{secs}\", \"--start_at_ms\", \"{at}\"]\n",
                    valet_guests::SYNC_APPEND
                ));
            }
            let file = b.dir.path().join(format!("t-{round}-{writers}.toml"));
            std::fs::write(&file, toml).unwrap();
            let out = valet_tests::valet_run(&device)
                .arg("--tenants")
                .arg(&file)
                .output()
                .unwrap();
            summary(
                &format!("round {round}: valet-run, {writers} tenants"),
                &writer_figures(&ok(&out, "valet-run")),
            );
        }
    }
}

/// `name : X micros/op; Y ops/sec;` lines: (name, ops/s).
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

#[test]
#[ignore]
fn leveldb_as_a_pod_against_valet_run() {
    if !fleet::available() {
        return;
    }
    let Some(leveldb) = valet_guests::require("leveldb") else {
        return;
    };
    let b = Bench::start();
    b.import(
        "docker.io/valet/leveldb:1",
        &std::fs::read(leveldb).unwrap(),
    );
    let num = std::env::var("VALET_FLEET_LEVELDB_NUM").unwrap_or_else(|_| "100000".into());
    for sync in ["0", "1"] {
        let n = if sync == "1" {
            "10000".to_string()
        } else {
            num.clone()
        };
        let args = [
            "--benchmarks=fillseq,fillrandom,overwrite,readrandom",
            "--num",
            &n,
            "--sync",
            sync,
        ];
        for round in 0..2 {
            let id = format!("ldb-{sync}-{round}");
            let pod = ok(
                &b.spawn("docker.io/valet/leveldb:1", &id, "ldb", &args)
                    .wait_with_output()
                    .unwrap(),
                "leveldb pod",
            );
            let device = b.dir.path().join(format!("ldb-{sync}-{round}"));
            let out = valet_tests::valet_run(&device)
                .args(["--policy", "default", leveldb, "--"])
                .args(args)
                .output()
                .unwrap();
            let vr = ok(&out, "valet-run leveldb");
            for ((name, p), (_, v)) in db_bench_lines(&pod).iter().zip(db_bench_lines(&vr)) {
                println!("leveldb --sync {sync} round {round} {name}: pod {p:.0} ops/s, valet-run {v:.0} ops/s, pod/valet-run {:.2}", p / v);
            }
        }
    }
}
