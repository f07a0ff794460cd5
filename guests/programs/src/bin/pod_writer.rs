//! A pod's guest in the containerd tests (`runtime/shim/tests`): appends fixed-size records
//! to its log on the store with an fsync after each, then reads the log back.
//!
//! Usage: pod_writer NAME DIR RECORDS RECORD_SIZE
//!
//! Appends to `DIR/NAME.log`, continuing after the whole records already there (a killed
//! run leaves its synced prefix), until the log holds RECORDS records (0: until killed).
//! Record `i` is `content::pod_record(NAME, i, RECORD_SIZE)`. Then reads the log back and
//! compares every record. The exit code is `$POD_EXIT` (default 0) when all went well.
//!
//! Protocol on stdout, one line each, flushed:
//!
//!     start UNIX_NS           first thing in main: when the guest began running
//!     motd TEXT               `/etc/motd` of the container's rootfs, when there is one
//!     ack I                   record I is appended and its fsync returned
//!     enospc I                appending record I failed with ENOSPC (exit 4)
//!     ok N                    the log holds N intact records
//!
//! Exit codes: `$POD_EXIT` good, 1 another I/O error, 2 usage, 3 a damaged record, 4 ENOSPC.
//!
//! With `$POD_SLEEP_SECS`, it sleeps that long after `ok` before it exits (a pod killed
//! while it waits in the host). With `$POD_ALLOC_MIB`, it first allocates and fills that
//! many MiB and says `allocated N MiB` (a pod's memory limit). With `$POD_REWRITE`, after
//! `ok` it writes the whole log again in place that many times, syncing each, and says
//! `rewrote N` (a quota must not charge bytes that do not grow a file). With `$POD_FILES`,
//! it then creates that many empty files `DIR/NAME.N` and says `files N`, or `files-enospc I`
//! (exit 4) when creating file I fails with ENOSPC (a limit of names). With `$POD_SPIN_MS`,
//! it first spins on the CPU for that many milliseconds of wall time and says `cpu MS`,
//! the CPU time its thread used meanwhile (a pod's CPU limit), and `rounds N`, the rounds
//! of 10,000 multiply-adds it did.

use std::fs::OpenOptions;
use std::io::{Read, Seek, Write};
use std::time::{SystemTime, UNIX_EPOCH};

#[allow(dead_code)]
#[path = "../content.rs"]
mod content;

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{line}\n").as_bytes()).ok();
    out.flush().ok();
}

fn fail(code: i32, what: String) -> ! {
    eprintln!("pod_writer: {what}");
    std::process::exit(code)
}

fn main() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    say(format!("start {now}"));
    if let Ok(motd) = std::fs::read_to_string("/etc/motd") {
        say(format!("motd {}", motd.trim()));
    }
    if let Some(ms) = std::env::var("POD_SPIN_MS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        let (start, cpu) = (std::time::Instant::now(), thread_cpu_ms());
        let (mut x, mut rounds) = (1u64, 0u64);
        while start.elapsed().as_millis() < u128::from(ms) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            rounds += 1;
        }
        say(format!("cpu {}", thread_cpu_ms() - cpu));
        say(format!("rounds {rounds}"));
    }
    if let Some(mib) = std::env::var("POD_ALLOC_MIB")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        let block = vec![1u8; mib << 20];
        say(format!("allocated {} MiB", block.iter().filter(|&&b| b == 1).count() >> 20));
    }
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        fail(2, "usage: pod_writer NAME DIR RECORDS RECORD_SIZE".into());
    }
    let name = &args[1];
    let path = format!("{}/{name}.log", args[2]);
    let number = |s: &str| -> u64 {
        s.parse()
            .unwrap_or_else(|_| fail(2, format!("not a number: {s}")))
    };
    let records = number(&args[3]);
    let size = number(&args[4]) as usize;
    if size == 0 {
        fail(2, "RECORD_SIZE must be more than 0".into());
    }
    let mut log = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| fail(1, format!("open {path}: {e}")));
    let len = log
        .metadata()
        .unwrap_or_else(|e| fail(1, format!("stat {path}: {e}")))
        .len();
    // A torn last record (never acknowledged) is cut off before appending.
    let whole = len / size as u64;
    if whole * size as u64 != len {
        log.set_len(whole * size as u64)
            .unwrap_or_else(|e| fail(1, format!("truncate {path}: {e}")));
    }
    let mut i = whole;
    while records == 0 || i < records {
        let record = content::pod_record(name, i, size);
        let done = log.write_all(&record).and_then(|()| log.sync_all());
        match done {
            Ok(()) => say(format!("ack {i}")),
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                say(format!("enospc {i}"));
                std::process::exit(4)
            }
            Err(e) => fail(1, format!("append record {i}: {e}")),
        }
        i += 1;
    }
    let mut data = Vec::new();
    std::fs::File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .unwrap_or_else(|e| fail(1, format!("read {path}: {e}")));
    for (n, chunk) in data.chunks(size).enumerate() {
        if chunk != content::pod_record(name, n as u64, size).as_slice() {
            fail(3, format!("record {n} of {path} is damaged"));
        }
    }
    say(format!("ok {}", data.len() / size));
    if let Some(times) = std::env::var("POD_REWRITE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
    {
        // The whole log written again in place: the file does not grow.
        let mut file = OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| fail(1, format!("open {path}: {e}")));
        for _ in 0..times {
            file.seek(std::io::SeekFrom::Start(0))
                .and_then(|_| file.write_all(&data))
                .and_then(|()| file.sync_data())
                .unwrap_or_else(|e| fail(1, format!("rewrite {path}: {e}")));
        }
        say(format!("rewrote {times}"));
    }
    if let Some(count) = std::env::var("POD_FILES")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        for i in 0..count {
            let file = format!("{}/{name}.{i}", args[2]);
            match std::fs::File::create(&file) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                    say(format!("files-enospc {i}"));
                    std::process::exit(4)
                }
                Err(e) => fail(1, format!("create {file}: {e}")),
            }
        }
        say(format!("files {count}"));
    }
    if let Some(secs) = std::env::var("POD_SLEEP_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        std::thread::sleep(std::time::Duration::from_secs(secs));
    }
    let code = std::env::var("POD_EXIT")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    std::process::exit(code)
}

/// The CPU time this thread has used, in milliseconds (WASI's thread CPU-time clock).
#[cfg(target_os = "wasi")]
fn thread_cpu_ms() -> u64 {
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    extern "C" {
        fn clock_time_get(id: u32, precision: u64, time: *mut u64) -> u16;
    }
    const THREAD_CPUTIME: u32 = 3;
    let mut ns = 0u64;
    // SAFETY: `ns` is a valid place for the call to write the time to.
    match unsafe { clock_time_get(THREAD_CPUTIME, 1, &mut ns) } {
        0 => ns / 1_000_000,
        errno => fail(1, format!("clock_time_get: errno {errno}")),
    }
}

#[cfg(not(target_os = "wasi"))]
fn thread_cpu_ms() -> u64 {
    0
}
