//! fsrandom: random sequences of file-system calls, one seed after the other, with their
//! transcript on stdout (see `random_calls.rs`).
//!
//! Usage: fsrandom MOUNT run FIRST_SEED LAST_SEED OPS  |  fsrandom MOUNT dump

#[path = "../random_calls.rs"]
mod random_calls;
#[path = "../rawfs.rs"]
mod rawfs;

use random_calls::{dump, run, Transcript};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: fsrandom MOUNT run FIRST_SEED LAST_SEED OPS | fsrandom MOUNT dump");
        std::process::exit(2)
    };
    let Some(mount) = args.get(1) else { usage() };
    let Some(root) = rawfs::find_preopen(mount) else {
        eprintln!("no preopened directory {mount}");
        std::process::exit(2);
    };
    match args.get(2).map(String::as_str) {
        Some("run") => {
            let num = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
            let (Some(first), Some(last), Some(ops)) = (num(3), num(4), num(5)) else {
                usage()
            };
            for seed in first..=last {
                let mut t = Transcript::default();
                run(&mut t, root, seed, ops);
                print!("{}", t.0);
            }
        }
        Some("dump") => {
            let mut t = Transcript::default();
            dump(&mut t, root, ".");
            print!("{}", t.0);
        }
        _ => usage(),
    }
}
