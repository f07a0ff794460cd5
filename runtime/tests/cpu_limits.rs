//! `valet-run --cpus`: a guest held to its CPU limit, the store's work for it counted.
//! These tests measure CPU time against wall time, so they run one at a time in a binary
//! of their own. Beside the other end-to-end tests' spinning guests, the one counting the
//! store's work failed in CI once (2026-12-07: 0.687 s of CPU in 0.647 s under a quarter
//! of a core; not reproduced in 45 runs here). Beside three spinning processes it failed
//! 3 times in 25 another way: the store's writer got no core, the guest wrote every buffer
//! itself, and the store had no work of its own to count.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

fn valet_run() -> Command {
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
}

/// Held by each test while it runs: they measure CPU time, and must not share the cores.
fn alone() -> MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// `--cpus` holds a guest that spins for 0.6 s of wall time under a tenth of a core to
/// about 60 ms of CPU (a guest without a limit would use most of the 0.6 s); a number
/// that is no CPU limit is our one-line error.
#[test]
fn cpus_bounds_the_cpu_time_a_guest_uses() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let out = valet_run()
        .arg("--device")
        .arg(dir.path())
        .args(["--zone-size", "16", "--zones", "16", "--cpus", "0.1"])
        .args(["--env", "POD_SPIN_MS=600"])
        .arg(valet_guests::POD_WRITER)
        .args(["w", "/data", "1", "430"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let cpu: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cpu line: {stdout}"));
    assert!(cpu <= 200, "{cpu} ms of CPU in 0.6 s under 0.1 cores");
    // A guest paused for its limit still stops at once when it must.
    let started = std::time::Instant::now();
    let out = valet_run()
        .arg("--device")
        .arg(dir.path())
        .args(["--cpus", "0.01", "--timeout", "500ms"])
        .args(["--env", "POD_SPIN_MS=60000"])
        .arg(valet_guests::POD_WRITER)
        .args(["w", "/data", "1", "430"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(124),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let out = valet_run()
        .arg("--device")
        .arg(dir.path())
        .args(["--cpus", "0"])
        .arg(valet_guests::POD_WRITER)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--cpus"), "{stderr}");
}

/// `--cpus` counts what the store's threads do for the guest too: a guest writing 512 MiB
/// as fast as it can under a quarter of a core keeps `valet-run` near a quarter of a core,
/// where the background writer's copies of its buffers used to run uncounted (about one
/// whole core busy, measured). The bound leaves room for start-up and the exit's sync.
#[test]
fn cpus_counts_the_stores_work_for_the_guest() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    // Reaped by `wait4` below, which gives its resource usage (std's `wait` does not).
    #[allow(clippy::zombie_processes)]
    let child = valet_run()
        .arg("--device")
        .arg(dir.path())
        .args([
            "--zone-size",
            "16",
            "--zones",
            "16",
            "--cpus",
            "0.25",
            "--stats",
        ])
        .arg(valet_guests::WRITE_BENCH)
        .args(["write", "1048576", "512", "/data"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid to overwrite; the pid is our own child's.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(waited, child.id() as libc::pid_t);
    let wall = started.elapsed().as_secs_f64();
    let stderr = std::io::read_to_string(child.stderr.unwrap()).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{stderr}"
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = secs(usage.ru_utime) + secs(usage.ru_stime);
    assert!(
        cpu / wall < 0.6,
        "{cpu:.3} s of CPU in {wall:.3} s under 0.25 cores\n{stderr}"
    );
    assert!(
        stderr.contains("default: the store's threads used"),
        "{stderr}"
    );
    // The stats say what the limit charged and how long the guest paused for it (the
    // failure above, should it come again, shows whether the limiter acted at all).
    let paused: f64 = stderr
        .lines()
        .find_map(|l| l.split(" and paused ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("no charge line: {stderr}"));
    assert!(paused > 0.0, "never paused under 0.25 cores\n{stderr}");
}
