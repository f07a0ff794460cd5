//! The Rust guest programs in `programs/` (their own workspace), built for WASI, and a few
//! of them for the host too (the comparison report runs both).
//!
//! Programs whose name starts with `threads_` are built for `wasm32-wasip1-threads` (shared
//! memory, `wasi::thread-spawn`, so `std::thread` works); all others for `wasm32-wasip1`.
//! One cargo invocation per target, each naming its programs with `--bin`.
//!
//! Programs with C inside (SQLite's amalgamation, via rusqlite's `bundled`) need Debian's
//! clang for WASI: the C compiler, archiver and target are passed to the `cc` crate through
//! its per-target variables. Without that toolchain those programs are skipped.

use std::env;
use std::path::Path;
use std::process::Command;

use crate::toolchain::{wasi_clang, CLANG_TARGET};
use crate::{Ctx, Guest};

const TARGET: &str = "wasm32-wasip1";
const THREADS_TARGET: &str = "wasm32-wasip1-threads";
const THREADS_PREFIX: &str = "threads_";

/// Programs that compile C for their target (through the `cc` crate).
const NEEDS_C: &[&str] = &["sqlite_bench"];

/// Programs also built for the host, for the comparison report's native runs.
const NATIVE: &[&str] = &["sqlite_bench", "rusty_leveldb", "cache"];

fn target_of(name: &str) -> &'static str {
    if name.starts_with(THREADS_PREFIX) {
        THREADS_TARGET
    } else {
        TARGET
    }
}

/// One cargo invocation building `names` for `target`, with the features of those among
/// them that have one, and `envs` set (the `cc` crate's compiler variables).
fn cargo_build(
    programs: &Path,
    target_dir: &Path,
    target: &str,
    names: &[&String],
    features: &[String],
    envs: &[(String, String)],
) {
    if names.is_empty() {
        return;
    }
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--target", target])
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .arg("--manifest-path")
        .arg(programs.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    for name in names {
        command.args(["--bin", name]);
    }
    let wanted: Vec<&str> = features
        .iter()
        .filter(|f| names.contains(f))
        .map(String::as_str)
        .collect();
    if !wanted.is_empty() {
        command.args(["--features", &wanted.join(",")]);
    }
    let status = command
        // Flags meant for the host build must not leak into the guests'.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("running cargo for the guest programs");
    if !status.success() {
        panic!(
            "building the guest programs for {target} failed; is the target installed? \
             (`rustup target add {target}`, which `.ci/setup` does)"
        );
    }
}

/// The programs with dependencies of their own: each has a feature of its name in
/// `programs/Cargo.toml` (and `required-features` on its `[[bin]]`), so that a target whose
/// invocation does not name the program does not build its dependencies.
fn own_features(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).expect("programs/Cargo.toml");
    text.lines()
        .map(str::trim)
        .skip_while(|l| *l != "[features]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| Some(l.split_once('=')?.0.trim().to_string()))
        .collect()
}

/// The `cc` crate's variables for compiling C for `target` with Debian's clang for WASI.
fn c_env(target: &str, ar: &str) -> Vec<(String, String)> {
    let suffix = target.replace('-', "_");
    vec![
        (format!("CC_{suffix}"), "clang".to_string()),
        (format!("AR_{suffix}"), ar.to_string()),
        // clang 14 knows the target as wasm32-wasi only; the last --target wins.
        (
            format!("CFLAGS_{suffix}"),
            format!("--target={CLANG_TARGET}"),
        ),
    ]
}

/// Builds every program in `programs/src/bin` for WASI, and those in [`NATIVE`] for the host.
pub fn build(ctx: &mut Ctx) {
    let programs = ctx.manifest_dir.join("programs");
    ctx.watch("programs/src");
    ctx.watch("programs/Cargo.toml");
    ctx.watch("programs/Cargo.lock");

    let mut names: Vec<String> = std::fs::read_dir(programs.join("src/bin"))
        .expect("programs/src/bin")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    names.sort();

    let clang = wasi_clang(false);
    if let Err(why) = &clang {
        for name in names.iter().filter(|n| NEEDS_C.contains(&n.as_str())) {
            ctx.skip(name, &format!("its C needs clang for WASI: {why}"));
        }
        names.retain(|n| !NEEDS_C.contains(&n.as_str()));
    }

    let features = own_features(&programs.join("Cargo.toml"));
    let target_dir = ctx.out_dir.join("target");
    for target in [TARGET, THREADS_TARGET] {
        let these: Vec<&String> = names.iter().filter(|n| target_of(n) == target).collect();
        let envs = match &clang {
            Ok(clang) if these.iter().any(|n| NEEDS_C.contains(&n.as_str())) => {
                c_env(target, &clang.ar)
            }
            _ => Vec::new(),
        };
        cargo_build(&programs, &target_dir, target, &these, &features, &envs);
    }
    // The host build: the host's own C compiler, `--target` given so that build scripts
    // stay apart from the programs and are shared with the WASI builds.
    let host = env::var("HOST").expect("HOST");
    let native: Vec<&String> = names
        .iter()
        .filter(|n| NATIVE.contains(&n.as_str()))
        .collect();
    cargo_build(&programs, &target_dir, &host, &native, &features, &[]);

    for name in names {
        let target = target_of(&name);
        let wasm = target_dir
            .join(target)
            .join("release")
            .join(format!("{name}.wasm"));
        let native = NATIVE.contains(&name.as_str()).then(|| {
            let exe = format!("{name}{}", env::consts::EXE_SUFFIX);
            target_dir.join(&host).join("release").join(exe)
        });
        ctx.guests.push(Guest {
            doc: format!("`programs/src/bin/{name}.rs` built for {target}."),
            name,
            wasm,
            native,
        });
    }
}
