//! The CPU time of the store's own threads is counted for the tenant whose files they
//! serve: never for another tenant, and not for work a caller's own thread did (that is
//! in the caller's thread clock already).

use std::sync::Arc;
use std::time::{Duration, Instant};

use valet_vfs::device::{Geometry, MemoryDevice};
use valet_vfs::{OpenOptions, Store, StoreConfig};

const PIECE: usize = 512 * 1024;

#[test]
fn the_background_writers_work_is_its_files_tenants() {
    let geometry = Geometry {
        zone_count: 48,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 12,
        max_active: 12,
    };
    let device = Arc::new(MemoryDevice::new(geometry).unwrap());
    let store = Store::open(device, StoreConfig::default()).unwrap();
    let (a, a_root) = store.tenant("a").unwrap();
    let (b, b_root) = store.tenant("b").unwrap();

    // b's small synced write is done on this thread, by the sync itself.
    let log = store
        .open_file(b_root, "log", OpenOptions::create())
        .unwrap();
    log.write_at(&[7u8; 4096], 0).unwrap();
    log.sync_data().unwrap();

    // a's 16 MiB fill whole buffers (the pool holds 32 MiB, so no write waits for one and
    // writes it itself): each goes to the background writer.
    let table = store
        .open_file(a_root, "table", OpenOptions::create())
        .unwrap();
    for i in 0..32u8 {
        let at = u64::from(i) * PIECE as u64;
        table.write_at(&vec![i; PIECE], at).unwrap();
    }
    let a_work = store.tenant_work(a);
    let deadline = Instant::now() + Duration::from_secs(20);
    while a_work.cpu().is_zero() {
        assert!(
            Instant::now() < deadline,
            "the writer's work was never counted for a"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    table.sync_all().unwrap();

    assert_eq!(store.tenant_work(b).cpu(), Duration::ZERO);
    // Read before the stats: the writer may still be adding the end of its last round.
    let counted = a_work.cpu();
    let stats = store.stats();
    let of = |name: &str| {
        stats
            .tenants
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no stats of {name}: {:?}", stats.tenants))
            .store_cpu_ns
    };
    assert!(of("a") > 0);
    assert_eq!(of("b"), 0);
    assert!(Duration::from_nanos(of("a")) >= counted);
    log.close().unwrap();
    table.close().unwrap();
    store.unmount().unwrap();
}
