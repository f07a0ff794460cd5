//! Small records appended and fsynced one by one by `--threads T` writer threads of one
//! guest (wasm32-wasip1-threads, so `std::thread` works): see `../sync_append.rs`.

#[path = "../sync_append.rs"]
mod sync_append;

fn main() {
    sync_append::main()
}
