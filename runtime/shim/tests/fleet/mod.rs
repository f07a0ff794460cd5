//! What the containerd tests share: a containerd of their own (root, state and sockets in a
//! temporary directory), the node agent (`valet-run node`), image tars, and `ctr`.
//! Everything started here is stopped when its handle drops. The comparison report's fleet
//! section (`benches/src/report/fleet.rs`) includes this module too, with its own binaries.

#![allow(dead_code)]

pub mod oci;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The containerd namespace the tests use.
pub const NS: &str = "valet-test";
/// The runtime name `ctr run --runtime` takes for our shim.
pub const RUNTIME: &str = "io.containerd.valet.v1";

/// Whether containerd tests can run here: root, and containerd and ctr installed. When they
/// cannot, says why and returns false, or fails when `VALET_REQUIRE_FLEET=1` (CI).
pub fn available() -> bool {
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("not root")
    } else if !on_path("containerd") || !on_path("ctr") {
        Some("containerd or ctr is not installed (bash .ci/setup-fleet)")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var_os("VALET_REQUIRE_FLEET").is_some_and(|v| v == "1") => {
            panic!("VALET_REQUIRE_FLEET=1 but the containerd tests cannot run: {why}")
        }
        Some(why) => {
            eprintln!("skipped: containerd tests: {why}");
            false
        }
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file()))
}

/// Polls `ready` every 20 ms until it holds or `limit` passes.
pub fn wait_for(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The node agent, a child process.
pub struct Agent {
    child: Child,
    pub device: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Agent {
    /// Starts `valet-run node` on `device` (a small test geometry, made on first use).
    pub fn start(device: &Path, socket: &Path) -> Agent {
        Agent::start_with(valet_tests::valet_run_path(), device, socket, &[])
    }

    /// Starts the agent of the `valet-run` at `valet_run`, with `extra` options.
    pub fn start_with(valet_run: &Path, device: &Path, socket: &Path, extra: &[&str]) -> Agent {
        let log = device.with_extension("agent.log");
        // Each agent its own wasmtime disk cache (under the user's cache directory), so a
        // fresh agent is a fresh node: what it does not compile comes from containerd.
        let cache = device.with_extension("cache");
        let child = Command::new(valet_run)
            .env("XDG_CACHE_HOME", &cache)
            .args(["node", "--device"])
            .arg(device)
            .args(["--zone-size", "64", "--zones", "64", "--socket"])
            .arg(socket)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting valet-run node");
        let mut agent = Agent {
            child,
            device: device.to_path_buf(),
            socket: socket.to_path_buf(),
            log,
        };
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Ok(Some(status)) = agent.child.try_wait() {
                panic!("the agent exited ({status}): {}", agent.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the agent did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash.
    pub fn kill(mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// A containerd of the test's own.
pub struct Containerd {
    child: Child,
    pub dir: tempfile::TempDir,
    pub address: PathBuf,
    /// The `ctr` of the same containerd.
    ctr: PathBuf,
}

impl Containerd {
    /// Starts containerd with the shim on its PATH, `VALET_NODE_SOCKET` pointing at
    /// `agent_socket`, and `extra` appended to its config (the CRI plugin's settings; the
    /// plugin is disabled when `extra` is empty).
    pub fn start(agent_socket: &Path, extra: &str) -> Containerd {
        // Set for the shim's tests; the report (which includes this module) passes its own.
        let Some(shim) = option_env!("CARGO_BIN_EXE_containerd-shim-valet-v1") else {
            panic!("no shim binary: use Containerd::start_with");
        };
        Containerd::start_with(Path::new(shim), agent_socket, extra)
    }

    /// As [`Containerd::start`], with the shim binary at `shim`.
    pub fn start_with(shim: &Path, agent_socket: &Path, extra: &str) -> Containerd {
        Containerd::start_from(None, shim, agent_socket, extra)
    }

    /// As [`Containerd::start_with`], with `containerd` and `ctr` from directory `tools`
    /// (another version than the installed one) when given.
    pub fn start_from(
        tools: Option<&Path>,
        shim: &Path,
        agent_socket: &Path,
        extra: &str,
    ) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("valet-ctrd")
            .tempdir_in("/tmp")
            .unwrap();
        let d = dir.path();
        let bin = d.join("bin");
        std::fs::create_dir(&bin).unwrap();
        symlink(shim, bin.join("containerd-shim-valet-v1")).unwrap();
        let address = d.join("c.sock");
        let disabled = if extra.is_empty() {
            r#"disabled_plugins = ["io.containerd.grpc.v1.cri"]"#
        } else {
            ""
        };
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
{disabled}
[grpc]
  address = "{address}"
[ttrpc]
  address = "{address}.ttrpc"
[debug]
  level = "info"
{extra}
"#,
            root = d.join("root").display(),
            state = d.join("state").display(),
            address = address.display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let tool = |name: &str| tools.map_or_else(|| PathBuf::from(name), |t| t.join(name));
        let child = Command::new(tool("containerd"))
            .arg("--config")
            .arg(d.join("config.toml"))
            .env("PATH", path)
            .env("VALET_NODE_SOCKET", agent_socket)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("containerd.log")).unwrap())
            .spawn()
            .expect("starting containerd");
        let c = Containerd {
            child,
            dir,
            address,
            ctr: tool("ctr"),
        };
        wait_for(Duration::from_secs(60), "containerd's socket", || {
            c.ctr(&["version"]).status.success()
        });
        c
    }

    /// `ctr -a SOCKET -n NS ARGS...`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_command(args).output().expect("running ctr")
    }

    pub fn ctr_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("-a").arg(&self.address).args(["-n", NS]).args(args);
        c
    }

    /// `ctr ARGS`, failing the test with its output unless it succeeds.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(
            out.status.success(),
            "ctr {args:?}: {}\n{}\ncontainerd log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Imports an image tar.
    pub fn import(&self, tar: &[u8]) {
        self.import_into(NS, tar);
    }

    /// Imports an image tar into containerd namespace `ns` (`k8s.io` for the CRI plugin).
    pub fn import_into(&self, ns: &str, tar: &[u8]) {
        let path = self.dir.path().join("image.tar");
        std::fs::write(&path, tar).unwrap();
        let out = Command::new(&self.ctr)
            .arg("-a")
            .arg(&self.address)
            .args(["-n", ns, "images", "import", "--all-platforms"])
            .arg(&path)
            .output()
            .expect("running ctr");
        assert!(
            out.status.success(),
            "ctr images import: {}\ncontainerd log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
    }

    /// The shims this containerd started (their command line names its address).
    pub fn shims(&self) -> Vec<i32> {
        let want = self.address.to_string_lossy().into_owned();
        let mut pids = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&cmd);
            if cmd.contains("containerd-shim-valet-v1") && cmd.contains(&want) {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Tasks first (their shims exit once their containers are gone), then containerd,
        // then any shim left (SIGKILL by pid), then the mounts under our root. The CRI
        // plugin's containers live in namespace k8s.io.
        for ns in [NS, "k8s.io"] {
            let ctr = |args: &[&str]| {
                Command::new(&self.ctr)
                    .arg("-a")
                    .arg(&self.address)
                    .args(["-n", ns])
                    .args(args)
                    .output()
                    .expect("running ctr")
            };
            let tasks = ctr(&["tasks", "ls", "-q"]);
            for id in String::from_utf8_lossy(&tasks.stdout).lines() {
                ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
                ctr(&["tasks", "rm", "-f", id]);
            }
            let containers = ctr(&["containers", "ls", "-q"]);
            for id in String::from_utf8_lossy(&containers.stdout).lines() {
                ctr(&["containers", "rm", id]);
            }
        }
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(10) {
                self.child.kill().ok();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.wait().ok();
        for pid in self.shims() {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        unmount_under(self.dir.path());
    }
}

/// Unmounts whatever is still mounted under `dir` (rootfs mounts of killed tasks), deepest
/// first, so the temporary directory can be removed.
fn unmount_under(dir: &Path) {
    let Ok(file) = std::fs::File::open("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.to_string_lossy().into_owned();
    let mut points: Vec<String> = BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let c = std::ffi::CString::new(p).unwrap();
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
