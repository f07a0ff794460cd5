//! Writes small files without pause until told to stop: the guest of the hot-swap test
//! (`runtime/tests/hot_swap.rs`), which swaps placement policies under it.
//!
//! Usage: steady_writer DIR CTL
//!
//! Creates `DIR/f000001.dat`, `DIR/f000002.dat`, ... one after another; each gets
//! `content::steady_file(i)` (1–12 KiB, not block aligned), then `fsync`, then `close`. Any failed create,
//! write, sync or close is an error: a line on stderr and exit code 1. `CTL` is a host
//! directory the test controls:
//!
//! - `CTL/stop` appearing ends the loop;
//! - `CTL/epoch` holds a number the test bumps after each policy change; the first time the
//!   guest sees a new value it says so, naming the next file it will create. That file and
//!   every later one were created after the change took effect.
//!
//! Protocol on stdout, one line each, flushed:
//!
//!     epoch E next NAME      seen before NAME is created
//!     closed NAME            after NAME's write, fsync and close all succeeded
//!     wrote N files, all intact
//!
//! The last line comes after every file was read back and compared with `content`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::IntoRawFd;

#[allow(dead_code)]
#[path = "../content.rs"]
mod content;

use content::{steady_file, steady_name};

fn fail(what: String) -> ! {
    eprintln!("steady_writer: error: {what}");
    std::process::exit(1);
}

/// One line on stdout, in one write, flushed.
fn say(line: String) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(format!("{line}\n").as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        fail("cannot write to stdout".into());
    }
}

/// Creates file `i` in `dir`, writes, syncs and closes it, checking every step.
fn write_one(dir: &str, i: u64) {
    let path = format!("{dir}/{}", steady_name(i));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap_or_else(|e| fail(format!("create {path}: {e}")));
    f.write_all(&steady_file(i))
        .unwrap_or_else(|e| fail(format!("write {path}: {e}")));
    f.sync_all()
        .unwrap_or_else(|e| fail(format!("fsync {path}: {e}")));
    // std's drop ignores a failed close; close by hand to see it.
    let fd = f.into_raw_fd();
    if let Err(e) = unsafe { wasi::fd_close(fd as wasi::Fd) } {
        fail(format!("close {path}: {e}"));
    }
}

/// Reads every file back; exits with an error on the first difference.
fn verify(dir: &str, count: u64) {
    let mut listed: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| fail(format!("readdir {dir}: {e}")))
        .map(|e| {
            e.unwrap_or_else(|e| fail(format!("readdir {dir}: {e}")))
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    listed.sort();
    let expected: Vec<String> = (1..=count).map(steady_name).collect();
    if listed != expected {
        fail(format!(
            "{dir} holds {} entries, expected {count} (f000001.dat..)",
            listed.len()
        ));
    }
    for i in 1..=count {
        let path = format!("{dir}/{}", steady_name(i));
        let mut data = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut data))
            .unwrap_or_else(|e| fail(format!("read {path}: {e}")));
        if data != steady_file(i) {
            fail(format!("{path}: {} bytes read back differ", data.len()));
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: steady_writer DIR CTL");
        std::process::exit(2);
    }
    let (dir, ctl) = (&args[1], &args[2]);
    let stop = format!("{ctl}/stop");
    let epoch_file = format!("{ctl}/epoch");
    let mut epoch = String::new();
    let mut i = 0u64;
    loop {
        if fs::metadata(&stop).is_ok() {
            break;
        }
        i += 1;
        // The test replaces the file by rename, so a read sees a whole value or the old one.
        if let Ok(seen) = fs::read_to_string(&epoch_file) {
            let seen = seen.trim().to_string();
            if seen != epoch {
                say(format!("epoch {seen} next {}", steady_name(i)));
                epoch = seen;
            }
        }
        write_one(dir, i);
        say(format!("closed {}", steady_name(i)));
    }
    verify(dir, i);
    say(format!("wrote {i} files, all intact"));
}
