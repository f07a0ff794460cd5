//! Differential conformance of the WASI filesystem adapter.
//!
//! Two probes print one line per call (`label -> result`): the Rust `fsprobe` calls every
//! WASIp1 filesystem function directly, with its error cases; the C `c_fsprobe`
//! (guests/c/fsprobe.c) goes through wasi-libc's POSIX functions, as C and C++ engines do.
//! Each runs under `valet-run` on the zoned store and under wasmtime's stock WASI
//! (wasmtime-wasi 48's preview1, the same wasmtime release) over a fresh host directory, both
//! mounted at `/data`. The transcripts must agree line by line, except for the differences
//! listed per probe ([`DIFFERENCES`], [`C_DIFFERENCES`]), each with its reason; a listed
//! difference that no longer shows up fails the test too, so the lists stay true.

use valet_benches::stock;

use std::process::{Command, Stdio};

/// One accepted difference: the line's label, valet's result, stock's result, and why.
struct Difference {
    label: &'static str,
    valet: &'static str,
    stock: &'static str,
    why: &'static str,
}

const PREAD_CAP: &str = "stock caps one fd_pread at 64 KiB; valet returns every requested byte \
                         that exists (LevelDB's PosixEnv reads a block with one pread)";
const ALLOCATE: &str = "stock dropped fd_allocate (ENOTSUP, even for bad arguments); valet \
                        grows the file as posix_fallocate does";
const TRAILING_SLASH: &str = "stock (cap-std) does not follow a symlink named with a trailing \
                              slash; POSIX and Linux resolve `link/` to what the link names";
const RMDIR_SLASH: &str = "stock (cap-std) refuses a trailing slash on rmdir; POSIX and Linux \
                           accept it";
const LINK_FOLLOW: &str = "stock refuses path_link with SYMLINK_FOLLOW (EINVAL); valet links \
                           what the old path names, as linkat(AT_SYMLINK_FOLLOW) does";
const DIR_SYNC: &str = "stock refuses fsync of a directory (EBADF); valet makes the store's \
                        metadata durable (LevelDB and badger sync the directory after a \
                        MANIFEST change)";
const VECTORED_WRITE: &str = "stock writes only the first non-empty buffer of an fd_write / \
                              fd_pwrite (a short write, which POSIX allows); valet writes them \
                              all, as writev does";
const VECTORED_READ: &str = "stock reads into only the first non-empty buffer of an fd_read / \
                             fd_pread (a short read, which POSIX allows); valet fills them \
                             in order while data lasts, as readv does";
const COOKIES: &str = "stock's fd_readdir cookies are positions in the host's listing, so \
                       entries removed between two reads make it skip others; valet's cookies \
                       name the entry they follow";

const DIFFERENCES: &[Difference] = &[
    Difference {
        label: "fd_read [4, 100]",
        valet: "ok \"hello world!\"",
        stock: "ok \"hell\"",
        why: VECTORED_READ,
    },
    Difference {
        label: "fd_tell",
        valet: "ok 12",
        stock: "ok 4",
        why: VECTORED_READ,
    },
    Difference {
        label: "fd_read [0, 3] (empty first buffer)",
        valet: "ok \"\"",
        stock: "ok \"o w\"",
        why: VECTORED_READ,
    },
    Difference {
        label: "fd_read [100]",
        valet: "ok \"\"",
        stock: "ok \"orld!\"",
        why: VECTORED_READ,
    },
    Difference {
        label: "fd_pread [3, 10] at 0",
        valet: "ok \"hABCD world!\\0\"",
        stock: "ok \"hAB\"",
        why: VECTORED_READ,
    },
    Difference {
        label: "open dsync DSYNC|CREAT",
        valet: "ok 6",
        stock: "ENOTSUP",
        why: "stock (cap-std) cannot open with O_DSYNC / O_SYNC; valet syncs every write",
    },
    Difference {
        label: "fd_write [\"hello \", \"world\"]",
        valet: "ok 11",
        stock: "ok 6",
        why: VECTORED_WRITE,
    },
    Difference {
        label: "fd_pwrite [\"AB\", \"CD\"] at 1",
        valet: "ok 4",
        stock: "ok 2",
        why: VECTORED_WRITE,
    },
    Difference {
        label: "fd_pread [1.5 MiB] at 0",
        valet: "ok n=1572864 bytes match=true",
        stock: "ok n=65536 bytes match=true",
        why: PREAD_CAP,
    },
    Difference {
        label: "fd_pread [1 MiB] at 1 MiB (to EOF)",
        valet: "ok n=524288 bytes match=true",
        stock: "ok n=65536 bytes match=true",
        why: PREAD_CAP,
    },
    Difference {
        label: "fd_pread [100000] at 12345",
        valet: "ok n=100000 bytes match=true",
        stock: "ok n=65536 bytes match=true",
        why: PREAD_CAP,
    },
    Difference {
        label: "fd_advise WILLNEED 1 MiB of big, then pread",
        valet: "ok n=1048576 bytes match=true",
        stock: "ok n=65536 bytes match=false",
        why: PREAD_CAP,
    },
    Difference {
        label: "fd_fdstat_set_flags DSYNC",
        valet: "ok",
        stock: "EINVAL",
        why: "stock refuses to change the sync flags of an open file; valet honours them",
    },
    Difference {
        label: "fd_sync directory",
        valet: "ok",
        stock: "EBADF",
        why: DIR_SYNC,
    },
    Difference {
        label: "fd_datasync directory",
        valet: "ok",
        stock: "EBADF",
        why: DIR_SYNC,
    },
    Difference {
        label: "fd_sync of removed dd",
        valet: "ok",
        stock: "EBADF",
        why: DIR_SYNC,
    },
    Difference {
        label: "fd_sync preopened root",
        valet: "ok",
        stock: "EBADF",
        why: DIR_SYNC,
    },
    Difference {
        label: "rmdir dd/e/ (trailing slash)",
        valet: "ok",
        stock: "EINVAL",
        why: RMDIR_SLASH,
    },
    Difference {
        label: "symlink: stat dl/ (no follow, trailing slash)",
        valet: "ok DIRECTORY",
        stock: "ok SYMBOLIC_LINK",
        why: TRAILING_SLASH,
    },
    Difference {
        label: "symlink: rmdir dl/",
        valet: "ENOTDIR",
        stock: "EINVAL",
        why: RMDIR_SLASH,
    },
    Difference {
        label: "link l1 -> l3 with SYMLINK_FOLLOW",
        valet: "ok",
        stock: "EINVAL",
        why: LINK_FOLLOW,
    },
    Difference {
        label: "fd_allocate 0+8192",
        valet: "ok",
        stock: "ENOTSUP",
        why: ALLOCATE,
    },
    Difference {
        label: "size",
        valet: "ok 8192",
        stock: "ok 3",
        why: ALLOCATE,
    },
    Difference {
        label: "fd_allocate 0+10 (inside the file)",
        valet: "ok",
        stock: "ENOTSUP",
        why: ALLOCATE,
    },
    Difference {
        label: "fd_allocate len 0",
        valet: "EINVAL",
        stock: "ENOTSUP",
        why: ALLOCATE,
    },
    Difference {
        label: "fd_allocate on a read-only fd",
        valet: "EBADF",
        stock: "ENOTSUP",
        why: ALLOCATE,
    },
    Difference {
        label: "cat al (first bytes kept)",
        valet: "ok \"abc\\0\"",
        stock: "ok \"abc\"",
        why: ALLOCATE,
    },
    Difference {
        label: "deleted while listing with a 128-byte buffer",
        valet: "40 of 40",
        stock: "22 of 40",
        why: COOKIES,
    },
    Difference {
        label: "rmdir many",
        valet: "ok",
        stock: "ENOTEMPTY",
        why: COOKIES,
    },
];

/// The C probe's accepted differences: the same causes, seen through wasi-libc.
const C_DIFFERENCES: &[Difference] = &[
    Difference {
        label: "preadv [2, 2] at 0",
        valet: "ok n=4 \"ab\" \"cd\"",
        stock: "ok n=2 \"ab\" \"\"",
        why: VECTORED_READ,
    },
    Difference {
        label: "writev [ab, cd]",
        valet: "ok 4",
        stock: "ok 2",
        why: VECTORED_WRITE,
    },
    Difference {
        label: "posix_fallocate 8192",
        valet: "ok",
        stock: "ENOTSUP",
        why: ALLOCATE,
    },
    Difference {
        label: "fstat after posix_fallocate",
        valet: "ok file size=8192",
        stock: "ok file size=4096",
        why: ALLOCATE,
    },
    Difference {
        label: "size after append",
        valet: "ok file size=8193",
        stock: "ok file size=4097",
        why: ALLOCATE,
    },
    Difference {
        label: "pread first 4",
        valet: "ok \"!bcd\"",
        stock: "ok \"!bll\"",
        why: VECTORED_WRITE,
    },
    Difference {
        label: "pread 1.5 MiB in one call",
        valet: "ok n=1572864 match=1",
        stock: "ok n=65536 match=1",
        why: PREAD_CAP,
    },
    Difference {
        label: "fsync a directory",
        valet: "ok",
        stock: "EBADF",
        why: DIR_SYNC,
    },
];

/// Splits `label -> result` at the last arrow (labels may hold one); lines without a
/// result (section titles) are all label.
fn split(line: &str) -> (&str, &str) {
    line.rsplit_once(" -> ").unwrap_or((line, ""))
}

/// Starts a probe under valet-run on a fresh device (it runs while stock WASI runs here).
fn start_valet(dev: &std::path::Path, probe: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(dev)
        .args(["--zone-size", "16", "--zones", "16"])
        .arg(probe)
        .arg("/data")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running valet-run")
}

/// Compares two transcripts; returns a readable report of everything not accepted.
fn compare(valet: &str, stock: &str, differences: &[Difference]) -> Result<(), String> {
    let v: Vec<&str> = valet.lines().collect();
    let s: Vec<&str> = stock.lines().collect();
    let mut report = String::new();
    let mut used = vec![false; differences.len()];
    for i in 0..v.len().max(s.len()) {
        let (Some(vl), Some(sl)) = (v.get(i), s.get(i)) else {
            report += &format!("line {}: one transcript ends early\n", i + 1);
            break;
        };
        let ((vlab, vres), (slab, sres)) = (split(vl), split(sl));
        if vlab != slab {
            report += &format!(
                "line {}: the transcripts lose step here\n  valet: {vl}\n  stock: {sl}\n",
                i + 1
            );
            break;
        }
        if vres == sres {
            continue;
        }
        match differences
            .iter()
            .position(|d| d.label == vlab && d.valet == vres && d.stock == sres)
        {
            Some(k) => used[k] = true,
            None => {
                report += &format!("line {}: {vlab}\n  valet: {vres}\n  stock: {sres}\n", i + 1)
            }
        }
    }
    for (d, used) in differences.iter().zip(used) {
        if !used {
            report += &format!(
                "listed difference no longer seen: {} (valet {:?}, stock {:?}; {})\n",
                d.label, d.valet, d.stock, d.why
            );
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// Runs `probe` (`name`, its .wasm) under both hosts and checks the transcripts.
fn check_probe(name: &str, probe: &str, differences: &[Difference]) {
    let dev = tempfile::tempdir().unwrap();
    let valet = start_valet(dev.path(), probe);
    let host = tempfile::tempdir().unwrap();
    let stock = stock::run(probe, &[name, "/data"], &[(host.path(), "/data")]);
    let out = valet.wait_with_output().unwrap();
    let valet = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed under valet-run:\n{}\n{valet}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stock.code, 0,
        "{name} failed under stock WASI:\n{}\n{}",
        stock.stderr, stock.stdout
    );

    if let Some(dir) = std::env::var_os("FSPROBE_DUMP") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::write(dir.join(format!("{name}-valet.txt")), &valet).unwrap();
        std::fs::write(dir.join(format!("{name}-stock.txt")), &stock.stdout).unwrap();
    }

    // The probe cleans up after itself on both sides.
    assert!(
        valet.ends_with("ls root at the end -> ok ../ ./\n"),
        "{valet}"
    );
    assert_eq!(std::fs::read_dir(host.path()).unwrap().count(), 0);
    assert!(valet.lines().count() > 100, "{valet}");

    if let Err(report) = compare(&valet, &stock.stdout, differences) {
        panic!(
            "{name} under valet-run and under stock wasmtime WASI differ beyond the listed \
             differences:\n\n{report}\n(full transcripts: valet {} lines, stock {} lines; \
             set FSPROBE_DUMP=DIR to write them out)",
            valet.lines().count(),
            stock.stdout.lines().count()
        );
    }
}

#[test]
fn fsprobe_transcripts_match_stock_wasmtime_except_listed_differences() {
    check_probe("fsprobe", valet_guests::FSPROBE, DIFFERENCES);
}

#[test]
fn c_fsprobe_transcripts_match_stock_wasmtime_except_listed_differences() {
    let Some(probe) = valet_guests::require("c_fsprobe") else {
        return;
    };
    check_probe("c_fsprobe", probe, C_DIFFERENCES);
}

const LINK_ORDER: &str = "Linux checks link's old name, then the new name's directory, then \
                          whether the old may be linked (not a directory); stock (cap-std) \
                          checks them in another order";

/// Differences between the results of one call of the `fsrandom` guest, by the call's name:
/// valet's (Linux's) result, stock's, and why.
const RANDOM_DIFFERENCES: &[(&str, &str, &str, &str)] = &[
    ("link", "ENOENT", "ENOTDIR", LINK_ORDER),
    ("link", "ENOENT", "ELOOP", LINK_ORDER),
    ("link", "ENOENT", "EPERM", LINK_ORDER),
    ("sync", "ok DIRECTORY ok", "ok DIRECTORY EBADF", DIR_SYNC),
    (
        "datasync",
        "ok DIRECTORY ok",
        "ok DIRECTORY EBADF",
        DIR_SYNC,
    ),
];

/// Whether two `fsrandom` lines differ only as [`RANDOM_DIFFERENCES`] allows.
fn accepted(valet: &str, stock: &str) -> bool {
    let ((vlab, vres), (slab, sres)) = (split(valet), split(stock));
    // Labels are `<call number> <call> <arguments>`.
    let call = vlab.split(' ').nth(1).unwrap_or("");
    vlab == slab
        && RANDOM_DIFFERENCES
            .iter()
            .any(|&(c, v, s, _)| c == call && v == vres && s == sres)
}

/// Random sequences of file-system calls (the `fsrandom` guest: opens, writes and reads at
/// the position and at offsets, seeks, size changes, syncs, renames, links, symlinks,
/// directories) give stock wasmtime's transcript over a host directory, both under
/// `valet-run` on the store and under `valet-run --dir` over another host directory; the
/// store's tree after a remount is the one stock left on disk.
/// `VALET_FSRANDOM_SEEDS=N` runs seeds 1..=N (default 12, 400 calls each); `FSPROBE_DUMP=DIR`
/// writes the transcripts out.
#[test]
fn random_call_sequences_match_stock_wasmtime_and_survive_a_remount() {
    let probe = valet_guests::FSRANDOM;
    let seeds = std::env::var("VALET_FSRANDOM_SEEDS").unwrap_or_else(|_| "12".into());
    let run = ["fsrandom", "/data", "run", "1", &seeds, "400"];
    let dump = ["fsrandom", "/data", "dump"];
    // Each seed leaves about 100 KB behind: room for them all (the image is sparse).
    let zones = (16 + seeds.parse::<u64>().unwrap() / 8).to_string();
    let dev = tempfile::tempdir().unwrap();
    let valet_dir = tempfile::tempdir().unwrap();
    let mut mount = valet_dir.path().as_os_str().to_owned();
    mount.push("::/data");
    let valet = |host_dir: bool, args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_valet-run"));
        command.arg("--device").arg(dev.path());
        if host_dir {
            // The store moves out of the way of the host directory.
            command.args(["--mount", "/store", "--dir"]).arg(&mount);
        } else {
            command.args(["--zone-size", "16", "--zones", &zones]);
        }
        let out = command
            .args([probe, "--"])
            .args(&args[1..])
            .output()
            .expect("running valet-run");
        assert!(
            out.status.success(),
            "fsrandom failed under valet-run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let host = tempfile::tempdir().unwrap();
    let stock = |args: &[&str]| {
        let out = stock::run(probe, args, &[(host.path(), "/data")]);
        assert_eq!(
            out.code, 0,
            "fsrandom failed under stock WASI: {}",
            out.stderr
        );
        out.stdout
    };
    for (what, args) in [
        ("the calls", &run[..]),
        ("the tree after a remount", &dump[..]),
    ] {
        let s = stock(args);
        for (on, host_dir) in [("store", false), ("host directory", true)] {
            let v = valet(host_dir, args);
            if let Some(dir) = std::env::var_os("FSPROBE_DUMP") {
                let dir = std::path::PathBuf::from(dir);
                let name = |who: &str| format!("fsrandom-{}-{who}.txt", args[2]);
                std::fs::write(dir.join(name(&on.replace(' ', "-"))), &v).unwrap();
                std::fs::write(dir.join(name("stock")), &s).unwrap();
            }
            assert!(v.lines().count() > 100, "{v}");
            if let Some((i, (vl, sl))) = v
                .lines()
                .zip(s.lines())
                .enumerate()
                .find(|(_, (vl, sl))| vl != sl && !accepted(vl, sl))
            {
                panic!(
                    "{what} on the {on} differ from stock wasmtime's at line {}:\n  valet: {vl}\n  \
                     stock: {sl}",
                    i + 1
                );
            }
            assert_eq!(
                v.lines().count(),
                s.lines().count(),
                "{what} on the {on}: one transcript ends early"
            );
        }
    }
}
