//! One tenant of a multi-tenant run: writes and fsyncs its own files, then checks that its
//! root holds only its own files and that `..` from the root is refused.
//! Usage: tenant_writer NAME DIR FILES SIZE
//!
//! Writes DIR/NAME-<i>.bin (i < FILES, SIZE + i bytes each) and DIR/NAME-dir/nested.bin,
//! byte j of file key k being `pattern(k, j)` (the test computes the same). Prints
//! `NAME: entries: ...` and `NAME: <probe>: <outcome>` lines, then `NAME: ok`.
//! Exit codes: 0 good, 2 usage, 3 a foreign entry is visible, 4 data mismatch, 5 `..` was
//! not refused with EPERM.

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};

/// Byte `j` of the file with key `k`.
fn pattern(k: u64, j: u64) -> u8 {
    ((j.wrapping_mul(2654435761) >> 7) ^ k.wrapping_mul(0x9e37)) as u8
}

fn key(name: &str, i: u64) -> u64 {
    name.bytes()
        .fold(i, |h, b| h.wrapping_mul(131).wrapping_add(b as u64))
}

fn write_file(path: &str, k: u64, size: u64) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {path}: {e}"));
    let mut j = 0;
    while j < size {
        let n = (size - j).min(8192);
        let chunk: Vec<u8> = (j..j + n).map(|x| pattern(k, x)).collect();
        f.write_all(&chunk).expect("write");
        j += n;
    }
    f.sync_all().expect("fsync");
}

fn check_file(path: &str, k: u64, size: u64) -> bool {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .unwrap_or_else(|e| panic!("read {path}: {e}"));
    data.len() as u64 == size
        && data
            .iter()
            .enumerate()
            .all(|(j, &b)| b == pattern(k, j as u64))
}

/// A probe that must fail with EPERM.
fn refused(name: &str, what: &str, result: std::io::Result<()>) -> bool {
    match result {
        Ok(()) => {
            println!("{name}: {what}: allowed");
            false
        }
        Err(e) => {
            println!(
                "{name}: {what}: {:?} (errno {:?})",
                e.kind(),
                e.raw_os_error()
            );
            e.kind() == ErrorKind::PermissionDenied
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: tenant_writer NAME DIR FILES SIZE");
        std::process::exit(2);
    }
    let (name, dir) = (&args[1], &args[2]);
    let files: u64 = args[3].parse().expect("FILES");
    let size: u64 = args[4].parse().expect("SIZE");

    for i in 0..files {
        write_file(&format!("{dir}/{name}-{i}.bin"), key(name, i), size + i);
    }
    fs::create_dir(format!("{dir}/{name}-dir")).expect("mkdir");
    write_file(
        &format!("{dir}/{name}-dir/nested.bin"),
        key(name, files),
        size,
    );

    let mut entries: Vec<String> = fs::read_dir(dir)
        .expect("readdir")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    entries.sort();
    println!("{name}: entries: {}", entries.join(" "));
    if let Some(foreign) = entries.iter().find(|e| !e.starts_with(name.as_str())) {
        println!("{name}: foreign entry {foreign}");
        std::process::exit(3);
    }

    let intact = (0..files)
        .all(|i| check_file(&format!("{dir}/{name}-{i}.bin"), key(name, i), size + i))
        && check_file(
            &format!("{dir}/{name}-dir/nested.bin"),
            key(name, files),
            size,
        );
    if !intact {
        println!("{name}: data mismatch");
        std::process::exit(4);
    }

    let up = format!("{dir}/..");
    let probes = [
        refused(name, "readdir ..", fs::read_dir(&up).map(drop)),
        refused(name, "stat ..", fs::metadata(&up).map(drop)),
        refused(
            name,
            "create ../x",
            File::create(format!("{up}/x")).map(drop),
        ),
        refused(
            name,
            "open dir/../../x",
            File::open(format!("{dir}/{name}-dir/../../x")).map(drop),
        ),
    ];
    if probes.iter().any(|ok| !ok) {
        std::process::exit(5);
    }
    println!("{name}: ok");
}
