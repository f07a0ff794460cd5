//! What `sync_append` and `threads_sync_append` share: WRITERS writers (threads of one
//! guest, or one each), each appending RECORD-byte records to its own file and fsyncing
//! after every record, for a fixed time. The comparison report runs several of them at
//! once (tenants of one `valet-run`, stock wasmtime processes) to measure how well
//! concurrent syncs are grouped.
//!
//! Usage: `--dir DIR [--name NAME] [--threads T] [--record_size B] [--seconds S]
//! [--num MAX] [--start_at_ms UNIX_MS] [--sync fsync|fdatasync]`
//!
//! Writer `t` appends to `DIR/NAME-t.log` (created, truncated). With `--start_at_ms` every
//! writer waits until that wall-clock time before its first record, so that writers in
//! other processes start together; one that was ready only later says by how much
//! (`late_ms`). A writer stops after S seconds or MAX records, whichever comes first, then
//! checks its file's length. Each writer prints one line, in one write:
//!
//! ```text
//! sync_append NAME-t: records N secs E ops_per_sec R p50_us A p99_us B p999_us C p9999_us D late_ms L
//! ```
//!
//! Exit codes: 0 good, 1 an I/O error, 2 usage, 3 a file of the wrong length.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

struct Args {
    dir: String,
    name: String,
    threads: usize,
    record: usize,
    seconds: f64,
    num: u64,
    start_at_ms: Option<u64>,
    datasync: bool,
}

fn usage(why: &str) -> ! {
    eprintln!("sync_append: {why}");
    eprintln!(
        "usage: sync_append --dir DIR [--name NAME] [--threads T] [--record_size B] \
         [--seconds S] [--num MAX] [--start_at_ms UNIX_MS] [--sync fsync|fdatasync]"
    );
    std::process::exit(2)
}

fn fail(what: String) -> ! {
    eprintln!("sync_append: error: {what}");
    std::process::exit(1)
}

fn parse() -> Args {
    let mut a = Args {
        dir: String::new(),
        name: "w".into(),
        threads: 1,
        record: 430,
        seconds: 3.0,
        num: u64::MAX,
        start_at_ms: None,
        datasync: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let (flag, value) = match flag.split_once('=') {
            Some((f, v)) => (f.to_string(), v.to_string()),
            None => {
                let v = it
                    .next()
                    .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
                (flag, v)
            }
        };
        let number = |v: &str| -> f64 {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{flag}: not a number: {v}")))
        };
        match flag.replace('-', "_").as_str() {
            "__dir" => a.dir = value,
            "__name" => a.name = value,
            "__threads" => a.threads = number(&value) as usize,
            "__record_size" => a.record = number(&value) as usize,
            "__seconds" => a.seconds = number(&value),
            "__num" => a.num = number(&value) as u64,
            "__start_at_ms" => a.start_at_ms = Some(number(&value) as u64),
            "__sync" => {
                a.datasync = match value.as_str() {
                    "fsync" => false,
                    "fdatasync" => true,
                    _ => usage("--sync: fsync or fdatasync"),
                }
            }
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    if a.dir.is_empty() || a.threads == 0 || a.record == 0 {
        usage("--dir is required; --threads and --record_size must be positive");
    }
    a
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The nearest-rank `p`th percentile of `sorted` in microseconds.
fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

/// One writer; returns false when its file has the wrong length.
fn writer(a: &Args, t: usize) -> bool {
    let name = format!("{}-{t}", a.name);
    let path = format!("{}/{name}.log", a.dir);
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap_or_else(|e| fail(format!("create {path}: {e}")));
    let record: Vec<u8> = (0..a.record)
        .map(|i| (i as u64 * 31 + t as u64 * 7 + 1) as u8)
        .collect();
    let mut late_ms = 0;
    if let Some(at) = a.start_at_ms {
        let now = now_ms();
        if now < at {
            std::thread::sleep(Duration::from_millis(at - now));
        } else {
            late_ms = now - at;
        }
    }
    let limit = Duration::from_secs_f64(a.seconds);
    let start = Instant::now();
    let mut nanos = Vec::with_capacity(1 << 16);
    while (nanos.len() as u64) < a.num && start.elapsed() < limit {
        let t0 = Instant::now();
        f.write_all(&record)
            .unwrap_or_else(|e| fail(format!("write {path}: {e}")));
        let synced = if a.datasync {
            f.sync_data()
        } else {
            f.sync_all()
        };
        synced.unwrap_or_else(|e| fail(format!("sync {path}: {e}")));
        nanos.push(t0.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    drop(f);
    let n = nanos.len() as u64;
    let len = fs::metadata(&path)
        .unwrap_or_else(|e| fail(format!("stat {path}: {e}")))
        .len();
    nanos.sort_unstable();
    let line = format!(
        "sync_append {name}: records {n} secs {secs:.4} ops_per_sec {:.1} p50_us {:.1} \
         p99_us {:.1} p999_us {:.1} p9999_us {:.1} late_ms {late_ms}\n",
        n as f64 / secs.max(1e-9),
        pct(&nanos, 50.0),
        pct(&nanos, 99.0),
        pct(&nanos, 99.9),
        pct(&nanos, 99.99),
    );
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    let good = len == n * a.record as u64;
    if !good {
        eprintln!(
            "sync_append: {path} holds {len} bytes, expected {}",
            n * a.record as u64
        );
    }
    good
}

pub fn main() {
    let a = std::sync::Arc::new(parse());
    if let Err(e) = fs::create_dir_all(&a.dir) {
        fail(format!("mkdir {}: {e}", a.dir));
    }
    let good = if a.threads == 1 {
        writer(&a, 0)
    } else {
        let handles: Vec<_> = (0..a.threads)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || writer(&a, t))
            })
            .collect();
        // Join every writer before judging any.
        let goods: Vec<bool> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .collect();
        goods.iter().all(|g| *g)
    };
    if !good {
        std::process::exit(3);
    }
}
