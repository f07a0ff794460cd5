//! RocksDB 11.8.1 for wasm32-wasip1-threads: `db_bench`, `ldb`, a few of RocksDB's own tests
//! and our `acked_writer` (`rocksdb/`), linked against the threaded sysroot that
//! `.ci/setup-rocksdb` builds (clang 22, wasi-libc, libc++ with threads, gflags).
//!
//! RocksDB's source is the tree shipped in the `librocksdb-sys` crate (pinned in Cargo.toml,
//! never built itself), found with `cargo metadata` and checked by version; `src.mk` lists the
//! files. RocksDB stays unmodified but for `rocksdb/patches/*.patch` (applied to copies), with
//! a force-included port header (`rocksdb/port/wasi_port.h`) for the POSIX names WASI lacks.
//!
//! On request (`VALET_ROCKSDB_REPORT=1`) it also builds the comparison report's db_bench as
//! RocksDB's release build, for WASI and natively ([`report_db_bench`], [`native_db_bench`]).
//!
//! A cold build compiles about 420 files (roughly 10 minutes on 2 cores), so objects and
//! programs are cached outside the target directory, in the same cache as the sysroot
//! (`~/.cache/valet-rocksdb/build-<hash of compiler, sysroot and flags>`): `cargo clean`, a
//! fresh clone or another profile costs seconds once the cache is warm.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::SystemTime;

use crate::{Ctx, Guest};

/// The crate that ships RocksDB's source, its exact version, and where in it RocksDB lives.
const SOURCE_CRATE: &str = "librocksdb-sys";
const SOURCE_VERSION: &str = "0.19.0+11.8.1";
const ROCKSDB_VERSION: (&str, &str, &str) = ("11", "8", "1");

/// RocksDB's own tests built as programs (each has its own `main`). Which of the four candidates
/// build and run, and why the others do not, is in the README.
const TESTS: &[(&str, &str)] = &[
    ("env_test", "env/env_test.cc"),
    ("db_basic_test", "db/db_basic_test.cc"),
    ("db_io_failure_test", "db/db_io_failure_test.cc"),
    ("fault_injection_test", "db/fault_injection_test.cc"),
];

const CLANG: &str = "clang++-22";
const TARGET: &str = "wasm32-wasip1-threads";
const SETUP_HINT: &str = "run `bash .ci/setup-rocksdb` (clang 22 and a threaded WASI sysroot)";

/// Compilers running at once (the machine is small and shared).
const JOBS: usize = 2;

pub fn build(ctx: &mut Ctx) {
    ctx.watch("rocksdb");
    println!("cargo:rerun-if-env-changed=VALET_ROCKSDB_CACHE");
    let names = || {
        std::iter::once("rocksdb".to_string())
            .chain(["rocksdb_ldb".to_string(), "rocksdb_acked_writer".into()])
            .chain(TESTS.iter().map(|(t, _)| format!("rocksdb_{t}")))
    };
    let cache = cache_dir();
    let sysroot = cache.join("sysroot");
    let stamp = match fs::read_to_string(sysroot.join(".complete")) {
        Ok(stamp) => stamp,
        Err(_) => {
            let reason = format!("no sysroot at {}: {SETUP_HINT}", sysroot.display());
            return names().for_each(|n| ctx.skip(&n, &reason));
        }
    };
    println!(
        "cargo:rerun-if-changed={}",
        sysroot.join(".complete").display()
    );
    let clang_version = match Command::new(CLANG).arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => {
            let reason = format!("{CLANG} not found: {SETUP_HINT}");
            return names().for_each(|n| ctx.skip(&n, &reason));
        }
    };
    let source = match rocksdb_source(ctx) {
        Ok(source) => source,
        Err(reason) => return names().for_each(|n| ctx.skip(&n, &reason)),
    };
    let ours = ctx.manifest_dir.join("rocksdb");
    let src_mk = fs::read_to_string(source.join("src.mk")).expect("RocksDB's src.mk");
    let list = |var: &str| -> Vec<PathBuf> {
        make_list(&src_mk, var)
            .unwrap_or_else(|| panic!("src.mk has no {var}"))
            .iter()
            .map(|f| source.join(f))
            .collect()
    };

    let flags = compile_flags(&sysroot, &source, &ours);
    let key = format!(
        "{:016x}",
        fnv1a(&[
            &clang_version,
            &stamp,
            &recipe(&flags, &ours),
            SOURCE_VERSION
        ])
    );
    let build_dir = cache.join(format!("build-{key}"));
    let patched = apply_patches(&source, &ours.join("patches"), &build_dir.join("patched"));
    let cxx = || {
        let mut command = Command::new(CLANG);
        command.args(&flags);
        command
    };

    // The library: src.mk's LIB_SOURCES (patched files swapped in; util/build_version.cc
    // generated from its template, as RocksDB's Makefile does), and our runtime pieces.
    let version_cc = build_version(&source, &build_dir.join("generated"));
    let lib: Vec<PathBuf> = list("LIB_SOURCES")
        .into_iter()
        .map(|f| {
            patched
                .iter()
                .find(|(orig, _)| *orig == f)
                .map_or(f, |(_, p)| p.clone())
        })
        .map(|f| {
            if f.ends_with("util/build_version.cc") {
                version_cc.clone()
            } else {
                f
            }
        })
        .collect();
    let runtime = vec![ours.join("port/wasi_runtime.cc")];
    let tools = list("TOOL_LIB_SOURCES");
    let bench = list("BENCH_LIB_SOURCES");
    let mut test_lib = list("TEST_LIB_SOURCES");
    test_lib.push(source.join("third-party/gtest-1.8.1/fused-src/gtest/gtest-all.cc"));

    let mut programs: Vec<(String, String, Vec<PathBuf>)> = vec![
        (
            "rocksdb".into(),
            "RocksDB 11.8.1's db_bench (`--benchmarks=fillseq,... --num N --threads T`), \
             wasm32-wasip1-threads."
                .into(),
            // db_bench links RocksDB's test utilities (comparators, compressible strings).
            [&lib, &runtime, &tools, &bench]
                .into_iter()
                .flatten()
                .cloned()
                .chain([
                    source.join("test_util/testutil.cc"),
                    source.join("tools/db_bench.cc"),
                ])
                .collect(),
        ),
        (
            "rocksdb_ldb".into(),
            "RocksDB 11.8.1's ldb tool (`--db=DIR scan`, `get`, `checkconsistency`, ...).".into(),
            [&lib, &runtime, &tools]
                .into_iter()
                .flatten()
                .cloned()
                .chain([source.join("tools/ldb.cc")])
                .collect(),
        ),
        (
            "rocksdb_acked_writer".into(),
            "Writes random keys to RocksDB with sync=1, printing each acknowledged key \
             (`DB SEED COUNT`)."
                .into(),
            [&lib, &runtime]
                .into_iter()
                .flatten()
                .cloned()
                .chain([ours.join("acked_writer.cc")])
                .collect(),
        ),
    ];
    for (test, file) in TESTS {
        programs.push((
            format!("rocksdb_{test}"),
            format!("RocksDB 11.8.1's own `{file}` (gtest; `--gtest_filter=...`)."),
            [&lib, &runtime, &tools, &test_lib]
                .into_iter()
                .flatten()
                .cloned()
                .chain([source.join(file)])
                .collect(),
        ));
    }

    // Compile every distinct source once (all that is missing), then link each program.
    let obj_dir = build_dir.join("obj");
    fs::create_dir_all(&obj_dir).unwrap();
    let mut all: Vec<&PathBuf> = programs.iter().flat_map(|(_, _, s)| s).collect();
    all.sort();
    all.dedup();
    let mut jobs = Vec::new();
    for src in &all {
        let obj = object_path(&obj_dir, &source, &ours, src);
        if !fresh(&obj, src) {
            let mut command = cxx();
            if src.starts_with(&ours) {
                command.args(["-Wall", "-Wextra"]);
            } else {
                command.arg("-w");
            }
            jobs.push((command, (*src).clone(), obj));
        }
    }
    if !jobs.is_empty() {
        println!(
            "cargo:warning=building RocksDB for WASI: {} of {} files to compile (cached in {})",
            jobs.len(),
            all.len(),
            build_dir.display()
        );
    }
    compile_all(jobs);

    // The report's db_bench, as RocksDB's release build (see `report_flags`): for WASI,
    // and natively with db_bench's sources but our WASI runtime pieces.
    let report_wasm = report_db_bench(
        &cache,
        &report_flags(flags.clone()),
        [&clang_version, &stamp],
        &source,
        &ours,
        &programs[0].2,
    );
    let native_sources: Vec<PathBuf> = programs[0]
        .2
        .iter()
        .filter(|s| !runtime.contains(s))
        .cloned()
        .collect();
    let native = native_db_bench(&cache, &source, &ours, &native_sources, &clang_version);

    let bin_dir = build_dir.join("bin");
    fs::create_dir_all(&bin_dir).unwrap();
    for (name, doc, sources) in programs {
        let objects: Vec<PathBuf> = sources
            .iter()
            .map(|s| object_path(&obj_dir, &source, &ours, s))
            .collect();
        let wasm = bin_dir.join(format!("{name}.wasm"));
        link_if_stale(&flags, &objects, &wasm);
        ctx.guests.push(Guest {
            name,
            doc,
            wasm,
            native: None,
        });
    }
    if let Some(wasm) = report_wasm {
        ctx.guests.push(Guest {
            name: REPORT_DB_BENCH.into(),
            doc: "RocksDB 11.8.1's db_bench as RocksDB's release build (`NDEBUG`), for the \
                  comparison report; built with `VALET_ROCKSDB_REPORT=1` only."
                .into(),
            wasm,
            native,
        });
    }
}

/// The report's db_bench: built only on request, as is its native twin (the name is the
/// lookup name of both).
const REPORT_DB_BENCH: &str = "rocksdb_release";

/// The environment variable that asks for the report's builds (`.ci/setup-rocksdb-report`).
const REPORT_BUILDS: &str = "VALET_ROCKSDB_REPORT";

fn report_builds_requested() -> bool {
    println!("cargo:rerun-if-env-changed={REPORT_BUILDS}");
    std::env::var_os(REPORT_BUILDS).is_some_and(|v| v == "1")
}

/// The flags of the report's builds: the guest's, plus `NDEBUG` as in RocksDB's own release
/// build (`make release`). Without it every assert runs, and every kill point
/// (`TEST_KILL_RANDOM`, two on each `WritableFileWriter::Append`) builds two `std::string`s on
/// the heap: a profile of `fillrandom` under `valet-run` put 18 % of the time in wasi-libc's
/// malloc and free, half of it from those appends. The tests need the debug build's sync
/// points, so they keep it.
fn report_flags(mut flags: Vec<String>) -> Vec<String> {
    flags.push("-DNDEBUG".into());
    flags
}

/// db_bench for WASI with the report's flags, in a build directory of its own (objects
/// compiled with and without `NDEBUG` must not meet in one program). About 10 minutes on 2
/// cores, so only on request; otherwise a cached build of this recipe is used if there is
/// one.
fn report_db_bench(
    cache: &Path,
    flags: &[String],
    [clang_version, sysroot_stamp]: [&str; 2],
    source: &Path,
    ours: &Path,
    sources: &[PathBuf],
) -> Option<PathBuf> {
    let requested = report_builds_requested();
    let key = format!(
        "{:016x}",
        fnv1a(&[
            clang_version,
            sysroot_stamp,
            &recipe(flags, ours),
            SOURCE_VERSION,
            "report-v1"
        ])
    );
    let build_dir = cache.join(format!("report-{key}"));
    let wasm = build_dir
        .join("bin")
        .join(format!("{REPORT_DB_BENCH}.wasm"));
    if !requested {
        return wasm.exists().then_some(wasm);
    }
    fs::create_dir_all(build_dir.join("bin")).unwrap();
    let objects = compile_niced(
        "the report's db_bench for WASI",
        flags,
        sources,
        &build_dir.join("obj"),
        source,
        ours,
    );
    link_if_stale(flags, &objects, &wasm);
    Some(wasm)
}

/// `$VALET_ROCKSDB_CACHE`, else `$XDG_CACHE_HOME/valet-rocksdb`, else `~/.cache/valet-rocksdb`
/// (the same rule as `.ci/setup-rocksdb`).
fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VALET_ROCKSDB_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    base.join("valet-rocksdb")
}

/// Flags for every file; the link adds its own.
fn compile_flags(sysroot: &Path, source: &Path, ours: &Path) -> Vec<String> {
    let mut flags: Vec<String> = vec![
        format!("--target={TARGET}"),
        format!("--sysroot={}", sysroot.display()),
        "-pthread".into(),
        "-O2".into(),
        // Without NDEBUG: RocksDB's tests need its sync points and TEST_ hooks, which exist
        // only then. The report's db_bench, wasm and native, adds it (`report_flags`).
        "-std=c++20".into(),
        // Without wasm exception handling (stock wasmtime 36 cannot run it): a throw ends the
        // program (`port/wasi_runtime.cc`); none happens in the runs here.
        "-fexceptions".into(),
        "-DROCKSDB_PLATFORM_POSIX".into(),
        "-DROCKSDB_LIB_IO_POSIX".into(),
        // Not OS_LINUX: no fallocate, sync_file_range, fadvise or io_uring paths.
        "-DROCKSDB_NO_DYNAMIC_EXTENSION".into(),
        "-DGFLAGS=1".into(),
        "-D_WASI_EMULATED_MMAN".into(),
        "-D_WASI_EMULATED_PROCESS_CLOCKS".into(),
        "-D_WASI_EMULATED_GETPID".into(),
        "-D_WASI_EMULATED_SIGNAL".into(),
        // gtest's output capture needs dup/dup2/mkstemp, which WASI lacks.
        "-DGTEST_HAS_STREAM_REDIRECTION=0".into(),
        "-include".into(),
        ours.join("port/wasi_port.h").display().to_string(),
    ];
    for dir in [
        source.to_path_buf(),
        source.join("include"),
        source.join("third-party/gtest-1.8.1/fused-src"),
    ] {
        flags.push(format!("-I{}", dir.display()));
    }
    flags
}

/// The host build of db_bench (for the report's native row): the same sources, patches and
/// flags but the WASI target and its emulation, compiled by the same clang for the host with
/// the host's libstdc++ and gflags (Debian's `libgflags-dev`, 2.2.2 as in the sysroot).
///
/// About 20 CPU-minutes, so only on request: with `VALET_ROCKSDB_REPORT=1` it is built (under
/// `nice`) into `<cache>/native-<hash>/db_bench`; otherwise a cached one of this recipe is
/// used if there is one, and none is built (CI never builds it; `.ci/setup-rocksdb-report`
/// does).
fn native_db_bench(
    cache: &Path,
    source: &Path,
    ours: &Path,
    sources: &[PathBuf],
    clang_version: &str,
) -> Option<PathBuf> {
    // A native build finished by another cargo run (it renames its directory into the cache).
    println!("cargo:rerun-if-changed={}", cache.display());
    let flags = native_flags(source, ours);
    let key = format!(
        "{:016x}",
        fnv1a(&[
            clang_version,
            &recipe(&flags, ours),
            SOURCE_VERSION,
            "native-v1"
        ])
    );
    let done = cache.join(format!("native-{key}"));
    let exe = done.join("db_bench");
    if exe.exists() {
        return Some(exe);
    }
    if !report_builds_requested() {
        return None;
    }
    let build_dir = cache.join(format!("native-{key}.build"));
    let objects = compile_niced(
        "native db_bench",
        &flags,
        sources,
        &build_dir.join("obj"),
        source,
        ours,
    );
    let staged = build_dir.join("db_bench");
    let out = Command::new(CLANG)
        .args(&flags)
        .args(&objects)
        .args(["-lgflags", "-lpthread", "-o"])
        .arg(&staged)
        .output()
        .expect("running the linker");
    assert!(
        out.status.success(),
        "linking native db_bench failed (is libgflags-dev installed?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The finished program appears at once, in a directory of its own.
    let tmp = cache.join(format!("native-{key}.{}", std::process::id()));
    fs::create_dir_all(&tmp).unwrap();
    fs::rename(&staged, tmp.join("db_bench")).unwrap();
    fs::rename(&tmp, &done).unwrap();
    let _ = fs::remove_dir_all(&build_dir);
    Some(exe)
}

/// Compiles what is missing of `sources` into `obj_dir` with `flags`, under `nice` (the
/// report's builds are long and run beside other work), and returns every object, in the
/// sources' order.
fn compile_niced(
    what: &str,
    flags: &[String],
    sources: &[PathBuf],
    obj_dir: &Path,
    source: &Path,
    ours: &Path,
) -> Vec<PathBuf> {
    fs::create_dir_all(obj_dir).unwrap();
    let objects: Vec<PathBuf> = sources
        .iter()
        .map(|s| object_path(obj_dir, source, ours, s))
        .collect();
    let jobs: Vec<_> = sources
        .iter()
        .zip(&objects)
        .filter(|(src, obj)| !fresh(obj, src))
        .map(|(src, obj)| {
            let mut command = Command::new("nice");
            command.args(["-n", "5", CLANG]).args(flags).arg("-w");
            (command, src.clone(), obj.clone())
        })
        .collect();
    if !jobs.is_empty() {
        println!(
            "cargo:warning=building {what}: {} of {} files to compile (in {})",
            jobs.len(),
            sources.len(),
            obj_dir.display()
        );
    }
    compile_all(jobs);
    objects
}

/// The report's wasm flags for the host: the same optimisation, language, exceptions,
/// `NDEBUG`, RocksDB defines (POSIX port, still no OS_LINUX paths) and patches, without the
/// WASI target and emulation.
fn native_flags(source: &Path, ours: &Path) -> Vec<String> {
    let dummy = Path::new("/nonexistent-sysroot");
    let mut flags: Vec<String> = report_flags(compile_flags(dummy, source, ours))
        .into_iter()
        .filter(|f| {
            !f.starts_with("--target=")
                && !f.starts_with("--sysroot=")
                && !f.starts_with("-D_WASI_")
        })
        .collect();
    // glibc declares major()/minor() in sys/sysmacros.h, which RocksDB includes only with
    // OS_LINUX (the WASI build gets them from the port header).
    flags.extend(["-include".into(), "sys/sysmacros.h".into()]);
    flags
}

/// Links `output` unless it is newer than every one of its objects.
fn link_if_stale(flags: &[String], objects: &[PathBuf], output: &Path) {
    let stale =
        mtime(output).is_none_or(|out| objects.iter().any(|o| mtime(o).is_none_or(|t| t > out)));
    if stale {
        link(flags, objects, output);
    }
}

/// Links a program: shared memory for threads, 8 MiB main stack, up to 4 GiB of memory.
fn link(flags: &[String], objects: &[PathBuf], output: &Path) {
    let tmp = output.with_extension(format!("wasm.{}", std::process::id()));
    let mut command = Command::new(CLANG);
    command
        .args(flags)
        .args([
            "-Wl,--import-memory,--export-memory,--max-memory=4294967296",
            "-Wl,-z,stack-size=8388608",
        ])
        .args(objects)
        .args([
            "-lgflags",
            "-lwasi-emulated-mman",
            "-lwasi-emulated-process-clocks",
            "-lwasi-emulated-getpid",
            "-lwasi-emulated-signal",
            "-o",
        ])
        .arg(&tmp);
    let out = command.output().expect("running the linker");
    assert!(
        out.status.success(),
        "linking {} failed:\n{}",
        output.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    fs::rename(tmp, output).unwrap();
}

/// The variable's file list in `src.mk` (`VAR = a.cc b.cc \` continued over lines).
fn make_list(src_mk: &str, var: &str) -> Option<Vec<String>> {
    let mut lines = src_mk.lines();
    let first = lines.find(|l| {
        l.split_once('=')
            .is_some_and(|(name, _)| name.trim() == var)
    })?;
    let mut text = first.split_once('=').unwrap().1.to_string();
    let mut line = first;
    for next in lines {
        if !line.trim_end().ends_with('\\') {
            break;
        }
        text.push(' ');
        text.push_str(next);
        line = next;
    }
    Some(
        text.split_whitespace()
            .filter(|w| *w != "\\")
            .map(str::to_string)
            .collect(),
    )
}

/// Copies the files the patches touch and applies the patches to the copies (with `git
/// apply`, which works outside a repository). Returns (original, patched copy) pairs.
fn apply_patches(source: &Path, patches: &Path, dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut list: Vec<PathBuf> = fs::read_dir(patches)
        .expect("rocksdb/patches")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    list.sort();
    let mut files: Vec<String> = Vec::new();
    for patch in &list {
        for line in fs::read_to_string(patch).unwrap().lines() {
            if let Some(path) = line.strip_prefix("+++ b/") {
                if !files.iter().any(|f| f == path) {
                    files.push(path.to_string());
                }
            }
        }
    }
    // Patch copies in a fresh staging directory, then keep only changed files, so an
    // unchanged patch does not make its objects stale.
    let stage = dir.with_extension(format!("stage.{}", std::process::id()));
    let _ = fs::remove_dir_all(&stage);
    for file in &files {
        let copy = stage.join(file);
        fs::create_dir_all(copy.parent().unwrap()).unwrap();
        fs::copy(source.join(file), &copy).unwrap();
    }
    for patch in &list {
        let out = Command::new("git")
            .current_dir(&stage)
            .args(["apply", "-p1"])
            .arg(patch)
            .output()
            .expect("running git apply");
        assert!(
            out.status.success(),
            "{} does not apply to RocksDB {SOURCE_VERSION}: {}",
            patch.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for file in &files {
        let (new, kept) = (stage.join(file), dir.join(file));
        if fs::read(&new).ok() != fs::read(&kept).ok() {
            fs::create_dir_all(kept.parent().unwrap()).unwrap();
            fs::rename(&new, &kept).unwrap();
        }
    }
    let _ = fs::remove_dir_all(&stage);
    files
        .iter()
        .map(|f| (source.join(f), dir.join(f)))
        .collect()
}

/// `util/build_version.cc` from RocksDB's template, written only when it changes.
fn build_version(source: &Path, dir: &Path) -> PathBuf {
    let template = fs::read_to_string(source.join("util/build_version.cc.in"))
        .expect("RocksDB's util/build_version.cc.in");
    let (major, minor, patch) = ROCKSDB_VERSION;
    let text = template
        .replace("@GIT_SHA@", "unknown")
        .replace("@GIT_TAG@", &format!("v{major}.{minor}.{patch}"))
        .replace("@GIT_MOD@", "0")
        .replace("@GIT_DATE@", "unknown")
        .replace("@BUILD_DATE@", "unknown")
        .replace("@ROCKSDB_PLUGIN_EXTERNS@", "")
        .replace("@ROCKSDB_PLUGIN_BUILTINS@", "");
    let path = dir.join("build_version.cc");
    if fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
        fs::create_dir_all(dir).unwrap();
        fs::write(&path, text).unwrap();
    }
    path
}

/// An object's cache path: its path under RocksDB's tree (or ours, or the crate's) flattened.
fn object_path(obj_dir: &Path, source: &Path, ours: &Path, src: &Path) -> PathBuf {
    let rel = if let Ok(rel) = src.strip_prefix(source) {
        format!("rocksdb/{}", rel.display())
    } else if let Ok(rel) = src.strip_prefix(ours) {
        format!("valet/{}", rel.display())
    } else if let Some(pos) = src.components().position(|c| c.as_os_str() == "patched") {
        let rel: PathBuf = src.components().skip(pos + 1).collect();
        format!("patched/{}", rel.display())
    } else {
        format!("crate/{}", src.file_name().unwrap().to_string_lossy())
    };
    obj_dir.join(format!("{}.o", rel.replace('/', "__")))
}

/// FNV-1a over the parts (stable across Rust versions, unlike `DefaultHasher`).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in parts.iter().flat_map(|p| p.bytes().chain([0])) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x100000001b3);
    }
    hash
}

fn mtime(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// An object is fresh when it is newer than its source (the force-included header is in the
/// build directory's key).
fn fresh(obj: &Path, src: &Path) -> bool {
    mtime(obj).is_some_and(|t| mtime(src).is_some_and(|s| t >= s))
}

/// What the objects depend on besides the compiler and the sources: the flags with our
/// checkout's path taken out (every worktree and clone shares one cache) and the text of the
/// force-included port header.
fn recipe(flags: &[String], ours: &Path) -> String {
    let header = fs::read_to_string(ours.join("port/wasi_port.h")).expect("wasi_port.h");
    format!(
        "{}\n{header}",
        flags
            .join(" ")
            .replace(&ours.display().to_string(), "<valet>")
    )
}

/// Compiles each (command, source, object), `JOBS` at a time. An object appears only when
/// whole (another build may share the cache), and is kept as soon as it is built, so a failed
/// build resumes where it stopped. Panics after all have run if any failed.
fn compile_all(jobs: Vec<(Command, PathBuf, PathBuf)>) {
    let mut queue = jobs.into_iter();
    let mut running: Vec<(Child, PathBuf, PathBuf, PathBuf)> = Vec::new();
    let mut failures = Vec::new();
    loop {
        while running.len() < JOBS {
            let Some((mut command, src, obj)) = queue.next() else {
                break;
            };
            let tmp = obj.with_extension(format!("o.{}", std::process::id()));
            let child = command
                .arg("-c")
                .arg(&src)
                .arg("-o")
                .arg(&tmp)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {CLANG}: {e}"));
            running.push((child, src, obj, tmp));
        }
        if running.is_empty() {
            break;
        }
        let (child, src, obj, tmp) = running.remove(0);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            fs::rename(&tmp, &obj).unwrap();
            for line in stderr.lines() {
                println!("cargo:warning={line}");
            }
        } else {
            failures.push(format!("{}:\n{stderr}", src.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} RocksDB files failed to compile:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// RocksDB's tree inside the registry's copy of librocksdb-sys, checked by version.
fn rocksdb_source(ctx: &Ctx) -> Result<PathBuf, String> {
    let dir = ctx
        .registry_package(SOURCE_CRATE, SOURCE_VERSION)?
        .join("rocksdb");
    let version = fs::read_to_string(dir.join("include/rocksdb/version.h")).unwrap_or_default();
    let (major, minor, patch) = ROCKSDB_VERSION;
    let matches = [
        ("ROCKSDB_MAJOR", major),
        ("ROCKSDB_MINOR", minor),
        ("ROCKSDB_PATCH", patch),
    ]
    .iter()
    .all(|(name, value)| version.contains(&format!("#define {name} {value}\n")));
    if !matches {
        return Err(format!(
            "{} is not RocksDB {major}.{minor}.{patch}",
            dir.display()
        ));
    }
    Ok(dir)
}
