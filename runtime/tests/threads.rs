//! wasm32-wasip1-threads guests: four `std::thread`s (wasi-threads) write and fsync their
//! own files at once through one shared WASI context; every byte is in the store after.
//! A trap or `exit` in any thread ends the whole program with its outcome (134, or the exit
//! code), whether the main thread is parked in a wait or spinning, and never aborts the host.

use std::path::Path;
use std::process::Command;

use valet_runtime::device::DeviceSpec;
use valet_vfs::device::Geometry;
use valet_vfs::OpenOptions;

/// What threads_writer's thread `t` writes at offset `j`.
fn pattern(t: u64, j: u64) -> u8 {
    ((j.wrapping_mul(2654435761) >> 9) ^ (t.wrapping_mul(0x5bd1) + 1)) as u8
}

fn device(dir: &Path) -> DeviceSpec {
    DeviceSpec::image(dir, Geometry::EMBEDDED_DEFAULT)
}

/// `valet-run` on the store at `dev`, made with 16 zones of 16 MiB on first use.
fn valet_run(dev: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_valet-run"));
    command
        .arg("--device")
        .arg(dev)
        .args(["--zone-size", "16", "--zones", "16"]);
    command
}

fn run_writer(dev: &Path, threads: u64, size: u64, end: Option<&str>) -> std::process::Output {
    valet_run(dev)
        .arg(valet_guests::THREADS_WRITER)
        .args(["/data", &threads.to_string(), &size.to_string()])
        .args(end)
        .output()
        .unwrap()
}

#[test]
fn threaded_guest_writes_from_four_threads() {
    const THREADS: u64 = 4;
    const SIZE: u64 = 300_001;
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let out = run_writer(&dev, THREADS, SIZE, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("4 files verified"), "{stdout}");
    check_files(&dev, THREADS, SIZE);
}

#[test]
fn a_trap_or_exit_in_one_thread_ends_the_program_with_its_code() {
    const THREADS: u64 = 4;
    const SIZE: u64 = 100_003;
    for (end, code) in [("trap", 134), ("exit", 7)] {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        let out = run_writer(&dev, THREADS, SIZE, Some(end));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{end}: {stdout}\n{stderr}");
        assert!(!stdout.contains("verified"), "{end}: {stdout}");
        if end == "trap" {
            assert!(stderr.contains("guest trapped"), "{stderr}");
            // The guest's backtrace, once, and no host Rust backtrace.
            assert_eq!(stderr.matches("guest trapped").count(), 1, "{stderr}");
            assert!(!stderr.contains("std::backtrace"), "{stderr}");
            assert!(!stderr.contains("Stack backtrace"), "{stderr}");
        }
        // Every thread synced before the end: all files whole.
        check_files(&dev, THREADS, SIZE);
    }
}

/// Four threads write records to one file, through append descriptors of their own or
/// through one shared descriptor at its position, on the store and on a host directory:
/// every record lands whole, once, after every write before it.
#[test]
fn threads_writing_to_one_file_never_write_over_each_other() {
    const THREADS: u64 = 4;
    // 40 records of 50,001 bytes a thread: the store's windows fill and start mid-record.
    const SIZE: u64 = 2_000_040;
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let mut dir_arg = host.into_os_string();
    dir_arg.push("::/host");
    for (guest_dir, mode) in [
        ("/data", "append"),
        ("/host", "append"),
        ("/data", "shared"),
        ("/host", "shared"),
    ] {
        let out = valet_run(&tmp.path().join("dev"))
            .arg("--dir")
            .arg(&dir_arg)
            .arg(valet_guests::THREADS_WRITER)
            .args([guest_dir, &THREADS.to_string(), &SIZE.to_string(), mode])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{guest_dir} {mode}: {:?}\n{stdout}\n{stderr}",
            out.status
        );
        assert!(
            stdout.contains("160 appended records verified"),
            "{guest_dir} {mode}: {stdout}"
        );
    }
}

/// A hand-written wasip1-threads module: `_start` spawns one thread, then waits forever
/// (`park`) or spins forever (`spin`); the thread traps (`arg` 0) or exits with 9 (1).
fn spawner(main_waits: &str, arg: i32) -> Vec<u8> {
    let main_body = match main_waits {
        "park" => "(drop (memory.atomic.wait32 (i32.const 64) (i32.const 0) (i64.const -1)))",
        _ => "(loop $spin (br $spin))",
    };
    wat::parse_str(format!(
        r#"(module
          (import "wasi" "thread-spawn" (func $spawn (param i32) (result i32)))
          (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
          (import "env" "memory" (memory 1 1 shared))
          (func (export "wasi_thread_start") (param $tid i32) (param $arg i32)
            (if (i32.eqz (local.get $arg)) (then unreachable))
            (call $exit (i32.const 9)))
          (func (export "_start")
            (if (i32.le_s (call $spawn (i32.const {arg})) (i32.const 0)) (then unreachable))
            {main_body}))"#
    ))
    .unwrap()
}

/// A hand-written wasip1-threads module: `_start` starts threads until 20 have started
/// (retrying a refused `thread-spawn` after 1 ms, up to 1,000 times) and exits with how
/// many did. Each thread parks forever (`park`) or returns at once.
fn thread_counter(threads_park: bool) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
          (import "wasi" "thread-spawn" (func $spawn (param i32) (result i32)))
          (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
          (import "env" "memory" (memory 1 1 shared))
          (func (export "wasi_thread_start") (param $tid i32) (param $park i32)
            (if (local.get $park)
              (then (drop (memory.atomic.wait32 (i32.const 64) (i32.const 0) (i64.const -1))))))
          (func (export "_start") (local $started i32) (local $refused i32)
            (block $done
              (loop $again
                (br_if $done (i32.ge_u (local.get $started) (i32.const 20)))
                (br_if $done (i32.ge_u (local.get $refused) (i32.const 1000)))
                (if (i32.gt_s (call $spawn (i32.const {park})) (i32.const 0))
                  (then (local.set $started (i32.add (local.get $started) (i32.const 1))))
                  (else
                    (local.set $refused (i32.add (local.get $refused) (i32.const 1)))
                    (drop (memory.atomic.wait32 (i32.const 128) (i32.const 0) (i64.const 1000000)))))
                (br $again)))
            (call $exit (local.get $started))))"#,
        park = threads_park as i32
    ))
    .unwrap()
}

/// `--max-threads` (a pod's pids limit in the node agent, a tenant's `max_threads` under
/// `--tenants`) bounds the threads running at once, the first included; a thread that
/// ended frees its place.
#[test]
fn max_threads_bounds_the_threads_running_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    for (park, limit, started) in [
        (true, Some("5"), 4),
        (false, Some("5"), 20),
        (true, None, 20),
    ] {
        let app = tmp.path().join(format!("counter-{park}.wasm"));
        std::fs::write(&app, thread_counter(park)).unwrap();
        let mut command = valet_run(&tmp.path().join("dev"));
        if let Some(limit) = limit {
            command.args(["--max-threads", limit]);
        }
        let out = command.arg(&app).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(started),
            "threads park: {park}, --max-threads {limit:?}: {stderr}"
        );
    }
    // Under --tenants: a tenant's own max_threads, else --max-threads.
    let app = tmp.path().join("counter-true.wasm");
    for (key, flag, started) in [("max_threads = 3", None, 2), ("", Some("4"), 3)] {
        let file = tmp.path().join("tenants.toml");
        let toml = format!("[[tenant]]\nname = \"t\"\napp = {app:?}\n{key}\n");
        std::fs::write(&file, toml).unwrap();
        let mut command = valet_run(&tmp.path().join("dev"));
        command.arg("--tenants").arg(&file);
        if let Some(limit) = flag {
            command.args(["--max-threads", limit]);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(started),
            "{key:?} {flag:?}: {stderr}"
        );
    }
}

#[test]
fn a_spawned_thread_ends_a_parked_or_spinning_main_thread() {
    let tmp = tempfile::tempdir().unwrap();
    for main in ["park", "spin"] {
        for (arg, code) in [(0, 134), (1, 9)] {
            let app = tmp.path().join(format!("spawner-{main}-{arg}.wasm"));
            std::fs::write(&app, spawner(main, arg)).unwrap();
            let out = valet_run(&tmp.path().join("dev"))
                .arg(&app)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{main} {arg}: {stderr}");
        }
    }
}

/// From the host side, after the process is gone: every thread's file whole.
fn check_files(dev: &Path, threads: u64, size: u64) {
    let store = device(dev).mount_existing().unwrap();
    let (_, root) = store.tenant("default").unwrap();
    for t in 0..threads {
        let f = store
            .open_file(root, &format!("thread-{t}.bin"), OpenOptions::read())
            .unwrap();
        assert_eq!(f.metadata().unwrap().size, size);
        let mut data = vec![0u8; size as usize];
        assert_eq!(f.read_at(&mut data, 0).unwrap(), data.len());
        assert!(
            data.iter()
                .enumerate()
                .all(|(j, &b)| b == pattern(t, j as u64)),
            "thread-{t}.bin differs"
        );
    }
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{}", report.findings());
}

/// Runs `guest ARGS` under valet-run on the store in `dev` (`geometry`: `--zone-size` and
/// `--zones`) and returns its stdout.
fn transcript(dev: &Path, geometry: [&str; 4], guest: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(dev)
        .args(geometry)
        .args([guest, "--"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{guest} {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.lines().count() > 50, "{stdout}");
    stdout
}

/// Eight threads making random file-system calls at once (the `fsrandom` sequences, one
/// seed per thread, each in its own directory) on a device small enough that GC runs
/// meanwhile: each thread's transcript is the one its seed gives alone, and so is the tree
/// after a remount. `VALET_THREADS_FSRANDOM_ROUNDS=N` runs N rounds of other seeds.
#[test]
fn random_calls_from_eight_threads_give_what_each_gives_alone() {
    let rounds: u64 = std::env::var("VALET_THREADS_FSRANDOM_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    // 12 zones of 1 MiB: eight sequences write about 5.6 MiB and leave 1.1 MiB live, so GC
    // moves data and resets zones while they run.
    let small = ["--zone-size", "1", "--zones", "12"];
    let large = ["--zone-size", "16", "--zones", "16"];
    for round in 0..rounds {
        let (first, last) = ((round * 8 + 1).to_string(), (round * 8 + 8).to_string());
        let tmp = tempfile::tempdir().unwrap();
        let (together, alone) = (tmp.path().join("together"), tmp.path().join("alone"));
        let threads = [&first[..], &last, "1000"];
        let seq = ["run", &first[..], &last, "1000"];
        assert_eq!(
            transcript(
                &together,
                small,
                valet_guests::THREADS_FSRANDOM,
                &[&["/data"], &threads[..]].concat()
            ),
            transcript(
                &alone,
                large,
                valet_guests::FSRANDOM,
                &[&["/data"], &seq[..]].concat()
            ),
            "seeds {first}..={last}: the threads' transcripts differ from the seeds' alone"
        );
        assert_eq!(
            transcript(&together, small, valet_guests::FSRANDOM, &["/data", "dump"]),
            transcript(&alone, large, valet_guests::FSRANDOM, &["/data", "dump"]),
            "seeds {first}..={last}: the trees after a remount differ"
        );
    }
}
