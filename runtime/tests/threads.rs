//! wasm32-wasip1-threads guests: four `std::thread`s (wasi-threads) write and fsync their
//! own files at once through one shared WASI context; every byte is in the store after.

use std::path::Path;
use std::process::Command;

use valet_runtime::device::DeviceSpec;
use valet_vfs::device::{Geometry, IoMode};
use valet_vfs::OpenOptions;

/// What threads_writer's thread `t` writes at offset `j`.
fn pattern(t: u64, j: u64) -> u8 {
    ((j.wrapping_mul(2654435761) >> 9) ^ (t.wrapping_mul(0x5bd1) + 1)) as u8
}

fn device(dir: &Path) -> DeviceSpec {
    DeviceSpec {
        dir: dir.to_path_buf(),
        zonefs: None,
        zonefs_capacity: None,
        geometry: Geometry::EMBEDDED_DEFAULT,
        io: IoMode::Auto,
    }
}

#[test]
fn threaded_guest_writes_from_four_threads() {
    const THREADS: u64 = 4;
    const SIZE: u64 = 300_001;
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let out = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(&dev)
        .args(["--zone-size", "16", "--zones", "16"])
        .arg(valet_guests::THREADS_WRITER)
        .args(["/data", &THREADS.to_string(), &SIZE.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("4 files verified"), "{stdout}");

    // From the host side, after the process is gone: every file whole.
    let store = device(&dev).mount_existing().unwrap();
    let (_, root) = store.tenant("default").unwrap();
    for t in 0..THREADS {
        let f = store
            .open_file(root, &format!("thread-{t}.bin"), OpenOptions::read())
            .unwrap();
        assert_eq!(f.metadata().unwrap().size, SIZE);
        let mut data = vec![0u8; SIZE as usize];
        assert_eq!(f.read_at(&mut data, 0).unwrap(), data.len());
        assert!(
            data.iter()
                .enumerate()
                .all(|(j, &b)| b == pattern(t, j as u64)),
            "thread-{t}.bin differs"
        );
    }
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}
