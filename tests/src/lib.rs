//! Helpers for the end-to-end tests in `tests/`: running a guest under the real `valet-run`
//! binary on a fresh emulated device.

pub mod vm;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The `valet-run` binary of this build profile, built on first use if this test binary was
/// built without it (as with `cargo test -p valet-tests`).
pub fn valet_run_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // target/<profile>/deps/<test binary> -> target/<profile>/valet-run
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>");
        let path = profile_dir.join("valet-run");
        if !path.exists() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut command = Command::new(cargo);
            command.args(["build", "-p", "valet-runtime", "--bin", "valet-run"]);
            if profile_dir.file_name().is_some_and(|p| p == "release") {
                command.arg("--release");
            }
            let status = command.status().expect("running cargo to build valet-run");
            assert!(status.success(), "building valet-run failed");
        }
        path
    })
}

/// `valet-run --device DEVICE` with a small geometry suited to tests (64 zones of 64 MiB),
/// ready for more options, the module and `--` guest arguments.
pub fn valet_run(device: &Path) -> Command {
    let mut command = Command::new(valet_run_path());
    command
        .arg("--device")
        .arg(device)
        .args(["--zone-size", "64", "--zones", "64"]);
    command
}

/// Runs `wasm` with `args` on `device` with the store at `/data`, and fails the test with
/// the guest's output unless it exits 0. Returns stdout.
pub fn run_ok(device: &Path, wasm: &str, extra: &[&str], args: &[&str]) -> String {
    let out = valet_run(device)
        .args(extra)
        .arg(wasm)
        .arg("--")
        .args(args)
        .output()
        .expect("starting valet-run");
    check(&out, wasm)
}

/// The stdout of a finished run, or a test failure showing everything it printed.
pub fn check(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed with {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}
