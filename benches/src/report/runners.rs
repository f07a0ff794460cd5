//! Running one guest under each configuration the report compares, each run in its own
//! process on fresh data: (a) `valet-run` with the matching policy, (b) `valet-run` with
//! `one-stream`, (c) stock wasmtime WASI over a host directory (this executable re-run
//! with [`STOCK_SUBCOMMAND`]), (d) the guest compiled natively on a host directory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use valet_vfs::Stats;

use super::workloads::{Workload, ZONE_MIB};

/// The hidden subcommand that runs one guest under stock WASI: `__stock WASM HOST_DIR ARGS`.
pub const STOCK_SUBCOMMAND: &str = "__stock";

/// Where the guest sees its data under (a), (b) and (c).
pub const MOUNT: &str = "/data";

/// One of the compared configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// (a) valet-run, store, the workload's matching policy.
    Placed,
    /// (b) valet-run, store, every file in one stream.
    OneStream,
    /// (c) stock wasmtime WASI over a host directory.
    Stock,
    /// (d) the guest compiled for the host, on a host directory.
    Native,
}

impl Config {
    pub const ALL: [Config; 4] = [
        Config::Placed,
        Config::OneStream,
        Config::Stock,
        Config::Native,
    ];

    /// Column header.
    pub fn label(self) -> &'static str {
        match self {
            Config::Placed => "(a) valet + policy",
            Config::OneStream => "(b) valet + one stream",
            Config::Stock => "(c) stock wasmtime",
            Config::Native => "(d) native",
        }
    }

    /// Short name for plot legends.
    pub fn short(self) -> &'static str {
        match self {
            Config::Placed => "valet+policy",
            Config::OneStream => "valet one-stream",
            Config::Stock => "stock wasmtime",
            Config::Native => "native",
        }
    }
}

/// How one run ended. Its data directory lives as long as this value.
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
    /// CPU time (user and system) of the run's process and all its threads; `None` when it
    /// was killed for its time limit.
    pub cpu: Option<Duration>,
    /// The process's peak resident memory in bytes (guest memory it touched, the engine,
    /// and under `valet-run` the store's buffers; see [`PeakWatch`]); `None` when it was
    /// killed for its time limit or ended before it was first sampled.
    pub peak_rss: Option<u64>,
    /// The store's accounting (valet-run only).
    pub stats: Option<Stats>,
    /// The store's device directory (valet-run only).
    pub device: Option<PathBuf>,
    _dir: TempDir,
}

impl Outcome {
    /// The exit code and the telling line of stderr (a panic's message, our own error
    /// line, or the last line), for a failure note.
    pub fn why(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        let line = lines
            .iter()
            .position(|l| l.contains("panicked at"))
            .map(|i| lines[i..(i + 2).min(lines.len())].join(" "))
            .or_else(|| {
                let own = lines
                    .iter()
                    .find(|l| l.contains("error") || l.contains(": "));
                own.map(|l| l.to_string())
            })
            .or_else(|| lines.last().map(|l| l.to_string()));
        let line = line.unwrap_or_else(|| "no message".into());
        format!("exit {}: {}", self.code, line.trim())
    }
}

/// What every run needs: the binaries and a scratch directory on the disk under test.
pub struct Runner {
    pub valet_run: PathBuf,
    pub self_exe: PathBuf,
    pub work: PathBuf,
    pub timeout: Duration,
}

impl Runner {
    /// Runs `workload` under `config`; `Err` when the configuration does not apply (no
    /// native build) or the run could not start.
    pub fn run(&self, config: Config, w: &Workload, zones: u32) -> Result<Outcome, String> {
        let wasm = valet_guests::wasm(w.guest).ok_or("guest not built")?;
        match config {
            Config::Placed | Config::OneStream => {
                let policy = if config == Config::Placed {
                    w.policy
                } else {
                    "one-stream"
                };
                self.guest(wasm, policy, w.args_for(MOUNT), zones)
            }
            Config::Stock => self.stock(wasm, &w.args_for(MOUNT)),
            Config::Native => {
                let exe = valet_guests::native(w.guest).ok_or("no native build")?;
                let dir = self.scratch()?;
                let data = dir.path().join("data");
                std::fs::create_dir(&data).map_err(|e| e.to_string())?;
                let mut cmd = Command::new(exe);
                cmd.args(w.args_for(&data.to_string_lossy()))
                    .current_dir(&data);
                self.spawn(cmd, dir, None)
            }
        }
    }

    /// Runs guest `wasm` with `args` under stock WASI, a fresh host directory at [`MOUNT`].
    pub fn stock(&self, wasm: &str, args: &[String]) -> Result<Outcome, String> {
        let dir = self.scratch()?;
        std::fs::create_dir(dir.path().join("data")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.self_exe);
        cmd.arg(STOCK_SUBCOMMAND)
            .arg(wasm)
            .arg(dir.path().join("data"))
            .args(args);
        self.spawn(cmd, dir, None)
    }

    /// Runs guest `wasm` with `args` under `valet-run --policy policy`.
    pub fn guest(
        &self,
        wasm: &str,
        policy: &str,
        args: Vec<String>,
        zones: u32,
    ) -> Result<Outcome, String> {
        let mut all = vec!["--policy".to_string(), policy.to_string(), wasm.into()];
        all.push("--".into());
        all.extend(args);
        self.valet(&all, zones)
    }

    /// Runs `valet-run` with `args` on a fresh device of `zones` zones, with stats.
    pub fn valet(&self, args: &[String], zones: u32) -> Result<Outcome, String> {
        let dir = self.scratch()?;
        let device = dir.path().join("device");
        let mut cmd = Command::new(&self.valet_run);
        cmd.arg("--device")
            .arg(&device)
            .args(["--zone-size", &ZONE_MIB.to_string()])
            .args(["--zones", &zones.to_string()])
            .arg("--stats-json")
            .arg(dir.path().join("stats.json"))
            .args(args);
        self.spawn(cmd, dir, Some(device))
    }

    fn scratch(&self) -> Result<TempDir, String> {
        tempfile::Builder::new()
            .prefix("run-")
            .tempdir_in(&self.work)
            .map_err(|e| format!("scratch directory in {}: {e}", self.work.display()))
    }

    /// Runs `cmd` with its output in files of `dir`, killing it after the timeout.
    fn spawn(
        &self,
        mut cmd: Command,
        dir: TempDir,
        device: Option<PathBuf>,
    ) -> Result<Outcome, String> {
        let out_path = dir.path().join("stdout");
        let err_path = dir.path().join("stderr");
        let file = |p: &Path| File::create(p).map_err(|e| e.to_string());
        cmd.stdin(Stdio::null())
            .stdout(file(&out_path)?)
            .stderr(file(&err_path)?);
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(|e| format!("{cmd:?}: {e}"))?;
        let mut peak = PeakWatch::default();
        let ended = loop {
            peak.sample(child.id());
            if let Some(ended) = reap(&child)? {
                break Some(ended);
            }
            if start.elapsed() > self.timeout {
                // Our own child, by its id.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let wall = start.elapsed();
        let read =
            |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
        let mut stderr = read(&err_path);
        let code = match ended {
            Some(Ended { code, .. }) => code,
            None => {
                stderr.push_str(&format!("killed after {} s\n", self.timeout.as_secs()));
                -1
            }
        };
        let stats = std::fs::read_to_string(dir.path().join("stats.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        Ok(Outcome {
            code,
            stdout: read(&out_path),
            stderr,
            wall,
            cpu: ended.map(|e| e.cpu),
            peak_rss: ended.and(peak.peak()),
            stats,
            device,
            _dir: dir,
        })
    }
}

/// How a child process ended, with the CPU time it used.
#[derive(Clone, Copy)]
pub(super) struct Ended {
    /// The exit code, -1 for a signal.
    pub code: i32,
    pub cpu: Duration,
}

/// The peak resident memory of a running child, from its `VmHWM` (the high-water mark of
/// the address space it exec'd into), sampled as it runs: the rusage `wait4` gives has a
/// `ru_maxrss` too, but Linux carries into it the resident size of the process the child
/// was forked from (this report, tens of MiB) at its exec.
#[derive(Default)]
pub(super) struct PeakWatch(Option<u64>);

impl PeakWatch {
    /// Takes the child's high-water mark now (nothing once it has ended).
    pub fn sample(&mut self, pid: u32) {
        if let Some(bytes) = vm_hwm(pid) {
            self.0 = Some(self.0.map_or(bytes, |p| p.max(bytes)));
        }
    }

    /// The highest mark sampled.
    pub fn peak(&self) -> Option<u64> {
        self.0
    }
}

/// The `VmHWM` of process `pid` in bytes.
pub fn vm_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// How `child` ended, if it has, reaped with `wait4` for its resource usage
/// (`Child::try_wait` gives no rusage).
pub(super) fn reap(child: &std::process::Child) -> Result<Option<Ended>, String> {
    let mut status = 0;
    // SAFETY: all-zero is a valid rusage; wait4 fills it for our own child's id.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: a non-blocking wait for our own child, with pointers to locals.
    let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    match got {
        0 => Ok(None),
        p if p == pid => {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            };
            let time = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            Ok(Some(Ended {
                code,
                cpu: time(usage.ru_utime) + time(usage.ru_stime),
            }))
        }
        _ => Err(format!("wait4: {}", std::io::Error::last_os_error())),
    }
}

/// `valet-run` next to this executable, brought up to date with cargo first.
pub fn find_valet_run(self_exe: &Path) -> Result<PathBuf, String> {
    let path = self_exe.with_file_name("valet-run");
    let usable = |p: &Path| {
        Command::new(p)
            .args(["policy", "check", "one-stream"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    // Always through cargo (a no-op when it is up to date): a valet-run older than the
    // sources would put stale figures beside fresh ones.
    eprintln!(
        "report: building valet-run (cargo build --release -p valet-runtime --bin valet-run)"
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Into the target directory this executable is in (`target/release/..`).
    let mut build = Command::new(cargo);
    build.args([
        "build",
        "--release",
        "-p",
        "valet-runtime",
        "--bin",
        "valet-run",
    ]);
    if let Some(target) = self_exe.parent().and_then(Path::parent) {
        build.arg("--target-dir").arg(target);
    }
    let status = build.status().map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() || !usable(&path) {
        return Err(format!("no usable valet-run at {}", path.display()));
    }
    Ok(path)
}

/// The hidden subcommand: runs `wasm` under stock WASI with `host_dir` at [`MOUNT`], prints
/// its output and returns its exit code.
pub fn stock_main(args: &[String]) -> i32 {
    let [wasm, host_dir, rest @ ..] = args else {
        eprintln!("usage: report {STOCK_SUBCOMMAND} WASM HOST_DIR [ARGS...]");
        return 2;
    };
    let name = Path::new(wasm)
        .file_stem()
        .map_or("guest".into(), |s| s.to_string_lossy().into_owned());
    let mut argv: Vec<&str> = vec![&name];
    argv.extend(rest.iter().map(String::as_str));
    let out = crate::stock::run(wasm, &argv, &[(Path::new(host_dir), MOUNT)]);
    print!("{}", out.stdout);
    eprint!("{}", out.stderr);
    out.code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_peak_is_its_own_not_the_forking_processs() {
        // This test process holds 64 MiB more than the child will.
        let held = vec![1u8; 64 << 20];
        let mut child = Command::new("sleep").arg("0.2").spawn().unwrap();
        let mut peak = PeakWatch::default();
        while reap(&child).unwrap().is_none() {
            peak.sample(child.id());
            std::thread::sleep(Duration::from_millis(20));
        }
        let own = vm_hwm(std::process::id()).unwrap();
        let childs = peak.peak().expect("sampled while it ran");
        assert!(own >= 64 << 20, "{own}");
        assert!(childs < 16 << 20, "sleep's peak: {childs} bytes");
        drop(std::hint::black_box(held));
        let _ = child.wait();
    }
}
