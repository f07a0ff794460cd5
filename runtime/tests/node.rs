//! The node agent without containerd: this test plays the shim's part of the protocol
//! (`valet_runtime::node::proto`) against an agent serving in-process, so the agent's
//! behaviour is checked on any machine (the containerd tests in `runtime/shim/tests` need
//! root and containerd).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use valet_runtime::admin::{client, AdminAddr};
use valet_runtime::device::DeviceSpec;
use valet_runtime::node::proto::{self, CpuQuota, Create, FromAgent, ToAgent};
use valet_runtime::node::{self, NodeConfig};
use valet_runtime::remove::Removal;
use valet_vfs::device::{Geometry, IoMode};

const RECORD: usize = 430;

/// One agent for the whole test binary (the store allows one mount per device), and a
/// rootfs holding the pod_writer guest.
struct Fixture {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    rootfs: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| start_agent(64))
}

/// A temporary directory with a container's rootfs holding the pod_writer guest.
fn new_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("node.sock");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::copy(valet_guests::POD_WRITER, rootfs.join("app.wasm")).unwrap();
    std::fs::write(rootfs.join("etc/motd"), "from the rootfs\n").unwrap();
    Fixture {
        _dir: dir,
        socket,
        rootfs,
    }
}

/// Waits (bounded) until an agent listens on `socket`.
fn wait_for_agent(socket: &std::path::Path) {
    let start = Instant::now();
    while UnixStream::connect(socket).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the agent did not listen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An agent serving in this process on a fresh store of `zones` zones of 12 MiB.
fn start_agent(zones: u32) -> Fixture {
    start_agent_with(zones, None, None)
}

/// [`start_agent`], serving the admin API on `admin` and metrics on `metrics` too.
fn start_agent_with(
    zones: u32,
    admin: Option<String>,
    metrics: Option<std::net::SocketAddr>,
) -> Fixture {
    {
        let f = new_fixture();
        let mut geometry = Geometry::EMBEDDED_DEFAULT;
        geometry.zone_size = 16 << 20;
        geometry.zone_capacity = 12 << 20;
        geometry.zone_count = zones;
        let config = NodeConfig {
            device: DeviceSpec {
                dir: f._dir.path().join("store"),
                zonefs: None,
                zonefs_capacity: None,
                fdp: None,
                geometry,
                io: IoMode::Auto,
                writeback: Some(valet_runtime::device::DEFAULT_WRITEBACK),
                handoff: Some(valet_runtime::device::DEFAULT_HANDOFF),
            },
            socket: f.socket.clone(),
            admin,
            metrics,
        };
        std::thread::spawn(move || node::serve(config).expect("the agent"));
        wait_for_agent(&f.socket);
        f
    }
}

/// A pipe: (read end, write end).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    unsafe {
        (
            File::from(OwnedFd::from_raw_fd(fds[0])),
            File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    }
}

/// A container as the shim drives it.
struct Pod {
    conn: UnixStream,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

fn reader(mut f: File) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        f.read_to_string(&mut s).ok();
        s
    })
}

/// Sends Create; the agent's answer is returned with the pod.
fn create(id: &str, annotations: &[(&str, &str)], args: &[&str]) -> (Pod, FromAgent) {
    create_on(fixture(), id, annotations, args)
}

/// [`create`] on the agent of `f`.
fn create_on(
    f: &Fixture,
    id: &str,
    annotations: &[(&str, &str)],
    args: &[&str],
) -> (Pod, FromAgent) {
    create_with(
        f,
        id,
        annotations,
        args,
        &[("POD_EXIT", "0")],
        Limits::default(),
    )
}

/// The container's resource limits, as the shim reads them from its OCI spec.
#[derive(Default)]
struct Limits {
    memory: Option<u64>,
    cpu: Option<CpuQuota>,
}

/// [`create_on`] with the guest's environment and limits.
fn create_with(
    f: &Fixture,
    id: &str,
    annotations: &[(&str, &str)],
    args: &[&str],
    env: &[(&str, &str)],
    limits: Limits,
) -> (Pod, FromAgent) {
    let conn = UnixStream::connect(&f.socket).unwrap();
    let rootfs = File::open(&f.rootfs).unwrap();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let annotations: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let request = ToAgent::Create(Create {
        id: id.into(),
        module: "/app.wasm".into(),
        args: std::iter::once("/app.wasm")
            .chain(args.iter().copied())
            .map(String::from)
            .collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        annotations,
        stdio: [false, true, true],
        content_store: false,
        module_fd: false,
        memory_limit: limits.memory,
        pids_limit: None,
        cpu_limit: limits.cpu,
    });
    let stdio = [None, Some(out_w), Some(err_w)];
    proto::send(&conn, &request, &node::create_fds(&rootfs, &stdio)).unwrap();
    drop(stdio);
    let (answer, _) = proto::recv::<FromAgent>(&conn).unwrap().unwrap();
    let pod = Pod {
        conn,
        stdout: reader(out_r),
        stderr: reader(err_r),
    };
    (pod, answer)
}

impl Pod {
    fn start(&self) {
        proto::send(&self.conn, &ToAgent::Start, &[]).unwrap();
        let (m, _) = proto::recv::<FromAgent>(&self.conn).unwrap().unwrap();
        assert_eq!(m, FromAgent::Started);
    }

    /// Waits for the exit; returns it with the pod's stdout and stderr.
    fn wait(self) -> (FromAgent, String, String) {
        let (m, _) = proto::recv::<FromAgent>(&self.conn).unwrap().unwrap();
        drop(self.conn);
        (m, self.stdout.join().unwrap(), self.stderr.join().unwrap())
    }

    /// Kills the guest as SIGKILL would: it must end with 128 + 9 within 2 s. Returns its
    /// stdout.
    fn kill_promptly(self) -> String {
        let asked = Instant::now();
        proto::send(&self.conn, &ToAgent::Kill { signal: 9 }, &[]).unwrap();
        let (e, out, _) = self.wait();
        assert_eq!(e, FromAgent::Exited { code: 137 }, "{out}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        out
    }
}

fn acked(stdout: &str) -> u64 {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ack "))
        .filter_map(|n| n.parse::<u64>().ok())
        .max()
        .map_or(0, |n| n + 1)
}

#[test]
fn pods_run_at_once_with_their_own_stdio_and_exit_codes() {
    let (a, ca) = create(
        "a",
        &[("valet.io/tenant", "na")],
        &["wa", "/data", "200", "430"],
    );
    let (b, cb) = create(
        "b",
        &[("valet.io/tenant", "nb"), ("valet.io/policy", "rocks")],
        &["wb", "/data", "200", "430"],
    );
    assert_eq!((ca, cb), (FromAgent::Created, FromAgent::Created));
    a.start();
    b.start();
    let (ea, out_a, err_a) = a.wait();
    let (eb, out_b, _) = b.wait();
    assert_eq!(ea, FromAgent::Exited { code: 0 }, "{out_a}\n{err_a}");
    assert_eq!(eb, FromAgent::Exited { code: 0 }, "{out_b}");
    assert!(
        out_a.contains("ok 200") && out_a.contains("motd from the rootfs"),
        "{out_a}"
    );
    assert!(out_b.contains("ok 200"), "{out_b}");
    // Each pod's stdout carries only its own lines.
    assert_eq!(out_a.lines().filter(|l| l.starts_with("ack")).count(), 200);
}

#[test]
fn a_pod_over_its_quota_gets_enospc_while_another_keeps_writing() {
    let (q, cq) = create(
        "q",
        &[("valet.io/tenant", "nq"), ("valet.io/quota", "32KiB")],
        &["wq", "/data", "1000", "430"],
    );
    let (w, cw) = create(
        "w",
        &[("valet.io/tenant", "nw")],
        &["ww", "/data", "300", "430"],
    );
    assert_eq!((cq, cw), (FromAgent::Created, FromAgent::Created));
    q.start();
    w.start();
    let (eq, out_q, _) = q.wait();
    let (ew, out_w, _) = w.wait();
    assert_eq!(eq, FromAgent::Exited { code: 4 }, "{out_q}");
    let n = acked(&out_q);
    assert!(out_q.contains(&format!("enospc {n}")), "{out_q}");
    assert!(
        n > 0 && n * RECORD as u64 <= 32 << 10,
        "{n} records under 32 KiB"
    );
    assert_eq!(ew, FromAgent::Exited { code: 0 }, "{out_w}");
    assert!(out_w.contains("ok 300"), "{out_w}");
}

/// A pod's limit of names (`valet.io/files`) is its tenant's: past it, creating a file is
/// ENOSPC for that pod, while a pod of another tenant goes on making hundreds.
#[test]
fn a_pod_at_its_limit_of_names_gets_enospc_while_another_keeps_creating() {
    let f = fixture();
    let env = |files| [("POD_EXIT", "0"), ("POD_FILES", files)];
    let (l, cl) = create_with(
        f,
        "lf",
        &[("valet.io/tenant", "nlf"), ("valet.io/files", "10")],
        &["wlf", "/data", "3", "430"],
        &env("50"),
        Limits::default(),
    );
    let (m, cm) = create_with(
        f,
        "mf",
        &[("valet.io/tenant", "nmf")],
        &["wmf", "/data", "3", "430"],
        &env("300"),
        Limits::default(),
    );
    assert_eq!((cl, cm), (FromAgent::Created, FromAgent::Created));
    l.start();
    m.start();
    let (el, out_l, _) = l.wait();
    let (em, out_m, _) = m.wait();
    // Ten names: the mount's directory `data`, the log, and eight of the files.
    assert_eq!(el, FromAgent::Exited { code: 4 }, "{out_l}");
    assert!(out_l.contains("ok 3"), "{out_l}");
    assert!(out_l.contains("files-enospc 8"), "{out_l}");
    assert_eq!(em, FromAgent::Exited { code: 0 }, "{out_m}");
    assert!(out_m.contains("files 300"), "{out_m}");
}

#[test]
fn bad_requests_fail_at_create_with_one_line() {
    for (annotations, says) in [
        (
            vec![("valet.io/quota", "12X")],
            "valet.io/quota=\"12X\": unknown unit",
        ),
        (vec![("valet.io/policy", "nosuch")], "no such policy"),
        (
            vec![("valet.io/files", "lots")],
            "valet.io/files=\"lots\": not a count",
        ),
        (vec![("valet.io/mounts", "data")], "not an absolute path"),
    ] {
        let (_pod, answer) = create("bad", &annotations, &["w", "/data", "1", "430"]);
        match answer {
            FromAgent::Failed { message } => {
                assert!(message.contains(says), "{message}");
                assert!(!message.contains('\n'));
            }
            other => panic!("{annotations:?}: {other:?}"),
        }
    }
    // A module that is not WebAssembly.
    let f = fixture();
    std::fs::write(f.rootfs.join("bad.wasm"), b"not wasm").unwrap();
    let conn = UnixStream::connect(&f.socket).unwrap();
    let rootfs = File::open(&f.rootfs).unwrap();
    let request = ToAgent::Create(Create {
        id: "badmod".into(),
        module: "/bad.wasm".into(),
        args: vec!["/bad.wasm".into()],
        env: vec![],
        annotations: BTreeMap::new(),
        stdio: [false, false, false],
        content_store: false,
        module_fd: false,
        memory_limit: None,
        pids_limit: None,
        cpu_limit: None,
    });
    proto::send(
        &conn,
        &request,
        &node::create_fds(&rootfs, &[None, None, None]),
    )
    .unwrap();
    let (answer, _) = proto::recv::<FromAgent>(&conn).unwrap().unwrap();
    assert!(
        matches!(&answer, FromAgent::Failed { message } if message.contains("not a valid WebAssembly module")),
        "{answer:?}"
    );
}

#[test]
fn a_kill_or_a_vanished_shim_stops_the_guest_and_keeps_what_it_synced() {
    // Killed: exit 128 + 9, promptly.
    let (p, c) = create(
        "k",
        &[("valet.io/tenant", "nk")],
        &["wk", "/data", "0", "430"],
    );
    assert_eq!(c, FromAgent::Created);
    p.start();
    std::thread::sleep(Duration::from_millis(200));
    let out = p.kill_promptly();
    let n = acked(&out);
    assert!(n > 0, "{out}");
    // A second run of the tenant finds every acknowledged record intact and goes on.
    let (p, _) = create(
        "k2",
        &[("valet.io/tenant", "nk")],
        &["wk", "/data", &(n + 5).to_string(), "430"],
    );
    p.start();
    let (e, out2, err2) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 0 }, "{out2}\n{err2}");
    assert!(out2.lines().any(|l| l.starts_with("ok ")), "{out2}");

    // Killed while asleep in the host (`poll_oneoff` for an hour): stopped at once too.
    let (p, c) = create_with(
        fixture(),
        "s",
        &[("valet.io/tenant", "ns")],
        &["ws", "/data", "3", "430"],
        &[("POD_EXIT", "0"), ("POD_SLEEP_SECS", "3600")],
        Limits::default(),
    );
    assert_eq!(c, FromAgent::Created);
    p.start();
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    proto::send(&p.conn, &ToAgent::Kill { signal: 9 }, &[]).unwrap();
    // Fail, rather than hang for the hour, if the kill does not reach the sleeper.
    let limit = Some(Duration::from_secs(20));
    p.conn.set_read_timeout(limit).unwrap();
    let (e, out, _) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 137 }, "{out}");
    assert!(
        out.contains("ok 3"),
        "the kill came before the sleep: {out}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );

    // The shim vanishes: the guest is stopped (its stdout reaches end of file).
    let (p, _) = create(
        "v",
        &[("valet.io/tenant", "nv")],
        &["wv", "/data", "0", "430"],
    );
    p.start();
    std::thread::sleep(Duration::from_millis(200));
    let Pod { conn, stdout, .. } = p;
    drop(conn);
    let out = stdout.join().unwrap();
    assert!(acked(&out) > 0, "{out}");
}

/// A pod's memory limit bounds its guest's memory: under 32 MiB, 64 MiB cannot be had
/// (the guest's allocation fails, and it aborts); the same pod without a limit gets it.
#[test]
fn a_pods_memory_limit_bounds_its_guest() {
    let env = [("POD_EXIT", "0"), ("POD_ALLOC_MIB", "64")];
    let args = ["wm", "/data", "1", "430"];
    let tenant = [("valet.io/tenant", "nm")];
    let (p, c) = create_with(
        fixture(),
        "m1",
        &tenant,
        &args,
        &env,
        Limits {
            memory: Some(32 << 20),
            ..Limits::default()
        },
    );
    assert_eq!(c, FromAgent::Created);
    p.start();
    let (e, out, err) = p.wait();
    assert_ne!(e, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    assert!(!out.contains("allocated"), "{out}");
    assert!(err.contains("memory allocation"), "{err}");
    let (p, _) = create_with(fixture(), "m2", &tenant, &args, &env, Limits::default());
    p.start();
    let (e, out, err) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    assert!(
        out.contains("allocated 64 MiB") && out.contains("ok 1"),
        "{out}"
    );
}

/// The CPU time a pod_writer run with `$POD_SPIN_MS` says it used.
fn spun_ms(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cpu line: {stdout}"))
}

/// A pod's CPU limit holds its guest to its share: spinning for a second of wall time
/// under a tenth of a core, it uses about a tenth of a second of CPU (at most 0.3 s: the
/// overrun of a period is paid in the next), and the same guest without a limit more.
#[test]
fn a_pods_cpu_limit_bounds_the_cpu_time_its_guest_uses() {
    let env = [("POD_EXIT", "0"), ("POD_SPIN_MS", "1000")];
    let args = ["wc", "/data", "1", "430"];
    let tenant = [("valet.io/tenant", "nc")];
    let tenth = Limits {
        cpu: Some(CpuQuota {
            quota_us: 10_000,
            period_us: 100_000,
        }),
        ..Limits::default()
    };
    let (p, c) = create_with(fixture(), "c1", &tenant, &args, &env, tenth);
    assert_eq!(c, FromAgent::Created);
    p.start();
    let (e, out, err) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    let limited = spun_ms(&out);
    assert!(limited <= 300, "{limited} ms of CPU in 1 s under 0.1 cores");
    let (p, _) = create_with(fixture(), "c2", &tenant, &args, &env, Limits::default());
    p.start();
    let (e, out, err) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    let free = spun_ms(&out);
    assert!(free > limited, "{free} ms without a limit, {limited} with");
    // A limit the agent cannot keep is refused at create.
    let bad = Limits {
        cpu: Some(CpuQuota {
            quota_us: 10,
            period_us: 100_000,
        }),
        ..Limits::default()
    };
    let (_, c) = create_with(fixture(), "c3", &tenant, &args, &env, bad);
    assert!(
        matches!(&c, FromAgent::Failed { message } if message.contains("CPU limit")),
        "{c:?}"
    );
    // Killed while paused for its limit (1 ms a second: its first tick's CPU puts it
    // seconds in debt), it stops at once, not when the debt is paid.
    let slow = Limits {
        cpu: Some(CpuQuota {
            quota_us: 1_000,
            period_us: 1_000_000,
        }),
        ..Limits::default()
    };
    let spin = [("POD_EXIT", "0"), ("POD_SPIN_MS", "60000")];
    let (p, c) = create_with(fixture(), "c4", &tenant, &args, &spin, slow);
    assert_eq!(c, FromAgent::Created);
    p.start();
    std::thread::sleep(Duration::from_millis(300));
    p.kill_promptly();
}

/// Tenants never share a zone: on a small store, pods of new tenants are created while it
/// has spare zones for them, then refused at create with one line; a pod of a tenant it
/// has still runs.
#[test]
fn new_tenants_past_the_spare_zones_are_refused_at_create() {
    let agent = start_agent(12);
    let mut admitted = Vec::new();
    let refusal = loop {
        let n = admitted.len();
        assert!(n < 12, "12 tenants admitted on a 12-zone store");
        let tenant = format!("t{n}");
        let (pod, answer) = create_on(
            &agent,
            &format!("p{n}"),
            &[("valet.io/tenant", &tenant)],
            &["w", "/data", "20", "430"],
        );
        match answer {
            FromAgent::Created => {
                pod.start();
                let (exit, out, err) = pod.wait();
                assert_eq!(
                    exit,
                    FromAgent::Exited { code: 0 },
                    "{tenant}: {out}\n{err}"
                );
                admitted.push(tenant);
            }
            FromAgent::Failed { message } => break message,
            other => panic!("{tenant}: {other:?}"),
        }
    };
    assert!(admitted.len() >= 2, "only {admitted:?} admitted");
    assert!(
        refusal.contains("no room for another tenant") && !refusal.contains('\n'),
        "{refusal}"
    );
    let (pod, answer) = create_on(
        &agent,
        "again",
        &[("valet.io/tenant", &admitted[0])],
        &["w2", "/data", "20", "430"],
    );
    assert_eq!(answer, FromAgent::Created);
    pod.start();
    let (exit, out, _) = pod.wait();
    assert_eq!(exit, FromAgent::Exited { code: 0 }, "{out}");
}

/// A quota counts what files hold, not what was written: a pod rewriting its log in place
/// many times over never grows it, and is never refused.
#[test]
fn rewrites_in_place_never_reach_the_quota() {
    let (pod, answer) = create_with(
        fixture(),
        "rewrite",
        &[("valet.io/tenant", "nr"), ("valet.io/quota", "32KiB")],
        &["r", "/data", "50", "430"],
        &[("POD_EXIT", "0"), ("POD_REWRITE", "20")],
        Limits::default(),
    );
    assert_eq!(answer, FromAgent::Created);
    pod.start();
    let (exit, out, err) = pod.wait();
    // 50 records of 430 B (21.5 KB) written 21 times: 450 KB through a 32 KiB quota.
    assert_eq!(exit, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    assert!(out.contains("ok 50") && out.contains("rewrote 20"), "{out}");
}

/// SIGTERM to the agent (its DaemonSet's pod deleted) stops every pod with that signal, as
/// a kill does: each shim hears 143 promptly, the agent then unmounts the store and ends by
/// SIGTERM, and every acknowledged record is on the store.
#[test]
fn a_terminated_agent_stops_its_pods_with_the_signal_and_ends_by_it() {
    use std::os::unix::process::ExitStatusExt;
    let f = new_fixture();
    let store_dir = f._dir.path().join("store");
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("node")
        .arg("--device")
        .arg(&store_dir)
        .arg("--socket")
        .arg(&f.socket)
        .args(["--zone-size", "16", "--zones", "24"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_agent(&f.socket);
    // Two pods that write their records, then sleep in the host for an hour.
    let pods: Vec<Pod> = ["ta", "tb"]
        .iter()
        .map(|name| {
            let (p, c) = create_with(
                &f,
                name,
                &[("valet.io/tenant", name)],
                &[name, "/data", "5", "430"],
                &[("POD_EXIT", "0"), ("POD_SLEEP_SECS", "3600")],
                Limits::default(),
            );
            assert_eq!(c, FromAgent::Created);
            p.start();
            // Fail, rather than hang for the hour, if the signal does not reach the pod.
            p.conn
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            p
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) }, 0);
    for p in pods {
        let (e, out, err) = p.wait();
        assert_eq!(e, FromAgent::Exited { code: 143 }, "{out}\n{err}");
        assert!(
            out.contains("ok 5"),
            "the signal came before the sleep: {out}"
        );
    }
    let status = agent.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let store = DeviceSpec::image(&store_dir, Geometry::EMBEDDED_DEFAULT)
        .mount_read_only()
        .unwrap();
    assert!(store.fsck().unwrap().is_clean());
    for (_, name, root) in store.tenants() {
        let log = store
            .open_file(
                root,
                &format!("data/{name}.log"),
                valet_vfs::OpenOptions::read(),
            )
            .unwrap();
        assert_eq!(log.metadata().unwrap().size, 5 * RECORD as u64, "{name}");
    }
}

/// The admin API removes a tenant's files only while none of its pods runs; a pod counts
/// from its create (which makes its store directories) to its guest's end. The tenant's
/// next pod starts afresh.
#[test]
fn the_admin_api_removes_a_tenants_files_only_between_its_pods() {
    let sock_dir = tempfile::tempdir().unwrap();
    let admin = sock_dir.path().join("admin.sock");
    let f = start_agent_with(16, Some(admin.to_str().unwrap().to_string()), None);
    let token = std::fs::read_to_string(f._dir.path().join("store/admin.token")).unwrap();
    let addr = AdminAddr::Unix(admin);
    let rm = |tenant: &str| {
        let body = br#"{"path": "/", "recursive": true}"#;
        let path = format!("/tenants/{tenant}/rm");
        let (code, body) = client::request(&addr, &token, "POST", &path, body).unwrap();
        (code, String::from_utf8_lossy(&body).into_owned())
    };
    let (p, c) = create_on(
        &f,
        "r1",
        &[("valet.io/tenant", "nr")],
        &["w", "/data", "20", "430"],
    );
    assert_eq!(c, FromAgent::Created);
    let (code, body) = rm("nr");
    assert_eq!(code, 409, "a created pod counts: {body}");
    p.start();
    let (e, out, err) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    assert_eq!(acked(&out), 20, "{out}");

    let (code, body) = rm("nr");
    assert_eq!(code, 200, "{body}");
    let removal: Removal = serde_json::from_str(&body).unwrap();
    assert_eq!((removal.files, removal.dirs), (1, 1), "{removal}");
    assert_eq!(removal.bytes_before, 20 * 430, "{removal}");
    assert_eq!(removal.bytes_after, 0, "{removal}");
    assert_eq!(rm("nobody").0, 404);

    let (p, _) = create_on(
        &f,
        "r2",
        &[("valet.io/tenant", "nr")],
        &["w", "/data", "3", "430"],
    );
    p.start();
    let (e, out, err) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    assert_eq!(acked(&out), 3, "only the new pod's records: {out}");
}

/// The agent's metrics name each pod's tenant: its pods running (a pod counts from its
/// create), once it synced the latency of its syncs, the bytes its files hold, its quota.
#[test]
fn the_agents_metrics_count_each_pods_guests_and_syncs() {
    // A free port: bound and let go (the agent binds it again at once).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let f = start_agent_with(16, None, Some(addr));
    let scrape = || {
        let (code, body) =
            client::request(&AdminAddr::Tcp(addr), "", "GET", "/metrics", b"").unwrap();
        assert_eq!(code, 200);
        String::from_utf8(body).unwrap()
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .parse()
            .unwrap()
    };
    // It spins for 300 ms of wall time under half a core first: metered and paused.
    let half = Limits {
        cpu: Some(CpuQuota {
            quota_us: 50_000,
            period_us: 100_000,
        }),
        ..Limits::default()
    };
    let (p, c) = create_with(
        &f,
        "m1",
        &[("valet.io/tenant", "mt"), ("valet.io/quota", "1MiB")],
        &["w", "/data", "20", "430"],
        &[("POD_EXIT", "0"), ("POD_SPIN_MS", "300")],
        half,
    );
    assert_eq!(c, FromAgent::Created);
    let text = scrape();
    assert_eq!(value(&text, "valet_tenant_guests{tenant=\"mt\"}"), 1.0);
    p.start();
    // While it spins: its linear memory (pod_writer's 17 pages and more) is the tenant's.
    std::thread::sleep(Duration::from_millis(100));
    let text = scrape();
    let memory = value(&text, "valet_tenant_memory_bytes{tenant=\"mt\"}");
    assert!(memory >= 17.0 * 65536.0, "{memory} bytes");
    assert!(value(&text, "process_resident_memory_bytes") >= memory);
    // A Rust guest's stack and data are in RAM; part of what it grew may not be.
    let resident = value(&text, "valet_tenant_memory_resident_bytes{tenant=\"mt\"}");
    assert!(
        resident > 0.0 && resident <= memory,
        "{resident} of {memory} bytes"
    );
    let (e, out, err) = p.wait();
    assert_eq!(e, FromAgent::Exited { code: 0 }, "{out}\n{err}");
    assert_eq!(acked(&out), 20, "{out}");
    let text = scrape();
    assert_eq!(value(&text, "valet_tenant_guests{tenant=\"mt\"}"), 0.0);
    assert_eq!(
        value(&text, "valet_tenant_memory_bytes{tenant=\"mt\"}"),
        0.0
    );
    assert_eq!(
        value(&text, "valet_tenant_memory_resident_bytes{tenant=\"mt\"}"),
        0.0
    );
    let syncs = value(&text, "valet_sync_duration_seconds_count{tenant=\"mt\"}");
    assert!(
        syncs >= 20.0,
        "{syncs} syncs counted for 20 acknowledged records"
    );
    assert!(value(&text, "valet_tenant_host_bytes_total{tenant=\"mt\"}") >= 20.0 * 430.0);
    assert!(value(&text, "valet_tenant_bytes{tenant=\"mt\"}") >= 20.0 * 430.0);
    assert_eq!(
        value(&text, "valet_tenant_quota_bytes{tenant=\"mt\"}"),
        1048576.0
    );
    assert_eq!(
        value(&text, "valet_tenant_quota_refusals_total{tenant=\"mt\"}"),
        0.0
    );
    let cpu = value(&text, "valet_tenant_cpu_seconds_total{tenant=\"mt\"}");
    assert!((0.05..=0.3).contains(&cpu), "{cpu} s of CPU");
    let paused = value(
        &text,
        "valet_tenant_cpu_throttled_seconds_total{tenant=\"mt\"}",
    );
    assert!(paused > 0.0, "{paused} s paused");
}

/// Sends a Create for the module at `module` in `f`'s rootfs; returns the connection and
/// the agent's answer, which must come within 20 s.
fn create_module(
    f: &Fixture,
    id: &str,
    module: &str,
    annotations: &[(&str, &str)],
) -> (UnixStream, FromAgent) {
    let conn = UnixStream::connect(&f.socket).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let rootfs = File::open(&f.rootfs).unwrap();
    let request = ToAgent::Create(Create {
        id: id.into(),
        module: module.into(),
        args: vec![module.into()],
        env: vec![],
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        stdio: [false, false, false],
        content_store: false,
        module_fd: false,
        memory_limit: None,
        pids_limit: None,
        cpu_limit: None,
    });
    proto::send(
        &conn,
        &request,
        &node::create_fds(&rootfs, &[None, None, None]),
    )
    .unwrap();
    let (answer, _) = proto::recv::<FromAgent>(&conn)
        .expect("an answer within 20 s")
        .unwrap();
    (conn, answer)
}

/// A module that is a FIFO, or larger than any module, is refused at create with one line
/// (a FIFO used to hold the create forever, a huge file to fill the agent's memory).
#[test]
fn a_module_that_is_no_regular_file_or_too_large_is_refused_at_create() {
    let f = fixture();
    let fifo = f.rootfs.join("fifo.wasm");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
    let huge = File::create(f.rootfs.join("huge.wasm")).unwrap();
    huge.set_len(proto::MAX_MODULE + 1).unwrap();
    for (module, says) in [
        ("/fifo.wasm", "not a regular file"),
        ("/huge.wasm", "over the agent's limit of 512 MiB"),
        ("/etc", "not a regular file"),
    ] {
        let (_conn, answer) = create_module(f, "odd", module, &[]);
        match answer {
            FromAgent::Failed { message } => {
                assert!(message.contains(says), "{module}: {message}");
                assert!(message.contains(module), "{module}: {message}");
            }
            other => panic!("{module}: {other:?}"),
        }
    }
}

/// The container's stdout reaches its end when the guest exits, while the shim is still
/// connected (containerd waits for it before it deletes the container).
#[test]
fn a_pods_stdout_ends_when_its_guest_exits_before_the_shim_hangs_up() {
    let (p, c) = create(
        "eof",
        &[("valet.io/tenant", "neof")],
        &["weof", "/data", "3", "430"],
    );
    assert_eq!(c, FromAgent::Created);
    p.start();
    let (m, _) = proto::recv::<FromAgent>(&p.conn).unwrap().unwrap();
    assert_eq!(m, FromAgent::Exited { code: 0 });
    let (done, ended) = std::sync::mpsc::channel();
    let Pod { conn, stdout, .. } = p;
    std::thread::spawn(move || done.send(stdout.join().unwrap()));
    let out = ended
        .recv_timeout(Duration::from_secs(10))
        .expect("stdout still open after the guest's exit");
    assert!(out.contains("ok 3"), "{out}");
    drop(conn);
}

/// A pod that names no quota runs under its tenant's; a create that fails (its module is
/// not WebAssembly) changes nothing: not the tenant's quota, and no new tenant is left.
#[test]
fn a_pod_without_a_quota_runs_under_its_tenants_and_a_failed_create_changes_nothing() {
    let sock_dir = tempfile::tempdir().unwrap();
    let admin = sock_dir.path().join("admin.sock");
    let f = start_agent_with(16, Some(admin.to_str().unwrap().to_string()), None);
    let token = std::fs::read_to_string(f._dir.path().join("store/admin.token")).unwrap();
    let addr = AdminAddr::Unix(admin);
    let (q, c) = create_on(
        &f,
        "q1",
        &[("valet.io/tenant", "nqt"), ("valet.io/quota", "32KiB")],
        &["wq1", "/data", "1000", "430"],
    );
    assert_eq!(c, FromAgent::Created);
    q.start();
    let (e, out, _) = q.wait();
    assert_eq!(e, FromAgent::Exited { code: 4 }, "{out}");
    std::fs::write(f.rootfs.join("bad.wasm"), b"not wasm").unwrap();
    for tenant in ["nqt", "leftover"] {
        let (_conn, answer) = create_module(
            &f,
            "bad",
            "/bad.wasm",
            &[("valet.io/tenant", tenant), ("valet.io/quota", "1G")],
        );
        assert!(
            matches!(&answer, FromAgent::Failed { message } if message.contains("not a valid WebAssembly module")),
            "{answer:?}"
        );
    }
    // The second pod's new file finds the tenant's 32 KiB taken by the first's log.
    let (q, c) = create_on(
        &f,
        "q2",
        &[("valet.io/tenant", "nqt")],
        &["wq2", "/data", "1000", "430"],
    );
    assert_eq!(c, FromAgent::Created);
    q.start();
    let (e, out, _) = q.wait();
    assert_eq!(e, FromAgent::Exited { code: 4 }, "{out}");
    assert!(out.contains("enospc"), "{out}");
    let (code, body) = client::request(&addr, &token, "GET", "/tenants", b"").unwrap();
    assert_eq!(code, 200);
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("\"nqt\""), "{body}");
    assert!(!body.contains("leftover"), "{body}");
}

/// A new tenant takes no zone until it writes: pods of new tenants created at once (none
/// started) are admitted only as far as the spare zones go, two each; once one of them
/// is gone, its zones are spare again.
#[test]
fn new_tenants_created_at_once_are_admitted_only_as_far_as_the_spare_zones_go() {
    let agent = start_agent(12);
    let mut held = Vec::new();
    let refusal = loop {
        let n = held.len();
        assert!(n < 6, "{n} new tenants admitted at once on a 12-zone store");
        let tenant = format!("z{n}");
        let (pod, answer) = create_on(
            &agent,
            &format!("pz{n}"),
            &[("valet.io/tenant", &tenant)],
            &["w", "/data", "1", "430"],
        );
        match answer {
            FromAgent::Created => held.push(pod),
            FromAgent::Failed { message } => break message,
            other => panic!("{tenant}: {other:?}"),
        }
    };
    assert!(!held.is_empty(), "{refusal}");
    assert!(refusal.contains("no room for another tenant"), "{refusal}");
    // One shim hangs up before its start: its tenant's zones are spare again.
    drop(held.pop());
    let start = Instant::now();
    loop {
        let (pod, answer) = create_on(
            &agent,
            "late",
            &[("valet.io/tenant", "zlate")],
            &["w", "/data", "1", "430"],
        );
        if answer == FromAgent::Created {
            held.push(pod);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still refused: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A guest's trap is told on the container's stderr, the last line before it ends (the
/// stderr then reaches its end), and the pod exits with 134.
#[test]
fn a_trapping_guest_says_so_on_its_stderr_and_exits_134() {
    let f = fixture();
    let module = wat::parse_str(r#"(module (func (export "_start") unreachable))"#).unwrap();
    std::fs::write(f.rootfs.join("trap.wasm"), module).unwrap();
    let conn = UnixStream::connect(&f.socket).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let rootfs = File::open(&f.rootfs).unwrap();
    let (err_r, err_w) = pipe();
    let request = ToAgent::Create(Create {
        id: "trap".into(),
        module: "/trap.wasm".into(),
        args: vec!["/trap.wasm".into()],
        env: vec![],
        annotations: [("valet.io/tenant".to_string(), "ntrap".to_string())].into(),
        stdio: [false, false, true],
        content_store: false,
        module_fd: false,
        memory_limit: None,
        pids_limit: None,
        cpu_limit: None,
    });
    let stdio = [None, None, Some(err_w)];
    proto::send(&conn, &request, &node::create_fds(&rootfs, &stdio)).unwrap();
    drop(stdio);
    let stderr = reader(err_r);
    let (answer, _) = proto::recv::<FromAgent>(&conn).unwrap().unwrap();
    assert_eq!(answer, FromAgent::Created);
    proto::send(&conn, &ToAgent::Start, &[]).unwrap();
    let (m, _) = proto::recv::<FromAgent>(&conn).unwrap().unwrap();
    assert_eq!(m, FromAgent::Started);
    let (m, _) = proto::recv::<FromAgent>(&conn).unwrap().unwrap();
    assert_eq!(m, FromAgent::Exited { code: 134 });
    let err = stderr.join().unwrap();
    assert!(err.starts_with("valet: guest trapped: "), "{err}");
    assert!(err.contains("unreachable"), "{err}");
    drop(conn);
}
