//! LevelDB under `valet-run --policy rocks` on the real device interfaces, in QEMU VMs
//! (`valet_tests::vm`): on the kernel's zonefs over an emulated NVMe ZNS namespace, and on
//! the FDP backend over an NVMe namespace with FDP. The placement is checked from the device
//! side: the kernel's `blkzone report` write pointers against the store's zone map
//! (`valet-run fs zones`), and the drive's reclaim unit usage per placement identifier
//! (`nvme fdp status`) against the identifiers of the store's streams.
//!
//! The guest is compiled on the host (`VALET_PORTABLE_CODE=1`: for x86-64-v2, which QEMU's
//! emulated CPU has) into a module cache that is shipped into the VM: Cranelift under TCG
//! would take minutes. Skips with a message where QEMU, the kernel or the LevelDB guest is
//! missing; `VALET_REQUIRE_VM=1` makes a missing VM piece a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use valet_tests::vm::{Assets, Initramfs, Kernel, KernelSeries, Namespace, Vm};

const MIB: u64 = 1 << 20;
/// The first run writes (10 MiB: two memtables become tables); the zone maps are read
/// while its log and tables are alive; the
/// second run reopens the database and reads every key back.
const WRITE: &str = "--benchmarks=fillrandom,overwrite --num 12000";
const READ: &str = "--benchmarks=readrandom --use_existing_db=1 --num 12000";

fn initramfs(
    assets: &Assets,
    kernel: &Kernel,
    dir: &Path,
    modules: &[&str],
    tools: &[(&Path, &str)],
    script: &str,
) -> PathBuf {
    let wasm = valet_guests::require("leveldb").expect("checked by the caller");
    let cache = valet_tests::vm::portable_module_cache(
        wasm,
        &["--benchmarks=fillseq", "--num", "10"],
        dir,
        "LevelDB",
    );
    let mut initrd = Initramfs::new(assets, kernel);
    for module in modules {
        initrd.add_module(module);
    }
    initrd.add_binary(valet_tests::valet_run_path(), "valet-run");
    for (path, name) in tools {
        initrd.add_binary(path, name);
    }
    initrd.add_file("guest/leveldb.wasm", &std::fs::read(wasm).unwrap());
    initrd.add_dir(&cache, "cache");
    initrd.set_init(&format!(
        "export XDG_CACHE_HOME=/cache VALET_PORTABLE_CODE=1\n\
         mkdir -p /data/dev\n\
         {script}"
    ));
    let cpio = dir.join("initrd.cpio");
    initrd.pack(&cpio);
    cpio
}

/// `STORE zone state write_pointer owner placement` lines of `valet-run fs zones`.
fn store_zones(lines: &[String]) -> Vec<(u32, String, u64, String, String)> {
    lines
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let zone = f.first()?.parse().ok()?;
            Some((
                zone,
                f[1].to_string(),
                f[2].parse().ok()?,
                f[3].to_string(),
                f[4].to_string(),
            ))
        })
        .collect()
}

fn check_leveldb(console: &str) {
    assert!(
        console.contains("(12000 of 12000 found)"),
        "LevelDB did not find every key after reopening:\n{console}"
    );
}

#[test]
fn leveldb_on_kernel_zonefs_in_a_vm() {
    let Some(assets) = Assets::find() else { return };
    let Some(kernel) = assets.kernel(KernelSeries::V6_12) else {
        return;
    };
    let Some(mkzonefs) = assets.mkzonefs() else {
        return;
    };
    if valet_guests::require("leveldb").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cpio = initramfs(
        &assets,
        &kernel,
        dir.path(),
        &["zonefs"],
        &[(&mkzonefs, "mkzonefs"), (Path::new("/usr/sbin/blkzone"), "blkzone")],
        &format!(
            "mkzonefs -f /dev/valet-ns1 >/dev/null\n\
             mkdir -p /mnt/zns\n\
             mount -t zonefs -o errors=repair /dev/valet-ns1 /mnt/zns\n\
             valet-run --device /data/dev --zonefs /mnt/zns --policy rocks --stats /guest/leveldb.wasm -- {WRITE}\n\
             valet-run fs zones --device /data/dev --zonefs /mnt/zns | sed 's/^/STORE /'\n\
             blkzone report /dev/valet-ns1 | sed 's/^/DEVICE /'\n\
             valet-run --device /data/dev --zonefs /mnt/zns --policy rocks /guest/leveldb.wasm -- {READ}\n"
        ),
    );
    let vm = Vm {
        qemu: assets.qemu.clone(),
        kernel,
        initrd: cpio,
        namespaces: vec![Namespace::Zns {
            image: dir.path().join("zns.img"),
            size: 512 * MIB,
            zone_size: 16 * MIB,
            zone_capacity: 12 * MIB,
            max_open: 14,
            max_active: 14,
        }],
        memory_mib: 1536,
        timeout: Duration::from_secs(240),
    };
    let run = vm.run();
    println!("{}", run.console);
    run.assert_ok("LevelDB on zonefs in the VM");
    check_leveldb(&run.console);
    let store = store_zones(&run.lines_with("STORE "));
    // The kernel's zones: the first holds zonefs's superblock, so store zone i is zone i+1.
    let device: Vec<(u64, String)> = run
        .lines_with("DEVICE ")
        .iter()
        .map(|l| {
            let wptr = l
                .split("wptr 0x")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            let cond = l
                .split("zcond:")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            (
                u64::from_str_radix(wptr, 16).unwrap() * 512,
                cond.to_string(),
            )
        })
        .collect();
    let mut streams = BTreeMap::<String, BTreeSet<u32>>::new();
    for (zone, state, wp, owner, _) in &store {
        let (dev_wp, cond) = &device[*zone as usize + 1];
        if state == "Full" {
            assert!(
                cond.contains("(fu)"),
                "zone {zone}: store Full, drive {cond}"
            );
        } else {
            assert_eq!(
                dev_wp, wp,
                "zone {zone}: drive's write pointer against the store's"
            );
        }
        streams.entry(owner.clone()).or_default().insert(*zone);
    }
    println!("zones by owner: {streams:?}");
    let logs = streams.get("0/1").expect("no zone of the log stream");
    let tables = streams.get("0/2").expect("no zone of the table stream");
    assert!(logs.is_disjoint(tables));
}

#[test]
fn leveldb_on_fdp_in_a_vm() {
    let Some(assets) = Assets::find() else { return };
    let Some(kernel) = assets.kernel(KernelSeries::V6_12) else {
        return;
    };
    if valet_guests::require("leveldb").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cpio = initramfs(
        &assets,
        &kernel,
        dir.path(),
        &[],
        &[(Path::new("/usr/sbin/nvme"), "nvme")],
        &format!(
            "valet-run --device /data/dev --fdp /dev/valet-ng1 --policy rocks --stats /guest/leveldb.wasm -- {WRITE}\n\
             valet-run fs zones --device /data/dev --fdp /dev/valet-ng1 | sed 's/^/STORE /'\n\
             echo \"FDPSTATUS $(nvme fdp status /dev/valet-ns1 -o json | tr -d '\\n ')\"\n\
             valet-run --device /data/dev --fdp /dev/valet-ng1 --policy rocks /guest/leveldb.wasm -- {READ}\n"
        ),
    );
    let vm = Vm {
        qemu: assets.qemu.clone(),
        kernel,
        initrd: cpio,
        namespaces: vec![Namespace::Fdp {
            image: dir.path().join("fdp.img"),
            size: 512 * MIB,
            reclaim_unit: 16 * MIB,
            handles: 8,
        }],
        memory_mib: 1536,
        timeout: Duration::from_secs(240),
    };
    let run = vm.run();
    println!("{}", run.console);
    run.assert_ok("LevelDB on FDP in the VM");
    check_leveldb(&run.console);
    let store = store_zones(&run.lines_with("STORE "));
    let mut pids = BTreeMap::<String, BTreeSet<u64>>::new();
    for (_, _, _, owner, pid) in &store {
        if owner != "-" {
            pids.entry(owner.clone())
                .or_default()
                .insert(pid.parse().unwrap());
        }
    }
    println!("placement ids by stream: {pids:?}");
    let logs = pids.get("0/1").expect("no zone of the log stream");
    let tables = pids.get("0/2").expect("no zone of the table stream");
    assert!(logs.is_disjoint(tables), "{pids:?}");
    // The drive's side: every identifier of the log and table streams has reclaim unit
    // space used, and no identifier the store never gave out has any.
    let status = run
        .lines_with("FDPSTATUS ")
        .pop()
        .expect("nvme fdp status output");
    let used: BTreeMap<u64, u64> = status
        .split("\"pid\":")
        .skip(1)
        .map(|s| {
            let pid = s.split(',').next().unwrap().parse().unwrap();
            let ruamw: u64 = s
                .split("\"ruamw\":")
                .nth(1)
                .unwrap()
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap();
            (pid, (16 * MIB / 4096) - ruamw)
        })
        .collect();
    println!("reclaim unit blocks used by placement id: {used:?}");
    // No zone was reset and no reclaim unit filled in this run, so the blocks the drive
    // counts under the log's and the tables' identifiers are the blocks of the store's zones
    // that carry them: exactly, for zones still being written; for zones the store finished
    // (rocks starts a new table zone every 30 s window), at most up to their capacity.
    for pid in logs.iter().chain(tables) {
        let zones: Vec<_> = store.iter().filter(|z| z.4 == pid.to_string()).collect();
        let written: u64 = zones
            .iter()
            .filter(|z| z.1 != "Full")
            .map(|z| z.2 / 4096)
            .sum();
        let finished = zones.iter().filter(|z| z.1 == "Full").count() as u64;
        let most = written + finished * (16 * MIB / 4096);
        assert!(
            used[pid] >= written && used[pid] <= most && (finished > 0 || used[pid] == written),
            "placement id {pid}: drive {used:?}, store {store:?}"
        );
    }
    // Identifier 0 also carries the metadata journal.
    let given: BTreeSet<u64> = pids.values().flatten().copied().chain([0]).collect();
    for (pid, blocks) in &used {
        assert!(
            given.contains(pid) || *blocks == 0,
            "placement id {pid} used {blocks} blocks but the store never gave it out"
        );
    }
}
