//! `valet-run --tenants`: two guests writing at once on one device, each in its own tenant.
//! Neither sees the other's files, `..` from a root is EPERM, their zones are disjoint, and
//! the exit code and stats report every tenant.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use valet_runtime::device::DeviceSpec;
use valet_vfs::device::Geometry;
use valet_vfs::{FileKind, OpenOptions, Stats, Store};

fn valet_run() -> Command {
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
}

fn device(dir: &Path) -> DeviceSpec {
    DeviceSpec::image(dir, Geometry::EMBEDDED_DEFAULT)
}

/// Runs `--tenants toml` on a small device at `dev`.
fn run_tenants(dev: &Path, toml: &Path, extra: &[&str]) -> Output {
    valet_run()
        .arg("--device")
        .arg(dev)
        .args(["--zone-size", "16", "--zones", "16"])
        .arg("--tenants")
        .arg(toml)
        .args(extra)
        .output()
        .unwrap()
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// What tenant_writer writes (its `pattern` and `key`).
fn pattern(k: u64, j: u64) -> u8 {
    ((j.wrapping_mul(2654435761) >> 7) ^ k.wrapping_mul(0x9e37)) as u8
}

fn key(name: &str, i: u64) -> u64 {
    name.bytes()
        .fold(i, |h, b| h.wrapping_mul(131).wrapping_add(b as u64))
}

fn read_all(store: &Store, dir: u64, path: &str) -> Vec<u8> {
    let f = store.open_file(dir, path, OpenOptions::read()).unwrap();
    let mut data = vec![0u8; f.metadata().unwrap().size as usize];
    assert_eq!(f.read_at(&mut data, 0).unwrap(), data.len());
    data
}

const FILES: u64 = 6;
const SIZE: u64 = 150_000;

#[test]
fn two_tenants_write_at_once_and_never_meet() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    // One app path relative to the TOML file, one absolute.
    std::fs::copy(valet_guests::TENANT_WRITER, tmp.path().join("writer.wasm")).unwrap();
    let toml = tmp.path().join("tenants.toml");
    std::fs::write(
        &toml,
        format!(
            r#"
[[tenant]]
name = "alpha"
app = "writer.wasm"
args = ["alpha", "/data", "{FILES}", "{SIZE}"]

[[tenant]]
name = "beta"
app = {:?}
args = ["beta", "/store", "{FILES}", "{SIZE}"]
policy = "default"
mount = "/store"
env = {{ UNUSED = "1" }}
"#,
            valet_guests::TENANT_WRITER
        ),
    )
    .unwrap();
    let stats_json = tmp.path().join("stats.json");
    let out = run_tenants(&dev, &toml, &["--stats-json", stats_json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);

    // Each guest listed its root and saw only its own files; `..` was EPERM for both.
    for name in ["alpha", "beta"] {
        let own: Vec<String> = (0..FILES)
            .map(|i| format!("{name}-{i}.bin"))
            .chain([format!("{name}-dir")])
            .collect();
        let line = format!("{name}: entries: {}\n", own.join(" "));
        assert!(stdout.contains(&line), "{line:?} missing\n{}", show(&out));
        assert!(stdout.contains(&format!("{name}: ok\n")), "{}", show(&out));
        assert!(
            stdout.contains(&format!("{name}: readdir ..: PermissionDenied")),
            "{}",
            show(&out)
        );
    }

    // Per-tenant counters in the stats: every byte each guest wrote, nothing shared.
    let stats: Stats = serde_json::from_slice(&std::fs::read(&stats_json).unwrap()).unwrap();
    let written = FILES * SIZE + FILES * (FILES - 1) / 2 + SIZE;
    for name in ["alpha", "beta"] {
        let t = stats.tenants.iter().find(|t| t.name == name).unwrap();
        assert_eq!(t.host_bytes, written, "{name}: {t:?}");
    }

    // From the host side: each namespace holds exactly its tenant's files, intact.
    let store = device(&dev).mount_existing().unwrap();
    let tenants = store.tenants();
    let id_of = |name: &str| tenants.iter().find(|t| t.1 == name).unwrap().0;
    for (_, name, root) in &tenants {
        if name == "default" {
            continue;
        }
        let names: BTreeSet<String> = store
            .read_dir(*root)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names.len() as u64, FILES + 1, "{name}: {names:?}");
        assert!(
            names.iter().all(|n| n.starts_with(name.as_str())),
            "{names:?}"
        );
        for i in 0..FILES {
            let data = read_all(&store, *root, &format!("{name}-{i}.bin"));
            assert_eq!(data.len() as u64, SIZE + i);
            let k = key(name, i);
            assert!(data
                .iter()
                .enumerate()
                .all(|(j, &b)| b == pattern(k, j as u64)));
        }
        let nested = store.lookup(*root, &format!("{name}-dir")).unwrap();
        assert_eq!(store.metadata(nested).unwrap().kind, FileKind::Dir);
    }

    // Zones: each tenant owns some, no zone is owned by both, and fsck (which checks that
    // every extent lies in a zone of its own file's tenant) is clean.
    let owners = store.zone_owners();
    let zones =
        |t: u32| -> BTreeSet<u32> { owners.iter().filter(|o| o.1 == t).map(|o| o.0).collect() };
    let (a, b) = (zones(id_of("alpha")), zones(id_of("beta")));
    assert!(!a.is_empty() && !b.is_empty(), "{owners:?}");
    assert!(a.is_disjoint(&b), "alpha {a:?} and beta {b:?} share zones");
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{}", report.findings());
    assert_eq!(report.files, 2 * (FILES + 1));
}

#[test]
fn exit_code_is_the_first_failing_tenant_in_file_order() {
    let tmp = tempfile::tempdir().unwrap();
    let toml = tmp.path().join("t.toml");
    let app = valet_guests::TENANT_WRITER;
    // tenant_writer without its arguments exits 2 (usage); with them, 0.
    std::fs::write(
        &toml,
        format!(
            r#"
[[tenant]]
name = "good"
app = {app:?}
args = ["good", "/data", "1", "10"]
[[tenant]]
name = "bad"
app = {app:?}
[[tenant]]
name = "worse"
app = {app:?}
args = ["too", "few"]
"#
        ),
    )
    .unwrap();
    let out = run_tenants(&tmp.path().join("dev"), &toml, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("good: ok"));
}

#[test]
fn bad_tenant_files_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let app = valet_guests::TENANT_WRITER;
    let cases = [
        ("", "no [[tenant]] tables"),
        (
            &*format!("[[tenant]]\nname = \"x\"\napp = {app:?}\ncolour = 1\n"),
            "unknown field",
        ),
        (
            &*format!(
                "[[tenant]]\nname = \"x\"\napp = {app:?}\n[[tenant]]\nname = \"x\"\napp = {app:?}\n"
            ),
            "listed twice",
        ),
        (
            &*format!("[[tenant]]\nname = \"x\"\napp = {app:?}\npolicy = \"nope\"\n"),
            "no policy named nope",
        ),
        (
            "[[tenant]]\nname = \"x\"\napp = \"missing.wasm\"\n",
            "missing.wasm",
        ),
        (
            &*format!("[[tenant]]\nname = \"x\"\napp = {app:?}\nquota = \"12X\"\n"),
            "line 4, column 9 | 4 | quota = \"12X\" | ^^^^^ quota \"12X\": unknown unit",
        ),
        (
            &*format!("[[tenant]]\nname = \"x\"\napp = {app:?}\ncpus = 0\n"),
            "cpus: 0 cores: give a number of cores above 0",
        ),
    ];
    for (i, (text, what)) in cases.iter().enumerate() {
        let toml = tmp.path().join(format!("{i}.toml"));
        std::fs::write(&toml, text).unwrap();
        let out = run_tenants(&dev, &toml, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{}", show(&out));
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("valet-run: error: "), "{stderr}");
        assert!(stderr.contains(what), "expected {what:?}: {stderr}");
        // Refused before a store was made.
        assert!(!dev.exists(), "case {i} made a store");
    }
    // --tenants replaces APP and the per-guest options.
    let out = valet_run()
        .arg("--tenants")
        .arg(tmp.path().join("0.toml"))
        .args(["--mount", "/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

/// A tenant's `quota` (and `--quota` for the tenants without one): the tenant past it
/// gets ENOSPC, while the others write on.
#[test]
fn a_tenant_over_its_quota_gets_enospc_while_another_writes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let app = valet_guests::POD_WRITER;
    let toml = tmp.path().join("quota.toml");
    std::fs::write(
        &toml,
        format!(
            "[[tenant]]\nname = \"small\"\napp = {app:?}\nargs = [\"log\", \"/data\", \"1000\", \"430\"]\n\
             quota = \"32K\"\n\n\
             [[tenant]]\nname = \"roomy\"\napp = {app:?}\nargs = [\"log\", \"/data\", \"300\", \"430\"]\n\n\
             [[tenant]]\nname = \"default\"\napp = {app:?}\nargs = [\"log\", \"/data\", \"300\", \"430\"]\n\
             quota = \"1M\"\n"
        ),
    )
    .unwrap();
    // `--quota` holds for `roomy`, which sets none: 300 records fit in 256 KiB.
    let out = run_tenants(&dev, &toml, &["--quota", "256K"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // pod_writer exits 4 on ENOSPC; the first tenant in file order decides the code.
    assert_eq!(out.status.code(), Some(4), "{}", show(&out));
    assert_eq!(stdout.matches("ok 300").count(), 2, "{}", show(&out));
    assert_eq!(stdout.matches("enospc ").count(), 1, "{}", show(&out));

    let store = device(&dev).mount_read_only().unwrap();
    for (_, name, root) in store.tenants() {
        let size = store
            .open_file(root, "log.log", OpenOptions::read())
            .unwrap()
            .metadata()
            .unwrap()
            .size;
        match name.as_str() {
            "small" => assert!(size > 0 && size <= 32 << 10, "{size} bytes over 32 KiB"),
            _ => assert_eq!(size, 300 * 430, "tenant {name}"),
        }
    }

    // A --quota too small for `roomy` stops it too, and only it among the other two.
    let dev = tmp.path().join("dev2");
    let out = run_tenants(&dev, &toml, &["--quota", "64K"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{}", show(&out));
    assert_eq!(stdout.matches("ok 300").count(), 1, "{}", show(&out));
    assert_eq!(stdout.matches("enospc ").count(), 2, "{}", show(&out));
}

/// `--quota` of one guest: ENOSPC past it, and what it wrote before stays.
#[test]
fn quota_bounds_a_single_guest() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let out = valet_run()
        .arg("--device")
        .arg(&dev)
        .args(["--zone-size", "16", "--zones", "16", "--quota", "16K"])
        .arg(valet_guests::POD_WRITER)
        .args(["log", "/data", "1000", "430"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{}", show(&out));
    let acked = stdout.lines().filter(|l| l.starts_with("ack ")).count() as u64;
    assert!(
        stdout.contains(&format!("enospc {acked}")),
        "{}",
        show(&out)
    );
    assert!(acked > 0 && acked * 430 <= 16 << 10, "{acked} records");

    let store = device(&dev).mount_read_only().unwrap();
    let (_, _, root) = store.tenants().into_iter().next().unwrap();
    let log = read_all(&store, root, "log.log");
    assert_eq!(log.len() as u64, acked * 430);
    // A quota that is not a size is refused before anything runs.
    let out = valet_run()
        .arg("--device")
        .arg(tmp.path().join("dev2"))
        .args(["--quota", "lots"])
        .arg(valet_guests::POD_WRITER)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", show(&out));
    assert!(!tmp.path().join("dev2").exists());
}
