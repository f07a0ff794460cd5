//! The FDP backend on an NVMe namespace with Flexible Data Placement, in a QEMU VM
//! (`valet_tests::vm`). Skips with a message where QEMU or the kernel is missing;
//! `VALET_REQUIRE_VM=1` makes that a failure.
//!
//! - `store_runs_on_fdp_in_a_vm`: `valet-vfs`'s `kernel_devices` FDP tests (placement
//!   identifiers checked against the drive's reclaim unit status, its host-bytes counter
//!   against the store's accounting, deallocation, the zone table across reopen, the store's
//!   streams under different identifiers and its remount, a read-only mount that writes
//!   not one byte and a blank namespace that a read-only open leaves blank) and the store's model-based
//!   property test with remounts (`model`'s `fdp_store_matches_model`).
//! - `store_runs_on_fdp_write_streams_in_a_vm`: the same device tests on the 6.18 kernel,
//!   whose block layer offers the placement handles as write streams (the backend's
//!   preferred path there).
//! - `ssd_model_replays_the_fdp_write_stream`: the report's FDP row
//!   (`valet_tests::vm::fdp_ssd_model_figures`): the backend's write stream for an LSM
//!   workload replayed on the SSD model with and without placement identifiers.
//! - `power_cuts_on_fdp_keep_every_acknowledged_byte`: QEMU is killed while the guest
//!   appends records with an fdatasync after each, then the VM boots again on the same image,
//!   recovers, runs fsck and checks every byte; every file must hold at least what was
//!   acknowledged. `VALET_VM_POWER_CUTS=N` runs N cuts (default 2; the README's long mode
//!   runs more).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use valet_tests::vm::{cargo_test_binary, Assets, Initramfs, Kernel, KernelSeries, Namespace, Vm};

const MIB: u64 = 1 << 20;

fn fdp_vm(assets: &Assets, kernel: &Kernel, initrd: PathBuf, image: &Path) -> Vm {
    Vm {
        qemu: assets.qemu.clone(),
        kernel: kernel.clone(),
        initrd,
        namespaces: vec![Namespace::Fdp {
            image: image.to_path_buf(),
            size: 256 * MIB,
            reclaim_unit: 16 * MIB,
            handles: 8,
        }],
        memory_mib: 1024,
        timeout: Duration::from_secs(240),
    }
}

fn initramfs(assets: &Assets, kernel: &Kernel, script: &str, out: &Path) {
    let devices = cargo_test_binary("valet-vfs", "kernel_devices");
    let model = cargo_test_binary("valet-vfs", "model");
    let mut initrd = Initramfs::new(assets, kernel);
    initrd.add_binary(Path::new("/usr/sbin/nvme"), "nvme");
    initrd.add_binary(&devices, "kernel_devices");
    initrd.add_binary(&model, "model");
    initrd.set_init(script);
    initrd.pack(out);
}

#[test]
fn store_runs_on_fdp_in_a_vm() {
    let Some(assets) = Assets::find() else { return };
    let Some(kernel) = assets.kernel(KernelSeries::V6_12) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cpio = dir.path().join("initrd.cpio");
    initramfs(
        &assets,
        &kernel,
        "nvme fdp configs /dev/nvme0 -e 1 | head -8\n\
         VALET_FDP_DEVICE=/dev/valet-ng1 kernel_devices --ignored --test-threads 1 --nocapture --skip fdp_power_cut_phase --skip fdp_write_stream_on_the_ssd_model fdp\n\
         VALET_MODEL_FDP=/dev/valet-ng1 model --ignored --exact fdp_store_matches_model --test-threads 1\n\
         nvme fdp stats /dev/nvme0 -e 1\n",
        &cpio,
    );
    let run = fdp_vm(&assets, &kernel, cpio, &dir.path().join("fdp.img")).run();
    println!("{}", run.console);
    run.assert_ok("FDP tests in the VM");
    assert!(
        run.console.contains("test result: ok. 4 passed"),
        "{}",
        run.tail()
    );
    assert!(
        run.console.contains("test result: ok. 1 passed"),
        "{}",
        run.tail()
    );
    eprintln!("FDP VM: {:.1} s", run.elapsed.as_secs_f64());
}

/// The backend's tests again on the 6.18 kernel, where it writes through block-layer write
/// streams instead of passthrough (the drive's own reclaim unit status still decides).
#[test]
fn store_runs_on_fdp_write_streams_in_a_vm() {
    let Some(assets) = Assets::find() else { return };
    let Some(kernel) = assets.kernel(KernelSeries::V6_18) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cpio = dir.path().join("initrd.cpio");
    initramfs(
        &assets,
        &kernel,
        "cat /sys/block/$(basename $(readlink /dev/valet-ns1))/queue/max_write_streams\n\
         VALET_FDP_DEVICE=/dev/valet-ng1 kernel_devices --ignored --test-threads 1 --nocapture --skip fdp_power_cut_phase --skip fdp_write_stream_on_the_ssd_model fdp\n",
        &cpio,
    );
    let run = fdp_vm(&assets, &kernel, cpio, &dir.path().join("fdp.img")).run();
    println!("{}", run.console);
    run.assert_ok("FDP tests on write streams in the VM");
    assert!(
        run.console.contains("writes by io_uring write streams"),
        "{}",
        run.tail()
    );
    assert!(
        run.console.contains("test result: ok. 4 passed"),
        "{}",
        run.tail()
    );
}

#[test]
fn ssd_model_replays_the_fdp_write_stream() {
    let Some(figures) = valet_tests::vm::fdp_ssd_model_figures() else {
        return;
    };
    let figures = figures.unwrap();
    eprintln!("FDP write stream on the SSD model: {figures:?}");
    let get = |k: &str| figures.iter().find(|(n, _)| n == k).unwrap().1;
    assert!(get("host_mib") > 100.0, "{figures:?}");
    assert!(
        get("waf_with_placement") < get("waf_without"),
        "{figures:?}"
    );
}

#[test]
fn power_cuts_on_fdp_keep_every_acknowledged_byte() {
    let Some(assets) = Assets::find() else { return };
    let Some(kernel) = assets.kernel(KernelSeries::V6_12) else {
        return;
    };
    let cuts: u32 = std::env::var("VALET_VM_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let dir = tempfile::tempdir().unwrap();
    let phase = |name: &str| {
        let cpio = dir.path().join(format!("{name}.cpio"));
        initramfs(
            &assets,
            &kernel,
            &format!(
                "mkdir -p /data/conventional\n\
                 VALET_POWER_PHASE={name} VALET_FDP_DEVICE=/dev/valet-ng1 kernel_devices --ignored --exact fdp_power_cut_phase --nocapture\n"
            ),
            &cpio,
        );
        cpio
    };
    let (write, verify) = (phase("write"), phase("verify"));
    let image = dir.path().join("fdp.img");
    for cut in 0..cuts {
        // Cut after a varying number of acknowledged syncs.
        let after = 5 + (cut as usize * 37) % 120;
        let run = fdp_vm(&assets, &kernel, write.clone(), &image)
            .run_until(|console| console.matches("ACK ").count() >= after);
        assert!(
            run.killed && run.status.is_none(),
            "cut {cut}: the workload ended before the cut:\n{}",
            run.tail()
        );
        let mut acked: BTreeMap<String, u64> = BTreeMap::new();
        for line in run.lines_with("ACK ") {
            let (name, size) = line.split_once(' ').unwrap();
            // A line may be cut in the middle by the kill.
            if let Ok(size) = size.trim().parse() {
                acked.insert(name.to_string(), size);
            }
        }
        let check = fdp_vm(&assets, &kernel, verify.clone(), &image).run();
        check.assert_ok(&format!("cut {cut}: recovery"));
        let recovered: BTreeMap<String, u64> = check
            .lines_with("RECOVERED ")
            .iter()
            .map(|l| {
                let (name, size) = l.split_once(' ').unwrap();
                (name.to_string(), size.trim().parse().unwrap())
            })
            .collect();
        for (name, size) in &acked {
            assert!(
                recovered.get(name).is_some_and(|r| r >= size),
                "cut {cut}: {name} had {size} bytes acknowledged, recovered {:?}",
                recovered.get(name)
            );
        }
        eprintln!(
            "power cut {cut} after {after} acknowledged syncs: acknowledged {acked:?}, recovered {recovered:?}"
        );
    }
}
