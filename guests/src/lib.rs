//! Paths of the guest programs, compiled to WebAssembly by this crate's build script.
//!
//! Each Rust program in `programs/src/bin/<name>.rs` becomes a constant `<NAME>` holding the
//! path of its `.wasm` (wasm32-wasip1; wasm32-wasip1-threads for programs named `threads_*`),
//! so tests read as "run guest X, expect Y". Guests in other languages (C, C++, Go) are
//! looked up with [`wasm`], since a machine without their toolchain skips them ([`SKIPPED`]).
//! Nothing compiled is committed.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// The `.wasm` of guest `name`, if it was built.
pub fn wasm(name: &str) -> Option<&'static str> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// The host build of guest `name`, if there is one.
pub fn native(name: &str) -> Option<&'static str> {
    NATIVE.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// Guest `name`'s `.wasm`, or `None` after printing why it was not built (for tests that
/// skip a guest whose toolchain this machine lacks).
pub fn require(name: &str) -> Option<&'static str> {
    let found = wasm(name);
    if found.is_none() {
        let why = SKIPPED
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("unknown guest", |(_, why)| *why);
        eprintln!("skipped: guest {name} was not built: {why}");
    }
    found
}

/// Deterministic contents the guests write, for the tests that check them.
#[path = "../programs/src/content.rs"]
pub mod content;
