//! LevelDB 1.22 (C++) with our single-threaded port, our POSIX/WASI `Env` and our
//! db_bench-compatible driver (`leveldb/`), built for wasm32-wasi and for the host.
//!
//! LevelDB's source comes from the `leveldb-sys` crate (pinned in Cargo.toml, never built
//! itself), found with `cargo metadata`. Its files stay untouched: defining
//! `LEVELDB_PLATFORM_CHROMIUM` makes `port/port.h` include `port/port_chromium.h`, which
//! our include directory, first on the path, provides. Objects are cached in the target
//! directory (see [`object_dir`]) and recompiled only when their source, our port header or
//! the compiler flags change, so edits elsewhere in `guests/` do not cost a LevelDB rebuild.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::SystemTime;

use crate::toolchain::{self, WasiClang};
use crate::{Ctx, Guest};

/// The LevelDB library sources (CMakeLists.txt's `leveldb` target, without the C API).
const LEVELDB_SOURCES: &[&str] = &[
    "db/builder.cc",
    "db/db_impl.cc",
    "db/db_iter.cc",
    "db/dbformat.cc",
    "db/dumpfile.cc",
    "db/filename.cc",
    "db/log_reader.cc",
    "db/log_writer.cc",
    "db/memtable.cc",
    "db/repair.cc",
    "db/table_cache.cc",
    "db/version_edit.cc",
    "db/version_set.cc",
    "db/write_batch.cc",
    "table/block.cc",
    "table/block_builder.cc",
    "table/filter_block.cc",
    "table/format.cc",
    "table/iterator.cc",
    "table/merger.cc",
    "table/table.cc",
    "table/table_builder.cc",
    "table/two_level_iterator.cc",
    "util/arena.cc",
    "util/bloom.cc",
    "util/cache.cc",
    "util/coding.cc",
    "util/comparator.cc",
    "util/crc32c.cc",
    "util/env.cc",
    "util/filter_policy.cc",
    "util/hash.cc",
    "util/logging.cc",
    "util/options.cc",
    "util/status.cc",
];

/// Ours, in `guests/leveldb/`.
const OUR_SOURCES: &[&str] = &["valet_env.cc", "bench.cc"];
const PORT_HEADER: &str = "leveldb/port/port_chromium.h";

/// The crate that ships the source, its exact version (as pinned in Cargo.toml), and where
/// in it LevelDB lives.
const SOURCE_CRATE: &str = "leveldb-sys";
const SOURCE_VERSION: &str = "2.0.9";
const SOURCE_SUBDIR: &str = "deps/leveldb-1.22";

/// Compilers running at once (the machine is small and shared).
const JOBS: usize = 2;

pub fn build(ctx: &mut Ctx) {
    ctx.watch("leveldb");
    let clang = match toolchain::wasi_clang(true) {
        Ok(clang) => clang,
        Err(reason) => return ctx.skip("leveldb", &reason),
    };
    let source = match leveldb_source(ctx) {
        Ok(source) => source,
        Err(reason) => return ctx.skip("leveldb", &reason),
    };
    let ours = ctx.manifest_dir.join("leveldb");
    let common: Vec<String> = vec![
        "-O2".into(),
        "-DNDEBUG".into(),
        "-DLEVELDB_PLATFORM_CHROMIUM=1".into(),
        "-fno-rtti".into(),
        format!("-I{}", ours.display()),
        format!("-I{}", source.display()),
        format!("-I{}", source.join("include").display()),
    ];
    let inputs: Vec<(PathBuf, bool)> = LEVELDB_SOURCES
        .iter()
        .map(|s| (source.join(s), false))
        .chain(OUR_SOURCES.iter().map(|s| (ours.join(s), true)))
        .collect();
    let port_header = ctx.manifest_dir.join(PORT_HEADER);

    let wasm = ctx.out_dir.join("leveldb.wasm");
    let wasm_cxx = || {
        let mut command = clang.cxx();
        command.args(&common);
        command
    };
    // LevelDB keeps blocks and keys on the stack: more than wasm-ld's default 64 KiB.
    let wasm_link = ["-Wl,-z,stack-size=1048576"];
    build_target(
        &ctx.out_dir,
        "wasm",
        &inputs,
        &port_header,
        &wasm_cxx,
        &wasm_link,
        &wasm,
    );

    let native = ctx.out_dir.join("leveldb-native");
    let native_cxx = || {
        let mut command = native_compiler(&clang);
        command
            .args(["-std=c++17", "-fno-exceptions"])
            .args(&common);
        command
    };
    build_target(
        &ctx.out_dir,
        "host",
        &inputs,
        &port_header,
        &native_cxx,
        &[],
        &native,
    );

    ctx.guests.push(Guest {
        name: "leveldb".into(),
        doc: "LevelDB 1.22 with a db_bench-compatible single-threaded driver \
              (`--benchmarks=fillseq,... --num N --verify=1`)."
            .into(),
        wasm,
        native: Some(native),
    });
}

/// The host's C++ compiler: `$CXX`, or clang++ (found with the WASI toolchain).
fn native_compiler(clang: &WasiClang) -> Command {
    println!("cargo:rerun-if-env-changed=CXX");
    Command::new(std::env::var("CXX").unwrap_or_else(|_| clang.cxx.to_string()))
}

/// The directory of LevelDB's source inside the registry's copy of leveldb-sys.
fn leveldb_source(ctx: &Ctx) -> Result<PathBuf, String> {
    let dir = ctx
        .registry_package(SOURCE_CRATE, SOURCE_VERSION)?
        .join(SOURCE_SUBDIR);
    if !dir.join("include/leveldb/db.h").exists() {
        return Err(format!("{} holds no LevelDB", dir.display()));
    }
    Ok(dir)
}

fn mtime(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Where a target's objects are cached: `<target dir>/valet-leveldb/<kind>-<hash of the
/// commands>`, shared by every build of this crate (test, release and clippy builds each
/// have their own OUT_DIR, and LevelDB takes minutes to compile here); OUT_DIR itself when
/// the layout is not cargo's usual `<target>/<profile>/build/<crate>-<hash>/out`.
fn object_dir(out_dir: &Path, kind: &str, commands: &str) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    commands.hash(&mut hasher);
    let name = format!("{kind}-{:016x}", hasher.finish());
    let mut up = out_dir.ancestors();
    match (up.nth(2), up.nth(1)) {
        (Some(build), Some(target)) if build.file_name() == Some("build".as_ref()) => {
            target.join("valet-leveldb").join(name)
        }
        _ => out_dir.join(name),
    }
}

/// Compiles `inputs` (only what is out of date) and links `output`. Our own inputs
/// (`true`) also get warnings.
fn build_target(
    out_dir: &Path,
    kind: &str,
    inputs: &[(PathBuf, bool)],
    port_header: &Path,
    cxx: &dyn Fn() -> Command,
    link_flags: &[&str],
    output: &Path,
) {
    let obj_dir = object_dir(out_dir, kind, &format!("{:?} {link_flags:?}", cxx()));
    fs::create_dir_all(&obj_dir).unwrap();
    let header_time = mtime(port_header).expect("the port header exists");
    let mut objects = Vec::new();
    let mut stale = Vec::new();
    let mut renames = Vec::new();
    for (src, ours) in inputs {
        let stem = src.file_stem().unwrap().to_string_lossy();
        let obj = obj_dir.join(format!("{stem}.o"));
        let fresh =
            mtime(&obj).is_some_and(|t| t >= header_time && mtime(src).is_some_and(|s| t >= s));
        if !fresh {
            let mut command = cxx();
            if *ours {
                command.args(["-Wall", "-Wextra"]);
            } else {
                // LevelDB's own code: not ours to warn about.
                command.arg("-w");
            }
            // Another build may share the directory: objects appear whole or not at all.
            let tmp = obj_dir.join(format!("{stem}.o.{}", std::process::id()));
            command.arg("-c").arg(src).arg("-o").arg(&tmp);
            stale.push(command);
            renames.push((tmp, obj.clone()));
        }
        objects.push(obj);
    }
    run_all(stale);
    for (tmp, obj) in renames {
        fs::rename(tmp, obj).unwrap();
    }
    let relink =
        mtime(output).is_none_or(|out| objects.iter().any(|o| mtime(o).is_none_or(|t| t > out)));
    if relink {
        let mut link = cxx();
        link.args(link_flags).args(&objects).arg("-o").arg(output);
        run_all(vec![link]);
    }
}

/// Runs the commands, `JOBS` at a time; panics with a failing command's output.
fn run_all(commands: Vec<Command>) {
    let mut queue = commands.into_iter();
    let mut running: Vec<(String, Child)> = Vec::new();
    loop {
        while running.len() < JOBS {
            let Some(mut command) = queue.next() else {
                break;
            };
            let what = format!("{command:?}");
            let child = command
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {what}: {e}"));
            running.push((what, child));
        }
        if running.is_empty() {
            return;
        }
        let (what, child) = running.remove(0);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what} failed:\n{stderr}");
        for line in stderr.lines() {
            println!("cargo:warning={line}");
        }
    }
}
