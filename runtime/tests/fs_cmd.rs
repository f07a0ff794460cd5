//! `valet-run fs`: a host tree goes into the store and comes back out byte for byte, `ls`
//! and `cat` show it, fsck is clean, and mistakes are one-line errors that create nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use valet_runtime::device::DeviceSpec;
use valet_vfs::device::{Geometry, IoMode};

fn valet_run() -> Command {
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
}

/// `valet-run fs ARGS... --device DEV`.
fn fs(dev: &Path, args: &[&str]) -> Output {
    valet_run()
        .arg("fs")
        .args(args)
        .arg("--device")
        .arg(dev)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Our one-line failure: exit 125, `valet-run: error: ...` containing `what`.
fn assert_error(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("valet-run: error: "), "{stderr}");
    assert!(stderr.contains(what), "expected {what:?} in {stderr}");
}

fn small_device(dir: &Path) -> DeviceSpec {
    let geometry = Geometry {
        zone_count: 16,
        zone_size: 16 << 20,
        zone_capacity: 12 << 20,
        ..Geometry::EMBEDDED_DEFAULT
    };
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

/// A formatted store with an empty `default` tenant, as a first `valet-run` leaves it (made
/// through the library: no guest needed).
fn new_store(dir: &Path) {
    let store = small_device(dir).mount().unwrap();
    store.tenant("default").unwrap();
    store.sync().unwrap();
}

/// Deterministic binary content, every byte value present.
fn bytes(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A host tree with nested and empty directories, empty, odd-sized, multi-buffer and
/// non-ASCII-named files, and `CURRENT` (which the default policy keeps conventional).
fn make_tree(root: &Path) {
    let files: [(&str, Vec<u8>); 7] = [
        ("top.txt", b"hello, zones\n".to_vec()),
        ("empty.bin", Vec::new()),
        ("big.bin", bytes(1_500_000, 1)),
        ("CURRENT", b"MANIFEST-000001\n".to_vec()),
        ("a/b/c/deep.bin", bytes(4097, 2)),
        ("a/b/odd name \u{fc}.dat", bytes(70_000, 3)),
        ("a/zero.bin", vec![0u8; 8192]),
    ];
    for (path, data) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
    std::fs::create_dir_all(root.join("a/empty_dir")).unwrap();
}

/// Every path under `root` with its contents (None for a directory).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if path.is_dir() {
                out.insert(rel, None);
                stack.push(path);
            } else {
                out.insert(rel, Some(std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

#[test]
fn a_tree_goes_in_and_comes_back_out_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let (dev, src, dst) = (
        tmp.path().join("dev"),
        tmp.path().join("src"),
        tmp.path().join("dst"),
    );
    new_store(&dev);
    make_tree(&src);

    let out = fs(&dev, &["import", src.to_str().unwrap(), "/imported/here"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("imported 7 files"),
        "{}",
        stdout(&out)
    );

    let out = fs(&dev, &["ls", "/imported/here"]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out),
        "-           16 CURRENT\n\
         d            0 a\n\
         -      1500000 big.bin\n\
         -            0 empty.bin\n\
         -           13 top.txt\n"
    );
    let out = fs(&dev, &["ls", "-R", "imported/here/a"]);
    assert_ok(&out);
    let listing = stdout(&out);
    for line in [
        "d            0 b\n",
        "d            0 empty_dir\n",
        "-         8192 zero.bin\n",
        "-        70000 b/odd name \u{fc}.dat\n",
        "d            0 b/c\n",
        "-         4097 b/c/deep.bin\n",
    ] {
        assert!(listing.contains(line), "{line:?} missing from\n{listing}");
    }
    let out = fs(&dev, &["ls", "/imported/here/a/b/c/deep.bin"]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out),
        "-         4097 /imported/here/a/b/c/deep.bin\n"
    );

    let out = fs(&dev, &["cat", "/imported/here/big.bin"]);
    assert_ok(&out);
    assert!(out.stdout == bytes(1_500_000, 1), "cat big.bin differs");
    let out = fs(&dev, &["cat", "imported/here/CURRENT"]);
    assert_ok(&out);
    assert_eq!(out.stdout, b"MANIFEST-000001\n");

    let out = fs(&dev, &["export", "/imported/here", dst.to_str().unwrap()]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("exported 7 files"),
        "{}",
        stdout(&out)
    );
    assert_eq!(snapshot(&src), snapshot(&dst), "the exported tree differs");

    // One file out, into a directory that does not exist yet.
    let one = tmp.path().join("one");
    assert_ok(&fs(
        &dev,
        &[
            "export",
            "/imported/here/a/b/c/deep.bin",
            one.to_str().unwrap(),
        ],
    ));
    assert_eq!(std::fs::read(one.join("deep.bin")).unwrap(), bytes(4097, 2));

    let out = fs(&dev, &["fsck"]);
    assert_ok(&out);
    let report = stdout(&out);
    assert!(report.contains("fsck: clean"), "{report}");
    assert!(report.contains("files"), "{report}");

    let out = fs(&dev, &["tenants"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("default"), "{}", stdout(&out));
}

/// A conventional file whose host file was deleted on the host: `fsck` names it and exits
/// 1, `cat` of it is a one-line error, and the store's other files still list, read and
/// export.
#[test]
fn a_lost_host_file_is_named_by_fsck_and_the_other_files_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    let store = small_device(&dev).mount().unwrap();
    let (_, root) = store.tenant("default").unwrap();
    let log = bytes(10_000, 1);
    for (name, data) in [("CURRENT", &b"MANIFEST-000002\n"[..]), ("000001.log", &log)] {
        let f = store
            .open_file(root, name, valet_vfs::OpenOptions::create())
            .unwrap();
        f.write_at(data, 0).unwrap();
        f.close().unwrap();
    }
    let ino = store.lookup(root, "CURRENT").unwrap();
    store.unmount().unwrap();
    let host_file = dev.join("conventional").join(ino.to_string());
    std::fs::remove_file(host_file).unwrap();

    let out = fs(&dev, &["fsck"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let damage = format!("damaged: conventional file {ino}: its host file is missing");
    assert!(stdout(&out).contains(&damage), "{}", stdout(&out));
    assert_error(&fs(&dev, &["cat", "/CURRENT"]), "its host file is missing");
    let out = fs(&dev, &["cat", "/000001.log"]);
    assert_ok(&out);
    assert_eq!(out.stdout, log);
    let out = fs(&dev, &["ls"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("CURRENT"), "{}", stdout(&out));
    // An export takes everything else out, names what it left, and exits 1.
    let to = dir.path().join("out");
    let out = fs(&dev, &["export", "/", to.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let left = "damaged, not exported: /CURRENT: corrupt store: conventional file";
    assert!(stdout(&out).contains(left), "{}", stdout(&out));
    assert_eq!(std::fs::read(to.join("000001.log")).unwrap(), log);
    assert!(!to.join("CURRENT").exists());
}

/// Looking changes nothing: every inspecting command leaves each byte and modification
/// time of the device's files as it was, and none runs while a writer has the store.
#[test]
fn inspecting_changes_nothing_and_is_refused_while_a_writer_has_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let (dev, src, dst) = (
        tmp.path().join("dev"),
        tmp.path().join("src"),
        tmp.path().join("dst"),
    );
    new_store(&dev);
    make_tree(&src);
    assert_ok(&fs(&dev, &["import", src.to_str().unwrap(), "/t"]));
    let files = || {
        let mut all: Vec<_> = snapshot(&dev).into_iter().collect();
        for (rel, _) in all.iter_mut() {
            let modified = std::fs::metadata(dev.join(&*rel))
                .unwrap()
                .modified()
                .unwrap();
            rel.push(format!("{modified:?}"));
        }
        all
    };
    let before = files();
    for args in [
        &["ls", "-R", "/"][..],
        &["cat", "/t/big.bin"],
        &["cat", "/t/CURRENT"],
        &["export", "/t", dst.to_str().unwrap()],
        &["fsck", "--deep"],
        &["tenants"],
        &["zones"],
    ] {
        assert_ok(&fs(&dev, args));
    }
    assert!(
        before == files(),
        "an inspecting command changed the device's files"
    );
    assert_eq!(snapshot(&src), snapshot(&dst), "the exported tree differs");

    let writer = small_device(&dev).mount().unwrap();
    assert_error(&fs(&dev, &["ls", "/"]), "in use by another process");
    drop(writer);
    assert_ok(&fs(&dev, &["ls", "/"]));
}

/// Every path under `root`, links as links: (kind, content or target).
fn snapshot_links(root: &Path) -> BTreeMap<PathBuf, (char, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let seen = if meta.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                ('l', target.into_os_string().into_encoded_bytes())
            } else if meta.is_dir() {
                stack.push(path);
                ('d', Vec::new())
            } else {
                ('-', std::fs::read(&path).unwrap())
            };
            out.insert(rel, seen);
        }
    }
    out
}

#[test]
fn symlinks_go_in_and_come_back_out_as_links() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let (dev, src, dst) = (
        tmp.path().join("dev"),
        tmp.path().join("src"),
        tmp.path().join("dst"),
    );
    new_store(&dev);
    std::fs::create_dir_all(src.join("d/e")).unwrap();
    std::fs::write(src.join("d/e/f.txt"), b"linked to\n").unwrap();
    symlink("d/e/f.txt", src.join("to-file")).unwrap();
    symlink("d", src.join("to-dir")).unwrap();
    symlink("../../nowhere", src.join("d/e/dangling")).unwrap();
    symlink("../f.txt", src.join("d/e/up")).unwrap();
    symlink("/etc/passwd", src.join("absolute")).unwrap();

    let out = fs(&dev, &["import", src.to_str().unwrap(), "/in"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("imported 1 files, 3 directories, 4 symlinks"),
        "{}",
        stdout(&out)
    );
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(
        warning.contains("skipping") && warning.contains("absolute"),
        "{warning}"
    );

    let out = fs(&dev, &["ls", "/in"]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out),
        "d            0 d\n\
         l            1 to-dir -> d\n\
         l            9 to-file -> d/e/f.txt\n"
    );
    let out = fs(&dev, &["ls", "/in/to-file"]);
    assert_eq!(stdout(&out), "l            9 /in/to-file -> d/e/f.txt\n");
    // Paths through links resolve in the store.
    let out = fs(&dev, &["cat", "/in/to-file"]);
    assert_eq!(out.stdout, b"linked to\n");
    let out = fs(&dev, &["cat", "/in/to-dir/e/f.txt"]);
    assert_eq!(out.stdout, b"linked to\n");
    assert_ok(&fs(&dev, &["fsck"]));

    let out = fs(&dev, &["export", "/in", dst.to_str().unwrap()]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("exported 1 files, 2 directories, 4 symlinks"),
        "{}",
        stdout(&out)
    );
    let mut want = snapshot_links(&src);
    want.remove(Path::new("absolute"));
    assert_eq!(snapshot_links(&dst), want);

    // A second import replaces links of the same name and changes nothing else.
    let out = fs(&dev, &["import", src.to_str().unwrap(), "/in"]);
    assert_ok(&out);
    let again = tmp.path().join("again");
    assert_ok(&fs(&dev, &["export", "/in", again.to_str().unwrap()]));
    assert_eq!(snapshot_links(&again), want);
}

#[test]
fn import_into_another_tenant_stays_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (dev, src) = (tmp.path().join("dev"), tmp.path().join("src"));
    new_store(&dev);
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("mine.txt"), b"tenant b's\n").unwrap();

    assert_ok(&fs(
        &dev,
        &["import", "--tenant", "b", src.to_str().unwrap(), "/"],
    ));
    let out = fs(&dev, &["ls", "--tenant", "b"]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "-           11 mine.txt\n");
    // The default tenant's root is empty, and nothing climbs from it into b's.
    let out = fs(&dev, &["ls"]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "");
    assert_error(&fs(&dev, &["cat", "../mine.txt"]), "cat ../mine.txt");
    let out = fs(&dev, &["tenants"]);
    assert_eq!(
        stdout(&out),
        "   0  default  0 names  0 bytes\n   1  b  1 names  11 bytes\n"
    );
}

#[test]
fn mistakes_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    new_store(&dev);
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    assert_ok(&fs(
        &dev,
        &["import", tmp.path().join("f").to_str().unwrap(), "/d"],
    ));

    assert_error(
        &fs(&dev, &["cat", "/missing"]),
        "cat /missing: no such file or directory",
    );
    assert_error(
        &fs(&dev, &["ls", "/d/missing"]),
        "no such file or directory",
    );
    assert_error(&fs(&dev, &["cat", "/d"]), "is a directory");
    assert_error(
        &fs(&dev, &["ls", "--tenant", "nobody"]),
        "no tenant \"nobody\"",
    );
    assert_error(
        &fs(&dev, &["import", "/no/such/host/dir", "/x"]),
        "cannot read /no/such/host/dir",
    );
    assert_error(
        &fs(&dev, &["export", "/nothing", tmp.path().to_str().unwrap()]),
        "no such file or directory",
    );
    // A file where a directory is needed, in the store.
    assert_error(
        &fs(
            &dev,
            &["import", tmp.path().join("f").to_str().unwrap(), "/d/f"],
        ),
        "not a directory",
    );
    assert_error(&fs(&dev, &["frobnicate"]), "unrecognized subcommand");
    assert_error(&fs(&dev, &["cat"]), "required");
    // A file where the device's directory should be.
    let not_dir = tmp.path().join("f");
    assert_error(
        &fs(&not_dir, &["import", not_dir.to_str().unwrap(), "/x"]),
        "not a directory",
    );
    // Geometry flags that disagree with the existing image (16 zones of 16 MiB), which
    // were once ignored: the run went on with a geometry nobody asked for.
    let modified = || {
        let image = std::fs::metadata(dev.join("zones.img")).unwrap();
        (image.len(), image.modified().unwrap())
    };
    let image_before = modified();
    let f = tmp.path().join("f");
    assert_error(
        &fs(&dev, &["import", "--zones", "5", f.to_str().unwrap(), "/x"]),
        "--zones 5: the image",
    );
    let run = valet_run()
        .args([
            "--device",
            dev.to_str().unwrap(),
            "--zone-size",
            "64",
            "app.wasm",
        ])
        .output()
        .unwrap();
    assert_error(&run, "--zone-size 64: the image");
    assert_eq!(modified(), image_before);
    // Flags that agree are fine.
    assert_ok(&fs(
        &dev,
        &["import", "--zones", "16", f.to_str().unwrap(), "/y"],
    ));
}

#[test]
fn import_creates_a_device_that_does_not_exist_yet() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/a.txt"), "alpha\n").unwrap();
    let dev = tmp.path().join("new-dev");
    let out = fs(
        &dev,
        &[
            "import",
            "--zone-size",
            "16",
            "--zones",
            "16",
            src.to_str().unwrap(),
            "/in",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dev.join("zones.img").exists());
    let out = fs(&dev, &["cat", "/in/sub/a.txt"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "alpha\n");
    // The geometry asked for: 16 zones of 16 MiB (and a header), not the 32 GiB default.
    let size = std::fs::metadata(dev.join("zones.img")).unwrap().len();
    assert!(size < (17 * 16) << 20, "image of {size} bytes");
}

#[test]
fn no_store_is_created_where_none_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let nowhere = tmp.path().join("nowhere");
    for args in [
        &["ls"][..],
        &["cat", "/x"],
        &["fsck"],
        &["tenants"],
        &["export", "/", tmp.path().join("out").to_str().unwrap()],
    ] {
        assert_error(&fs(&nowhere, args), "no store at");
    }
    assert!(!nowhere.exists(), "an fs command created the device");
    // import of something that does not exist creates nothing either.
    let missing = tmp.path().join("missing");
    assert_error(
        &fs(&nowhere, &["import", missing.to_str().unwrap(), "/"]),
        "cannot read",
    );
    assert!(!nowhere.exists(), "a failed import created the device");
    // Options given before `fs` make `fs` the application: say so.
    let out = valet_run()
        .arg("--device")
        .arg(&nowhere)
        .args(["fs", "ls"])
        .output()
        .unwrap();
    assert_error(&out, "`fs` takes its options after the command");
    assert!(!nowhere.exists());
    // A drive with nothing on it (an emulated zonefs layout here) is no store either.
    let blank = tmp.path().join("zonefs");
    valet_vfs::device::ZonefsDevice::format_emulated(&blank, 8, 1 << 20).unwrap();
    let out = valet_run()
        .args(["fs", "ls", "--zonefs"])
        .arg(&blank)
        .arg("--device")
        .arg(&nowhere)
        .output()
        .unwrap();
    assert_error(&out, "no store on the drive at");
}

/// `fs rm`: a file, a link (not what it points at), a directory only with -r, and `/` with
/// -r empties the tenant; its bytes and names go, the other tenant keeps its own, and the
/// store stays clean.
#[test]
fn rm_frees_a_tenants_files_without_running_a_guest() {
    let tmp = tempfile::tempdir().unwrap();
    let (dev, src) = (tmp.path().join("dev"), tmp.path().join("src"));
    new_store(&dev);
    make_tree(&src);
    std::os::unix::fs::symlink("top.txt", src.join("link")).unwrap();
    let src_arg = src.to_str().unwrap();
    assert_ok(&fs(&dev, &["import", src_arg, "/"]));
    assert_ok(&fs(&dev, &["import", "--tenant", "b", src_arg, "/"]));
    let tenant_a = |dev: &Path| {
        let out = fs(dev, &["tenants"]);
        assert_ok(&out);
        stdout(&out).lines().next().unwrap().to_string()
    };
    let full = tenant_a(&dev);

    let out = fs(&dev, &["rm", "/link"]);
    assert_ok(&out);
    assert!(stdout(&out).starts_with("removed 0 files, 1 links, 0 directories"));
    let out = fs(&dev, &["rm", "/big.bin"]);
    assert_ok(&out);
    let said = stdout(&out);
    let number = |after: &str| -> u64 {
        let at = said.find(after).unwrap() + after.len();
        let digits: String = said[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    assert_eq!(number("(was ") - number("holds "), 1_500_000, "{said}");
    assert_error(&fs(&dev, &["rm", "/a"]), "rm /a: is a directory");
    assert_error(&fs(&dev, &["rm", "/nothing"]), "rm /nothing");
    let out = fs(&dev, &["rm", "-r", "/a/b"]);
    assert_ok(&out);
    assert!(stdout(&out).starts_with("removed 2 files, 0 links, 2 directories"));
    let out = fs(&dev, &["ls", "-R"]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out),
        "-           16 CURRENT\nd            0 a\n-            0 empty.bin\n-           13 top.txt\n\
         d            0 a/empty_dir\n-         8192 a/zero.bin\n"
    );
    let out = fs(&dev, &["rm", "-r", "/"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("holds 0 bytes"), "{}", stdout(&out));
    assert_eq!(tenant_a(&dev), "   0  default  0 names  0 bytes");
    assert_ne!(full, tenant_a(&dev));
    let out = fs(&dev, &["ls", "-R", "--tenant", "b"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("a/b/c/deep.bin"), "{}", stdout(&out));
    let out = fs(&dev, &["fsck"]);
    assert_ok(&out);
    assert!(stdout(&out).ends_with("fsck: clean\n"));
}

/// `valet-run` on the store at `dev`, serving its admin API on `sock`, once its guest
/// (write_then_wait) has written its three files and waits on stdin.
fn guest_with_admin(dev: &Path, sock: &Path) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut guest = valet_run()
        .arg("--device")
        .arg(dev)
        .arg("--admin")
        .arg(sock)
        .args(["--quota", "64M"])
        .arg(valet_guests::WRITE_THEN_WAIT)
        .args(["--", "/data", "wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(guest.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "written\n");
    guest
}

/// `fs rm --admin`: a running `valet-run` removes files of a tenant that has no guest at
/// once, and its own guest's files only when forced; each removal is durable when the
/// command returns, and the store is clean after the process is killed.
#[test]
fn rm_through_the_admin_api_while_a_guest_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (dev, src) = (tmp.path().join("dev"), tmp.path().join("src"));
    new_store(&dev);
    make_tree(&src);
    assert_ok(&fs(
        &dev,
        &["import", "--tenant", "gone", src.to_str().unwrap(), "/"],
    ));
    let sock = tmp.path().join("admin.sock");
    let mut guest = guest_with_admin(&dev, &sock);
    let sock = sock.to_str().unwrap();
    let online = |args: &[&str]| {
        let all: Vec<&str> = ["rm", "--admin", sock]
            .iter()
            .chain(args)
            .copied()
            .collect();
        fs(&dev, &all)
    };

    assert_error(&fs(&dev, &["rm", "/top.txt"]), "in use by another process");
    let out = fs(&dev, &["tenants", "--admin", sock]);
    assert_ok(&out);
    let listing = stdout(&out);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 2, "{listing}");
    assert!(lines[0].starts_with("   0  default  "), "{listing}");
    assert!(
        lines[0].ends_with(" bytes of a 67108864-byte quota  1 guests running"),
        "{listing}"
    );
    assert!(
        lines[1].ends_with("  gone  11 names  1582318 bytes  0 guests running"),
        "{listing}"
    );
    let out = online(&["--tenant", "gone", "-r", "/a"]);
    assert_ok(&out);
    assert!(
        stdout(&out).starts_with("removed 3 files, 0 links, 4 directories; tenant gone holds 1500029 bytes (was 1582318)"),
        "{}",
        stdout(&out)
    );
    assert_error(
        &online(&["--tenant", "gone", "/a"]),
        "admin API answered 404: rm /a: no such file",
    );
    assert_error(
        &online(&["--tenant", "nobody", "/"]),
        "no tenant \"nobody\"",
    );
    let out = online(&["--tenant", "gone", "-r", "/"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("tenant gone holds 0 bytes"));

    assert_error(
        &online(&["/unsynced-0.dat"]),
        "admin API answered 409: tenant \"default\" has 1 guest(s) running",
    );
    let out = online(&["--force", "/unsynced-0.dat"]);
    assert_ok(&out);
    assert!(stdout(&out).starts_with("removed 1 files"));

    // What the API answered is durable: a SIGKILL right after loses none of it.
    guest.kill().unwrap();
    guest.wait().unwrap();
    let out = fs(&dev, &["ls"]);
    assert_ok(&out);
    let listing = stdout(&out);
    assert!(!listing.contains("unsynced-0.dat"), "{listing}");
    let out = fs(&dev, &["ls", "-R", "--tenant", "gone"]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "");
    let out = fs(&dev, &["fsck"]);
    assert_ok(&out);
    assert!(stdout(&out).ends_with("fsck: clean\n"));
}

/// `ls`, `cat`, `fsck --deep` and `zones` with `--admin` read the store of a running
/// `valet-run`: what its guest wrote and never synced included, a file larger than one
/// answer whole, the deep check of every live block while the guest holds its files.
#[test]
fn inspection_through_the_admin_api_while_a_guest_runs() {
    use valet_guests::content::unsynced_file;

    let tmp = tempfile::tempdir().unwrap();
    let (dev, src) = (tmp.path().join("dev"), tmp.path().join("src"));
    new_store(&dev);
    std::fs::create_dir_all(&src).unwrap();
    let huge = bytes(9_000_001, 7);
    std::fs::write(src.join("huge.bin"), &huge).unwrap();
    assert_ok(&fs(
        &dev,
        &["import", "--tenant", "big", src.to_str().unwrap(), "/"],
    ));
    let sock = tmp.path().join("admin.sock");
    let mut guest = guest_with_admin(&dev, &sock);
    let sock = sock.to_str().unwrap();
    let online = |command: &str, args: &[&str]| {
        let all: Vec<&str> = [command, "--admin", sock]
            .iter()
            .chain(args)
            .copied()
            .collect();
        fs(&dev, &all)
    };

    let out = online("ls", &[]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out),
        "-      1200000 unsynced-0.dat\n-       300000 unsynced-1.dat\n-         3000 unsynced-2.dat\n"
    );
    for i in 0..3 {
        let out = online("cat", &[&format!("/unsynced-{i}.dat")]);
        assert_ok(&out);
        assert!(out.stdout == unsynced_file(i), "unsynced-{i}.dat differs");
    }
    let out = online("cat", &["--tenant", "big", "/huge.bin"]);
    assert_ok(&out);
    assert!(out.stdout == huge, "{} bytes back", out.stdout.len());
    assert_error(
        &online("cat", &["/nothing"]),
        "admin API answered 404: cat /nothing: no such file",
    );
    let out = online("ls", &["-R", "--tenant", "big"]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "-      9000001 huge.bin\n");

    let out = online("fsck", &["--deep"]);
    assert_ok(&out);
    let report = stdout(&out);
    assert!(report.ends_with("fsck: clean\n"), "{report}");
    let verified: u64 = report
        .split("fsck: ")
        .nth(2)
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(verified >= 9_000_001 / 4096, "{report}");
    let out = online("zones", &[]);
    assert_ok(&out);
    let zones = stdout(&out);
    assert!(
        zones.starts_with("zone state write_pointer owner placement\n"),
        "{zones}"
    );
    assert!(zones.lines().count() > 2, "{zones}");

    drop(guest.stdin.take());
    assert!(guest.wait().unwrap().success());
}
