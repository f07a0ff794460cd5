//! `valet-run fs fsck --deep`: a block damaged on the medium after it was written is found
//! by reading it back against its checksum, which the shallow check cannot see.

use std::path::Path;
use std::process::{Command, Output};

use valet_runtime::device::DeviceSpec;
use valet_vfs::device::{Geometry, IoMode};
use valet_vfs::OpenOptions;

fn fsck(dev: &Path, deep: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_valet-run"));
    cmd.args(["fs", "fsck", "--device"]).arg(dev);
    if deep {
        cmd.arg("--deep");
    }
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const MARK: &[u8] = b"valet-fsck-deep-marker:";

#[test]
fn deep_fsck_finds_a_block_damaged_after_it_was_written() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = DeviceSpec {
        dir: tmp.path().to_path_buf(),
        zonefs: None,
        zonefs_capacity: None,
        fdp: None,
        geometry: Geometry {
            zone_count: 8,
            zone_size: 4 << 20,
            zone_capacity: 4 << 20,
            ..Geometry::EMBEDDED_DEFAULT
        },
        io: IoMode::Auto,
        writeback: Some(valet_runtime::device::DEFAULT_WRITEBACK),
        handoff: Some(valet_runtime::device::DEFAULT_HANDOFF),
    };
    {
        let store = spec.mount().unwrap();
        let (_, root) = store.tenant("default").unwrap();
        let f = store
            .open_file(root, "table", OpenOptions::create())
            .unwrap();
        let mut data = Vec::new();
        while data.len() < 256 * 1024 {
            data.extend_from_slice(MARK);
            data.extend_from_slice(format!("{:08}", data.len()).as_bytes());
        }
        f.write_at(&data, 0).unwrap();
        f.close().unwrap();
        store.unmount().unwrap();
    }

    let out = fsck(tmp.path(), true);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(report.contains("fsck: clean"), "{report}");
    assert!(report.contains("0 without a checksum"), "{report}");

    // Flip one bit in the middle of the file's data, in the image itself.
    let image = tmp.path().join("zones.img");
    let mut bytes = std::fs::read(&image).unwrap();
    let first = bytes
        .windows(MARK.len())
        .position(|w| w == MARK)
        .expect("the file's data is in the image");
    bytes[first + 128 * 1024] ^= 0x01;
    std::fs::write(&image, &bytes).unwrap();

    let shallow = fsck(tmp.path(), false);
    assert!(shallow.status.success(), "{}", text(&shallow.stdout));

    let deep = fsck(tmp.path(), true);
    assert_eq!(deep.status.code(), Some(1), "{}", text(&deep.stdout));
    let report = text(&deep.stdout);
    assert!(report.contains("does not match its checksum"), "{report}");
    let stderr = text(&deep.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("fsck found 1 problem"), "{stderr}");
}
