//! The comparison report; see `valet_benches::report`.
//!
//!     cargo run --release -p valet-benches --bin report -- --scale small|full --out bench-report

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(valet_benches::report::main(&args));
}
