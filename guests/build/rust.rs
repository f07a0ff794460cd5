//! The Rust guest programs in `programs/` (their own workspace), built for WASI.
//!
//! Programs whose name starts with `threads_` are built for `wasm32-wasip1-threads` (shared
//! memory, `wasi::thread-spawn`, so `std::thread` works); all others for `wasm32-wasip1`.
//! One cargo invocation per target, each naming its programs with `--bin`.

use std::env;
use std::path::Path;
use std::process::Command;

use crate::{Ctx, Guest};

const TARGET: &str = "wasm32-wasip1";
const THREADS_TARGET: &str = "wasm32-wasip1-threads";
const THREADS_PREFIX: &str = "threads_";

fn target_of(name: &str) -> &'static str {
    if name.starts_with(THREADS_PREFIX) {
        THREADS_TARGET
    } else {
        TARGET
    }
}

fn cargo_build(programs: &Path, target_dir: &Path, target: &str, names: &[&String]) {
    if names.is_empty() {
        return;
    }
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--target", target])
        .arg("--manifest-path")
        .arg(programs.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    for name in names {
        command.args(["--bin", name]);
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

/// Builds every program in `programs/src/bin` for WASI.
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

    let target_dir = ctx.out_dir.join("target");
    for target in [TARGET, THREADS_TARGET] {
        let these: Vec<&String> = names.iter().filter(|n| target_of(n) == target).collect();
        cargo_build(&programs, &target_dir, target, &these);
    }
    for name in names {
        let target = target_of(&name);
        let wasm = target_dir
            .join(target)
            .join("release")
            .join(format!("{name}.wasm"));
        ctx.guests.push(Guest {
            doc: format!("`programs/src/bin/{name}.rs` built for {target}."),
            name,
            wasm,
            native: None,
        });
    }
}
