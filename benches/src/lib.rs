//! Benchmarks of Valet's hot paths; see `benches/` and the README for how to run them.

pub mod stock;
