//! Synced small writes against what the disk allows: the one-flush limit (a 4 KiB overwrite
//! of an already written block of a host file, then `fdatasync`), what stock pays per synced
//! record (a 430 B append, then `fdatasync`), and several writers appending small records
//! with an fsync after each, at once: tenants of one `valet-run`, threads of one
//! wasip1-threads guest, stock wasmtime processes and native threads. All on the disk of the
//! report's data directory, in the same run as the guests.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::runners::{Runner, MOUNT};
use super::workloads::Scale;

/// The guests of the grouped-sync runs: one writer, and `--threads T` writers.
pub const GUEST: &str = "sync_append";
pub const THREADS_GUEST: &str = "threads_sync_append";
/// Record size of the synced appends: LevelDB's log record for a 20 B key and a 400 B value.
pub const RECORD: usize = 430;
/// Writers of the grouped-sync runs (tenants, processes or threads).
pub const WRITERS: usize = 4;
/// Block of the one-flush limit.
const BLOCK: usize = 4096;
/// Blocks of the file the one-flush limit overwrites, written and synced first.
const LIMIT_BLOCKS: u64 = 256;
/// Untimed operations before each native probe.
pub const WARMUP: usize = 50;
/// How far ahead of launch the writers of one run are told to start, so that writers in
/// different processes start together whatever their start-up costs.
const LEAD: Duration = Duration::from_millis(2500);

/// Operations of each native probe at `scale`.
pub fn probe_ops(scale: Scale) -> usize {
    match scale {
        Scale::Small => 5_000,
        Scale::Full => 20_000,
    }
}

/// Seconds each writer of a grouped-sync run appends.
pub fn seconds(scale: Scale) -> f64 {
    match scale {
        Scale::Small => 3.0,
        Scale::Full => 10.0,
    }
}

/// A native loop's rate and per-operation latency (µs).
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub ops: usize,
    pub ops_per_sec: f64,
    pub p50: f64,
    pub p99: f64,
    pub p9999: f64,
}

impl Probe {
    fn from_nanos(mut nanos: Vec<u64>, elapsed: Duration) -> Probe {
        nanos.sort_unstable();
        let pct = |p: f64| {
            let rank = (p / 100.0 * nanos.len() as f64).ceil() as usize;
            nanos
                .get(rank.clamp(1, nanos.len().max(1)) - 1)
                .map_or(0.0, |n| *n as f64 / 1000.0)
        };
        Probe {
            ops: nanos.len(),
            ops_per_sec: nanos.len() as f64 / elapsed.as_secs_f64().max(1e-9),
            p50: pct(50.0),
            p99: pct(99.0),
            p9999: pct(99.99),
        }
    }
}

/// Runs `op(i)` `WARMUP` times untimed, then `n` times timed.
fn timed(n: usize, mut op: impl FnMut(usize) -> std::io::Result<()>) -> Result<Probe, String> {
    for i in 0..WARMUP {
        op(i).map_err(|e| e.to_string())?;
    }
    let mut nanos = Vec::with_capacity(n);
    let start = Instant::now();
    for i in WARMUP..WARMUP + n {
        let t = Instant::now();
        op(i).map_err(|e| e.to_string())?;
        nanos.push(t.elapsed().as_nanos() as u64);
    }
    Ok(Probe::from_nanos(nanos, start.elapsed()))
}

/// The one-flush limit: `n` times, a 4 KiB `pwrite` over an already written and synced
/// block of a file in `dir`, then `fdatasync` (no allocation, no size change: one data
/// write and one device flush).
pub fn overwrite_limit(dir: &Path, n: usize) -> Result<Probe, String> {
    let path = dir.join("one-flush-limit.dat");
    let f = written_blocks(&path)?;
    let block = vec![0x5au8; BLOCK];
    let probe = timed(n, |i| {
        let at = (i as u64 % LIMIT_BLOCKS) * BLOCK as u64;
        f.write_all_at(&block, at)?;
        f.sync_data()
    });
    drop(f);
    let _ = std::fs::remove_file(&path);
    probe
}

/// A new file at `path` of `LIMIT_BLOCKS` blocks, written and synced: overwriting one of
/// them then costs one data write and one flush.
fn written_blocks(path: &Path) -> Result<File, String> {
    let f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for b in 0..LIMIT_BLOCKS {
        f.write_all_at(&[0x5a; BLOCK], b * BLOCK as u64)
            .map_err(|e| e.to_string())?;
    }
    f.sync_all().map_err(|e| e.to_string())?;
    Ok(f)
}

/// Appends `record`-byte records to a new file `name` in `dir`, `fdatasync` after each:
/// `n` times after the warm-up, or until `until` when given (then `n` is only a bound).
fn append_loop(
    path: &Path,
    record: usize,
    n: usize,
    until: Option<Instant>,
) -> Result<Probe, String> {
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let data = vec![0xa5u8; record];
    let Some(until) = until else {
        return timed(n, |_| {
            f.write_all(&data)?;
            f.sync_data()
        });
    };
    let mut nanos = Vec::new();
    let start = Instant::now();
    while Instant::now() < until && nanos.len() < n {
        let t = Instant::now();
        f.write_all(&data).map_err(|e| e.to_string())?;
        f.sync_data().map_err(|e| e.to_string())?;
        nanos.push(t.elapsed().as_nanos() as u64);
    }
    Ok(Probe::from_nanos(nanos, start.elapsed()))
}

/// What stock pays per synced record on this disk: `n` times a 430 B append + `fdatasync`.
pub fn append_probe(dir: &Path, n: usize) -> Result<Probe, String> {
    let path = dir.join("append-probe.log");
    let probe = append_loop(&path, RECORD, n, None);
    let _ = std::fs::remove_file(&path);
    probe
}

/// One writer of a grouped-sync run, as `sync_append` prints it.
#[derive(Clone, Debug, PartialEq)]
pub struct Writer {
    pub name: String,
    pub records: u64,
    pub secs: f64,
    pub ops_per_sec: f64,
    pub p50: f64,
    pub p99: f64,
    pub p9999: f64,
    /// How late it started against the agreed start, in ms.
    pub late_ms: f64,
}

/// Every `sync_append NAME: key value ...` line of `stdout` (tenants' lines interleave,
/// but each is one write).
pub fn parse_writers(stdout: &str) -> Vec<Writer> {
    stdout
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("sync_append ")?;
            let (name, fields) = rest.split_once(':')?;
            let tokens: Vec<&str> = fields.split_whitespace().collect();
            let get = |key: &str| -> Option<f64> {
                let at = tokens.iter().position(|t| *t == key)?;
                tokens.get(at + 1)?.parse().ok()
            };
            Some(Writer {
                name: name.trim().to_string(),
                records: get("records")? as u64,
                secs: get("secs")?,
                ops_per_sec: get("ops_per_sec")?,
                p50: get("p50_us")?,
                p99: get("p99_us")?,
                p9999: get("p9999_us")?,
                late_ms: get("late_ms").unwrap_or(0.0),
            })
        })
        .collect()
}

/// The writers of one grouped-sync run.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub writers: Vec<Writer>,
}

impl Group {
    /// Syncs per second of all writers together (they ran over the same window).
    pub fn aggregate(&self) -> f64 {
        self.writers.iter().map(|w| w.ops_per_sec).sum()
    }

    /// The median of the writers' P50s.
    pub fn p50(&self) -> f64 {
        let mut v: Vec<f64> = self.writers.iter().map(|w| w.p50).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
    }

    fn max(&self, f: impl Fn(&Writer) -> f64) -> f64 {
        self.writers.iter().map(f).fold(0.0, f64::max)
    }

    pub fn p99(&self) -> f64 {
        self.max(|w| w.p99)
    }

    pub fn p9999(&self) -> f64 {
        self.max(|w| w.p9999)
    }

    pub fn late_ms(&self) -> f64 {
        self.max(|w| w.late_ms)
    }

    /// Slowest and fastest writer's syncs/s.
    pub fn spread(&self) -> (f64, f64) {
        let rates = self.writers.iter().map(|w| w.ops_per_sec);
        (
            rates.clone().fold(f64::INFINITY, f64::min),
            rates.fold(0.0, f64::max),
        )
    }
}

/// Which grouped-sync run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One `sync_append` under valet-run.
    ValetOne,
    /// `WRITERS` tenants of one `valet-run --tenants`.
    ValetTenants,
    /// One `threads_sync_append --threads WRITERS` under valet-run.
    ValetThreads,
    /// One `sync_append` under stock wasmtime.
    StockOne,
    /// `WRITERS` stock wasmtime processes at once.
    StockProcesses,
    /// `WRITERS` native threads of this process (430 B append + fdatasync).
    NativeThreads,
    /// `WRITERS` threads of this process on one store, no guest.
    StoreThreads,
    /// The ideal group commit of `WRITERS` native threads, waiting asleep.
    IdealSleeping,
    /// The same, the waiting threads yielding their cores in a loop.
    IdealYielding,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::ValetOne,
        Kind::StockOne,
        Kind::ValetTenants,
        Kind::ValetThreads,
        Kind::StoreThreads,
        Kind::StockProcesses,
        Kind::NativeThreads,
        Kind::IdealSleeping,
        Kind::IdealYielding,
    ];

    pub fn label(self) -> String {
        match self {
            Kind::ValetOne => "valet-run, 1 guest".into(),
            Kind::ValetTenants => format!("valet-run --tenants, {WRITERS} tenants"),
            Kind::ValetThreads => {
                format!("valet-run, 1 wasip1-threads guest, {WRITERS} threads")
            }
            Kind::StockOne => "stock wasmtime 48, 1 process".into(),
            Kind::StockProcesses => format!("stock wasmtime 48, {WRITERS} processes at once"),
            Kind::NativeThreads => format!("native, {WRITERS} threads (fdatasync)"),
            Kind::StoreThreads => format!("the store alone (no guest), {WRITERS} threads"),
            Kind::IdealSleeping => {
                format!("ideal group commit, {WRITERS} native threads, sleeping waits")
            }
            Kind::IdealYielding => {
                format!("ideal group commit, {WRITERS} native threads, yielding waits")
            }
        }
    }
}

/// Every round of one kind of grouped-sync run.
#[derive(Clone, Debug, PartialEq)]
pub struct Rounds(pub Vec<Group>);

impl Rounds {
    /// The round with the median aggregate (the lower middle one of an even count).
    pub fn median(&self) -> Option<&Group> {
        let mut v: Vec<&Group> = self.0.iter().collect();
        v.sort_by(|a, b| a.aggregate().total_cmp(&b.aggregate()));
        v.get(v.len().saturating_sub(1) / 2).copied()
    }
}

/// Everything this module measures.
pub struct Synced {
    /// The one-flush limit, measured right after the LevelDB `--sync 1` runs.
    pub limit: Result<Probe, String>,
    /// 430 B append + fdatasync, measured with the limit.
    pub append: Result<Probe, String>,
    /// The same appends through the store alone, measured with the limit.
    pub store: Result<Probe, String>,
    /// The limit and the append again, right before the grouped-sync runs (how much the
    /// disk drifted).
    pub limit_again: Result<Probe, String>,
    pub append_again: Result<Probe, String>,
    pub groups: Vec<(Kind, Result<Rounds, String>)>,
}

impl Synced {
    /// The probes at the LevelDB rows (`first`) and before the grouped syncs (`again`),
    /// with the grouped syncs.
    pub fn new(first: Probes, again: Probes, groups: Vec<(Kind, Result<Rounds, String>)>) -> Self {
        Synced {
            limit: first.limit,
            append: first.append,
            store: first.store,
            limit_again: again.limit,
            append_again: again.append,
            groups,
        }
    }

    /// The median round of `kind`.
    pub fn group(&self, kind: Kind) -> Option<&Group> {
        self.groups
            .iter()
            .find(|(k, _)| *k == kind)
            .and_then(|(_, g)| g.as_ref().ok())
            .and_then(Rounds::median)
    }
}

/// Rounds of every grouped-sync run at `scale` (the kinds alternate within a round).
pub fn rounds(scale: Scale) -> usize {
    match scale {
        Scale::Small => 3,
        Scale::Full => 2,
    }
}

/// The store alone, no guest and no WASI: `n` times a 430 B append to a file of a store on
/// an image in `dir`, then `fdatasync` (`FileHandle::sync_data`). What the store adds to the
/// disk's one-flush limit.
pub fn store_probe(dir: &Path, n: usize) -> Result<Probe, String> {
    let image = dir.join("store-probe.img");
    let (store, root) = probe_store(&image)?;
    let file = store
        .open_file(root, "000003.log", valet_vfs::OpenOptions::create())
        .map_err(|e| e.to_string())?;
    let data = vec![0xa5u8; RECORD];
    let probe = timed(n, |i| {
        file.write_at(&data, (i * RECORD) as u64)
            .and_then(|_| file.sync_data())
            .map_err(std::io::Error::other)
    });
    let closed = file.close().and_then(|()| store.unmount());
    let _ = std::fs::remove_file(&image);
    closed.map_err(|e| e.to_string())?;
    probe
}

/// A store of its own on a new image at `image` (the embedded geometry), with the root of
/// its tenant `probe`.
fn probe_store(image: &Path) -> Result<(valet_vfs::Store, valet_vfs::Ino), String> {
    use std::sync::Arc;
    use valet_vfs::device::{Geometry, ImageDevice, ImageOptions};
    let device = ImageDevice::create(image, Geometry::EMBEDDED_DEFAULT, ImageOptions::default())
        .map_err(|e| format!("{}: {e}", image.display()))?;
    let store = valet_vfs::Store::open(Arc::new(device), valet_vfs::StoreConfig::default())
        .map_err(|e| e.to_string())?;
    let (_, root) = store.tenant("probe").map_err(|e| e.to_string())?;
    Ok((store, root))
}

/// The probes of one measuring point.
pub struct Probes {
    pub limit: Result<Probe, String>,
    pub append: Result<Probe, String>,
    pub store: Result<Probe, String>,
}

/// The native probes and the store probe, in a scratch directory of `work`.
pub fn probes(work: &Path, scale: Scale) -> Probes {
    let dir = match tempfile::Builder::new().prefix("flush-").tempdir_in(work) {
        Ok(d) => d,
        Err(e) => {
            let e = format!("scratch directory in {}: {e}", work.display());
            return Probes {
                limit: Err(e.clone()),
                append: Err(e.clone()),
                store: Err(e),
            };
        }
    };
    let n = probe_ops(scale);
    Probes {
        limit: overwrite_limit(dir.path(), n),
        append: append_probe(dir.path(), n),
        store: store_probe(dir.path(), n),
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `sync_append`'s arguments for writer `name` starting at `start`.
fn guest_args(name: &str, secs: f64, start: SystemTime, threads: usize) -> Vec<String> {
    [
        "--dir",
        &format!("{MOUNT}/log"),
        "--name",
        name,
        "--threads",
        &threads.to_string(),
        "--record_size",
        &RECORD.to_string(),
        "--seconds",
        &secs.to_string(),
        "--start_at_ms",
        &unix_ms(start).to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// The writers a finished run printed, `expect` of them, or why not.
fn group_of(out: super::runners::Outcome, expect: usize) -> Result<Group, String> {
    if out.code != 0 {
        return Err(out.why());
    }
    let writers = parse_writers(&out.stdout);
    if writers.len() != expect {
        return Err(format!("{} writer lines, expected {expect}", writers.len()));
    }
    Ok(Group { writers })
}

fn valet_tenants(runner: &Runner, wasm: &str, secs: f64, zones: u32) -> Result<Group, String> {
    let start = SystemTime::now() + LEAD;
    let mut toml = String::new();
    for t in 0..WRITERS {
        let name = format!("t{t}");
        let args: Vec<String> = guest_args(&name, secs, start, 1)
            .iter()
            .map(|a| format!("{a:?}"))
            .collect();
        toml.push_str(&format!(
            "[[tenant]]\nname = {name:?}\napp = {wasm:?}\nargs = [{}]\npolicy = \"default\"\n\
             mount = {MOUNT:?}\n\n",
            args.join(", ")
        ));
    }
    let file = runner.work.join("sync-tenants.toml");
    std::fs::write(&file, toml).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = runner.valet(&["--tenants".into(), file.display().to_string()], zones)?;
    group_of(out, WRITERS)
}

fn stock_processes(runner: &Runner, wasm: &str, secs: f64, n: usize) -> Result<Group, String> {
    let start = SystemTime::now() + LEAD;
    let outs: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|p| {
                let args = guest_args(&format!("p{p}"), secs, start, 1);
                s.spawn(move || runner.stock(wasm, &args))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("runner panicked".into())))
            .collect()
    });
    let mut writers = Vec::new();
    for out in outs {
        writers.extend(group_of(out?, 1)?.writers);
    }
    Ok(Group { writers })
}

fn native_threads(work: &Path, secs: f64, n: usize) -> Result<Group, String> {
    let dir = tempfile::Builder::new()
        .prefix("native-sync-")
        .tempdir_in(work)
        .map_err(|e| e.to_string())?;
    thread_group(n, secs, |t, until| {
        append_loop(
            &dir.path().join(format!("n{t}.log")),
            RECORD,
            usize::MAX,
            Some(until),
        )
    })
}

/// `n` threads of this process appending to files of one store on an image in `work`, no
/// guest and no WASI: what the store's group commit gives without any guest's cost.
fn store_threads(work: &Path, secs: f64, n: usize) -> Result<Group, String> {
    let dir = tempfile::Builder::new()
        .prefix("store-sync-")
        .tempdir_in(work)
        .map_err(|e| e.to_string())?;
    let (store, root) = probe_store(&dir.path().join("zones.img"))?;
    let group = thread_group(n, secs, |t, until| {
        let file = store
            .open_file(root, &format!("s{t}.log"), valet_vfs::OpenOptions::create())
            .map_err(|e| e.to_string())?;
        let data = vec![0xa5u8; RECORD];
        let mut nanos = Vec::new();
        let start = Instant::now();
        while Instant::now() < until {
            let at = (nanos.len() * RECORD) as u64;
            let t = Instant::now();
            file.write_at(&data, at).map_err(|e| e.to_string())?;
            file.sync_data().map_err(|e| e.to_string())?;
            nanos.push(t.elapsed().as_nanos() as u64);
        }
        let elapsed = start.elapsed();
        file.close().map_err(|e| e.to_string())?;
        Ok(Probe::from_nanos(nanos, elapsed))
    });
    store.unmount().map_err(|e| e.to_string())?;
    group
}

/// How the writers of the ideal group commit wait for the flush that covers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    /// On a condition variable: the flushing thread wakes them.
    Sleep,
    /// Yielding their cores in a loop until the flush ends.
    Yield,
}

/// One round of the ideal group commit: the records of the writers that arrived, in one
/// page, and the number of the flush that will carry them.
struct IdealRound {
    flush: u64,
    arrived: usize,
    /// Writers still writing (a writer whose time is up leaves).
    active: usize,
    page: Vec<u8>,
    failed: Option<String>,
}

/// The ideal group commit on this disk: `n` threads of this process, each copying a 430 B
/// record into one shared page; the last to arrive writes the page over an already
/// written block of a file in `work`, `fdatasync`s it and wakes the others. No store, no
/// journal, no allocation, no waiting for stragglers: every flush carries every writer,
/// which is the most any group commit can do for writers that each sync after each
/// record. What it loses against `n` syncs per one-flush limit is the time between one
/// flush's end and the next one's start: waking the writers and their next records.
fn ideal_group(work: &Path, secs: f64, n: usize, waiting: Waiting) -> Result<Group, String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Condvar, Mutex, MutexGuard};

    let dir = tempfile::Builder::new()
        .prefix("ideal-sync-")
        .tempdir_in(work)
        .map_err(|e| e.to_string())?;
    let file = written_blocks(&dir.path().join("ideal.dat"))?;
    let round = Mutex::new(IdealRound {
        flush: 0,
        arrived: 0,
        active: n,
        page: vec![0; BLOCK],
        failed: None,
    });
    let (flushed, ended) = (Condvar::new(), AtomicU64::new(0));
    // The caller is the last active writer to arrive: flush the page for everyone.
    let commit = |mut st: MutexGuard<'_, IdealRound>| {
        let at = (st.flush % LIMIT_BLOCKS) * BLOCK as u64;
        let page = std::mem::take(&mut st.page);
        drop(st); // the others all wait: nothing changes the round meanwhile
        let done = file.write_all_at(&page, at).and_then(|()| file.sync_data());
        let mut st = round.lock().unwrap_or_else(|p| p.into_inner());
        st.page = page;
        st.failed = st.failed.take().or(done.err().map(|e| e.to_string()));
        st.arrived = 0;
        st.flush += 1;
        ended.store(st.flush, Ordering::Release);
        flushed.notify_all();
    };
    let lock = || round.lock().unwrap_or_else(|p| p.into_inner());
    thread_group(n, secs, |_, until| {
        let record = [0xa5u8; RECORD];
        let mut nanos = Vec::new();
        let start = Instant::now();
        while Instant::now() < until {
            let t = Instant::now();
            let mut st = lock();
            let at = (st.arrived * RECORD) % (BLOCK - RECORD);
            st.page[at..at + RECORD].copy_from_slice(&record);
            st.arrived += 1;
            let mine = st.flush;
            let failed = if st.arrived == st.active {
                commit(st);
                lock().failed.clone()
            } else if waiting == Waiting::Yield {
                drop(st);
                while ended.load(Ordering::Acquire) == mine {
                    std::thread::yield_now();
                }
                lock().failed.clone()
            } else {
                while st.flush == mine {
                    st = flushed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                st.failed.clone()
            };
            if let Some(e) = failed {
                return Err(e);
            }
            nanos.push(t.elapsed().as_nanos() as u64);
        }
        let elapsed = start.elapsed();
        // Leave; the others, if all waiting now, would wait for us forever: flush for them.
        let mut st = lock();
        st.active -= 1;
        if st.arrived > 0 && st.arrived == st.active {
            commit(st);
        }
        Ok(Probe::from_nanos(nanos, elapsed))
    })
}

/// `n` threads of this process, each running `writer(t, until)` from one instant until
/// `secs` later; the probes they return as one group.
fn thread_group(
    n: usize,
    secs: f64,
    writer: impl Fn(usize, Instant) -> Result<Probe, String> + Sync,
) -> Result<Group, String> {
    let barrier = Barrier::new(n);
    let results: Vec<Result<Probe, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (barrier, writer) = (&barrier, &writer);
                s.spawn(move || {
                    barrier.wait();
                    writer(t, Instant::now() + Duration::from_secs_f64(secs))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("writer panicked".into())))
            .collect()
    });
    let mut writers = Vec::new();
    for (t, r) in results.into_iter().enumerate() {
        let p = r?;
        writers.push(Writer {
            name: format!("w{t}"),
            records: p.ops as u64,
            secs: p.ops as f64 / p.ops_per_sec.max(1e-9),
            ops_per_sec: p.ops_per_sec,
            p50: p.p50,
            p99: p.p99,
            p9999: p.p9999,
            late_ms: 0.0,
        });
    }
    Ok(Group { writers })
}

/// The grouped-sync runs (those whose guest was built), [`rounds`] of each, the kinds
/// taking turns so that a slow spell of the disk does not fall on one kind alone.
pub fn groups(runner: &Runner, scale: Scale) -> Vec<(Kind, Result<Rounds, String>)> {
    let mut out: Vec<(Kind, Result<Rounds, String>)> = Kind::ALL
        .iter()
        .map(|k| (*k, Ok(Rounds(Vec::new()))))
        .collect();
    for round in 0..rounds(scale) {
        for (kind, slot) in out.iter_mut() {
            let Ok(rounds) = slot else { continue };
            eprintln!(
                "report: synced appends, {}, round {}",
                kind.label(),
                round + 1
            );
            match group(runner, scale, *kind) {
                Ok(g) => rounds.0.push(g),
                Err(e) => *slot = Err(e),
            }
        }
    }
    out
}

/// One run of `kind`.
fn group(runner: &Runner, scale: Scale, kind: Kind) -> Result<Group, String> {
    let secs = seconds(scale);
    let zones = scale.zones();
    let wasm = match kind {
        Kind::ValetThreads => valet_guests::wasm(THREADS_GUEST),
        Kind::NativeThreads | Kind::StoreThreads | Kind::IdealSleeping | Kind::IdealYielding => {
            Some("")
        }
        _ => valet_guests::wasm(GUEST),
    };
    let Some(wasm) = wasm else {
        return Err("guest not built".to_string());
    };
    match kind {
        Kind::ValetOne => {
            let start = SystemTime::now() + LEAD;
            runner
                .guest(wasm, "default", guest_args("one", secs, start, 1), zones)
                .and_then(|o| group_of(o, 1))
        }
        Kind::ValetTenants => valet_tenants(runner, wasm, secs, zones),
        Kind::ValetThreads => {
            let start = SystemTime::now() + LEAD;
            let args = guest_args("th", secs, start, WRITERS);
            runner
                .guest(wasm, "default", args, zones)
                .and_then(|o| group_of(o, WRITERS))
        }
        Kind::StockOne => stock_processes(runner, wasm, secs, 1),
        Kind::StockProcesses => stock_processes(runner, wasm, secs, WRITERS),
        Kind::NativeThreads => native_threads(&runner.work, secs, WRITERS),
        Kind::StoreThreads => store_threads(&runner.work, secs, WRITERS),
        Kind::IdealSleeping => ideal_group(&runner.work, secs, WRITERS, Waiting::Sleep),
        Kind::IdealYielding => ideal_group(&runner.work, secs, WRITERS, Waiting::Yield),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_writer_lines_among_others() {
        let out = "\
sync_append t0-0: records 6000 secs 3.0010 ops_per_sec 1999.3 p50_us 401.2 p99_us 900.0 p999_us 1500.0 p9999_us 2000.5 late_ms 0
some other tenant's line
sync_append t1-0: records 3000 secs 3.0000 ops_per_sec 1000.0 p50_us 600.0 p99_us 1200.0 p999_us 1600.0 p9999_us 3000.0 late_ms 12
sync_append broken: records x
";
        let w = parse_writers(out);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].name, "t0-0");
        assert_eq!(w[0].records, 6000);
        assert_eq!(w[1].late_ms, 12.0);
        let g = Group { writers: w };
        assert!((g.aggregate() - 2999.3).abs() < 1e-9);
        assert_eq!(g.p50(), 401.2);
        assert_eq!(g.p9999(), 3000.0);
        assert_eq!(g.spread(), (1000.0, 1999.3));
    }

    #[test]
    fn median_round() {
        let w = |rate: f64| Writer {
            name: "w".into(),
            records: 1,
            secs: 1.0,
            ops_per_sec: rate,
            p50: 1.0,
            p99: 1.0,
            p9999: 1.0,
            late_ms: 0.0,
        };
        let g = |rate| Group {
            writers: vec![w(rate)],
        };
        let r = Rounds(vec![g(30.0), g(10.0), g(20.0)]);
        assert_eq!(r.median().unwrap().aggregate(), 20.0);
        assert_eq!(
            Rounds(vec![g(30.0), g(10.0)]).median().unwrap().aggregate(),
            10.0
        );
        assert!(Rounds(Vec::new()).median().is_none());
    }

    #[test]
    fn probe_percentiles() {
        let p = Probe::from_nanos(
            (1..=1000).map(|i| i * 1000).collect(),
            Duration::from_secs(2),
        );
        assert_eq!(p.ops, 1000);
        assert_eq!(p.ops_per_sec, 500.0);
        assert_eq!(p.p50, 500.0);
        assert_eq!(p.p99, 990.0);
        assert_eq!(p.p9999, 1000.0);
    }

    #[test]
    fn ideal_group_commit_ends_with_every_writer() {
        let dir = tempfile::tempdir().unwrap();
        for waiting in [Waiting::Sleep, Waiting::Yield] {
            let g = ideal_group(dir.path(), 0.2, 3, waiting).unwrap();
            assert_eq!(g.writers.len(), 3);
            // Every flush carries every writer while all three write.
            assert!(g.writers.iter().all(|w| w.records > 0), "{waiting:?}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn native_probes_run() {
        let dir = tempfile::tempdir().unwrap();
        let limit = overwrite_limit(dir.path(), 5).unwrap();
        assert_eq!(limit.ops, 5);
        let append = append_probe(dir.path(), 5).unwrap();
        assert_eq!(append.ops, 5);
        assert!(append.p50 > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
