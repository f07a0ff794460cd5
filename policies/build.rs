//! Builds the policies in `builtin/` for wasm32-unknown-unknown (a target with no WASI) and
//! writes `$OUT_DIR/builtin.rs`: `BUILTIN`, the (name, module bytes) of each.

use std::env;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let builtin = manifest_dir.join("builtin");
    for watched in ["builtin", "sdk/src", "sdk/Cargo.toml"] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest_dir.join(watched).display()
        );
    }
    let target_dir = out_dir.join("target");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--target", TARGET, "--workspace"])
        .arg("--manifest-path")
        .arg(builtin.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("running cargo for the built-in policies");
    if !status.success() {
        panic!(
            "building the built-in policies failed; is the target installed? \
             (`rustup target add {TARGET}`, which `.ci/setup` does)"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(&builtin)
        .expect("policies/builtin")
        .filter_map(|e| {
            let e = e.ok()?;
            e.path()
                .join("Cargo.toml")
                .exists()
                .then(|| e.file_name().into_string().ok())
                .flatten()
        })
        .collect();
    names.sort();
    let mut generated = String::from(
        "/// Built-in policies: (name, module).\npub const BUILTIN: &[(&str, &[u8])] = &[\n",
    );
    for name in names {
        let wasm = target_dir
            .join(TARGET)
            .join("release")
            .join(format!("{}.wasm", name.replace('-', "_")));
        assert!(wasm.exists(), "{} was not built", wasm.display());
        writeln!(
            generated,
            "    ({name:?}, include_bytes!({:?})),",
            wasm.display().to_string()
        )
        .unwrap();
    }
    generated.push_str("];\n");
    std::fs::write(out_dir.join("builtin.rs"), generated).unwrap();
}
