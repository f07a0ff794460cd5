//! Finding the C and C++ toolchain for WASI: Debian's clang, lld, wasi-libc and
//! libc++-dev-wasm32 (clang 14 knows the target as `wasm32-wasi`, not `wasm32-wasip1`).

use std::path::Path;
use std::process::Command;

/// The Debian packages `.ci/setup` installs for C and C++ guests.
pub const PACKAGES: &str = "clang lld wasi-libc libc++-dev-wasm32 libclang-rt-dev-wasm32";

/// clang's name for our target.
pub const CLANG_TARGET: &str = "wasm32-wasi";

/// A working clang for WASI.
pub struct WasiClang {
    /// `clang` for C, and `clang++` for C++.
    pub cc: &'static str,
    pub cxx: &'static str,
    /// llvm-ar, for static libraries.
    pub ar: String,
}

impl WasiClang {
    /// A C compiler command for WASI with the usual flags.
    pub fn c(&self) -> Command {
        let mut command = Command::new(self.cc);
        command.arg(format!("--target={CLANG_TARGET}"));
        command
    }

    /// A C++ compiler command for WASI (no exceptions: wasmtime 36 cannot run them).
    pub fn cxx(&self) -> Command {
        let mut command = Command::new(self.cxx);
        command.args([
            &format!("--target={CLANG_TARGET}"),
            "-fno-exceptions",
            "-std=c++17",
        ]);
        command
    }
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// clang with wasi-libc (and libc++ when `cxx`), or why not.
pub fn wasi_clang(cxx: bool) -> Result<WasiClang, String> {
    let missing = |what: &str| format!("{what} not found (apt-get install {PACKAGES})");
    if !runs("clang", &["--version"]) {
        return Err(missing("clang"));
    }
    if !runs("wasm-ld", &["--version"]) {
        return Err(missing("wasm-ld (lld)"));
    }
    if !Path::new("/usr/include/wasm32-wasi/stdio.h").exists() {
        return Err(missing("wasi-libc"));
    }
    if cxx && !Path::new("/usr/lib/wasm32-wasi/libc++.a").exists() {
        return Err(missing("libc++ for wasm32-wasi"));
    }
    let ar = ["llvm-ar", "llvm-ar-14", "llvm-ar-16", "llvm-ar-19"]
        .into_iter()
        .find(|ar| runs(ar, &["--version"]))
        .ok_or_else(|| missing("llvm-ar"))?;
    Ok(WasiClang {
        cc: "clang",
        cxx: "clang++",
        ar: ar.to_string(),
    })
}
