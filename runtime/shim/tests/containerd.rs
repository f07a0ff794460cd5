//! Valet pods under a real containerd: the test starts its own containerd (root, state and
//! socket in a temporary directory) with `containerd-shim-valet-v1` on its PATH, and the
//! node agent (`valet-run node`) on a fresh store, imports an image it builds (the
//! `pod_writer` guest as `/app.wasm`), and runs containers with `ctr`. Needs root and
//! containerd; skipped with a message otherwise, failed instead under
//! `VALET_REQUIRE_FLEET=1` (CI).
//!
//! `VALET_FLEET_CYCLES=N` sets how many kill cycles the durability test runs (default 3).

mod fleet;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet::{oci, Agent, Containerd, RUNTIME};
use valet_runtime::device::DeviceSpec;
use valet_vfs::device::{Geometry, IoMode};

const IMAGE: &str = "docker.io/valet/pod-writer:1";
const RECORD: usize = 430;

fn pod_writer() -> Vec<u8> {
    std::fs::read(valet_guests::POD_WRITER).expect("the pod_writer guest")
}

/// The image: the guest at `/app.wasm` and a file for it to read from its rootfs.
fn image() -> Vec<u8> {
    let wasm = pod_writer();
    oci::image_tar(
        IMAGE,
        "wasip1",
        "wasm",
        &["/app.wasm"],
        &[
            oci::File {
                path: "app.wasm",
                data: &wasm,
                mode: 0o755,
            },
            oci::File {
                path: "etc/motd",
                data: b"from the image\n",
                mode: 0o644,
            },
        ],
    )
}

struct Node {
    _dir: tempfile::TempDir,
    device: std::path::PathBuf,
    socket: std::path::PathBuf,
    agent: Option<Agent>,
    containerd: Containerd,
}

impl Node {
    fn start() -> Node {
        let dir = tempfile::Builder::new()
            .prefix("valet-node")
            .tempdir_in("/tmp")
            .unwrap();
        let device = dir.path().join("store");
        let socket = dir.path().join("node.sock");
        let agent = Agent::start(&device, &socket);
        let containerd = Containerd::start(&socket, "");
        containerd.import(&image());
        Node {
            _dir: dir,
            device,
            socket,
            agent: Some(agent),
            containerd,
        }
    }

    /// `ctr run --rm` of the image as container `id` with these annotations and env, the
    /// guest's arguments after the module path; not waited for.
    fn spawn(&self, id: &str, annotations: &[(&str, &str)], env: &[&str], args: &[&str]) -> Child {
        let mut c = self
            .containerd
            .ctr_command(&["run", "--rm", "--runtime", RUNTIME]);
        for (k, v) in annotations {
            c.arg("--annotation").arg(format!("{k}={v}"));
        }
        for e in env {
            c.arg("--env").arg(e);
        }
        c.args([IMAGE, id, "/app.wasm"]).args(args);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ctr run")
    }

    fn run(&self, id: &str, annotations: &[(&str, &str)], env: &[&str], args: &[&str]) -> Output {
        self.spawn(id, annotations, env, args)
            .wait_with_output()
            .unwrap()
    }

    /// Kills the agent and opens its store here (nothing else holds it then).
    fn stop_agent_and_mount(&mut self) -> valet_vfs::Store {
        if let Some(agent) = self.agent.take() {
            agent.kill();
        }
        device(&self.device)
            .mount_existing()
            .expect("mounting the node store")
    }
}

fn device(dir: &Path) -> DeviceSpec {
    let mut geometry = Geometry::EMBEDDED_DEFAULT;
    geometry.zone_size = 64 << 20;
    geometry.zone_capacity = (64 << 20) / 4 * 3;
    geometry.zone_count = 64;
    DeviceSpec {
        dir: dir.to_path_buf(),
        zonefs: None,
        zonefs_capacity: None,
        fdp: None,
        geometry,
        io: IoMode::Auto,
        writeback: Some(valet_runtime::device::DEFAULT_WRITEBACK),
        handoff: Some(valet_runtime::device::DEFAULT_HANDOFF),
    }
}

/// The container's exit code as `ctr run` gave it, or None when ctr lost it to a race in
/// containerd-shimkit 0.1.2 (the newest): its `State` polls, once, a future that takes the
/// task's state lock, so a `State` that meets the shim's own exit-event task holding that
/// lock answers RUNNING, and ctr's delete right after its wait fails with "task must be
/// stopped before deletion: running" (exit 1). Seen once in many CI runs; the guest's own
/// output is checked either way.
fn exit_code(out: &Output) -> Option<i32> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lost = stderr.contains("task must be stopped before deletion: running");
    match out.status.code() {
        Some(1) if lost => None,
        code => Some(code.unwrap_or(-1)),
    }
}

/// Asserts the container exited with `code` (unless ctr lost it, see [`exit_code`]).
#[track_caller]
fn assert_exit(out: &Output, code: i32, context: &str) {
    let got = exit_code(out).unwrap_or(code);
    assert_eq!(got, code, "{context}{}", text(out));
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The records of `tenant`'s log `name` on the store, checked against what the guest
/// writes; returns how many whole, intact records it holds.
fn records(store: &valet_vfs::Store, tenant: &str, name: &str) -> u64 {
    let (_, root) = store.tenant(tenant).unwrap();
    let ino = store
        .lookup(root, &format!("data/{name}.log"))
        .unwrap_or_else(|e| panic!("{tenant}: data/{name}.log: {e}"));
    let size = store.metadata(ino).unwrap().size;
    let handle = store
        .open_file(root, &format!("data/{name}.log"), Default::default())
        .unwrap();
    let mut data = vec![0; size as usize];
    let mut at = 0;
    while at < data.len() {
        let n = handle.read_at(&mut data[at..], at as u64).unwrap();
        assert!(n > 0, "short read");
        at += n;
    }
    handle.close().unwrap();
    let whole = data.len() / RECORD;
    for i in 0..whole {
        let want = valet_guests::content::pod_record(name, i as u64, RECORD);
        assert!(
            data[i * RECORD..(i + 1) * RECORD] == want[..],
            "{tenant}: record {i} of {name}.log is damaged"
        );
    }
    whole as u64
}

/// The highest `ack N` in a guest's output, plus one (the records acknowledged).
fn acked(stdout: &str) -> u64 {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ack "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .max()
        .map_or(0, |n| n + 1)
}

#[test]
fn pods_share_the_node_store_at_once() {
    if !fleet::available() {
        return;
    }
    let mut node = Node::start();
    // Three pods at once, each a tenant: two write 300 records, the third has a 64 KiB
    // quota and asks for 1000 (430 KB).
    let a = node.spawn(
        "pod-a",
        &[("valet.io/tenant", "a")],
        &[],
        &["wa", "/data", "300", "430"],
    );
    let b = node.spawn(
        "pod-b",
        &[("valet.io/tenant", "b"), ("valet.io/policy", "rocks")],
        &["POD_EXIT=7"],
        &["wb", "/data", "300", "430"],
    );
    let q = node.spawn(
        "pod-q",
        &[("valet.io/tenant", "q"), ("valet.io/quota", "64KiB")],
        &[],
        &["wq", "/data", "1000", "430"],
    );
    let (a, b, q) = (
        a.wait_with_output().unwrap(),
        b.wait_with_output().unwrap(),
        q.wait_with_output().unwrap(),
    );
    let agent_log = node.agent.as_ref().unwrap().log_text();
    assert_exit(&a, 0, &format!("agent: {agent_log}\npod a: "));
    assert!(
        String::from_utf8_lossy(&a.stdout).contains("ok 300"),
        "{}",
        text(&a)
    );
    // The rest of the rootfs is the image's, readable by the guest.
    assert!(
        String::from_utf8_lossy(&a.stdout).contains("motd from the image"),
        "{}",
        text(&a)
    );
    // Env and exit codes pass through.
    assert_exit(&b, 7, "pod b: ");
    assert!(
        String::from_utf8_lossy(&b.stdout).contains("ok 300"),
        "{}",
        text(&b)
    );
    // The pod over its quota gets ENOSPC; the others wrote everything.
    assert_exit(&q, 4, "pod q: ");
    let q_out = String::from_utf8_lossy(&q.stdout).into_owned();
    let q_acked = acked(&q_out);
    assert!(q_out.contains(&format!("enospc {q_acked}")), "{}", text(&q));
    assert!(
        q_acked > 0 && q_acked * RECORD as u64 <= 64 << 10,
        "{q_acked} records"
    );

    let store = node.stop_agent_and_mount();
    assert_eq!(records(&store, "a", "wa"), 300);
    assert_eq!(records(&store, "b", "wb"), 300);
    assert!(records(&store, "q", "wq") >= q_acked);
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "fsck: {report:?}");
    // Tenants never share a zone.
    let mut owner = BTreeMap::new();
    for (zone, tenant, _) in store.zone_owners() {
        assert_eq!(*owner.entry(zone).or_insert(tenant), tenant, "zone {zone}");
    }
}

#[test]
fn a_bad_annotation_fails_the_create_with_one_line() {
    if !fleet::available() {
        return;
    }
    let node = Node::start();
    let out = node.run(
        "bad",
        &[("valet.io/quota", "12X")],
        &[],
        &["w", "/data", "1", "430"],
    );
    assert!(!out.status.success(), "{}", text(&out));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains(r#"annotation valet.io/quota="12X": unknown unit"#),
        "{}",
        text(&out)
    );
    // An unknown policy is refused by the agent, at create time too.
    let out = node.run(
        "nopolicy",
        &[("valet.io/policy", "nosuch")],
        &[],
        &["w", "/data", "1", "430"],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such policy"),
        "{}",
        text(&out)
    );
}

/// A pod's tenant, its `ctr run`, what its stdout said so far, and the thread reading it.
type Watched = (
    String,
    Child,
    Arc<Mutex<String>>,
    std::thread::JoinHandle<()>,
);

/// Pods killed by `ctr task kill`, by SIGKILL of their shim, and by the agent's own death:
/// every acknowledged record is on the store afterwards, and the store checks clean.
#[test]
fn killed_pods_and_a_killed_agent_lose_no_acknowledged_record() {
    if !fleet::available() {
        return;
    }
    let cycles: u64 = std::env::var("VALET_FLEET_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(3);
    let mut node = Node::start();
    let mut acked_total = BTreeMap::<String, u64>::new();
    for cycle in 0..cycles {
        let how = cycle % 3;
        let ids = [format!("k{cycle}-a"), format!("k{cycle}-b")];
        // Each pod's stdout is read as it comes, so the test sees its acknowledgements.
        let pods: Vec<Watched> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let tenant = format!("k{i}");
                let mut child = node.spawn(
                    id,
                    &[("valet.io/tenant", &tenant)],
                    &[],
                    &[&format!("log{i}"), "/data", "1000000", "430"],
                );
                let seen = Arc::new(Mutex::new(String::new()));
                let stdout = child.stdout.take().unwrap();
                let sink = seen.clone();
                let reader = std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                        let mut s = sink.lock().unwrap();
                        s.push_str(&line);
                        s.push('\n');
                    }
                });
                (tenant, child, seen, reader)
            })
            .collect();
        // Let both write a while, then kill: the tasks, their shims, or the agent.
        fleet::wait_for(
            Duration::from_secs(120),
            "both pods to acknowledge records",
            || pods.iter().all(|p| acked(&p.2.lock().unwrap()) > 0),
        );
        std::thread::sleep(Duration::from_millis(100 + 37 * (cycle % 7)));
        match how {
            0 => {
                for id in &ids {
                    node.containerd
                        .ctr_ok(&["tasks", "kill", "-s", "SIGKILL", id]);
                }
            }
            1 => {
                for pid in shim_pids(&node.containerd) {
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            _ => {
                node.agent.take().unwrap().kill();
            }
        }
        for (i, (tenant, child, seen, reader)) in pods.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            reader.join().unwrap();
            let stdout = seen.lock().unwrap().clone();
            let n = acked(&stdout);
            assert!(
                !stdout.contains("ok "),
                "cycle {cycle} pod {i} finished before it was killed"
            );
            let total = acked_total.entry(tenant).or_default();
            *total = (*total).max(n);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if how == 2 {
                assert!(stderr.contains("node agent went away"), "{stderr}");
            }
            if how == 1 {
                // ctr loses its task with the shim ("ttrpc: closed").
                assert!(!out.status.success(), "cycle {cycle} pod {i}: {stderr}");
            } else {
                assert_eq!(
                    out.status.code(),
                    Some(137),
                    "cycle {cycle} pod {i}: {stderr}"
                );
            }
        }
        // Leftover containers of killed shims.
        for id in &ids {
            node.containerd.ctr(&["tasks", "rm", "-f", id]);
            node.containerd.ctr(&["containers", "rm", id]);
        }
        let store = node.stop_agent_and_mount();
        for (i, (tenant, want)) in acked_total.iter().enumerate() {
            let have = records(&store, tenant, &format!("log{i}"));
            assert!(
                have >= *want,
                "cycle {cycle}: {tenant} holds {have} of {want} acknowledged records"
            );
        }
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "cycle {cycle}: fsck: {report:?}");
        drop(store);
        node.agent = Some(Agent::start(&node.device, &node.socket));
    }
}

fn shim_pids(c: &Containerd) -> Vec<i32> {
    let want = c.address.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("containerd-shim-valet-v1") && cmd.contains(&want) {
            pids.push(pid);
        }
    }
    pids
}

/// A module compiled once is kept in containerd's content store beside its image: an agent
/// that never saw it (restarted, with its wasmtime disk cache gone) loads it compiled.
#[test]
fn a_fresh_agent_loads_the_compiled_module_from_containerds_content_store() {
    if !fleet::available() {
        return;
    }
    let mut node = Node::start();
    let args = ["c", "/data", "1", "430"];
    let out = node.run("c1", &[("valet.io/tenant", "c")], &[], &args);
    assert_exit(&out, 0, "");
    let log = node.agent.as_ref().unwrap().log_text();
    assert!(log.contains("valet-run node: compiled sha256:"), "{log}");
    // The blob, labelled with its source, and the image's target holding it for the GC.
    let content = node.containerd.ctr_ok(&["content", "ls"]);
    let blob = content
        .lines()
        .find(|l| l.contains("valet.io/precompiled."))
        .unwrap_or_else(|| panic!("no compiled module in the content store:\n{content}"));
    let digest = blob.split_whitespace().next().unwrap();
    assert!(
        content.lines().any(
            |l| l.contains("containerd.io/gc.ref.content.valet.precompiled.") && l.contains(digest)
        ),
        "the image does not refer to {digest}:\n{content}"
    );

    // The same program with another custom section: a module of its own, which compiles
    // to the very bytes kept already (one blob, labelled for both sources).
    let twin = "docker.io/valet/pod-writer-twin:1";
    node.containerd.import(&oci::image_tar(
        twin,
        "wasip1",
        "wasm",
        &["/app.wasm"],
        &[oci::File {
            path: "app.wasm",
            data: &oci::with_nonce(&pod_writer(), 7),
            mode: 0o755,
        }],
    ));
    let run_twin = |node: &Node, id: &str| {
        node.containerd
            .ctr_command(&["run", "--rm", "--runtime", RUNTIME])
            .args(["--annotation", "valet.io/tenant=c", twin, id, "/app.wasm"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run_twin(&node, "t1");
    assert_exit(&out, 0, "");

    // A fresh agent: nothing in memory, no disk cache. Both images load compiled.
    node.stop_agent_and_mount();
    std::fs::remove_dir_all(node.device.with_extension("cache")).ok();
    node.agent = Some(Agent::start(&node.device, &node.socket));
    let out = node.run("c2", &[("valet.io/tenant", "c")], &[], &args);
    assert_exit(&out, 0, "");
    let out = run_twin(&node, "t2");
    assert_exit(&out, 0, "");
    let log = node.agent.as_ref().unwrap().log_text();
    assert!(
        log.matches("from containerd's content store").count() == 2
            && !log.contains("compiled sha256:"),
        "{log}"
    );
}

/// containerd 1.7+ for the wasm OCI artifact form: `$VALET_CONTAINERD17` (a directory
/// holding its `containerd` and `ctr`), else where `.ci/setup-fleet` unpacks Debian
/// trixie's 1.7 (`~/.cache/valet-fleet/containerd-1.7/usr/bin`).
fn containerd17() -> Option<std::path::PathBuf> {
    let dir = match std::env::var_os("VALET_CONTAINERD17") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?
            .join("valet-fleet/containerd-1.7/usr/bin"),
    };
    dir.join("containerd").is_file().then_some(dir)
}

/// The wasm OCI artifact form (the module as an `application/wasm` layer, no filesystem
/// layer) runs under containerd 1.7: the shim reads the module from containerd's content
/// store. (Debian bookworm's containerd 1.6 cannot import such an image.)
#[test]
fn a_wasm_artifact_image_runs_under_containerd_17() {
    if !fleet::available() {
        return;
    }
    let Some(bin) = containerd17() else {
        let why = "no containerd 1.7 (bash .ci/setup-fleet, or VALET_CONTAINERD17=DIR)";
        if std::env::var_os("VALET_REQUIRE_FLEET").is_some_and(|v| v == "1") {
            panic!("VALET_REQUIRE_FLEET=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("valet-art")
        .tempdir_in("/tmp")
        .unwrap();
    let device = dir.path().join("store");
    let socket = dir.path().join("node.sock");
    let agent = Agent::start(&device, &socket);
    let containerd = Containerd::start_from(
        Some(&bin),
        Path::new(env!("CARGO_BIN_EXE_containerd-shim-valet-v1")),
        &socket,
        "",
    );
    let image = "docker.io/valet/pod-writer-artifact:1";
    containerd.import(&oci::wasm_artifact_tar(image, &pod_writer()));
    let out = containerd
        .ctr_command(&["run", "--rm", "--runtime", RUNTIME])
        .args(["--annotation", "valet.io/tenant=art"])
        .args([image, "art1", "/app.wasm", "wart", "/data", "20", "430"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let logs = format!(
        "containerd:\n{}\nagent:\n{}\n",
        containerd.log_tail(),
        agent.log_text()
    );
    assert_exit(&out, 0, &logs);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok 20"),
        "{}",
        text(&out)
    );
    drop(containerd);
    agent.kill();
    let store = device_spec_mount(&device);
    assert_eq!(records(&store, "art", "wart"), 20);
    assert!(store.fsck().unwrap().is_clean());
}

fn device_spec_mount(dir: &Path) -> valet_vfs::Store {
    device(dir)
        .mount_existing()
        .expect("mounting the node store")
}
