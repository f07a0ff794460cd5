//! Builds every guest for WASI, and natively where a report compares against native code, then
//! writes their paths to `$OUT_DIR/guests.rs` (the pattern of wasmtime's test-programs).
//!
//! One module per toolchain: Rust programs (`rust.rs`), LevelDB in C++ (`leveldb.rs`), Go
//! (`go.rs`), C (`c.rs`). A guest whose toolchain cannot be had here is skipped with a cargo
//! warning that says how to install it; with `VALET_REQUIRE_ALL_GUESTS=1` (CI) that is an error.

mod c;
mod go;
mod leveldb;
mod rocksdb;
mod rust;
mod toolchain;

use std::env;
use std::fmt::Write as _;
use std::path::PathBuf;

/// One built guest.
pub struct Guest {
    /// Lookup name (`valet_guests::wasm(name)`), also the constant's name in upper case.
    pub name: String,
    /// What it is, for the generated doc comment.
    pub doc: String,
    pub wasm: PathBuf,
    /// The same program compiled for the host, where the comparison report needs it.
    pub native: Option<PathBuf>,
}

/// Where the build writes and what it has built so far.
pub struct Ctx {
    pub manifest_dir: PathBuf,
    pub out_dir: PathBuf,
    require_all: bool,
    pub guests: Vec<Guest>,
    skipped: Vec<(String, String)>,
}

impl Ctx {
    /// Records that guest `name` cannot be built here, and why.
    pub fn skip(&mut self, name: &str, reason: &str) {
        if self.require_all {
            panic!("guest {name} cannot be built: {reason} (VALET_REQUIRE_ALL_GUESTS is set)");
        }
        println!("cargo:warning=skipping guest {name}: {reason}");
        self.skipped.push((name.to_string(), reason.to_string()));
    }

    /// The directory of registry package `name` at exactly `version` (its `Cargo.toml`'s
    /// directory), found with `cargo metadata` among this crate's dependencies, where the
    /// guests' C and C++ sources come from. The answer is cached in OUT_DIR, so `cargo
    /// metadata` runs once per build directory and package.
    pub fn registry_package(&self, name: &str, version: &str) -> Result<PathBuf, String> {
        let wanted = format!("{name}-{version}");
        let cached = self.out_dir.join(format!("{wanted}.dir"));
        if let Ok(dir) = std::fs::read_to_string(&cached) {
            let dir = PathBuf::from(dir);
            if dir.join("Cargo.toml").exists() {
                return Ok(dir);
            }
        }
        let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(self.manifest_dir.join("Cargo.toml"))
            .output()
            .map_err(|e| format!("running cargo metadata: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // Every package's manifest path, without a JSON parser: the registry keeps each
        // package in a directory named `<name>-<version>`.
        let json = String::from_utf8_lossy(&out.stdout);
        let dir = json
            .split("\"manifest_path\":\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .filter_map(|manifest| std::path::Path::new(manifest).parent())
            .find(|dir| {
                dir.file_name()
                    .is_some_and(|n| n.to_string_lossy() == wanted)
            })
            .ok_or_else(|| format!("{wanted} not found by cargo metadata"))?
            .to_path_buf();
        std::fs::write(&cached, dir.to_string_lossy().as_bytes()).unwrap();
        Ok(dir)
    }

    /// Tells cargo to rebuild when anything under `path` (relative to the crate) changes.
    pub fn watch(&self, path: &str) {
        println!(
            "cargo:rerun-if-changed={}",
            self.manifest_dir.join(path).display()
        );
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=VALET_REQUIRE_ALL_GUESTS");
    let mut ctx = Ctx {
        manifest_dir: PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap()),
        out_dir: PathBuf::from(env::var_os("OUT_DIR").unwrap()),
        require_all: env::var_os("VALET_REQUIRE_ALL_GUESTS").is_some_and(|v| v == "1"),
        guests: Vec::new(),
        skipped: Vec::new(),
    };
    rust::build(&mut ctx);
    c::build(&mut ctx);
    leveldb::build(&mut ctx);
    rocksdb::build(&mut ctx);
    go::build(&mut ctx);
    std::fs::write(ctx.out_dir.join("guests.rs"), generate(&ctx)).unwrap();
}

fn generate(ctx: &Ctx) -> String {
    let mut code = String::new();
    let mut all = String::from(
        "/// Every built guest: (name, .wasm path).\npub const ALL: &[(&str, &str)] = &[\n",
    );
    let mut native = String::from(
        "/// Guests also compiled for the host: (name, executable path).\npub const NATIVE: &[(&str, &str)] = &[\n",
    );
    for guest in &ctx.guests {
        assert!(
            guest.wasm.exists(),
            "{} was not built",
            guest.wasm.display()
        );
        let constant = guest.name.to_uppercase().replace('-', "_");
        let wasm = guest.wasm.display().to_string();
        writeln!(
            code,
            "/// {}\npub const {constant}: &str = {wasm:?};",
            guest.doc
        )
        .unwrap();
        writeln!(all, "    ({:?}, {constant}),", guest.name).unwrap();
        if let Some(path) = &guest.native {
            assert!(path.exists(), "{} was not built", path.display());
            writeln!(
                native,
                "    ({:?}, {:?}),",
                guest.name,
                path.display().to_string()
            )
            .unwrap();
        }
    }
    let mut skipped = String::from(
        "/// Guests not built here: (name, why).\npub const SKIPPED: &[(&str, &str)] = &[\n",
    );
    for (name, reason) in &ctx.skipped {
        writeln!(skipped, "    ({name:?}, {reason:?}),").unwrap();
    }
    for list in [all, native, skipped] {
        code.push_str(&list);
        code.push_str("];\n");
    }
    code
}
