//! Paths of the guest programs, compiled to WebAssembly by this crate's build script.
//!
//! Each program in `programs/src/bin/<name>.rs` becomes a constant `<NAME>` holding the path
//! of its `.wasm` (wasm32-wasip1; wasm32-wasip1-threads for programs named `threads_*`), so
//! tests read as "run guest X, expect Y". Nothing compiled is committed.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// Deterministic contents the guests write, for the tests that check them.
#[path = "../programs/src/content.rs"]
pub mod content;
