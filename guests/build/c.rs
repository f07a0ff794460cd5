//! C guests in `c/`, one program per `.c` file, built with Debian's clang for wasm32-wasi
//! against wasi-libc. Each `c/<name>.c` becomes guest `c_<name>`.

use std::path::Path;

use crate::toolchain::wasi_clang;
use crate::{Ctx, Guest};

pub fn build(ctx: &mut Ctx) {
    ctx.watch("c");
    let sources = ctx.manifest_dir.join("c");
    let mut programs: Vec<String> = std::fs::read_dir(&sources)
        .expect("guests/c")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".c").map(str::to_string)
        })
        .collect();
    programs.sort();
    let clang = match wasi_clang(false) {
        Ok(clang) => clang,
        Err(reason) => {
            for program in programs {
                ctx.skip(&format!("c_{program}"), &reason);
            }
            return;
        }
    };
    for program in programs {
        let source = sources.join(format!("{program}.c"));
        let wasm = ctx.out_dir.join(format!("c_{program}.wasm"));
        if !up_to_date(&source, &wasm) {
            let status = clang
                .c()
                .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
                .arg(&wasm)
                .arg(&source)
                .status()
                .expect("running clang");
            assert!(status.success(), "compiling {} failed", source.display());
        }
        ctx.guests.push(Guest {
            name: format!("c_{program}"),
            doc: format!("`c/{program}.c` built with clang for wasm32-wasi."),
            wasm,
            native: None,
        });
    }
}

fn up_to_date(source: &Path, output: &Path) -> bool {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((mtime(source), mtime(output)), (Some(s), Some(o)) if o >= s)
}
