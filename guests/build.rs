//! Builds the guest programs in `programs/` for wasm32-wasip1 and writes their paths to
//! `$OUT_DIR/guests.rs`, the way wasmtime's test-programs artifacts are built.

use std::env;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "wasm32-wasip1";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let programs = manifest_dir.join("programs");
    println!("cargo:rerun-if-changed={}", programs.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        programs.join("Cargo.toml").display()
    );

    let target_dir = out_dir.join("target");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--bins", "--target", TARGET])
        .arg("--manifest-path")
        .arg(programs.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        // Flags meant for the host build must not leak into the guests'.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("running cargo for the guest programs");
    if !status.success() {
        panic!(
            "building the guest programs failed; is the target installed? \
             (`rustup target add {TARGET}`, which `.ci/setup` does)"
        );
    }

    let mut names: Vec<String> = std::fs::read_dir(programs.join("src/bin"))
        .expect("programs/src/bin")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    names.sort();
    let mut generated = String::new();
    for name in names {
        let wasm = target_dir
            .join(TARGET)
            .join("release")
            .join(format!("{name}.wasm"));
        assert!(wasm.exists(), "{} was not built", wasm.display());
        let constant = name.to_uppercase().replace('-', "_");
        writeln!(
            generated,
            "/// `programs/src/bin/{name}.rs` built for {TARGET}.\npub const {constant}: &str = {:?};",
            wasm.display().to_string()
        )
        .unwrap();
    }
    std::fs::write(out_dir.join("guests.rs"), generated).unwrap();
}
