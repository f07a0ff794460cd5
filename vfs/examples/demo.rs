//! The store on the embedded default device, without a runtime: an LSM-shaped session
//! (logs appended and dropped, tables written once, a CURRENT file rewritten in place), then
//! a read-back of everything that should be there, an fsck and the accounting.
//!
//!     cargo run --release -p valet-vfs --example demo -- [--device DIR] [--mib N]
//!
//! The device is `DIR/zones.img` (created on first use, default `./valet-data`), the
//! conventional area `DIR/conventional/`. Run it twice: the second run recovers the store,
//! finds the first run's tables and adds its own.

use std::path::PathBuf;
use std::sync::Arc;

use valet_vfs::device::{Geometry, ImageDevice, ImageOptions, ZonedDevice};
use valet_vfs::{OpenOptions, Store, StoreConfig};

fn content(name: &str, len: usize) -> Vec<u8> {
    let seed = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    (0..len as u32)
        .map(|i| (seed.wrapping_add(i).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut dir = PathBuf::from("valet-data");
    let mut mib = 256u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => dir = args.next().ok_or("--device needs a directory")?.into(),
            "--mib" => mib = args.next().ok_or("--mib needs a number")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    std::fs::create_dir_all(&dir)?;
    let device = ImageDevice::open_or_create(
        dir.join("zones.img"),
        Geometry::EMBEDDED_DEFAULT,
        ImageOptions::default(),
    )?;
    let io = device.io_kind();
    let device: Arc<dyn ZonedDevice> = Arc::new(device);
    let config = StoreConfig {
        conventional_dir: Some(dir.join("conventional")),
        ..Default::default()
    };
    let store = Store::open(device, config)?;
    let (_, root) = store.tenant("demo")?;
    if store.lookup(root, "db").is_err() {
        store.create_dir(root, "db")?;
    }
    let db = store.lookup(root, "db")?;
    let before = store
        .read_dir(db)?
        .iter()
        .filter(|e| e.name.ends_with(".sst"))
        .count();
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();

    // Each round: a 4 MiB log filled in 400-byte records, then a table written once; every
    // fourth round a "compaction" replaces the round's tables with one.
    let rounds = (mib / 8).max(1);
    let mut kept = Vec::new();
    for round in 0..rounds {
        let log = format!("{run_id}-{round:04}.log");
        let f = store.open_file(db, &log, OpenOptions::create())?;
        let data = content(&log, 4 << 20);
        for (i, rec) in data.chunks(400).enumerate() {
            f.write_at(rec, (i * 400) as u64)?;
        }
        f.sync_data()?;
        f.close()?;
        let sst = format!("{run_id}-{round:04}.sst");
        let f = store.open_file(db, &sst, OpenOptions::create())?;
        f.write_at(&content(&sst, 4 << 20), 0)?;
        f.close()?;
        store.unlink(db, &log)?;
        kept.push(sst);
        if kept.len() == 4 {
            for old in kept.drain(..) {
                store.unlink(db, &old)?;
            }
            let merged = format!("{run_id}-{round:04}-merged.sst");
            let f = store.open_file(db, &merged, OpenOptions::create())?;
            f.write_at(&content(&merged, 8 << 20), 0)?;
            f.close()?;
        }
        let current = store.open_file(db, "CURRENT", OpenOptions::create())?;
        current.set_len(0)?;
        current.write_at(format!("MANIFEST-{round:06}\n").as_bytes(), 0)?;
        current.close()?;
    }

    // Everything that should be there reads back exactly.
    let mut checked = 0u64;
    for entry in store.read_dir(db)? {
        if !entry.name.ends_with(".sst") {
            continue;
        }
        let f = store.open_file(db, &entry.name, OpenOptions::read())?;
        let size = f.metadata()?.size as usize;
        let mut buf = vec![0u8; size];
        f.read_at(&mut buf, 0)?;
        if buf != content(&entry.name, size) {
            return Err(format!("{} does not read back", entry.name).into());
        }
        checked += size as u64;
    }
    let fsck = store.fsck()?.into_result()?;
    let stats = store.stats();
    let tables = store
        .read_dir(db)?
        .iter()
        .filter(|e| e.name.ends_with(".sst"))
        .count();
    println!("device      {} (io: {io})", dir.join("zones.img").display());
    println!("tables      {before} found at mount, {tables} now; {checked} bytes read back intact");
    println!(
        "written     host {} MiB, device {} MiB, GC moved {} MiB, metadata {} KiB",
        stats.host_bytes >> 20,
        stats.device_bytes >> 20,
        stats.gc_bytes_moved >> 20,
        stats.meta_bytes >> 10
    );
    println!(
        "WAF         {:.3}  (zone resets {}, finishes {}, device syncs {})",
        stats.waf, stats.zone_resets, stats.zone_finishes, stats.device_syncs
    );
    for s in &stats.streams {
        println!(
            "  stream {:<2} host {:>5} MiB  device {:>5} MiB  zones {:>3}  WAF {:.3}",
            s.stream,
            s.host_bytes >> 20,
            s.device_bytes >> 20,
            s.zones,
            s.waf
        );
    }
    println!(
        "fsck        clean: {} files, {} dirs, {} extents",
        fsck.files, fsck.dirs, fsck.extents
    );
    store.unmount()?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("demo: {e}");
        std::process::exit(1);
    }
}
