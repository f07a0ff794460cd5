//! Benchmarks of Valet's hot paths (`benches/`) and the comparison report (`report`, bin
//! `report`); see the README for how to run them.

pub mod report;
pub mod stock;
