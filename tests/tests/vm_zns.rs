//! The store on the kernel's zonefs over an emulated NVMe ZNS namespace, in a QEMU VM
//! (`valet_tests::vm`). Skips with a message where QEMU or the kernel is missing;
//! `VALET_REQUIRE_VM=1` makes that a failure.
//!
//! Inside: `mkzonefs`, `mount -t zonefs -o errors=repair`, then the device tests of
//! `valet-vfs`'s `kernel_devices` (geometry from sysfs and the zone report, O_DIRECT writes,
//! finish and reset on the drive, the drive's own active-zone error, the store remounted with
//! its zone map checked against the drive's write pointers) and the store's model-based
//! property test with remounts (`model`'s `zonefs_store_matches_model`, 6 cases).

use std::path::Path;
use std::time::Duration;

use valet_tests::vm::{cargo_test_binary, Assets, Initramfs, KernelSeries, Namespace, Vm};

const MIB: u64 = 1 << 20;

#[test]
fn store_runs_on_kernel_zonefs_in_a_vm() {
    let Some(assets) = Assets::find() else { return };
    let Some(kernel) = assets.kernel(KernelSeries::V6_12) else {
        return;
    };
    let Some(mkzonefs) = assets.mkzonefs() else {
        return;
    };
    let devices = cargo_test_binary("valet-vfs", "kernel_devices");
    let model = cargo_test_binary("valet-vfs", "model");
    let dir = tempfile::tempdir().unwrap();
    let mut initrd = Initramfs::new(&assets, &kernel);
    initrd.add_module("zonefs");
    initrd.add_binary(&mkzonefs, "mkzonefs");
    initrd.add_binary(Path::new("/usr/sbin/blkzone"), "blkzone");
    initrd.add_binary(&devices, "kernel_devices");
    initrd.add_binary(&model, "model");
    initrd.set_init(
        "mkzonefs -f /dev/valet-ns1 >/dev/null\n\
         mkdir -p /mnt/zns\n\
         mount -t zonefs -o errors=repair /dev/valet-ns1 /mnt/zns\n\
         cat /sys/block/$(basename $(readlink /dev/valet-ns1))/queue/max_active_zones\n\
         VALET_ZONEFS_MOUNT=/mnt/zns kernel_devices --ignored --test-threads 1 --nocapture zonefs\n\
         VALET_MODEL_ZONEFS=/mnt/zns model --ignored --exact zonefs_store_matches_model --test-threads 1\n\
         blkzone report /dev/valet-ns1 | head -20\n",
    );
    let cpio = dir.path().join("initrd.cpio");
    initrd.pack(&cpio);
    let vm = Vm {
        qemu: assets.qemu.clone(),
        kernel,
        initrd: cpio,
        namespaces: vec![Namespace::Zns {
            image: dir.path().join("zns.img"),
            size: 16 * MIB,
            zone_size: MIB,
            zone_capacity: 768 * 1024,
            max_open: 4,
            max_active: 5,
        }],
        memory_mib: 1024,
        timeout: Duration::from_secs(240),
    };
    let run = vm.run();
    println!("{}", run.console);
    run.assert_ok("zonefs tests in the VM");
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
    eprintln!("zonefs VM: {:.1} s", run.elapsed.as_secs_f64());
}
