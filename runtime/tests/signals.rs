//! Termination signals: a guest stopped by SIGTERM, SIGINT or SIGHUP keeps every byte it
//! wrote, synced or not, as a native program keeps them in the page cache, and `valet-run`
//! ends by that same signal. The guest writes three files it never syncs or closes, then
//! either waits in a WASI call or computes without ever making one; with `--tenants`, one
//! tenant waits and another appends records nonstop.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use valet_guests::content::{record, unsynced_file, RECORD_LEN};
use valet_runtime::device::DeviceSpec;
use valet_vfs::device::Geometry;
use valet_vfs::OpenOptions;

/// `valet-run` on a small device at `dev`, its stdio piped.
fn valet_run(dev: &std::path::Path) -> Command {
    let mut run = Command::new(env!("CARGO_BIN_EXE_valet-run"));
    run.arg("--device")
        .arg(dev)
        .args(["--zone-size", "16", "--zones", "24"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run
}

/// Starts `run` and waits until `guests` guests have said they have written.
fn started(mut run: Command, guests: usize) -> std::process::Child {
    let mut child = run.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..guests {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "written\n", "a guest did not get to write");
    }
    // The pipe stays open: a guest writing to it later must not meet a closed one.
    child.stdout = Some(stdout.into_inner());
    child
}

/// Runs the guest in `mode`, sends `signal` once it has written, and checks how
/// `valet-run` ended and what the store holds.
fn stopped_by(signal: i32, mode: &str) {
    stopped_after(signal, mode, &[], Duration::ZERO);
}

/// `stopped_by`, with `options` for valet-run and `pause` between the guest's last write
/// and the signal.
fn stopped_after(signal: i32, mode: &str, options: &[&str], pause: Duration) {
    let dev = tempfile::tempdir().unwrap();
    let mut run = valet_run(dev.path());
    run.args(options)
        .arg(valet_guests::WRITE_THEN_WAIT)
        .args(["--", "/data", mode]);
    let child = started(run, 1);
    std::thread::sleep(pause);
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
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{report:?}");
    let (_, _, root) = store.tenants().into_iter().next().unwrap();
    check_unsynced_files(&store, root);
}

/// The three files write_then_wait wrote, whole.
fn check_unsynced_files(store: &valet_vfs::Store, root: valet_vfs::Ino) {
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

/// SIGKILL cannot be caught, but the periodic writeback made what the guest wrote durable
/// well before it (twenty intervals): nothing of it is lost. With `--writeback off
/// --handoff off` the three files are gone after the same kill (the store before the
/// writeback).
#[test]
fn sigkill_after_a_writeback_interval_loses_nothing_the_guest_wrote() {
    stopped_after(
        libc::SIGKILL,
        "wait",
        &["--writeback", "100ms", "--handoff", "off"],
        Duration::from_secs(2),
    );
}

/// The same with hand-offs alone (written and journaled, never flushed): the host's page
/// cache keeps what they wrote, so a SIGKILL after one loses nothing either.
#[test]
fn sigkill_after_a_handoff_loses_nothing_the_guest_wrote() {
    stopped_after(
        libc::SIGKILL,
        "wait",
        &["--writeback", "off", "--handoff", "100ms"],
        Duration::from_secs(2),
    );
}

/// With `--tenants`, the signal stops every tenant before the store is unmounted: one
/// waiting in a WASI call, one appending records without pause. Each keeps what it
/// wrote, and the appender's file is whole records in order (no write refused or cut
/// short by the unmount).
#[test]
fn sigterm_stops_every_tenant_and_keeps_what_each_wrote() {
    let dev = tempfile::tempdir().unwrap();
    let tenants = dev.path().join("tenants.toml");
    let app = valet_guests::WRITE_THEN_WAIT;
    std::fs::write(
        &tenants,
        format!(
            "[[tenant]]\nname = \"waits\"\napp = {app:?}\nargs = [\"/data\", \"wait\"]\n\n\
             [[tenant]]\nname = \"appends\"\napp = {app:?}\nargs = [\"/data\", \"append\"]\n"
        ),
    )
    .unwrap();
    let mut run = valet_run(&dev.path().join("store"));
    run.arg("--tenants").arg(&tenants);
    let child = started(run, 2);
    // Let the appender get well into its records.
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: a plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGTERM),
        "{:?}: {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "{stderr}");

    let store = DeviceSpec::image(dev.path().join("store"), Geometry::EMBEDDED_DEFAULT)
        .mount_read_only()
        .unwrap();
    let roots: std::collections::BTreeMap<String, valet_vfs::Ino> = store
        .tenants()
        .into_iter()
        .map(|(_, name, root)| (name, root))
        .collect();
    check_unsynced_files(&store, roots["waits"]);
    check_unsynced_files(&store, roots["appends"]);
    let f = store
        .open_file(roots["appends"], "records.dat", OpenOptions::read())
        .unwrap();
    let len = f.metadata().unwrap().size as usize;
    let mut got = vec![0u8; len];
    assert_eq!(f.read_at(&mut got, 0).unwrap(), len);
    assert!(len >= RECORD_LEN, "no record kept");
    assert_eq!(len % RECORD_LEN, 0, "a record cut short: {len} bytes");
    for (n, chunk) in got.chunks(RECORD_LEN).enumerate() {
        assert!(
            chunk == record(n as u64),
            "record {n} of {}",
            len / RECORD_LEN
        );
    }
}
