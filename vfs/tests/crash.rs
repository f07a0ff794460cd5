//! SIGKILL crash test on the image backend.
//!
//! The parent test re-executes its own binary (the ignored test `crash_child`, with
//! `VALET_CRASH_CHILD=<dir>`): the child mounts the store on the image in `<dir>` and runs a
//! random fsync'ing workload forever — creates, appends, overwrites, truncates, renames over
//! other files, deletes (also of files it keeps open), on files of three streams, one of
//! them in a directory and one conventional. Before each batch of operations it appends an
//! `INTENT` line naming the paths the batch touches to an ack log (a host file opened
//! O_APPEND); after the batch's last fsync/close returns it appends a `STATE` line with
//! every file's path and contents (as segments of deterministic bytes derived from file id,
//! offset and version, so the parent can recompute them).
//!
//! The parent kills the child with SIGKILL after a seeded random 20–300 ms, mounts the image
//! (recovery), requires `fsck` to be clean, and takes the last complete `STATE` line: every
//! path that no later `INTENT` names must read back exactly as that state says (or be
//! absent if the state has no file there). Paths an unfinished batch touched may hold
//! anything a partial batch leaves; the parent deletes them, so the next child starts from
//! a state known exactly, and starts the next cycle on the same image.
//!
//! SIGKILL keeps the page cache, so this tests process crashes (including kills during a
//! mount's own recovery), not power loss; `tests/model.rs` covers power loss on the memory
//! device.
//!
//! `VALET_CRASH_CYCLES=N` sets the number of kill/recover cycles (default 50, about 15 s in
//! a debug build); `VALET_CRASH_SEED=S` varies the seed (default fixed), e.g.
//! `VALET_CRASH_CYCLES=5000 cargo test --release -p valet-vfs --test crash`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use valet_vfs::device::{Geometry, ImageDevice, ImageOptions};
use valet_vfs::{FileHandle, Ino, OpenOptions, Store, StoreConfig};

const CHILD_ENV: &str = "VALET_CRASH_CHILD";
const SEED_ENV: &str = "VALET_CRASH_SEED";
const CHILD_TEST: &str = "crash_child";

/// The names files live under: three streams by extension, one in a directory, one that the
/// default placement puts in the conventional area.
const PATHS: [&str; 8] = [
    "w0.log", "w1.log", "t0.sst", "t1.sst", "m0", "d/m1", "d/w2.log", "CURRENT",
];
const MAX_FILE: u64 = 384 * 1024;

fn geometry() -> Geometry {
    Geometry {
        zone_count: 24,
        zone_size: 512 * 1024,
        zone_capacity: 512 * 1024,
        block_size: 4096,
        max_open: 5,
        max_active: 5,
    }
}

fn config(dir: &Path) -> StoreConfig {
    StoreConfig {
        buffers: 3,
        buffer_size: 64 * 1024,
        max_pending_ops: 64,
        conventional_dir: Some(dir.join("conventional")),
        // Fragmented windows are rewritten whenever there is one, so kills land in them.
        defrag_start_bytes: Some(0),
        // Unsynced writes are written back every few operations, so kills land in that too.
        writeback: Some(Duration::from_millis(10)),
        // And handed off in between (journal records with no flush behind them).
        handoff: Some(Duration::from_millis(3)),
        ..Default::default()
    }
}

fn mount(dir: &Path) -> (Store, Ino) {
    // A killed child's io_uring is torn down by the kernel after the child is reaped, and
    // holds the image (and its lock) for a few milliseconds more: wait for that, briefly.
    let since = Instant::now();
    let dev = loop {
        match ImageDevice::open(dir.join("valet.img"), ImageOptions::default()) {
            Ok(dev) => break dev,
            Err(e) if e.to_string().contains("in use") && since.elapsed().as_secs() < 5 => {
                std::thread::yield_now()
            }
            Err(e) => panic!("open image: {e}"),
        }
    };
    let store = Store::open(Arc::new(dev), config(dir)).unwrap_or_else(|e| panic!("mount: {e}"));
    let (_, root) = store.tenant("app").unwrap();
    (store, root)
}

/// splitmix64
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------
// What the ack log describes

/// A file's contents: `size` bytes, of which the segments `(start, end, version)` hold
/// [`byte`]s of that version and everything else reads zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct FileState {
    id: u64,
    size: u64,
    segs: Vec<(u64, u64, u64)>,
}

/// The acknowledged state: every file by path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct State {
    next_id: u64,
    next_version: u64,
    files: BTreeMap<String, FileState>,
}

fn byte(id: u64, offset: u64, version: u64) -> u8 {
    let x = offset
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(id.wrapping_mul(0xD6E8_FEB8_6659_FD93))
        .wrapping_add(version.wrapping_mul(0xA076_1D64_78BD_642F));
    ((x >> 32) as u8) | 1
}

impl FileState {
    /// Cuts `[from, to)` out of the segments.
    fn cut(&mut self, from: u64, to: u64) {
        let mut out = Vec::with_capacity(self.segs.len() + 1);
        for &(s, e, v) in &self.segs {
            if e <= from || s >= to {
                out.push((s, e, v));
                continue;
            }
            if s < from {
                out.push((s, from, v));
            }
            if e > to {
                out.push((to, e, v));
            }
        }
        self.segs = out;
    }

    fn write(&mut self, offset: u64, len: u64, version: u64) {
        self.cut(offset, offset + len);
        self.segs.push((offset, offset + len, version));
        self.segs.sort_unstable();
        self.size = self.size.max(offset + len);
    }

    fn truncate(&mut self, size: u64) {
        self.cut(size, u64::MAX);
        self.size = size;
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.size as usize];
        for &(s, e, v) in &self.segs {
            for o in s..e {
                out[o as usize] = byte(self.id, o, v);
            }
        }
        out
    }
}

fn data(id: u64, offset: u64, len: u64, version: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|o| byte(id, o, version))
        .collect()
}

/// One line of the ack log.
#[derive(Debug, Serialize, Deserialize)]
enum Line {
    /// A batch touching these paths starts.
    Intent(Vec<String>),
    /// The batch is acknowledged (its last fsync/close returned): the whole state.
    State(State),
    /// The log thread's `fdatasync` returned: [`LOG`] holds this many bytes.
    Log(u64),
}

/// A file a second thread of the child appends small records to, `fdatasync` after each,
/// while the batches run: syncs of two threads meet in group commits, and small tails go
/// inline. Its bytes depend on the offset only, so any prefix can be checked.
const LOG: &str = "g.log";
const LOG_ID: u64 = u64::MAX;
const LOG_MAX: u64 = 512 * 1024;

fn append_line(log: &mut fs::File, line: &Line) {
    // One write, starting on a line of its own: a kill can tear a line of one thread (a
    // write cut at a page boundary) and the other thread's next line, or the next child's,
    // then follows it. Readers skip the torn piece.
    let text = format!("\n{}\n", serde_json::to_string(line).unwrap());
    log.write_all(text.as_bytes()).unwrap();
}

/// What the ack log says: the last acknowledged state, the paths touched by batches
/// started after it, the number of acknowledged batches, and the bytes of [`LOG`] synced.
struct Acked {
    state: State,
    touched: Vec<String>,
    acks: usize,
    log: u64,
}

fn read_log(path: &Path) -> Acked {
    let text = fs::read_to_string(path).unwrap();
    let mut state = None;
    let mut touched = Vec::new();
    let mut acks = 0;
    let mut log = 0;
    for line in text.split_inclusive('\n') {
        if !line.ends_with('\n') {
            break; // torn by the kill
        }
        if line.trim().is_empty() {
            continue;
        }
        // A piece of a line torn by a kill: that line's write never completed, so what it
        // would have said (an ack, or an intent whose batch never started) never happened.
        let Ok(line) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        match line {
            Line::Intent(paths) => touched.extend(paths),
            Line::State(s) => {
                state = Some(s);
                touched.clear();
                acks += 1;
            }
            Line::Log(n) => log = log.max(n),
        }
    }
    Acked {
        state: state.expect("the log starts with a state"),
        touched,
        acks,
        log,
    }
}

/// The log thread of the child: appends records of 1–2,000 bytes after the acknowledged
/// end of [`LOG`], each followed by `fdatasync` and an ack line.
fn run_log_thread(store: Store, root: Ino, dir: &Path, seed: u64) {
    let mut ack = fs::OpenOptions::new()
        .append(true)
        .open(dir.join("ack.log"))
        .unwrap();
    let fh = store.open_file(root, LOG, OpenOptions::create()).unwrap();
    let mut at = fh.metadata().unwrap().size;
    let mut rng = Rng(seed ^ 0x5EED);
    loop {
        let len = 1 + rng.below(2000);
        fh.write_at(&data(LOG_ID, at, len, 0), at).unwrap();
        fh.sync_data().unwrap();
        at += len;
        append_line(&mut ack, &Line::Log(at));
    }
}

// ---------------------------------------------------------------------------------------
// The child: a workload that never ends

#[test]
#[ignore = "the child process of crash_recovery_after_sigkill"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let seed = std::env::var(SEED_ENV).unwrap().parse().unwrap();
    run_child(Path::new(&dir), seed);
}

struct Child {
    store: Store,
    root: Ino,
    rng: Rng,
    state: State,
    /// Handles kept open between batches, by file id.
    open: HashMap<u64, FileHandle>,
    /// Handles of files unlinked or replaced while open.
    orphans: Vec<FileHandle>,
}

fn run_child(dir: &Path, seed: u64) {
    let state = read_log(&dir.join("ack.log")).state;
    let mut log = fs::OpenOptions::new()
        .append(true)
        .open(dir.join("ack.log"))
        .unwrap();
    let (store, root) = mount(dir);
    let (log_store, log_dir) = (store.clone(), dir.to_path_buf());
    std::thread::spawn(move || run_log_thread(log_store, root, &log_dir, seed));
    let mut child = Child {
        store,
        root,
        rng: Rng(seed),
        state,
        open: HashMap::new(),
        orphans: Vec::new(),
    };
    loop {
        let touched = child.batch(&mut log);
        if let Some(state) = touched {
            append_line(&mut log, &Line::State(state));
        }
    }
}

impl Child {
    fn handle(&mut self, path: &str) -> &FileHandle {
        let id = self.state.files[path].id;
        if !self.open.contains_key(&id) {
            let opts = OpenOptions {
                read: true,
                write: true,
                ..Default::default()
            };
            let fh = self.store.open_file(self.root, path, opts).unwrap();
            self.open.insert(id, fh);
        }
        &self.open[&id]
    }

    /// Ends a batch on `path`'s file: fsync, or close (both durable).
    fn finish(&mut self, path: &str) {
        let id = self.state.files[path].id;
        if self.rng.below(2) == 0 || self.open.len() > 3 {
            if let Some(fh) = self.open.remove(&id) {
                fh.close().unwrap();
                return;
            }
        }
        self.handle(path).sync_all().unwrap();
    }

    fn version(&mut self) -> u64 {
        self.state.next_version += 1;
        self.state.next_version
    }

    fn write(&mut self, path: &str, offset: u64, len: u64) {
        let version = self.version();
        let f = self.state.files.get_mut(path).unwrap();
        f.write(offset, len, version);
        let bytes = data(f.id, offset, len, version);
        self.handle(path).write_at(&bytes, offset).unwrap();
    }

    /// A file's handle goes with the file out of the namespace.
    fn orphan(&mut self, id: u64) {
        if let Some(fh) = self.open.remove(&id) {
            self.orphans.push(fh);
        }
    }

    /// Runs one batch and returns the state it acknowledged.
    fn batch(&mut self, log: &mut fs::File) -> Option<State> {
        let existing: Vec<String> = self.state.files.keys().cloned().collect();
        let free: Vec<&str> = PATHS
            .iter()
            .copied()
            .filter(|p| !self.state.files.contains_key(*p))
            .collect();
        let pick = self.rng.below(100);
        if existing.is_empty() || (pick < 15 && !free.is_empty()) {
            let &path = free.get(self.rng.below(free.len() as u64) as usize)?;
            append_line(log, &Line::Intent(vec![path.to_string()]));
            self.state.next_id += 1;
            let id = self.state.next_id;
            let opts = OpenOptions {
                exclusive: true,
                ..OpenOptions::create()
            };
            let fh = self.store.open_file(self.root, path, opts).unwrap();
            self.open.insert(id, fh);
            self.state.files.insert(
                path.to_string(),
                FileState {
                    id,
                    ..Default::default()
                },
            );
            let mut at = 0;
            for _ in 0..1 + self.rng.below(3) {
                let len = 1 + self.rng.below(100_000);
                self.write(path, at, len);
                at += len;
            }
            self.finish(path);
            return Some(self.state.clone());
        }
        let path = existing[self.rng.below(existing.len() as u64) as usize].clone();
        let size = self.state.files[&path].size;
        append_line(log, &Line::Intent(vec![path.clone()]));
        match pick {
            // Append.
            _ if pick < 50 && size < MAX_FILE => {
                let mut at = size;
                for _ in 0..1 + self.rng.below(3) {
                    let len = 1 + self.rng.below(40_000);
                    self.write(&path, at, len);
                    at += len;
                }
                self.finish(&path);
            }
            // Overwrite inside, unaligned, maybe past the end.
            _ if pick < 70 => {
                let offset = self.rng.below(size.min(MAX_FILE));
                let len = 1 + self.rng.below(50_000);
                self.write(&path, offset, len);
                self.finish(&path);
            }
            // Truncate, down or up.
            _ if pick < 80 || size >= MAX_FILE => {
                let new = self.rng.below(size.min(MAX_FILE) * 3 / 2 + 1);
                self.state.files.get_mut(&path).unwrap().truncate(new);
                self.handle(&path).set_len(new).unwrap();
                self.finish(&path);
            }
            // Rename, replacing whatever is at the target.
            _ if pick < 90 => {
                let to = PATHS[self.rng.below(PATHS.len() as u64) as usize];
                if to == path {
                    return None;
                }
                append_line(log, &Line::Intent(vec![to.to_string()]));
                self.store.rename(self.root, &path, self.root, to).unwrap();
                let moved = self.state.files.remove(&path).unwrap();
                if let Some(replaced) = self.state.files.insert(to.to_string(), moved) {
                    self.orphan(replaced.id);
                }
                if self.rng.below(2) == 0 {
                    self.store.sync().unwrap();
                } else {
                    self.finish(to);
                }
            }
            // Delete.
            _ => {
                self.store.unlink(self.root, &path).unwrap();
                let gone = self.state.files.remove(&path).unwrap();
                self.orphan(gone.id);
                self.store.sync().unwrap();
            }
        }
        // Orphans close at some later batch (each close frees the file durably).
        if self.rng.below(3) == 0 {
            for fh in self.orphans.drain(..) {
                fh.close().unwrap();
            }
        }
        Some(self.state.clone())
    }
}

// ---------------------------------------------------------------------------------------
// The parent

/// The image with a directory and nothing else, and an ack log saying so.
fn fresh(dir: &Path) {
    ImageDevice::create(dir.join("valet.img"), geometry(), ImageOptions::default()).unwrap();
    let (store, root) = mount(dir);
    store.create_dir(root, "d").unwrap();
    store.sync().unwrap();
    write_baseline(dir, &State::default());
}

fn write_baseline(dir: &Path, state: &State) {
    let previous = fs::read_to_string(dir.join("ack.log"))
        .ok()
        .map(|_| read_log(&dir.join("ack.log")).log)
        .filter(|&log| log <= LOG_MAX)
        .unwrap_or(0);
    let mut log = fs::File::create(dir.join("ack.log")).unwrap();
    append_line(&mut log, &Line::State(state.clone()));
    append_line(&mut log, &Line::Log(previous));
    log.sync_all().unwrap();
}

fn read_path(store: &Store, root: Ino, path: &str) -> Option<Vec<u8>> {
    let fh = store.open_file(root, path, OpenOptions::read()).ok()?;
    let size = fh.metadata().unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let n = fh.read_at(&mut buf, 0).unwrap();
    assert_eq!(n, size, "{path}: short read");
    fh.close().unwrap();
    Some(buf)
}

/// Recovers the image after a kill and checks the acknowledged state; returns the state the
/// next child starts from (the uncertain files deleted) and the acknowledged batch count.
fn recover_and_check(dir: &Path, cycle: usize) -> (State, usize) {
    let Acked {
        mut state,
        touched,
        acks,
        log,
    } = read_log(&dir.join("ack.log"));
    let (store, root) = mount(dir);
    let report = store.fsck().unwrap();
    assert!(
        report.is_clean(),
        "cycle {cycle}: fsck after recovery: {report:?}"
    );
    // The log thread's synced prefix survives; what followed it is cut off, so the next
    // child appends after exactly what was acknowledged.
    if let Some(got) = read_path(&store, root, LOG) {
        assert!(
            got.len() as u64 >= log,
            "cycle {cycle}: {LOG} has {} bytes, {log} were synced",
            got.len()
        );
        if got[..log as usize] != data(LOG_ID, 0, log, 0)[..] {
            panic!("cycle {cycle}: {LOG} lost synced bytes (first {log} acknowledged)");
        }
        let fh = store.open_file(root, LOG, OpenOptions::create()).unwrap();
        // Kept small on the small device: past 512 KiB the next child starts it afresh.
        fh.set_len(if log > LOG_MAX { 0 } else { log }).unwrap();
        fh.close().unwrap();
    } else {
        assert_eq!(log, 0, "cycle {cycle}: {LOG} is gone");
    }
    for path in PATHS {
        if touched.iter().any(|t| t == path) {
            continue;
        }
        let got = read_path(&store, root, path);
        match (state.files.get(path), got) {
            (None, None) => {}
            (Some(f), Some(got)) => {
                let want = f.bytes();
                if got != want {
                    let first = (0..got.len().min(want.len()))
                        .find(|&i| got[i] != want[i])
                        .unwrap_or(got.len().min(want.len()));
                    panic!(
                        "cycle {cycle}: {path} (file {}) lost acknowledged data: {} bytes, \
                         want {}, first difference at {first}",
                        f.id,
                        got.len(),
                        want.len()
                    );
                }
            }
            (want, got) => panic!(
                "cycle {cycle}: {path}: acknowledged {:?}, recovered {:?}",
                want.map(|f| f.id),
                got.map(|g| g.len())
            ),
        }
    }
    // What an unfinished batch touched is unknown: start the next cycle without it.
    for path in &touched {
        if store.lookup(root, path).is_ok() {
            store.unlink(root, path).unwrap();
        }
        state.files.remove(path);
    }
    store.sync().unwrap();
    let report = store.fsck().unwrap();
    assert!(
        report.is_clean(),
        "cycle {cycle}: fsck after cleanup: {report:?}"
    );
    drop(store);
    (state, acks)
}

#[test]
fn crash_recovery_after_sigkill() {
    let cycles: usize = std::env::var("VALET_CRASH_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(50);
    let seed: u64 = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00C0_FFEE);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fresh(dir);
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng(seed);
    let mut acked = 0;
    let started = Instant::now();
    for cycle in 0..cycles {
        let out = fs::File::create(dir.join("child.out")).unwrap();
        let mut child = Command::new(&exe)
            .args([CHILD_TEST, "--exact", "--ignored", "--nocapture"])
            .env(CHILD_ENV, dir)
            .env(SEED_ENV, rng.next().to_string())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(20 + rng.below(281)));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        if status.signal() != Some(libc::SIGKILL) {
            let output = fs::read_to_string(dir.join("child.out")).unwrap_or_default();
            panic!("cycle {cycle}: the child exited by itself ({status}):\n{output}");
        }
        let (state, acks) = recover_and_check(dir, cycle);
        acked += acks.saturating_sub(1); // the first state is the baseline
        write_baseline(dir, &state);
    }
    if std::env::var("VALET_CRASH_VERBOSE").is_ok() {
        eprintln!(
            "{cycles} cycles, {acked} acknowledged batches, {:?}",
            started.elapsed()
        );
    }
    // The children must have got somewhere, or the test proves nothing.
    assert!(
        acked >= cycles,
        "only {acked} acknowledged batches in {cycles} cycles ({:?})",
        started.elapsed()
    );
}
