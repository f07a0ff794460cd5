//! A hostile guest: every WASIp1 function called with arguments a program would never pass
//! (descriptors that are not open, pointers at and past the end of memory, lengths of
//! 4 GiB, counts of 2^31, flags with every bit set, memory full of noise). Each call must
//! come back with an errno, or end the guest with a trap: never a host panic, never an
//! allocation sized by the guest's numbers (the abort that ends the whole host, and with
//! the node agent every pod), never a hang, and the store stays consistent.
//!
//! Programs are generated from fixed seeds, so a failure names its seed and repeats. 40 run
//! in the normal suite; `VALET_HOSTILE_SEEDS=N` runs N (the long mode). Some programs ask
//! `poll_oneoff` for a long sleep, as a guest may: each gets 10 s, then is stopped.

use std::fmt::Write;
use std::sync::Arc;

use valet_runtime::host::{self, GuestSpec, Preopen, Stop, Stopping};
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{Store, StoreConfig};

/// Every function of `wasi_snapshot_preview1` but `proc_exit`, with its parameters
/// (`i`: i32, `I`: i64); each returns an errno (i32).
const CALLS: &[(&str, &str)] = &[
    ("args_get", "ii"),
    ("args_sizes_get", "ii"),
    ("environ_get", "ii"),
    ("environ_sizes_get", "ii"),
    ("clock_res_get", "ii"),
    ("clock_time_get", "iIi"),
    ("fd_advise", "iIIi"),
    ("fd_allocate", "iII"),
    ("fd_close", "i"),
    ("fd_datasync", "i"),
    ("fd_fdstat_get", "ii"),
    ("fd_fdstat_set_flags", "ii"),
    ("fd_fdstat_set_rights", "iII"),
    ("fd_filestat_get", "ii"),
    ("fd_filestat_set_size", "iI"),
    ("fd_filestat_set_times", "iIIi"),
    ("fd_pread", "iiiIi"),
    ("fd_prestat_get", "ii"),
    ("fd_prestat_dir_name", "iii"),
    ("fd_pwrite", "iiiIi"),
    ("fd_read", "iiii"),
    ("fd_readdir", "iiiIi"),
    ("fd_renumber", "ii"),
    ("fd_seek", "iIii"),
    ("fd_sync", "i"),
    ("fd_tell", "ii"),
    ("fd_write", "iiii"),
    ("path_create_directory", "iii"),
    ("path_filestat_get", "iiiii"),
    ("path_filestat_set_times", "iiiiIIi"),
    ("path_link", "iiiiiii"),
    ("path_open", "iiiiiIIii"),
    ("path_readlink", "iiiiii"),
    ("path_remove_directory", "iii"),
    ("path_rename", "iiiiii"),
    ("path_symlink", "iiiii"),
    ("path_unlink_file", "iii"),
    ("poll_oneoff", "iiii"),
    ("proc_raise", "i"),
    ("sched_yield", ""),
    ("random_get", "ii"),
    ("sock_accept", "iii"),
    ("sock_recv", "iiiiii"),
    ("sock_send", "iiiii"),
    ("sock_shutdown", "ii"),
];

/// Where the program keeps a few real paths and iovecs, so that some calls succeed and
/// later ones act on what they opened or created.
const PATHS: u32 = 8192;
const IOVECS: u32 = 9000;

/// i32 arguments: open and unopened descriptors, the paths and iovecs above, the end of
/// the one page of memory and past it, and huge and negative values.
const I32S: &[i64] = &[
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    -1,
    0x7fff_ffff,
    8192,
    8194,
    8196,
    8200,
    8210,
    9000,
    9016,
    65535,
    65536,
    65532,
    65528,
    -16,
    100,
    5000,
    0x1000_0000,
];
const I64S: &[i64] = &[0, 1, 4096, -1, i64::MAX, 1 << 32, 1 << 40, 12, -4096];

/// The strings at [`PATHS`]: (address, length).
const PATH_STRINGS: &[(i64, i64)] = &[
    (8192, 1),
    (8194, 1),
    (8196, 3),
    (8200, 2),
    (8203, 4),
    (8208, 3),
    (8212, 5),
];

/// Makes a call's arguments what a program would pass (an open descriptor, a real path,
/// the iovecs, flags that make sense), so that half of the calls get past their checks
/// and create, write, rename and remove what later calls then act on.
fn make_sensible(rng: &mut Rng, name: &str, args: &mut [i64]) {
    let fds: &[usize] = match name {
        "path_link" => &[0, 4],
        "path_rename" => &[0, 3],
        "path_symlink" => &[2],
        _ if name.starts_with("fd_") || name.starts_with("path_") => &[0],
        _ => &[],
    };
    for &i in fds {
        // The store's directory is 3: mostly that, but never closed or replaced here.
        args[i] = match name {
            "fd_close" | "fd_renumber" => rng.pick(&[4, 5, 6, 7]),
            _ => rng.pick(&[3, 3, 3, 4, 5, 6, 7]),
        };
    }
    let paths: &[usize] = match name {
        "path_filestat_get" | "path_filestat_set_times" | "path_open" => &[2],
        "path_link" => &[2, 5],
        "path_rename" => &[1, 4],
        "path_symlink" => &[0, 3],
        _ if name.starts_with("path_") => &[1],
        _ => &[],
    };
    for &i in paths {
        (args[i], args[i + 1]) = rng.pick(PATH_STRINGS);
    }
    match name {
        "path_filestat_get" | "path_filestat_set_times" | "path_link" | "path_open" => {
            args[1] = rng.pick(&[0, 1]); // lookup flags: none, or follow links
        }
        _ => {}
    }
    match name {
        "path_open" => {
            args[4] = rng.pick(&[0, 1, 1, 2, 5, 8, 9]); // oflags: CREAT, DIRECTORY, EXCL, TRUNC
            (args[5], args[6]) = (-1, -1);
            args[7] = rng.pick(&[0, 0, 1, 4, 16]); // fdflags: APPEND, NONBLOCK, SYNC
            args[8] = 9100;
        }
        "fd_write" | "fd_pwrite" | "fd_read" | "fd_pread" => {
            (args[1], args[2]) = (IOVECS as i64, rng.pick(&[1, 2, 3, 4]));
            if name.ends_with("pwrite") || name.ends_with("pread") {
                args[3] = rng.pick(&[0, 1, 4095, 4096, 100_000, 1 << 20]);
            }
            *args.last_mut().unwrap() = 9200;
        }
        _ => {}
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.next() as usize % from.len()]
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:02x}")).collect()
}

/// A module whose `_start` makes `calls` calls chosen and filled in from `seed`.
fn program(seed: u64, calls: usize) -> String {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut wat = String::from("(module\n");
    for (name, params) in CALLS {
        let types: Vec<&str> = params
            .chars()
            .map(|c| if c == 'i' { "i32" } else { "i64" })
            .collect();
        let _ = writeln!(
            wat,
            "(import \"wasi_snapshot_preview1\" \"{name}\" (func ${name} (param {}) (result i32)))",
            types.join(" ")
        );
    }
    let noise: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
    let paths = b"a\0d\0d/b\0..\0../x\0sym\0d/b/c\0";
    let iovecs: Vec<u8> = [0u32, 100, 100, 5000, 60000, 10000, 8192, 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let _ = writeln!(wat, "(memory (export \"memory\") 1)");
    let _ = writeln!(wat, "(data (i32.const 0) \"{}\")", hex(&noise));
    let _ = writeln!(wat, "(data (i32.const {PATHS}) \"{}\")", hex(paths));
    let _ = writeln!(wat, "(data (i32.const {IOVECS}) \"{}\")", hex(&iovecs));
    wat.push_str("(func (export \"_start\")\n");
    for _ in 0..calls {
        let (name, params) = rng.pick(CALLS);
        let mut args: Vec<i64> = params
            .chars()
            .map(|c| {
                let values = if c == 'i' { I32S } else { I64S };
                // Mostly the edge values; sometimes any small number.
                match rng.next() % 8 {
                    0 => (rng.next() % 70_000) as i64,
                    _ => rng.pick(values),
                }
            })
            .collect();
        if rng.next() % 2 == 0 {
            make_sensible(&mut rng, name, &mut args);
        }
        let args: Vec<String> = params
            .chars()
            .zip(&args)
            .map(|(c, v)| format!("({}.const {v})", if c == 'i' { "i32" } else { "i64" }))
            .collect();
        let _ = writeln!(wat, "(drop (call ${name} {}))", args.join(" "));
    }
    wat.push_str("))\n");
    wat
}

#[test]
fn hostile_calls_get_errnos_and_leave_the_store_consistent() {
    let engine = host::engine(Stopping::NoChecks).unwrap();
    let null = Arc::new(
        std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .unwrap(),
    );
    let geometry = Geometry {
        zone_count: 12,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 6,
        max_active: 8,
    };
    let seeds: u64 = std::env::var("VALET_HOSTILE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let mut made = 0;
    for seed in 1..=seeds {
        let bytes = wat::parse_str(program(seed, 400)).unwrap();
        let module = wasmtime::Module::new(&engine, &bytes).unwrap();
        let device = Arc::new(MemoryDevice::new(geometry).unwrap()) as Arc<dyn ZonedDevice>;
        let store = Store::open(device, StoreConfig::default()).unwrap();
        let (_, root) = store.tenant("guest").unwrap();
        let spec = GuestSpec {
            args: vec!["hostile".into(), "x".into()],
            env: vec![("K".into(), "V".into())],
            preopens: vec![Preopen::Store {
                ino: root,
                guest_path: "/data".into(),
            }],
            stdio: [Some(null.clone()), Some(null.clone()), Some(null.clone())],
            stop: Some(Arc::new(Stop::default())),
            ..Default::default()
        };
        let (done, watch) = std::sync::mpsc::channel::<()>();
        let stop = spec.stop.clone().unwrap();
        let watchdog = std::thread::spawn(move || {
            let limit = std::time::Duration::from_secs(10);
            if watch.recv_timeout(limit) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                stop.stop(libc::SIGALRM);
            }
        });
        // Ending with an exit code or a trap are both fine; an error of the host is not.
        let ran = host::run(&engine, &module, &spec, &store);
        drop(done);
        watchdog.join().unwrap();
        if let Err(e) = ran {
            panic!("seed {seed}: the host failed: {e:#}");
        }
        let report = store.fsck().unwrap();
        assert!(report.is_clean(), "seed {seed}: {}", report.findings());
        made += report.files + report.dirs + report.symlinks - 1;
    }
    // The sensible half of the calls got through: the programs made files, directories and
    // links, which later calls wrote, renamed and removed (the 40 seeds leave 47).
    assert!(
        made >= seeds / 2,
        "{made} files, directories and links made"
    );
}
