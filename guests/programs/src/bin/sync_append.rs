//! Small records appended and fsynced one by one, one writer: see `../sync_append.rs`.

#[path = "../sync_append.rs"]
mod sync_append;

fn main() {
    sync_append::main()
}
