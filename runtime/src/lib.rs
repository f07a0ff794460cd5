//! valet-runtime: the `valet-run` host. It runs unmodified WASI applications (wasm32-wasip1,
//! and wasm32-wasip1-threads) with valet-vfs's zoned store as their filesystem, so every
//! file they write is placed by a policy without the application knowing.
//!
//! Not here: the store itself (valet-vfs), policies (policies/), guests (guests/).

pub mod admin;
pub mod cpu_limit;
pub mod device;
pub mod epoch_clock;
pub mod fs_cmd;
pub mod guest_memory;
pub mod host;
pub mod http_serve;
pub mod inspect;
pub mod metrics;
pub mod node;
pub mod policy;
pub mod policy_cmd;
pub mod quota;
pub mod remove;
pub mod stats;
pub mod tenants;
pub mod termination;
pub mod trace;
pub mod wasi;
