//! Smallest round trip through the store: write, fsync, read back, list, remove.
//! Usage: hello_store DIR

use std::io::{Read, Write};

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "/data".into());
    let path = format!("{dir}/hello.txt");
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(b"hello, zones\n").expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    let mut s = String::new();
    std::fs::File::open(&path)
        .expect("open")
        .read_to_string(&mut s)
        .expect("read");
    print!("{s}");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .expect("readdir")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    println!("entries: {names:?}");
    std::fs::remove_file(&path).expect("unlink");
    std::process::exit(if s == "hello, zones\n" { 0 } else { 3 });
}
