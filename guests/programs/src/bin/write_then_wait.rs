//! Writes without syncing, then waits to be stopped: the guest of the termination-signal
//! tests (`runtime/tests/signals.rs`). A signal that ends a native program leaves what it
//! wrote in the host's page cache; under `valet-run` what it wrote must survive too.
//!
//! Usage: write_then_wait DIR MODE
//!
//! Writes `content::unsynced_file(i)` to `DIR/unsynced-i.dat` for i in 0..3 (the last one
//! small enough to stay in a write buffer) and never closes them. Prints `written`, then
//! with MODE `wait` reads stdin to its end (a guest blocked in a WASI call), with `sync`
//! first fdatasyncs the three files and prints `synced`, then waits as `wait` does (the
//! guest of the metrics test), with `spin` computes forever (a guest that makes no WASI
//! call at all), with `append` appends `content::record(n)` for n = 0, 1, 2, ... to
//! `DIR/records.dat` forever (a guest in the middle of writing when it is stopped).

use std::io::{Read, Write};

#[allow(dead_code)]
#[path = "../content.rs"]
mod content;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, mode) = (&args[1], args[2].as_str());
    let mut files = Vec::new();
    for i in 0..3 {
        let mut f = std::fs::File::create(format!("{dir}/unsynced-{i}.dat")).expect("create");
        f.write_all(&content::unsynced_file(i)).expect("write");
        files.push(f);
    }
    println!("written");
    std::io::stdout().flush().expect("stdout");
    if mode == "sync" {
        for f in &files {
            f.sync_data().expect("fdatasync");
        }
        println!("synced");
        std::io::stdout().flush().expect("stdout");
    }
    match mode {
        "wait" | "sync" => {
            let mut all = Vec::new();
            std::io::stdin().read_to_end(&mut all).expect("stdin");
        }
        "append" => {
            let mut f = std::fs::File::create(format!("{dir}/records.dat")).expect("create");
            for n in 0.. {
                f.write_all(&content::record(n)).expect("append");
            }
        }
        _ => {
            let mut x = 1u64;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
    }
    drop(files);
}
