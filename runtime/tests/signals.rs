//! Termination signals: a guest stopped by SIGTERM, SIGINT or SIGHUP keeps every byte it
//! wrote, synced or not, as a native program keeps them in the page cache, and `valet-run`
//! ends by that same signal. The guest writes three files it never syncs or closes, then
//! either waits in a WASI call or computes without ever making one.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use valet_guests::content::unsynced_file;
use valet_runtime::device::DeviceSpec;
use valet_vfs::device::Geometry;
use valet_vfs::OpenOptions;

/// Runs the guest in `mode`, sends `signal` once it has written, and checks how
/// `valet-run` ended and what the store holds.
fn stopped_by(signal: i32, mode: &str) {
    let dev = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(dev.path())
        .args(["--zone-size", "16", "--zones", "24"])
        .arg(valet_guests::WRITE_THEN_WAIT)
        .args(["--", "/data", mode])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "written\n", "the guest did not get to write");
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(signal),
        "{:?}: {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "{stderr}");

    let store = DeviceSpec::image(dev.path(), Geometry::EMBEDDED_DEFAULT)
        .mount_read_only()
        .unwrap();
    let (_, _, root) = store.tenants().into_iter().next().unwrap();
    for i in 0..3 {
        let f = store
            .open_file(root, &format!("unsynced-{i}.dat"), OpenOptions::read())
            .unwrap_or_else(|e| panic!("unsynced-{i}.dat after the signal: {e}"));
        let want = unsynced_file(i);
        let mut got = vec![0u8; want.len() + 1];
        let n = f.read_at(&mut got, 0).unwrap();
        got.truncate(n);
        assert!(
            got == want,
            "unsynced-{i}.dat: {n} bytes, not what was written"
        );
    }
}

#[test]
fn sigterm_keeps_what_a_guest_waiting_in_a_wasi_call_wrote() {
    stopped_by(libc::SIGTERM, "wait");
}

#[test]
fn sigint_keeps_what_a_guest_that_never_calls_wasi_wrote() {
    stopped_by(libc::SIGINT, "spin");
}

#[test]
fn sighup_keeps_what_a_guest_wrote() {
    stopped_by(libc::SIGHUP, "wait");
}
