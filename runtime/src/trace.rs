//! Placement traces: what a run asked its policy and told it, recorded as JSON lines
//! (`valet-run --record-trace FILE`), and replayed against any policy
//! (`valet-run policy check FILE.wasm --trace TRACE`) to see its decisions — and, replayed
//! on a store, the write amplification they lead to.
//!
//! One record per line:
//!
//! ```text
//! {"t":0.0012,"op":"place","tenant":0,"path":"db/000003.log","reason":"create","size":0}
//! {"t":0.0150,"op":"written","tenant":0,"path":"db/000003.log","bytes":524288}
//! {"t":0.0151,"op":"synced","tenant":0,"path":"db/000003.log"}
//! {"t":0.0200,"op":"closed","tenant":0,"path":"db/000003.log","size":524288}
//! {"t":0.9000,"op":"deleted","tenant":0,"path":"db/000003.log","lifetime_bytes":9000000,"lifetime_secs":0.88}
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{
    FileEvent, Hint, OpenOptions, OpenReason, Placement, PlacementRequest, Stats, Store,
    StoreConfig,
};

/// One traced call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Record {
    Place {
        t: f64,
        tenant: u32,
        path: String,
        reason: Reason,
        size: u64,
    },
    Written {
        t: f64,
        tenant: u32,
        path: String,
        bytes: u64,
    },
    Synced {
        t: f64,
        tenant: u32,
        path: String,
    },
    Closed {
        t: f64,
        tenant: u32,
        path: String,
        size: u64,
    },
    Deleted {
        t: f64,
        tenant: u32,
        path: String,
        lifetime_bytes: u64,
        lifetime_secs: f64,
    },
}

/// Why a decision was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Create,
    OpenForWrite,
    Rename,
}

impl From<OpenReason> for Reason {
    fn from(r: OpenReason) -> Self {
        match r {
            OpenReason::Create => Reason::Create,
            OpenReason::OpenForWrite => Reason::OpenForWrite,
            OpenReason::Rename => Reason::Rename,
        }
    }
}

impl From<Reason> for OpenReason {
    fn from(r: Reason) -> Self {
        match r {
            Reason::Create => OpenReason::Create,
            Reason::OpenForWrite => OpenReason::OpenForWrite,
            Reason::Rename => OpenReason::Rename,
        }
    }
}

/// Records queued for the trace writer before a recording call waits for room.
const TRACE_QUEUE: usize = 4096;

/// Where a run's trace goes: a thread of its own writes the file, fed through a bounded
/// queue shared by every recording placement, so a guest's call never waits for the
/// trace file's I/O (only for room in the queue, should the writer fall far behind).
pub type TraceOut = Arc<TraceWriter>;

/// The trace file's writer thread and the queue to it. Dropping it (with the last
/// recording placement) drains the queue, flushes the file and reports a failure once.
pub struct TraceWriter {
    queue: Mutex<Option<SyncSender<String>>>,
    thread: Mutex<Option<JoinHandle<std::io::Result<()>>>>,
    path: String,
}

impl TraceWriter {
    fn send(&self, line: String) {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queue.as_ref() {
            // A writer that stopped has reported why; tracing never fails the guest.
            let _ = queue.send(line);
        }
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        drop(self.queue.lock().unwrap_or_else(|p| p.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(Ok(Err(e))) = thread.map(JoinHandle::join) {
            eprintln!(
                "valet-run: trace {}: {e}; the trace is incomplete",
                self.path
            );
        }
    }
}

fn write_trace(file: File, queue: Receiver<String>) -> std::io::Result<()> {
    let mut out = BufWriter::new(file);
    for line in queue {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    out.into_inner().map_err(|e| e.into_error())?.sync_data()
}

/// A placement that records every call before passing it on.
pub struct Recorder {
    inner: Arc<dyn Placement>,
    out: TraceOut,
    start: Instant,
}

impl Recorder {
    /// Records into `out` (shared between the tenants of one run).
    pub fn new(inner: Arc<dyn Placement>, out: TraceOut, start: Instant) -> Self {
        Recorder { inner, out, start }
    }

    /// Creates a trace file and starts its writer thread.
    pub fn create(path: &Path) -> Result<TraceOut> {
        let file =
            File::create(path).with_context(|| format!("creating trace {}", path.display()))?;
        let (queue, from_queue) = sync_channel(TRACE_QUEUE);
        let thread = std::thread::Builder::new()
            .name("valet-trace".into())
            .spawn(move || write_trace(file, from_queue))
            .context("starting the trace writer")?;
        Ok(Arc::new(TraceWriter {
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
            path: path.display().to_string(),
        }))
    }

    fn write(&self, record: &Record) {
        // Tracing must never fail the application: a record that does not encode is lost.
        if let Ok(line) = serde_json::to_string(record) {
            self.out.send(line);
        }
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

impl Placement for Recorder {
    fn place(&self, r: &PlacementRequest<'_>) -> Hint {
        self.write(&Record::Place {
            t: self.now(),
            tenant: r.tenant,
            path: r.path.to_string(),
            reason: r.reason.into(),
            size: r.size,
        });
        self.inner.place(r)
    }

    fn event(&self, event: &FileEvent<'_>) {
        let t = self.now();
        let record = match *event {
            FileEvent::Written {
                tenant,
                path,
                bytes,
            } => Record::Written {
                t,
                tenant,
                path: path.into(),
                bytes,
            },
            FileEvent::Synced { tenant, path } => Record::Synced {
                t,
                tenant,
                path: path.into(),
            },
            FileEvent::Closed { tenant, path, size } => Record::Closed {
                t,
                tenant,
                path: path.into(),
                size,
            },
            FileEvent::Deleted {
                tenant,
                path,
                lifetime_bytes,
                lifetime_secs,
                ..
            } => Record::Deleted {
                t,
                tenant,
                path: path.into(),
                lifetime_bytes,
                lifetime_secs,
            },
        };
        self.write(&record);
        self.inner.event(event);
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn decisions(&self) -> u64 {
        self.inner.decisions()
    }

    fn faults(&self) -> u64 {
        self.inner.faults()
    }
}

/// Reads a trace; a malformed line is an error naming its number.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let file = File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
    let mut records = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: not a trace", path.display(), n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a trace record", path.display(), n + 1))?;
        records.push(record);
    }
    Ok(records)
}

/// The decision for each `place` record, in order, as the placement makes it (events are
/// fed too, so learning policies learn as they did in the run).
pub fn decisions(records: &[Record], placement: &dyn Placement) -> Vec<(String, Hint)> {
    let mut out = Vec::new();
    for r in records {
        match r {
            Record::Place {
                tenant,
                path,
                reason,
                size,
                ..
            } => {
                let hint = placement.place(&PlacementRequest {
                    tenant: *tenant,
                    path,
                    reason: (*reason).into(),
                    size: *size,
                });
                out.push((path.clone(), hint));
            }
            other => feed(other, placement),
        }
    }
    out
}

fn feed(record: &Record, placement: &dyn Placement) {
    let event = match record {
        Record::Written {
            tenant,
            path,
            bytes,
            ..
        } => FileEvent::Written {
            tenant: *tenant,
            path,
            bytes: *bytes,
        },
        Record::Synced { tenant, path, .. } => FileEvent::Synced {
            tenant: *tenant,
            path,
        },
        Record::Closed {
            tenant, path, size, ..
        } => FileEvent::Closed {
            tenant: *tenant,
            path,
            size: *size,
        },
        Record::Deleted {
            tenant,
            path,
            lifetime_bytes,
            lifetime_secs,
            ..
        } => FileEvent::Deleted {
            tenant: *tenant,
            path,
            hint: Hint::zoned(0),
            lifetime_bytes: *lifetime_bytes,
            lifetime_secs: *lifetime_secs,
        },
        Record::Place { .. } => return,
    };
    placement.event(&event);
}

/// Replays a trace's file lifecycle on a fresh memory store placed by `placement`: files
/// are created, written with as many bytes as the trace says, closed and deleted in the
/// trace's order. Returns the store's accounting (the WAF the decisions lead to).
pub fn replay_on_store(
    records: &[Record],
    placement: Arc<dyn Placement>,
    geometry: Geometry,
) -> Result<Stats> {
    let device = Arc::new(MemoryDevice::new(geometry)?) as Arc<dyn ZonedDevice>;
    let store = Store::open(device, StoreConfig::default())?;
    let mut roots = HashMap::new();
    let mut open: HashMap<(u32, String), (valet_vfs::FileHandle, u64)> = HashMap::new();
    let chunk = vec![0x5au8; 1 << 20];
    for r in records {
        let tenant = match r {
            Record::Place { tenant, .. }
            | Record::Written { tenant, .. }
            | Record::Synced { tenant, .. }
            | Record::Closed { tenant, .. }
            | Record::Deleted { tenant, .. } => *tenant,
        };
        if let std::collections::hash_map::Entry::Vacant(slot) = roots.entry(tenant) {
            let (id, root) = store.tenant(&format!("tenant-{tenant}"))?;
            store.set_placement(id, placement.clone());
            slot.insert(root);
        }
        let root = roots[&tenant];
        match r {
            Record::Place { path, .. } => {
                if let Some((dir, _)) = path.rsplit_once('/') {
                    let mut at = String::new();
                    for part in dir.split('/') {
                        at = if at.is_empty() {
                            part.into()
                        } else {
                            format!("{at}/{part}")
                        };
                        if store.lookup(root, &at).is_err() {
                            store.create_dir(root, &at)?;
                        }
                    }
                }
                if let std::collections::hash_map::Entry::Vacant(slot) =
                    open.entry((tenant, path.clone()))
                {
                    let f = store.open_file(root, path, OpenOptions::create())?;
                    let size = f.metadata()?.size;
                    slot.insert((f, size));
                }
            }
            Record::Written { path, bytes, .. } => {
                if let Some((f, at)) = open.get_mut(&(tenant, path.clone())) {
                    let mut left = *bytes;
                    while left > 0 {
                        let n = left.min(chunk.len() as u64) as usize;
                        f.write_at(&chunk[..n], *at)?;
                        *at += n as u64;
                        left -= n as u64;
                    }
                }
            }
            Record::Synced { path, .. } => {
                if let Some((f, _)) = open.get(&(tenant, path.clone())) {
                    f.sync_data()?;
                }
            }
            Record::Closed { path, .. } => {
                if let Some((f, _)) = open.remove(&(tenant, path.clone())) {
                    f.close()?;
                }
            }
            Record::Deleted { path, .. } => {
                if let Some((f, _)) = open.remove(&(tenant, path.clone())) {
                    f.close()?;
                }
                match store.unlink(root, path) {
                    Ok(()) | Err(valet_vfs::Error::NotFound) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    for (_, (f, _)) in open.drain() {
        f.close()?;
    }
    store.sync()?;
    Ok(store.stats())
}
