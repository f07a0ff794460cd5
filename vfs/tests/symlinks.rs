//! Symbolic links in the store: made, read, followed and not followed, dangling, looping,
//! refused when they lead out, renamed, unlinked and hard-linked; kept across a remount
//! (from the journal, then from the checkpoint the mount writes) and across a power cut.

use std::sync::Arc;

use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Error, FileKind, Ino, OpenOptions, Store, StoreConfig};

fn geometry() -> Geometry {
    Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 960 * 1024,
        block_size: 4096,
        max_open: 6,
        max_active: 8,
    }
}

fn mount(dev: &Arc<MemoryDevice>) -> Store {
    let config = StoreConfig {
        buffers: 8,
        buffer_size: 64 * 1024,
        ..Default::default()
    };
    Store::open(dev.clone() as Arc<dyn ZonedDevice>, config).unwrap()
}

fn put(store: &Store, dir: Ino, path: &str, data: &[u8]) {
    let f = store.open_file(dir, path, OpenOptions::create()).unwrap();
    f.write_at(data, 0).unwrap();
    f.close().unwrap();
}

fn read(store: &Store, dir: Ino, path: &str) -> Result<Vec<u8>, Error> {
    let f = store.open_file(dir, path, OpenOptions::read())?;
    let mut buf = vec![0u8; 4096];
    let n = f.read_at(&mut buf, 0)?;
    buf.truncate(n);
    f.close()?;
    Ok(buf)
}

fn kind(store: &Store, dir: Ino, path: &str, follow: bool) -> Result<FileKind, Error> {
    Ok(store.metadata(store.lookup_at(dir, path, follow)?)?.kind)
}

/// The errno name of a result, for compact assertions.
fn err<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(Error::NotFound) => "ENOENT".into(),
        Err(Error::Exists) => "EEXIST".into(),
        Err(Error::NotDir) => "ENOTDIR".into(),
        Err(Error::IsDir) => "EISDIR".into(),
        Err(Error::Escape) => "EPERM (escape)".into(),
        Err(Error::Loop) => "ELOOP".into(),
        Err(Error::Invalid(_)) => "EINVAL".into(),
        Err(Error::NameTooLong) => "ENAMETOOLONG".into(),
        Err(e) => format!("{e}"),
    }
}

#[test]
fn create_read_follow_and_not_follow() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    store.create_dir(root, "d").unwrap();
    put(&store, root, "d/f", b"hello");
    store.symlink(root, "d/f", "lf").unwrap();
    store.symlink(root, "d", "ld").unwrap();

    assert_eq!(store.read_link(root, "lf").unwrap(), "d/f");
    assert_eq!(kind(&store, root, "lf", false).unwrap(), FileKind::Symlink);
    assert_eq!(kind(&store, root, "lf", true).unwrap(), FileKind::File);
    let meta = store
        .metadata(store.lookup_at(root, "lf", false).unwrap())
        .unwrap();
    assert_eq!((meta.size, meta.nlink), (3, 1));
    assert_eq!(read(&store, root, "lf").unwrap(), b"hello");
    // A link in the middle of a path is always followed, and `..` after it climbs from
    // where the link led.
    assert_eq!(read(&store, root, "ld/f").unwrap(), b"hello");
    assert_eq!(kind(&store, root, "ld/../d", false).unwrap(), FileKind::Dir);
    // A trailing slash follows; a link to a file with one is ENOTDIR.
    assert_eq!(kind(&store, root, "ld/", false).unwrap(), FileKind::Dir);
    assert_eq!(err(store.lookup_at(root, "lf/", false)), "ENOTDIR");
    // Writing through a link writes the target.
    let f = store.open_file(root, "lf", OpenOptions::create()).unwrap();
    f.write_at(b"J", 0).unwrap();
    f.close().unwrap();
    assert_eq!(read(&store, root, "d/f").unwrap(), b"Jello");
    // O_NOFOLLOW and O_EXCL do not go through the link.
    let nofollow = OpenOptions {
        nofollow: true,
        ..OpenOptions::read()
    };
    assert_eq!(
        err(store.open_file(root, "lf", nofollow).map(|_| ())),
        "ELOOP"
    );
    let exclusive = OpenOptions {
        exclusive: true,
        ..OpenOptions::create()
    };
    assert_eq!(
        err(store.open_file(root, "lf", exclusive).map(|_| ())),
        "EEXIST"
    );
    assert_eq!(err(store.read_link(root, "d/f")), "EINVAL");
    assert_eq!(err(store.read_link(root, "d")), "EINVAL");
    assert_eq!(err(store.read_link(root, "missing")), "ENOENT");

    // Listings report the kind.
    let mut entries = store.read_dir(root).unwrap();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let kinds: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("d", FileKind::Dir),
            ("ld", FileKind::Symlink),
            ("lf", FileKind::Symlink)
        ]
    );

    // Names that exist, parents that do not, bad targets.
    assert_eq!(err(store.symlink(root, "x", "lf")), "EEXIST");
    assert_eq!(err(store.symlink(root, "x", "d")), "EEXIST");
    assert_eq!(err(store.symlink(root, "x", "missing/l")), "ENOENT");
    assert_eq!(err(store.symlink(root, "x", "d/f/l")), "ENOTDIR");
    assert_eq!(err(store.symlink(root, "x", "new/")), "ENOENT");
    assert_eq!(err(store.symlink(root, "", "l")), "ENOENT");
    assert_eq!(
        err(store.symlink(root, "/etc/passwd", "l")),
        "EPERM (escape)"
    );
    assert_eq!(
        err(store.symlink(root, &"a".repeat(4096), "l")),
        "ENAMETOOLONG"
    );
    assert_eq!(err(store.symlink(root, "a\0b", "l")), "EINVAL");
    assert!(store.symlink(root, &"a/".repeat(2047), "long").is_ok());
    assert!(store.fsck().unwrap().is_clean());
    assert_eq!(store.fsck().unwrap().symlinks, 3);
}

#[test]
fn dangling_links_and_loops() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    store.symlink(root, "nowhere", "dang").unwrap();
    assert_eq!(
        kind(&store, root, "dang", false).unwrap(),
        FileKind::Symlink
    );
    assert_eq!(err(store.lookup(root, "dang")), "ENOENT");
    assert_eq!(err(read(&store, root, "dang")), "ENOENT");
    assert_eq!(err(store.create_dir(root, "dang")), "EEXIST");
    // Creating through a dangling link creates its target, as open(O_CREAT) does.
    put(&store, root, "dang", b"made");
    assert_eq!(read(&store, root, "nowhere").unwrap(), b"made");
    store.unlink(root, "dang").unwrap();
    assert_eq!(read(&store, root, "nowhere").unwrap(), b"made");

    store.symlink(root, "self", "self").unwrap();
    assert_eq!(err(store.lookup(root, "self")), "ELOOP");
    assert_eq!(err(store.lookup(root, "self/x")), "ELOOP");
    assert_eq!(err(read(&store, root, "self")), "ELOOP");
    assert_eq!(err(store.create_dir(root, "self/x")), "ELOOP");
    assert_eq!(
        kind(&store, root, "self", false).unwrap(),
        FileKind::Symlink
    );
    store.symlink(root, "pong", "ping").unwrap();
    store.symlink(root, "ping", "pong").unwrap();
    assert_eq!(err(store.lookup(root, "ping")), "ELOOP");

    // Linux follows at most 40 links in one walk: c{i} -> c{i-1}, c0 -> nowhere.
    store.symlink(root, "nowhere", "c0").unwrap();
    for i in 1..=40 {
        store
            .symlink(root, &format!("c{}", i - 1), &format!("c{i}"))
            .unwrap();
    }
    assert_eq!(read(&store, root, "c39").unwrap(), b"made");
    assert_eq!(err(read(&store, root, "c40")), "ELOOP");
    // Links met in the middle of a path count the same.
    store.create_dir(root, "dir").unwrap();
    store.symlink(root, "dir", "e0").unwrap();
    for i in 1..=40 {
        store
            .symlink(root, &format!("e{}", i - 1), &format!("e{i}"))
            .unwrap();
    }
    put(&store, root, "e39/x", b"x");
    assert_eq!(err(store.lookup(root, "e40/x")), "ELOOP");
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn links_never_lead_above_the_directory_walked_from() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let (_, other) = store.tenant("other").unwrap();
    put(&store, other, "secret", b"other tenant");
    put(&store, root, "top", b"top");
    let a = store.create_dir(root, "a").unwrap();
    store.symlink(root, "..", "up").unwrap();
    store.symlink(root, "../..", "a/up2").unwrap();
    store.symlink(root, "a/up2", "hop").unwrap();
    store.symlink(root, "a/../..", "dd").unwrap();
    store.symlink(root, "../other/secret", "steal").unwrap();
    store.symlink(root, "../top", "a/back").unwrap();
    store.symlink(root, "../escaped", "out").unwrap();
    for path in [
        "up/top",
        "a/up2/top",
        "hop/top",
        "dd/top",
        "steal",
        "hop/hop/top",
    ] {
        assert_eq!(err(store.lookup(root, path)), "EPERM (escape)", "{path}");
        assert_eq!(err(read(&store, root, path)), "EPERM (escape)", "{path}");
    }
    assert_eq!(
        err(store
            .open_file(root, "out", OpenOptions::create())
            .map(|_| ())),
        "EPERM (escape)"
    );
    assert_eq!(err(store.create_dir(root, "up/x")), "EPERM (escape)");
    assert_eq!(err(store.unlink(root, "up/top")), "EPERM (escape)");
    assert_eq!(
        err(store.rename(root, "up/top", root, "t")),
        "EPERM (escape)"
    );
    assert_eq!(err(store.link(root, "up/top", root, "t")), "EPERM (escape)");
    // Inside the walk's directory a climbing link is fine; from `a` itself it climbs out.
    assert_eq!(read(&store, root, "a/back").unwrap(), b"top");
    assert_eq!(err(read(&store, a, "back")), "EPERM (escape)");
    // Nothing was made anywhere: the other tenant holds its one file.
    assert_eq!(store.read_dir(other).unwrap().len(), 1);
    assert_eq!(err(store.lookup(root, "escaped")), "ENOENT");
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn unlink_rename_and_hard_links_of_links() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    put(&store, root, "f", b"data");
    let d = store.create_dir(root, "d").unwrap();
    put(&store, root, "d/in", b"in");
    store.symlink(root, "f", "l").unwrap();
    store.symlink(root, "d", "ld").unwrap();

    // Removal takes the link, never what it names.
    assert_eq!(err(store.remove_dir(root, "ld")), "ENOTDIR");
    // With a trailing slash the link is followed to tell what it names (as wasmtime).
    assert_eq!(err(store.unlink(root, "ld/")), "EISDIR");
    store.symlink(root, "f", "lf").unwrap();
    assert_eq!(err(store.unlink(root, "lf/")), "ENOTDIR");
    store.unlink(root, "lf").unwrap();
    store.unlink(root, "ld").unwrap();
    assert_eq!(read(&store, root, "d/in").unwrap(), b"in");

    // A rename moves the link (relative targets keep their text, so may now dangle).
    store.rename(root, "l", d, "l2").unwrap();
    assert_eq!(store.read_link(d, "l2").unwrap(), "f");
    assert_eq!(err(read(&store, d, "l2")), "ENOENT");
    assert_eq!(err(store.rename(root, "d/l2/", root, "x")), "ENOTDIR");
    store.rename(root, "d/l2", root, "l").unwrap();
    assert_eq!(read(&store, root, "l").unwrap(), b"data");
    // A link over a directory, a directory over a link, a file over a link.
    assert_eq!(err(store.rename(root, "l", root, "d")), "EISDIR");
    assert_eq!(err(store.rename(root, "d", root, "l")), "ENOTDIR");
    put(&store, root, "g", b"g");
    store.rename(root, "g", root, "l").unwrap();
    assert_eq!(kind(&store, root, "l", false).unwrap(), FileKind::File);
    assert_eq!(read(&store, root, "f").unwrap(), b"data");

    // link() names the link itself; linkat(AT_SYMLINK_FOLLOW) what it names.
    store.symlink(root, "f", "m").unwrap();
    store.link(root, "m", root, "hm").unwrap();
    let hm = store
        .metadata(store.lookup_at(root, "hm", false).unwrap())
        .unwrap();
    assert_eq!((hm.kind, hm.nlink), (FileKind::Symlink, 2));
    store.link_at(root, "m", true, root, "hf").unwrap();
    let hf = store
        .metadata(store.lookup_at(root, "hf", false).unwrap())
        .unwrap();
    assert_eq!((hf.kind, hf.nlink), (FileKind::File, 2));
    store.unlink(root, "m").unwrap();
    assert_eq!(store.read_link(root, "hm").unwrap(), "f");
    store.unlink(root, "hm").unwrap();
    // Times of the link itself.
    store.symlink(root, "f", "t").unwrap();
    let t = store.lookup_at(root, "t", false).unwrap();
    store.set_times(t, Some(5), Some(7)).unwrap();
    let meta = store.metadata(t).unwrap();
    assert_eq!((meta.atime_ns, meta.mtime_ns), (5, 7));
    assert_ne!(
        store
            .metadata(store.lookup(root, "f").unwrap())
            .unwrap()
            .mtime_ns,
        7
    );
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{}", report.findings());
    assert_eq!(report.symlinks, 1);
}

/// The namespace with its links, as the store shows it: (path, kind, target or content).
fn tree(store: &Store, dir: Ino, prefix: &str, out: &mut Vec<(String, String)>) {
    let mut entries = store.read_dir(dir).unwrap();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let path = format!("{prefix}{}", e.name);
        match e.kind {
            FileKind::Dir => {
                out.push((path.clone(), "dir".into()));
                tree(store, e.ino, &format!("{path}/"), out);
            }
            FileKind::Symlink => {
                let target = store.read_link(dir, &e.name).unwrap();
                out.push((path, format!("-> {target}")));
            }
            FileKind::File => {
                let data = read(store, dir, &e.name).unwrap();
                out.push((path, String::from_utf8_lossy(&data).into_owned()));
            }
        }
    }
}

fn snapshot(store: &Store, root: Ino) -> Vec<(String, String)> {
    let mut out = Vec::new();
    tree(store, root, "", &mut out);
    out
}

#[test]
fn links_survive_remounts_and_checkpoints() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    let before = {
        let store = mount(&dev);
        let (_, root) = store.tenant("app").unwrap();
        store.create_dir(root, "d").unwrap();
        put(&store, root, "d/f", b"payload");
        store.symlink(root, "d/f", "l").unwrap();
        store.symlink(root, "../f", "d/back").unwrap();
        store.symlink(root, "gone", "dangling").unwrap();
        store.symlink(root, "tmp", "removed").unwrap();
        store.unlink(root, "removed").unwrap();
        store.link(root, "l", root, "d/hard").unwrap();
        store.sync().unwrap();
        snapshot(&store, root)
    };
    // First mount: from the journal (and it writes a checkpoint); second: from that
    // checkpoint, whose snapshot holds no targets but carries them.
    for round in 0..3 {
        let store = mount(&dev);
        let (_, root) = store.tenant("app").unwrap();
        assert_eq!(snapshot(&store, root), before, "after remount {round}");
        assert_eq!(read(&store, root, "l").unwrap(), b"payload");
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "{}", report.findings());
        assert_eq!(report.symlinks, 3);
    }
    // Enough commits to fill the active metadata zone: the store checkpoints on its own.
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    let f = store.lookup(root, "d/f").unwrap();
    for i in 0..400u64 {
        store.set_times(f, Some(i), None).unwrap();
        store.sync().unwrap();
    }
    drop(store);
    dev.power_fail();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(snapshot(&store, root), before);
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn a_power_cut_keeps_synced_links_and_drops_unsynced_ones_whole() {
    let dev = Arc::new(MemoryDevice::new(geometry()).unwrap());
    {
        let store = mount(&dev);
        let (_, root) = store.tenant("app").unwrap();
        store.symlink(root, "synced-target", "synced").unwrap();
        store.symlink(root, "doomed-target", "doomed").unwrap();
        // Durable: a sync of the store's metadata (a directory fsync) covers them.
        store.sync().unwrap();
        store.symlink(root, "late-target", "late").unwrap();
        store.unlink(root, "doomed").unwrap();
        // Abandoned without a sync: the power fails now.
    }
    dev.power_fail();
    let store = mount(&dev);
    let (_, root) = store.tenant("app").unwrap();
    assert_eq!(store.read_link(root, "synced").unwrap(), "synced-target");
    // What was not synced is there whole or not at all.
    for (link, target) in [("late", "late-target"), ("doomed", "doomed-target")] {
        match store.read_link(root, link) {
            Ok(t) => assert_eq!(t, target),
            Err(e) => assert_eq!(err::<()>(Err(e)), "ENOENT"),
        }
    }
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{}", report.findings());
}
