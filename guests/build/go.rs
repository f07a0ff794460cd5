//! The Go guests in `go/` (one module, versions pinned by `go.mod` and `go.sum`): buntdb and
//! tidwall/wal benchmarks, built with `GOOS=wasip1 GOARCH=wasm` (Go >= 1.21) and natively
//! for the comparison report.
//!
//! Modules come through the usual Go module proxy and cache (`GOPATH` and `GOCACHE` are left
//! at their defaults), so repeated builds are incremental. `-mod=readonly` makes `go.sum`
//! authoritative: a build never edits `go.mod` or `go.sum`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{Ctx, Guest};

/// (program directory under `go/`, description).
const PROGRAMS: &[(&str, &str)] = &[
    (
        "buntdb_bench",
        "Go (GOOS=wasip1): buntdb workloads (set, update, get, delete, shrink) with a fsync per \
         commit, and a reopen that checks every key.",
    ),
    (
        "wal_bench",
        "Go (GOOS=wasip1): tidwall/wal append, read and front truncation (segment files \
         deleted), and a reopen that checks the rest.",
    ),
];

/// The oldest Go with `GOOS=wasip1`.
const MIN_MINOR: u32 = 21;

const INSTALL: &str = "Go >= 1.21 not found: install it from go.dev/dl";

/// `go` on PATH, else the tarball's usual place; with its version when it is new enough.
fn find_go() -> Result<PathBuf, String> {
    let mut found = None;
    for candidate in ["go", "/usr/local/go/bin/go"] {
        let Ok(out) = Command::new(candidate)
            .args(["env", "GOVERSION"])
            .env("GOTOOLCHAIN", "local")
            .output()
        else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if minor_version(&version).is_some_and(|m| m >= MIN_MINOR) {
            return Ok(PathBuf::from(candidate));
        }
        found.get_or_insert(version);
    }
    Err(match found {
        Some(version) => format!("{INSTALL} (found {version})"),
        None => INSTALL.to_string(),
    })
}

/// 21 for "go1.21.3" or "go1.21rc2"; None for anything that is not Go 1.x.
fn minor_version(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("go1.")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A `go` command in `dir` that ignores the caller's Go settings that could change the build.
fn go_command(go: &Path, dir: &Path) -> Command {
    let mut command = Command::new(go);
    command
        .current_dir(dir)
        // Never fetch another toolchain, never pick up a go.work above us, no VCS stamping
        // (the checkout may belong to another user).
        .env("GOTOOLCHAIN", "local")
        .env("GOWORK", "off")
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env_remove("GOOS")
        .env_remove("GOARCH")
        .env_remove("CGO_ENABLED");
    command
}

fn run(mut command: Command, what: &str) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running go for {what}: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

pub fn build(ctx: &mut Ctx) {
    ctx.watch("go");
    let go = match find_go() {
        Ok(go) => go,
        Err(reason) => {
            for (name, _) in PROGRAMS {
                ctx.skip(name, &reason);
            }
            return;
        }
    };
    let module = ctx.manifest_dir.join("go");

    // Fetch the pinned modules first, so that a machine without the proxy or a module cache
    // says so instead of failing inside a build.
    let mut download = go_command(&go, &module);
    download.args(["mod", "download"]);
    match download.output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            let reason = format!(
                "`go mod download` failed (module proxy unreachable?): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            for (name, _) in PROGRAMS {
                ctx.skip(name, &reason);
            }
            return;
        }
        Err(e) => panic!("running {}: {e}", go.display()),
    }

    let out_dir = ctx.out_dir.join("go");
    let native_dir = out_dir.join("native");
    std::fs::create_dir_all(&native_dir).expect("creating the Go output directory");
    for (name, doc) in PROGRAMS {
        let package = format!("./{name}");
        let wasm = out_dir.join(format!("{name}.wasm"));
        let mut command = go_command(&go, &module);
        command
            .env("GOOS", "wasip1")
            .env("GOARCH", "wasm")
            .args(["build", "-trimpath", "-mod=readonly", "-o"])
            .arg(&wasm)
            .arg(&package);
        run(command, &format!("building {name} for wasip1"));

        let native = native_dir.join(name);
        let mut command = go_command(&go, &module);
        command
            // Pure Go: no C compiler needed for the host build either.
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath", "-mod=readonly", "-o"])
            .arg(&native)
            .arg(&package);
        run(command, &format!("building {name} natively"));

        ctx.guests.push(Guest {
            name: name.to_string(),
            doc: doc.to_string(),
            wasm,
            native: Some(native),
        });
    }
}
