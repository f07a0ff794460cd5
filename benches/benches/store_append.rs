//! Sequential append through the store versus the same bytes written straight to the same
//! kind of image, with the same flush points.
//!
//!     cargo bench -p valet-benches --bench store_append
//!
//! `store` appends 64 KiB writes to a file and fdatasyncs every 8 MiB (the store buffers,
//! allocates on flush and journals the extents); `raw` writes 512 KiB chunks at the zone
//! write pointer and syncs the device at the same points. The target is store ≥ 90 % of raw.
//!
//! `small_write_in_window` is the store's fast path alone: a 443 B write (LevelDB's log
//! record) that lands in the file's open window, copied under the store's lock. Its time
//! is about how long every small write holds that lock.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use valet_vfs::device::{Geometry, ImageDevice, ImageOptions, ZonedDevice};
use valet_vfs::{OpenOptions, Store, StoreConfig};

const MIB: u64 = 1 << 20;
const TOTAL: u64 = 64 * MIB;
const FLUSH_EVERY: u64 = 8 * MIB;
const GUEST_WRITE: usize = 64 * 1024;
const DEVICE_WRITE: usize = 512 * 1024;

fn geometry() -> Geometry {
    Geometry {
        zone_count: 32,
        zone_size: 64 * MIB,
        zone_capacity: 64 * MIB,
        block_size: 4096,
        max_open: 14,
        max_active: 14,
    }
}

fn image(dir: &tempfile::TempDir, name: &str) -> Arc<dyn ZonedDevice> {
    let dev = ImageDevice::create(dir.path().join(name), geometry(), ImageOptions::default())
        .expect("create image");
    Arc::new(dev)
}

/// Raw appends at the write pointer, moving on (and resetting) zone by zone. It cycles over
/// the first three zones, as the store does (it reuses the lowest free zone), so that both
/// write into recently reset space of the image rather than one into fresh file offsets.
struct RawWriter {
    device: Arc<dyn ZonedDevice>,
    zone: u32,
    wp: u64,
}

impl RawWriter {
    fn append(&mut self, data: &[u8]) {
        let cap = self.device.geometry().zone_capacity;
        if self.wp + data.len() as u64 > cap {
            self.zone = (self.zone + 1) % 3;
            self.device.reset(self.zone).expect("reset");
            self.wp = 0;
        }
        self.device.write(self.zone, self.wp, data).expect("write");
        self.wp += data.len() as u64;
    }
}

fn append(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("sequential_append_64MiB");
    group.throughput(Throughput::Bytes(TOTAL));
    group.sample_size(10);

    let payload = vec![0xa5u8; DEVICE_WRITE];
    let device = image(&dir, "raw.img");
    device.reset(0).expect("reset");
    let mut raw = RawWriter {
        device,
        zone: 0,
        wp: 0,
    };
    group.bench_function("raw_image", |b| {
        b.iter(|| {
            let mut written = 0;
            while written < TOTAL {
                raw.append(&payload);
                written += DEVICE_WRITE as u64;
                if written % FLUSH_EVERY == 0 {
                    raw.device.sync().expect("sync");
                }
            }
        })
    });

    let store = Store::open(image(&dir, "store.img"), StoreConfig::default()).expect("mount");
    let (_, root) = store.tenant("bench").expect("tenant");
    let mut round = 0u64;
    group.bench_function("store", |b| {
        b.iter(|| {
            round += 1;
            let name = format!("f{round}");
            let f = store
                .open_file(root, &name, OpenOptions::create())
                .expect("open");
            let mut written = 0;
            while written < TOTAL {
                f.write_at(&payload[..GUEST_WRITE], written).expect("write");
                written += GUEST_WRITE as u64;
                if written % FLUSH_EVERY == 0 {
                    f.sync_data().expect("sync");
                }
            }
            f.close().expect("close");
            store.unlink(root, &name).expect("unlink");
        })
    });
    group.finish();
}

const RECORD: usize = 443;

fn small_write(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(image(&dir, "small.img"), StoreConfig::default()).expect("mount");
    let (_, root) = store.tenant("bench").expect("tenant");
    let f = store
        .open_file(root, "log", OpenOptions::create())
        .expect("open");
    let record = [0x5au8; RECORD];
    // Offsets cycle through the first 400 KiB: inside the first window, which never fills.
    let span = 400 * 1024 / RECORD as u64 * RECORD as u64;
    let mut at = 0u64;
    c.bench_function("small_write_in_window", |b| {
        b.iter(|| {
            f.write_at(&record, at).expect("write");
            at = (at + RECORD as u64) % span;
        })
    });
    f.close().expect("close");
}

criterion_group!(benches, append, small_write);
criterion_main!(benches);
