//! Escape tests: no path a guest passes reaches outside its mounts.
//!
//! The `escape` guest runs under `valet-run` with the store at `/data` and a plain host
//! directory (`--dir`) at `/host`, and tries every path trick on both: `..` at and below the
//! root, `a/../../x`, `//`, absolute paths, symlinks, NUL, non-UTF-8 bytes, 4 KiB names and
//! paths, 300-deep paths, renaming and linking out of a mount or across mounts, opening the
//! mount's parent. Each attempt must end with the errno listed here. From the host side, a
//! sentinel tree planted around the device directory and the host directory (files named as
//! the guest's targets) must come out unchanged: same entries, sizes, contents, and access
//! and modification times (set beforehand so that a read would move the access time under
//! `relatime`).

use std::collections::BTreeMap;
use std::fs::{self, FileTimes};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

/// What every trick must give on the store (`/data`).
const STORE: &str = r"open .. (directory) -> EPERM
open ../ (directory) -> EPERM
open ./.. (directory) -> EPERM
open ../.. (directory) -> EPERM
stat .. -> EPERM
stat ../sentinel.txt -> EPERM
read ../sentinel.txt -> EPERM
create ../escaped -> EPERM
create ../outside/escaped -> EPERM
mkdir ../escaped-dir -> EPERM
unlink ../sentinel.txt -> EPERM
rmdir ../outside -> EPERM
set times of ../sentinel.txt -> EPERM
truncate ../sentinel.txt -> EPERM
mkdir a -> ok
stat a/.. -> ok DIRECTORY
stat a/../.. -> EPERM
create a/../../escaped -> EPERM
read a/../../sentinel.txt -> EPERM
create a/./../../escaped -> EPERM
create a//..//..//escaped -> EPERM
create a/../inside -> ok
from a: open .. (directory) -> EPERM
from a: stat ../inside -> EPERM
from a: create ../../escaped -> EPERM
stat / -> EPERM
stat // -> EPERM
read /etc/passwd -> EPERM
read //etc/passwd -> EPERM
create /escaped -> EPERM
create //escaped -> EPERM
create a//inside2 -> ok
mkdir /tmp/escaped-dir -> EPERM
open /data/.. (directory) -> EPERM
symlink up -> .. -> ok
symlink abs -> / -> EPERM
symlink a/deep -> ../../sentinel.txt -> ok
read up/sentinel.txt -> EPERM
create up/escaped -> EPERM
read abs/etc/passwd -> ENOENT
read a/deep -> EPERM
write a/deep -> EPERM
open up (directory) -> EPERM
stat up/outside -> EPERM
set times through up/sentinel.txt -> EPERM
link up/sentinel.txt -> stolen -> EPERM
rename up/sentinel.txt -> stolen -> EPERM
unlink up/sentinel.txt -> EPERM
symlink a/up2 -> ../.. -> ok
read a/up2/sentinel.txt -> EPERM
symlink hop -> a/up2 (a link to a link) -> ok
read hop/sentinel.txt -> EPERM
stat hop/outside/x.txt -> EPERM
symlink dd -> a/../.. (.. inside the target) -> ok
read dd/sentinel.txt -> EPERM
symlink out -> ../escaped (dangling) -> ok
create out (through the dangling link) -> EPERM
create out CREAT|EXCL -> EEXIST
mkdir hop/escaped-dir -> EPERM
symlink hop2 -> hop/outside (through a link) -> ok
read hop2/x.txt -> EPERM
symlink a/back -> ../inside -> ok
read a/back (stays inside) -> ok REGULAR_FILE
from a: read back (climbs above a) -> EPERM
symlink l1 -> l2, l2 -> l1 -> ok
read l1 (a loop) -> ELOOP
create a\0b -> EINVAL
create ..\0/escaped -> EINVAL
create inside\0../../escaped -> EINVAL
create bad\xff -> EILSEQ
create ..\xff/escaped -> EILSEQ
create ../\xff -> EILSEQ
mkdir \xc0\xaf (overlong '/') -> EILSEQ
create ..\\escaped (a backslash is a name byte) -> ok
create 255-byte name -> ok
create 256-byte name -> ENAMETOOLONG
create 4096-byte name -> ENAMETOOLONG
mkdir 4096-byte name -> ENAMETOOLONG
create (a/ x 2048)x (4 KiB path, missing dirs) -> ENAMETOOLONG
create (./ x 2048)inside3 (4 KiB path) -> ENAMETOOLONG
create (./ x 2048)../escaped -> ENAMETOOLONG
create (a/../ x 1000)../escaped -> ENAMETOOLONG
mkdir 300 nested directories -> 300 made
create at the bottom -> ok
create (d/ x 300)(../ x 300)inside4 -> ok
read (d/ x 300)(../ x 301)sentinel.txt -> EPERM
create (d/ x 300)(../ x 301)escaped -> EPERM
from the bottom: create (../ x 300)inside5 -> EPERM
from the bottom: create (../ x 301)escaped -> EPERM
rename f -> ../escaped -> EPERM
rename f -> /tmp/escaped -> EPERM
rename f -> a/../../escaped -> EPERM
rename dir -> ../escaped-dir -> EPERM
rename ../sentinel.txt -> stolen -> EPERM
rename ../outside -> stolen-dir -> EPERM
rename . -> moved (the mount itself) -> EBUSY
rename a -> a/inner (below itself) -> EINVAL
link f -> ../escaped -> EPERM
link ../sentinel.txt -> stolen -> EPERM
link /etc/passwd -> stolen -> EPERM
rmdir . (the mount itself) -> EINVAL
rmdir .. (the mount's parent) -> EPERM
rename f -> the other mount -> EXDEV
link f -> the other mount -> EXDEV
rename f -> the other mount's ../escaped -> EXDEV
listing -> ok . .. ..\escaped <255 bytes> a d dir f inside inside4";

/// Where the plain host directory (`/host`, served through cap-std) answers otherwise, and
/// why: none since the store refuses a path of PATH_MAX bytes or more as the host does.
/// (Symlinks answer alike: made inside, refused when followed out, on the store as on the
/// host.) A rename or link to the other mount is EXDEV from both sides.
const HOST_OVERRIDES: &[(&str, &str)] = &[];

fn split(line: &str) -> (&str, &str) {
    line.rsplit_once(" -> ").unwrap_or((line, ""))
}

/// What is recorded of one path outside the mounts.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    kind: &'static str,
    size: u64,
    atime: (i64, i64),
    mtime: (i64, i64),
    content: Vec<u8>,
    entries: Vec<String>,
}

/// Every path under `top` (and `top` itself) except the insides of `skip`, without
/// reading a directory before its times are recorded and reading files with O_NOATIME, so
/// the snapshot does not disturb what it records.
fn snapshot(top: &Path, skip: &[&Path]) -> BTreeMap<String, Seen> {
    let mut out = BTreeMap::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs::symlink_metadata(&path).unwrap();
        let rel = path.strip_prefix(top).unwrap().display().to_string();
        let mut seen = Seen {
            kind: "other",
            size: meta.len(),
            atime: (meta.atime(), meta.atime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            content: Vec::new(),
            entries: Vec::new(),
        };
        if skip.iter().any(|s| *s == path) {
            // Only that it is still there, as a directory.
            seen = Seen {
                kind: "mount",
                size: 0,
                atime: (0, 0),
                mtime: (0, 0),
                content: Vec::new(),
                entries: Vec::new(),
            };
            assert!(meta.is_dir(), "{rel}");
        } else if meta.file_type().is_symlink() {
            seen.kind = "symlink";
            seen.content = fs::read_link(&path)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes();
        } else if meta.is_file() {
            seen.kind = "file";
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOATIME)
                .open(&path)
                .unwrap()
                .read_to_end(&mut seen.content)
                .unwrap();
        } else if meta.is_dir() {
            seen.kind = "dir";
            seen.size = 0;
            for e in fs::read_dir(&path).unwrap() {
                let e = e.unwrap();
                seen.entries
                    .push(e.file_name().to_string_lossy().into_owned());
                stack.push(e.path());
            }
            seen.entries.sort();
        }
        out.insert(rel, seen);
    }
    out
}

/// Sets every planted path's access time an hour before its modification time.
fn age(top: &Path, skip: &[&Path]) {
    let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    let times = FileTimes::new()
        .set_accessed(base)
        .set_modified(base + Duration::from_secs(3600));
    let mut stack = vec![top.to_path_buf()];
    while let Some(path) = stack.pop() {
        if skip.iter().any(|s| *s == path) {
            continue;
        }
        if path.is_dir() {
            for e in fs::read_dir(&path).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
        fs::File::open(&path).unwrap().set_times(times).unwrap();
    }
}

#[test]
fn no_path_trick_leaves_the_mounts() {
    // top/
    //   sentinel.txt  etc/passwd  outside/{x.txt, sub/y.txt}  dev-sibling.txt
    //   dev/      the device directory (the store is mounted at /data)
    //   hostdir/  the --dir directory (mounted at /host)
    let top = tempfile::tempdir().unwrap();
    let top = top.path();
    let dev = top.join("dev");
    let hostdir = top.join("hostdir");
    for d in [&dev, &hostdir, &top.join("etc"), &top.join("outside/sub")] {
        fs::create_dir_all(d).unwrap();
    }
    for (path, content) in [
        ("sentinel.txt", "do not touch\n"),
        ("etc/passwd", "root:x:0:0::/root:/bin/sh\n"),
        ("outside/x.txt", "x\n"),
        ("outside/sub/y.txt", "y\n"),
        ("dev-sibling.txt", "beside the device\n"),
    ] {
        fs::write(top.join(path), content).unwrap();
    }
    let skip = [dev.as_path(), hostdir.as_path()];
    // The snapshot lists directories, which moves their access times: set every time
    // again after it (`age` lists a directory before setting its times).
    age(top, &skip);
    let before = snapshot(top, &skip);
    age(top, &skip);

    let out = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(&dev)
        .args(["--zone-size", "16", "--zones", "16", "--dir"])
        .arg(format!("{}::/host", hostdir.display()))
        .arg(valet_guests::ESCAPE)
        .args(["/data", "/host"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    let after = snapshot(top, &skip);
    let mut report = String::new();
    for (path, was) in &before {
        match after.get(path) {
            None => report += &format!("{path}: removed\n"),
            Some(now) if now != was => {
                report += &format!("{path}: changed\n  before: {was:?}\n  after:  {now:?}\n")
            }
            Some(_) => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        report += &format!("{path}: created\n");
    }
    assert!(
        report.is_empty(),
        "the guest touched the host outside its mounts:\n{report}"
    );

    // Every trick got the errno it must.
    for mount in ["/data", "/host"] {
        let prefix = format!("{mount}: ");
        let got: Vec<(&str, &str)> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .map(split)
            .collect();
        let want: Vec<(&str, &str)> = STORE
            .lines()
            .map(split)
            .map(|(label, result)| match mount {
                "/host" => HOST_OVERRIDES
                    .iter()
                    .find(|(l, _)| *l == label)
                    .map_or((label, result), |(l, r)| (*l, *r)),
                _ => (label, result),
            })
            .collect();
        let mut report = String::new();
        for i in 0..got.len().max(want.len()) {
            match (got.get(i), want.get(i)) {
                (Some(g), Some(w)) if g == w => {}
                (Some(g), Some(w)) if g.0 == w.0 => {
                    report += &format!("{}: got {}, want {}\n", g.0, g.1, w.1)
                }
                (g, w) => {
                    report += &format!("steps differ at {}: got {g:?}, want {w:?}\n", i + 1);
                    break;
                }
            }
        }
        assert!(
            report.is_empty(),
            "{mount}: tricks with unexpected outcomes:\n{report}\nfull output:\n{stdout}"
        );
    }
}
