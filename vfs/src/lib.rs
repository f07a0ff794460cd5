//! valet-vfs: the zoned extent store under Valet's WASI filesystem.
//!
//! Every file a guest writes lands here. A [`Placement`] decides, per open, which stream and
//! lifetime group a file's data joins; the store buffers writes per file, chooses blocks only
//! when a buffer is flushed (allocate-on-flush), keeps streams in disjoint zones, remaps
//! in-place writes out of place, resets zones whose data has all died, and migrates the
//! little that is left when free zones run short. Metadata is a crc32c-checked journal in two
//! metadata zones, so one device flush makes an fsync durable.
//!
//! What this crate is not: it knows nothing of wasmtime or WASI (the runtime adapts it), and
//! it is not a general POSIX filesystem (symbolic links, but no permissions or locks).

mod background;
pub mod device;
mod error;
pub mod ftl;
mod hint;
pub mod hint_only;
pub mod resolver;
mod stats;
mod store;
pub mod workload;

pub use background::{is_store_thread, thread_cpu_time};
pub use error::{Error, Result};
pub use hint::{Class, DefaultPlacement, FileEvent, Hint, OpenReason, Placement, PlacementRequest};
pub use stats::{
    PolicyStats, Stats, StreamStats, SyncLatency, TenantStats, SYNC_LATENCY_BOUNDS_NS,
};
pub use store::{
    DirEntry, FileHandle, FileKind, FsckReport, Ino, Metadata, OpenOptions, Store, StoreConfig,
    TenantId, TenantWork,
};
