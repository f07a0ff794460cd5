//! escape: tries every path trick that could reach outside a preopened directory and prints
//! each outcome, one line per attempt: `MOUNT: trick -> result`.
//!
//! Tricks: `..` at and below the root, `a/../../x`, `//`, absolute paths, symlinks (making
//! one and going through it, chains of links that climb out, creating through a dangling
//! link that points out, a link that stays inside but climbs above a descriptor, loops), NUL in a name, non-UTF-8 names (raw bytes), 4 KiB names and
//! paths, very deep paths, renaming and linking out of the mount and across mounts, and
//! opening the mount's parent. The host side of the test checks that nothing outside the
//! mounts changed; the names used (`sentinel.txt`, `outside/`) are the ones it planted
//! around them.
//!
//! Usage: escape MOUNT [OTHER_MOUNT]   (each a preopened directory that starts empty)

#[path = "../rawfs.rs"]
mod rawfs;

use rawfs::{
    mkdir_raw, open_raw, rename_raw, show, stat_raw, unlink_raw, write_all, ALL, FOLLOW, R, RO,
};
use wasi::Fd;

const DIRECTORY: wasi::Oflags = wasi::OFLAGS_DIRECTORY;
const CREAT: wasi::Oflags = wasi::OFLAGS_CREAT;

fn ok<T>(r: R<T>) -> R<String> {
    r.map(|_| String::new())
}

/// Opens (and closes) `path`; reports the kind of what was opened.
fn open_close(dir: Fd, path: &[u8], oflags: wasi::Oflags, rights: wasi::Rights) -> R<String> {
    let fd = open_raw(dir, FOLLOW, path, oflags, rights, 0)?;
    let kind = unsafe { wasi::fd_fdstat_get(fd) }.map(|s| s.fs_filetype.name().to_string());
    unsafe { wasi::fd_close(fd) }?;
    kind
}

/// Creates `path` and writes a marker into it.
fn create(dir: Fd, path: &[u8]) -> R<String> {
    let fd = open_raw(dir, FOLLOW, path, CREAT, ALL, 0)?;
    let r = write_all(fd, b"escaped?");
    unsafe { wasi::fd_close(fd) }?;
    ok(r)
}

fn tricks(m: &str, root: Fd, other: Option<Fd>) {
    let t = |label: &str, r: R<String>| show(&format!("{m}: {label}"), r);

    // The mount's parent and `..` at the root.
    t(
        "open .. (directory)",
        open_close(root, b"..", DIRECTORY, RO),
    );
    t(
        "open ../ (directory)",
        open_close(root, b"../", DIRECTORY, RO),
    );
    t(
        "open ./.. (directory)",
        open_close(root, b"./..", DIRECTORY, RO),
    );
    t(
        "open ../.. (directory)",
        open_close(root, b"../..", DIRECTORY, RO),
    );
    t("stat ..", stat_raw(root, b".."));
    t("stat ../sentinel.txt", stat_raw(root, b"../sentinel.txt"));
    t(
        "read ../sentinel.txt",
        open_close(root, b"../sentinel.txt", 0, RO),
    );
    t("create ../escaped", create(root, b"../escaped"));
    t(
        "create ../outside/escaped",
        create(root, b"../outside/escaped"),
    );
    t(
        "mkdir ../escaped-dir",
        ok(mkdir_raw(root, b"../escaped-dir")),
    );
    t(
        "unlink ../sentinel.txt",
        ok(unlink_raw(root, b"../sentinel.txt")),
    );
    t(
        "rmdir ../outside",
        ok(unsafe { wasi::path_remove_directory(root, "../outside") }),
    );
    t(
        "set times of ../sentinel.txt",
        ok(unsafe {
            wasi::path_filestat_set_times(
                root,
                FOLLOW,
                "../sentinel.txt",
                0,
                0,
                wasi::FSTFLAGS_MTIM_NOW,
            )
        }),
    );
    t(
        "truncate ../sentinel.txt",
        open_close(root, b"../sentinel.txt", wasi::OFLAGS_TRUNC, ALL),
    );

    // `..` below the root.
    t("mkdir a", ok(mkdir_raw(root, b"a")));
    t("stat a/..", stat_raw(root, b"a/.."));
    t("stat a/../..", stat_raw(root, b"a/../.."));
    t("create a/../../escaped", create(root, b"a/../../escaped"));
    t(
        "read a/../../sentinel.txt",
        open_close(root, b"a/../../sentinel.txt", 0, RO),
    );
    t(
        "create a/./../../escaped",
        create(root, b"a/./../../escaped"),
    );
    t(
        "create a//..//..//escaped",
        create(root, b"a//..//..//escaped"),
    );
    t("create a/../inside", create(root, b"a/../inside"));
    let a = open_raw(root, FOLLOW, b"a", DIRECTORY, RO, 0).unwrap_or(u32::MAX);
    t(
        "from a: open .. (directory)",
        open_close(a, b"..", DIRECTORY, RO),
    );
    t("from a: stat ../inside", stat_raw(a, b"../inside"));
    t("from a: create ../../escaped", create(a, b"../../escaped"));
    let _ = unsafe { wasi::fd_close(a) };

    // `//` and absolute paths.
    t("stat /", stat_raw(root, b"/"));
    t("stat //", stat_raw(root, b"//"));
    t("read /etc/passwd", open_close(root, b"/etc/passwd", 0, RO));
    t(
        "read //etc/passwd",
        open_close(root, b"//etc/passwd", 0, RO),
    );
    t("create /escaped", create(root, b"/escaped"));
    t("create //escaped", create(root, b"//escaped"));
    t("create a//inside2", create(root, b"a//inside2"));
    t(
        "mkdir /tmp/escaped-dir",
        ok(mkdir_raw(root, b"/tmp/escaped-dir")),
    );
    t(
        "open /data/.. (directory)",
        open_close(root, b"/data/..", DIRECTORY, RO),
    );

    // Symlinks: making one, and going through it.
    t(
        "symlink up -> ..",
        ok(unsafe { wasi::path_symlink("..", root, "up") }),
    );
    t(
        "symlink abs -> /",
        ok(unsafe { wasi::path_symlink("/", root, "abs") }),
    );
    t(
        "symlink a/deep -> ../../sentinel.txt",
        ok(unsafe { wasi::path_symlink("../../sentinel.txt", root, "a/deep") }),
    );
    t(
        "read up/sentinel.txt",
        open_close(root, b"up/sentinel.txt", 0, RO),
    );
    t("create up/escaped", create(root, b"up/escaped"));
    t(
        "read abs/etc/passwd",
        open_close(root, b"abs/etc/passwd", 0, RO),
    );
    t("read a/deep", open_close(root, b"a/deep", 0, RO));
    t(
        "write a/deep",
        open_close(root, b"a/deep", wasi::OFLAGS_TRUNC, ALL),
    );
    t(
        "open up (directory)",
        open_close(root, b"up", DIRECTORY, RO),
    );
    t("stat up/outside", stat_raw(root, b"up/outside"));
    t(
        "set times through up/sentinel.txt",
        ok(unsafe {
            wasi::path_filestat_set_times(
                root,
                FOLLOW,
                "up/sentinel.txt",
                0,
                0,
                wasi::FSTFLAGS_MTIM_NOW,
            )
        }),
    );
    t(
        "link up/sentinel.txt -> stolen",
        ok(unsafe { wasi::path_link(root, 0, "up/sentinel.txt", root, "stolen") }),
    );
    t(
        "rename up/sentinel.txt -> stolen",
        ok(unsafe { wasi::path_rename(root, "up/sentinel.txt", root, "stolen") }),
    );
    t(
        "unlink up/sentinel.txt",
        ok(unlink_raw(root, b"up/sentinel.txt")),
    );
    for link in ["up", "abs", "a/deep"] {
        let _ = unlink_raw(root, link.as_bytes());
    }

    // Links that lead out in more than one step, or only when created through.
    t(
        "symlink a/up2 -> ../..",
        ok(unsafe { wasi::path_symlink("../..", root, "a/up2") }),
    );
    t(
        "read a/up2/sentinel.txt",
        open_close(root, b"a/up2/sentinel.txt", 0, RO),
    );
    t(
        "symlink hop -> a/up2 (a link to a link)",
        ok(unsafe { wasi::path_symlink("a/up2", root, "hop") }),
    );
    t("read hop/sentinel.txt", open_close(root, b"hop/sentinel.txt", 0, RO));
    t("stat hop/outside/x.txt", stat_raw(root, b"hop/outside/x.txt"));
    t(
        "symlink dd -> a/../.. (.. inside the target)",
        ok(unsafe { wasi::path_symlink("a/../..", root, "dd") }),
    );
    t("read dd/sentinel.txt", open_close(root, b"dd/sentinel.txt", 0, RO));
    t(
        "symlink out -> ../escaped (dangling)",
        ok(unsafe { wasi::path_symlink("../escaped", root, "out") }),
    );
    t("create out (through the dangling link)", create(root, b"out"));
    t(
        "create out CREAT|EXCL",
        ok(open_raw(root, FOLLOW, b"out", CREAT | wasi::OFLAGS_EXCL, ALL, 0)),
    );
    t("mkdir hop/escaped-dir", ok(mkdir_raw(root, b"hop/escaped-dir")));
    t(
        "symlink hop2 -> hop/outside (through a link)",
        ok(unsafe { wasi::path_symlink("hop/outside", root, "hop2") }),
    );
    t("read hop2/x.txt", open_close(root, b"hop2/x.txt", 0, RO));
    t(
        "symlink a/back -> ../inside",
        ok(unsafe { wasi::path_symlink("../inside", root, "a/back") }),
    );
    t("read a/back (stays inside)", open_close(root, b"a/back", 0, RO));
    let a = open_raw(root, FOLLOW, b"a", DIRECTORY, RO, 0).unwrap_or(u32::MAX);
    t("from a: read back (climbs above a)", open_close(a, b"back", 0, RO));
    let _ = unsafe { wasi::fd_close(a) };
    t(
        "symlink l1 -> l2, l2 -> l1",
        ok(unsafe { wasi::path_symlink("l2", root, "l1") })
            .and(ok(unsafe { wasi::path_symlink("l1", root, "l2") })),
    );
    t("read l1 (a loop)", open_close(root, b"l1", 0, RO));
    for link in ["a/up2", "hop", "dd", "out", "hop2", "a/back", "l1", "l2"] {
        let _ = unlink_raw(root, link.as_bytes());
    }

    // NUL, non-UTF-8 and long names.
    t("create a\\0b", create(root, b"a\0b"));
    t("create ..\\0/escaped", create(root, b"..\0/escaped"));
    t(
        "create inside\\0../../escaped",
        create(root, b"inside\0../../escaped"),
    );
    t("create bad\\xff", create(root, b"bad\xff"));
    t("create ..\\xff/escaped", create(root, b"..\xff/escaped"));
    t("create ../\\xff", create(root, b"../\xff"));
    t(
        "mkdir \\xc0\\xaf (overlong '/')",
        ok(mkdir_raw(root, b"\xc0\xaf")),
    );
    t(
        "create ..\\\\escaped (a backslash is a name byte)",
        create(root, b"..\\escaped"),
    );
    t("create 255-byte name", create(root, &[b'n'; 255]));
    t("create 256-byte name", create(root, &[b'n'; 256]));
    t("create 4096-byte name", create(root, &[b'n'; 4096]));
    t("mkdir 4096-byte name", ok(mkdir_raw(root, &[b'n'; 4096])));
    let mut long = b"a/".repeat(2048);
    long.extend_from_slice(b"x");
    t(
        "create (a/ x 2048)x (4 KiB path, missing dirs)",
        create(root, &long),
    );
    let mut dots = b"./".repeat(2048);
    dots.extend_from_slice(b"inside3");
    t(
        "create (./ x 2048)inside3 (4 KiB path)",
        create(root, &dots),
    );
    let mut up = b"./".repeat(2048);
    up.extend_from_slice(b"../escaped");
    t("create (./ x 2048)../escaped", create(root, &up));
    let mut back = b"a/../".repeat(1000);
    back.extend_from_slice(b"../escaped");
    t("create (a/../ x 1000)../escaped", create(root, &back));

    // Very deep paths.
    const DEPTH: usize = 300;
    let mut deep = Vec::new();
    let mut made = 0;
    for _ in 0..DEPTH {
        deep.extend_from_slice(b"d/");
        if mkdir_raw(root, &deep[..deep.len() - 1]).is_ok() {
            made += 1;
        }
    }
    println!("{m}: mkdir {DEPTH} nested directories -> {made} made");
    let mut bottom = deep.clone();
    bottom.extend_from_slice(b"bottom");
    t("create at the bottom", create(root, &bottom));
    let mut climb = deep.clone();
    climb.extend(b"../".repeat(DEPTH));
    climb.extend_from_slice(b"inside4");
    t("create (d/ x 300)(../ x 300)inside4", create(root, &climb));
    let mut over = deep.clone();
    over.extend(b"../".repeat(DEPTH + 1));
    over.extend_from_slice(b"sentinel.txt");
    t(
        "read (d/ x 300)(../ x 301)sentinel.txt",
        open_close(root, &over, 0, RO),
    );
    let mut over = deep.clone();
    over.extend(b"../".repeat(DEPTH + 1));
    over.extend_from_slice(b"escaped");
    t("create (d/ x 300)(../ x 301)escaped", create(root, &over));
    let bottom_dir = open_raw(root, FOLLOW, &deep, DIRECTORY, RO, 0).unwrap_or(u32::MAX);
    let mut up = b"../".repeat(DEPTH);
    up.extend_from_slice(b"inside5");
    t(
        "from the bottom: create (../ x 300)inside5",
        create(bottom_dir, &up),
    );
    let mut up = b"../".repeat(DEPTH + 1);
    up.extend_from_slice(b"escaped");
    t(
        "from the bottom: create (../ x 301)escaped",
        create(bottom_dir, &up),
    );
    let _ = unsafe { wasi::fd_close(bottom_dir) };

    // Renaming and linking out of the mount.
    let _ = create(root, b"f");
    let _ = mkdir_raw(root, b"dir");
    t(
        "rename f -> ../escaped",
        ok(rename_raw(root, b"f", root, b"../escaped")),
    );
    t(
        "rename f -> /tmp/escaped",
        ok(rename_raw(root, b"f", root, b"/tmp/escaped")),
    );
    t(
        "rename f -> a/../../escaped",
        ok(rename_raw(root, b"f", root, b"a/../../escaped")),
    );
    t(
        "rename dir -> ../escaped-dir",
        ok(rename_raw(root, b"dir", root, b"../escaped-dir")),
    );
    t(
        "rename ../sentinel.txt -> stolen",
        ok(rename_raw(root, b"../sentinel.txt", root, b"stolen")),
    );
    t(
        "rename ../outside -> stolen-dir",
        ok(rename_raw(root, b"../outside", root, b"stolen-dir")),
    );
    t(
        "rename . -> moved (the mount itself)",
        ok(rename_raw(root, b".", root, b"moved")),
    );
    t(
        "rename a -> a/inner (below itself)",
        ok(rename_raw(root, b"a", root, b"a/inner")),
    );
    t(
        "link f -> ../escaped",
        ok(unsafe { wasi::path_link(root, 0, "f", root, "../escaped") }),
    );
    t(
        "link ../sentinel.txt -> stolen",
        ok(unsafe { wasi::path_link(root, 0, "../sentinel.txt", root, "stolen") }),
    );
    t(
        "link /etc/passwd -> stolen",
        ok(unsafe { wasi::path_link(root, 0, "/etc/passwd", root, "stolen") }),
    );
    t(
        "rmdir . (the mount itself)",
        ok(unsafe { wasi::path_remove_directory(root, ".") }),
    );
    t(
        "rmdir .. (the mount's parent)",
        ok(unsafe { wasi::path_remove_directory(root, "..") }),
    );
    if let Some(other) = other {
        t(
            "rename f -> the other mount",
            ok(rename_raw(root, b"f", other, b"moved-here")),
        );
        t(
            "link f -> the other mount",
            ok(unsafe { wasi::path_link(root, 0, "f", other, "linked-here") }),
        );
        t(
            "rename f -> the other mount's ../escaped",
            ok(rename_raw(root, b"f", other, b"../escaped")),
        );
    }

    // What the guest can see at the end: only its own files.
    t(
        "listing",
        rawfs::readdir(root, 4096, 0).map(|entries| {
            let mut names: Vec<String> = entries
                .iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .map(|n| {
                    if n.len() > 40 {
                        format!("<{} bytes>", n.len())
                    } else {
                        n
                    }
                })
                .collect();
            names.sort();
            names.join(" ")
        }),
    );
}

fn main() {
    let mounts: Vec<String> = std::env::args().skip(1).collect();
    let fds: Vec<(String, Fd)> = mounts
        .iter()
        .map(|m| match rawfs::find_preopen(m) {
            Some(fd) => (m.clone(), fd),
            None => {
                println!("no preopened directory {m}");
                std::process::exit(2);
            }
        })
        .collect();
    for (i, (m, fd)) in fds.iter().enumerate() {
        let other = fds
            .iter()
            .enumerate()
            .find(|(j, _)| *j != i)
            .map(|(_, (_, f))| *f);
        tricks(m, *fd, other);
    }
}
