//! threads_fsrandom: the `fsrandom` sequences of seeds FIRST..=LAST run at once, one thread
//! (wasi-threads) per seed, each in its own subdirectory; their transcripts are printed in
//! seed order once every thread is done, so they must equal `fsrandom`'s one seed after the
//! other (see `random_calls.rs`).
//!
//! Usage: threads_fsrandom MOUNT FIRST_SEED LAST_SEED OPS

#[path = "../random_calls.rs"]
mod random_calls;
#[path = "../rawfs.rs"]
mod rawfs;

use std::sync::{Arc, Barrier};

use random_calls::{run, Transcript};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let num = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
    let (Some(mount), Some(first), Some(last), Some(ops)) = (args.get(1), num(2), num(3), num(4))
    else {
        eprintln!("usage: threads_fsrandom MOUNT FIRST_SEED LAST_SEED OPS");
        std::process::exit(2);
    };
    let Some(root) = rawfs::find_preopen(mount) else {
        eprintln!("no preopened directory {mount}");
        std::process::exit(2);
    };
    let start = Arc::new(Barrier::new((last + 1 - first) as usize));
    let threads: Vec<_> = (first..=last)
        .map(|seed| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut t = Transcript::default();
                run(&mut t, root, seed, ops);
                t.0
            })
        })
        .collect();
    for thread in threads {
        match thread.join() {
            Ok(transcript) => print!("{transcript}"),
            Err(_) => std::process::exit(4),
        }
    }
}
