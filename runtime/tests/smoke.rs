//! valet-run end to end: a real guest on a fresh device, exit codes, one-line errors.

use std::process::Command;

fn valet_run() -> Command {
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
}

#[test]
fn guest_round_trips_a_file_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = valet_run()
        .args(["--device"])
        .arg(dir.path())
        .args(["--zone-size", "16", "--zones", "16", "--stats"])
        .arg(valet_guests::HELLO_STORE)
        .arg("/data")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("hello, zones"), "{stdout}");
    assert!(stdout.contains("hello.txt"), "{stdout}");
    assert!(stderr.contains("WAF"), "stats summary on stderr: {stderr}");
    assert!(dir.path().join("zones.img").exists());
}

#[test]
fn our_failures_are_one_line_and_exit_125() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("bad.wasm");
    std::fs::write(&garbage, b"not wasm at all").unwrap();
    for app in [garbage.as_path(), std::path::Path::new("/no/such.wasm")] {
        let out = valet_run()
            .arg("--device")
            .arg(dir.path().join("dev"))
            .arg(app)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("valet-run: error: "), "{stderr}");
    }
}

#[test]
fn policy_given_as_a_missing_wasm_file_finds_the_builtin() {
    let dir = tempfile::tempdir().unwrap();
    let run = |policy: &str| {
        valet_run()
            .current_dir(dir.path())
            .arg("--device")
            .arg(dir.path().join("dev"))
            .args(["--zone-size", "16", "--zones", "16", "--policy", policy])
            .arg(valet_guests::HELLO_STORE)
            .arg("/data")
            .output()
            .unwrap()
    };
    // `rocks.wasm` does not exist here: the built-in rocks runs.
    let out = run("rocks.wasm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A name no built-in has stays an error that names the file.
    let out = run("nosuch.wasm");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("nosuch.wasm"), "{stderr}");
}
