//! QEMU VMs for tests on the kernel's real device interfaces: an emulated NVMe ZNS namespace
//! under zonefs, or an NVMe namespace with FDP (`../shared/REAL-DEVICES.md` has the facts).
//!
//! A test builds an initramfs (static busybox as `/init`, the kernel modules it needs in
//! `modules.dep` order, host binaries with the libraries `ldd` lists), boots
//! `qemu-system-x86_64 -accel tcg` on one of the Debian cloud kernels that `.ci/setup-vm`
//! unpacked into `~/.cache/valet-vm`, and reads the guest's serial console. The guest's script
//! ends by printing `VALET-VM-EXIT <status>` and powering off; [`VmRun::status`] is that
//! status. Nothing is compiled inside the VM: test binaries are built on the host.
//!
//! Where QEMU or a kernel is missing the tests skip with a message ([`Assets::find`] returns
//! `None`); with `VALET_REQUIRE_VM=1` (CI) a missing piece fails the test instead.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Marker the guest prints before powering off.
const EXIT_MARKER: &str = "VALET-VM-EXIT ";

/// A Debian cloud kernel unpacked by `.ci/setup-vm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSeries {
    /// 6.12: zonefs works (6.1's does not); FDP only through NVMe passthrough.
    V6_12,
    /// 6.18: FDP placement handles also as block-layer write streams.
    V6_18,
}

impl KernelSeries {
    fn dir_name(self) -> &'static str {
        match self {
            KernelSeries::V6_12 => "kernel-6.12",
            KernelSeries::V6_18 => "kernel-6.18",
        }
    }
}

/// An unpacked kernel: `vmlinuz` and `lib/modules/<version>`.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub image: PathBuf,
    pub version: String,
    pub modules: PathBuf,
}

/// What the VM tests need from the host.
#[derive(Clone, Debug)]
pub struct Assets {
    pub qemu: PathBuf,
    pub busybox: PathBuf,
    cache: PathBuf,
}

/// The cache `.ci/setup-vm` fills.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VALET_VM_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("valet-vm")
}

/// Whether a missing VM piece fails the test (`VALET_REQUIRE_VM=1`, set by CI).
pub fn required() -> bool {
    std::env::var("VALET_REQUIRE_VM").is_ok_and(|v| v == "1")
}

/// Skips the calling test with `why` (returns), or fails it when the VM is required.
pub fn skip(why: &str) {
    if required() {
        panic!("VALET_REQUIRE_VM=1 but {why} (run .ci/setup-vm)");
    }
    eprintln!("skipping the VM test: {why} (run .ci/setup-vm, or see README 'VM tests')");
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Assets {
    /// Finds QEMU, busybox and the cache, or says (through [`skip`]) what is missing.
    pub fn find() -> Option<Assets> {
        let Some(qemu) = on_path("qemu-system-x86_64") else {
            skip("qemu-system-x86_64 is not installed");
            return None;
        };
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .iter()
            .map(PathBuf::from)
            .find(|p| is_static(p));
        let Some(busybox) = busybox else {
            skip("no static busybox (Debian's busybox-static)");
            return None;
        };
        Some(Assets {
            qemu,
            busybox,
            cache: cache_dir(),
        })
    }

    /// An unpacked kernel of `series`, or `None` after [`skip`].
    pub fn kernel(&self, series: KernelSeries) -> Option<Kernel> {
        let dir = self.cache.join(series.dir_name());
        let version = fs::read_to_string(dir.join("version")).ok();
        let image = dir.join("vmlinuz");
        match version {
            Some(v) if image.is_file() => {
                let version = v.trim().to_string();
                let modules = dir.join("lib/modules").join(&version);
                Some(Kernel {
                    image,
                    version,
                    modules,
                })
            }
            _ => {
                skip(&format!("no kernel in {}", dir.display()));
                None
            }
        }
    }

    /// `mkzonefs` unpacked from trixie's zonefs-tools.
    pub fn mkzonefs(&self) -> Option<PathBuf> {
        let path = self.cache.join("zonefs-tools/usr/sbin/mkzonefs");
        if path.is_file() {
            Some(path)
        } else {
            skip(&format!("no mkzonefs at {}", path.display()));
            None
        }
    }
}

fn is_static(path: &Path) -> bool {
    let Ok(out) = Command::new("ldd").arg(path).output() else {
        return false;
    };
    // ldd exits non-zero ("not a dynamic executable") for static binaries.
    path.is_file() && !out.status.success()
}

/// The libraries `ldd` lists for a dynamically linked binary (with the loader).
fn shared_libraries(binary: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .expect("running ldd");
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// An initramfs being put together in a temporary directory.
pub struct Initramfs {
    root: tempfile::TempDir,
    /// Modules in load order, as paths inside the image.
    modules: Vec<String>,
    loaded: BTreeSet<String>,
    kernel: Kernel,
}

impl Initramfs {
    /// busybox and the directories every guest needs.
    pub fn new(assets: &Assets, kernel: &Kernel) -> Initramfs {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in [
            "bin", "dev", "proc", "sys", "tmp", "mnt", "lib", "modules", "data",
        ] {
            fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        fs::copy(&assets.busybox, root.path().join("bin/busybox")).expect("copying busybox");
        Initramfs {
            root,
            modules: Vec::new(),
            loaded: BTreeSet::new(),
            kernel: kernel.clone(),
        }
    }

    /// Copies a host binary to `/bin/<name>` with the libraries it links, without its debug
    /// information (a debug `valet-run` is 300 MB with it, 30 MB without: the image lives
    /// in the VM's memory).
    pub fn add_binary(&mut self, host: &Path, name: &str) {
        let dest = self.root.path().join("bin").join(name);
        let stripped = Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&dest)
            .arg(host)
            .status()
            .is_ok_and(|s| s.success());
        if !stripped {
            fs::copy(host, &dest).unwrap_or_else(|e| panic!("copying {}: {e}", host.display()));
        }
        for lib in shared_libraries(host) {
            let inside = self.root.path().join(lib.strip_prefix("/").unwrap());
            if !inside.exists() {
                fs::create_dir_all(inside.parent().unwrap()).unwrap();
                // Follow symlinks: the image holds the library under the name asked for.
                fs::copy(&lib, &inside)
                    .unwrap_or_else(|e| panic!("copying {}: {e}", lib.display()));
            }
        }
    }

    /// Adds a file at `path` inside the image.
    pub fn add_file(&mut self, path: &str, contents: &[u8]) {
        let dest = self.root.path().join(path.trim_start_matches('/'));
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(dest, contents).unwrap();
    }

    /// Copies the host directory tree `host` to `inside` (e.g. a compiled-module cache).
    pub fn add_dir(&mut self, host: &Path, inside: &str) {
        for entry in fs::read_dir(host).unwrap_or_else(|e| panic!("{}: {e}", host.display())) {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{}/{name}", inside.trim_end_matches('/'));
            if entry.file_type().unwrap().is_dir() {
                self.add_dir(&entry.path(), &path);
            } else {
                self.add_file(&path, &fs::read(entry.path()).unwrap());
            }
        }
    }

    /// Adds kernel module `name` (e.g. `zonefs`) and what it depends on, from `modules.dep`,
    /// decompressed (busybox's insmod reads plain `.ko` files). Built-in modules add nothing.
    pub fn add_module(&mut self, name: &str) {
        let dep = fs::read_to_string(self.kernel.modules.join("modules.dep"))
            .expect("reading modules.dep");
        let file_name = |path: &str| {
            Path::new(path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .split('.')
                .next()
                .unwrap()
                .replace('-', "_")
        };
        let wanted = name.replace('-', "_");
        let Some(line) = dep
            .lines()
            .find(|l| file_name(l.split(':').next().unwrap()) == wanted)
        else {
            let builtin =
                fs::read_to_string(self.kernel.modules.join("modules.builtin")).unwrap_or_default();
            assert!(
                builtin.lines().any(|l| file_name(l) == wanted),
                "module {name} is neither in modules.dep nor built in"
            );
            return;
        };
        let (module, deps) = line.split_once(':').unwrap();
        // modules.dep lists dependencies deepest last: load them in reverse.
        let mut order: Vec<&str> = deps.split_whitespace().rev().collect();
        order.push(module);
        for path in order {
            let short = file_name(path);
            if !self.loaded.insert(short.clone()) {
                continue;
            }
            let source = self.kernel.modules.join(path);
            let bytes = if path.ends_with(".xz") {
                let out = Command::new("xz")
                    .arg("-dc")
                    .arg(&source)
                    .output()
                    .expect("running xz");
                assert!(out.status.success(), "xz -d {}", source.display());
                out.stdout
            } else {
                fs::read(&source).unwrap()
            };
            let inside = format!("modules/{short}.ko");
            self.add_file(&inside, &bytes);
            self.modules.push(format!("/{inside}"));
        }
    }

    /// Writes `/init`: the common prelude (file systems, modules, NVMe devices named by
    /// namespace id as `/dev/valet-nsN`), then `script`, then the exit marker and power-off.
    /// The script's last status is the VM's status.
    pub fn set_init(&mut self, script: &str) {
        let mut init = String::from(
            "#!/bin/busybox sh\n\
             /bin/busybox --install -s /bin\n\
             export PATH=/bin HOME=/tmp TMPDIR=/tmp\n\
             mount -t proc proc /proc\n\
             mount -t sysfs sys /sys\n\
             mount -t devtmpfs dev /dev\n\
             mount -t tmpfs tmp /tmp\n",
        );
        // Longer property runs reach the test binaries inside (README, "Long tests").
        if let Some(cases) = long_proptest_cases() {
            init.push_str(&format!("export PROPTEST_CASES={cases}\n"));
        }
        for module in &self.modules {
            // busybox insmod ignores boot options, so module parameters go here.
            init.push_str(&format!(
                "insmod {module} || echo 'insmod {module} failed'\n"
            ));
        }
        init.push_str(
            "i=0\n\
             while [ ! -e /dev/nvme0n1 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
             sleep 0.2\n\
             for d in /sys/block/nvme*n*; do\n\
             \x20 n=$(basename $d); ln -sf /dev/$n /dev/valet-ns$(cat $d/nsid)\n\
             \x20 [ -e /dev/ng${n#nvme} ] && ln -sf /dev/ng${n#nvme} /dev/valet-ng$(cat $d/nsid)\n\
             done\n\
             ( set -e\n",
        );
        init.push_str(script);
        init.push_str(
            "\n)\n\
             rc=$?\n\
             sync\n\
             echo \"VALET-VM-EXIT $rc\"\n\
             poweroff -f\n",
        );
        self.add_file("init", init.as_bytes());
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(
            self.root.path().join("init"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }

    /// Packs the image as an uncompressed newc cpio archive at `out`.
    pub fn pack(&self, out: &Path) {
        let list = Command::new("find")
            .arg(".")
            .current_dir(self.root.path())
            .output()
            .expect("running find");
        let mut cpio = Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet"])
            .current_dir(self.root.path())
            .stdin(Stdio::piped())
            .stdout(fs::File::create(out).unwrap())
            .spawn()
            .expect("running cpio (Debian's cpio)");
        use std::io::Write;
        cpio.stdin.take().unwrap().write_all(&list.stdout).unwrap();
        assert!(cpio.wait().unwrap().success(), "cpio failed");
    }
}

/// An NVMe namespace QEMU emulates, backed by a sparse image file.
#[derive(Clone, Debug)]
pub enum Namespace {
    /// A zoned namespace: zone size / capacity in bytes, open / active limits.
    Zns {
        image: PathBuf,
        size: u64,
        zone_size: u64,
        zone_capacity: u64,
        max_open: u32,
        max_active: u32,
    },
    /// A conventional namespace in an FDP subsystem: reclaim unit size, handles.
    Fdp {
        image: PathBuf,
        size: u64,
        reclaim_unit: u64,
        handles: u32,
    },
}

/// A VM to boot: kernel, initramfs, NVMe namespaces (nsid 1, 2, ... in order; all ZNS or
/// all FDP, on one controller).
pub struct Vm {
    pub qemu: PathBuf,
    pub kernel: Kernel,
    pub initrd: PathBuf,
    pub namespaces: Vec<Namespace>,
    pub memory_mib: u32,
    /// Killed after this long.
    pub timeout: Duration,
}

/// What a VM run printed and how it ended.
pub struct VmRun {
    pub console: String,
    /// The script's status from the exit marker; `None` if the VM never printed it.
    pub status: Option<i32>,
    pub elapsed: Duration,
    /// Whether the host killed QEMU (timeout or [`Vm::run_until`]).
    pub killed: bool,
}

impl VmRun {
    /// The console, for failure messages (the last 200 lines).
    pub fn tail(&self) -> String {
        let lines: Vec<&str> = self.console.lines().collect();
        lines[lines.len().saturating_sub(200)..].join("\n")
    }

    /// Fails the test unless the script exited 0.
    pub fn assert_ok(&self, what: &str) {
        assert_eq!(
            self.status,
            Some(0),
            "{what}: the VM's script failed (killed: {}, {:.1} s); console:\n{}",
            self.killed,
            self.elapsed.as_secs_f64(),
            self.tail()
        );
    }

    /// Lines of the console that start with `prefix`, with the prefix removed.
    pub fn lines_with(&self, prefix: &str) -> Vec<String> {
        self.console
            .lines()
            .filter_map(|l| {
                l.trim_end_matches('\r')
                    .strip_prefix(prefix)
                    .map(str::to_string)
            })
            .collect()
    }
}

impl Vm {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.qemu);
        c.args(["-accel", "tcg", "-cpu", "max", "-smp", "1", "-nographic"]);
        c.args(["-no-reboot", "-m", &self.memory_mib.to_string()]);
        c.arg("-kernel").arg(&self.kernel.image);
        c.arg("-initrd").arg(&self.initrd);
        c.args([
            "-append",
            "console=ttyS0 quiet panic=-1 no_timer_check nvme_core.multipath=N",
        ]);
        let fdp = self.namespaces.iter().find_map(|ns| match ns {
            Namespace::Fdp {
                reclaim_unit,
                handles,
                ..
            } => Some((*reclaim_unit, *handles)),
            _ => None,
        });
        let zns = self
            .namespaces
            .iter()
            .any(|ns| matches!(ns, Namespace::Zns { .. }));
        assert!(
            !(zns && fdp.is_some()),
            "one controller: ZNS or FDP, not both"
        );
        match fdp {
            Some((ru, handles)) => {
                c.args([
                    "-device",
                    &format!(
                        "nvme-subsys,id=subsys0,nqn=subsys0,fdp=on,fdp.runs={ru},fdp.nrg=1,fdp.nruh={handles}"
                    ),
                    "-device",
                    "nvme,id=nvme0,serial=valet0001,subsys=subsys0",
                ]);
            }
            None => {
                c.args(["-device", "nvme,id=nvme0,serial=valet0001,zoned.zasl=5"]);
            }
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            let nsid = i + 1;
            let (image, size) = match ns {
                Namespace::Zns { image, size, .. } | Namespace::Fdp { image, size, .. } => {
                    (image, *size)
                }
            };
            let f = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(image)
                .unwrap_or_else(|e| panic!("creating {}: {e}", image.display()));
            if f.metadata().unwrap().len() < size {
                f.set_len(size).unwrap();
            }
            c.arg("-drive").arg(format!(
                "file={},id=ns{nsid},format=raw,if=none,cache=writeback,discard=unmap",
                image.display()
            ));
            let common = format!(
                "nvme-ns,drive=ns{nsid},bus=nvme0,nsid={nsid},logical_block_size=4096,physical_block_size=4096"
            );
            let device = match ns {
                Namespace::Zns {
                    zone_size,
                    zone_capacity,
                    max_open,
                    max_active,
                    ..
                } => format!(
                    "{common},zoned=true,zoned.zone_size={zone_size},zoned.zone_capacity={zone_capacity},zoned.max_open={max_open},zoned.max_active={max_active}"
                ),
                Namespace::Fdp { handles, .. } => {
                    format!("{common},fdp.ruhs=0-{}", handles - 1)
                }
            };
            c.args(["-device", &device]);
        }
        c
    }

    fn spawn(&self, console: &Path) -> Child {
        self.command()
            .stdin(Stdio::null())
            .stdout(fs::File::create(console).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting qemu-system-x86_64")
    }

    /// Boots, waits for power-off (or the timeout) and returns the console.
    pub fn run(&self) -> VmRun {
        self.run_until(|_| false)
    }

    /// Boots and kills QEMU (a power cut) as soon as `cut` says so of the console so far,
    /// or at the timeout; otherwise waits for power-off.
    pub fn run_until(&self, mut cut: impl FnMut(&str) -> bool) -> VmRun {
        let dir = tempfile::tempdir().unwrap();
        let console_path = dir.path().join("console");
        let start = Instant::now();
        let mut child = self.spawn(&console_path);
        let timeout = if long_proptest_cases().is_some() {
            self.timeout.max(Duration::from_secs(3600))
        } else {
            self.timeout
        };
        let mut console = fs::File::open(&console_path).unwrap();
        let mut text = String::new();
        let mut killed = false;
        let mut raw = Vec::new();
        loop {
            raw.clear();
            console.seek(SeekFrom::Start(text.len() as u64)).unwrap();
            console.read_to_end(&mut raw).unwrap();
            text.push_str(&String::from_utf8_lossy(&raw));
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if start.elapsed() > timeout || cut(&text) {
                child.kill().ok();
                child.wait().ok();
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut rest = String::new();
        console.seek(SeekFrom::Start(text.len() as u64)).unwrap();
        console.read_to_string(&mut rest).ok();
        text.push_str(&rest);
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            e.read_to_string(&mut stderr).ok();
        }
        if !stderr.trim().is_empty() {
            text.push_str("\n[qemu stderr]\n");
            text.push_str(&stderr);
        }
        let status = text
            .lines()
            .filter_map(|l| l.trim_end_matches('\r').strip_prefix(EXIT_MARKER))
            .filter_map(|s| s.trim().parse().ok())
            .next_back();
        VmRun {
            console: text,
            status,
            elapsed: start.elapsed(),
            killed,
        }
    }
}

/// `PROPTEST_CASES` of the host, when set to a number.
fn long_proptest_cases() -> Option<u32> {
    std::env::var("PROPTEST_CASES").ok()?.parse().ok()
}

/// The executable of test target `test` of `package`, built (if needed) by cargo with the
/// profile of the running test binary, so the VM runs the code of this build.
pub fn cargo_test_binary(package: &str, test: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    // `--workspace` builds with the features `cargo test --workspace` unifies, so the
    // binary that run already built is reused instead of a second build of the crate.
    command.args([
        "test",
        "--workspace",
        "--test",
        test,
        "--no-run",
        "--message-format=json",
    ]);
    if is_release() {
        command.arg("--release");
    }
    let out = command
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "cargo test --no-run -p {package} --test {test} failed"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_it = msg["reason"] == "compiler-artifact"
            && msg["package_id"]
                .as_str()
                .is_some_and(|id| id.contains(package))
            && msg["target"]["name"] == test
            && msg["target"]["kind"][0] == "test";
        if let (true, Some(exe)) = (is_it, msg["executable"].as_str()) {
            return PathBuf::from(exe);
        }
    }
    panic!("cargo named no executable for {package} --test {test}");
}

/// A wasmtime module cache in `dir/cache` holding guest `wasm` compiled for x86-64-v2 (what
/// QEMU's emulated CPU runs), made by running the guest once on the host under `valet-run
/// --policy rocks` with `args`: compiling a large module under TCG would take minutes.
/// `what` names the guest in a failure.
pub fn portable_module_cache(wasm: &str, args: &[&str], dir: &Path, what: &str) -> PathBuf {
    let cache = dir.join("cache");
    let out = crate::valet_run(&dir.join("host-device"))
        .env("XDG_CACHE_HOME", &cache)
        .env("VALET_PORTABLE_CODE", "1")
        .args(["--policy", "rocks", wasm, "--"])
        .args(args)
        .output()
        .expect("starting valet-run");
    crate::check(&out, &format!("compiling {what} on the host"));
    cache
}

/// The build's binary `name` of another package (`valet-run`), built if missing.
pub fn cargo_bin(package: &str, name: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.args([
        "build",
        "-p",
        package,
        "--bin",
        name,
        "--message-format=json",
    ]);
    if is_release() {
        command.arg("--release");
    }
    let out = command
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "cargo build -p {package} --bin {name} failed"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact" && msg["target"]["name"] == name {
            if let Some(exe) = msg["executable"].as_str() {
                return PathBuf::from(exe);
            }
        }
    }
    panic!("cargo named no executable for {package} --bin {name}");
}

fn is_release() -> bool {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .is_some_and(|p| p == "release")
}

/// The FDP write stream on the SSD model, as the report shows it: boots the FDP VM (kernel
/// 6.12, 256 MiB namespace, 16 MiB reclaim units, 8 handles), runs `valet-vfs`'s
/// `kernel_devices` test `fdp_write_stream_on_the_ssd_model` and returns the fields of its
/// `SSD-MODEL` line (`host_mib`, `store_waf`, `waf_with_placement`, `waf_without`,
/// `reduction`, ...). `None` where no VM can run here ([`skip`] said why).
pub fn fdp_ssd_model_figures() -> Option<Result<Vec<(String, f64)>, String>> {
    let assets = Assets::find()?;
    let kernel = assets.kernel(KernelSeries::V6_12)?;
    let dir = tempfile::tempdir().unwrap();
    let devices = cargo_test_binary("valet-vfs", "kernel_devices");
    let mut initrd = Initramfs::new(&assets, &kernel);
    initrd.add_binary(&devices, "kernel_devices");
    initrd.set_init(
        "VALET_FDP_DEVICE=/dev/valet-ng1 kernel_devices --ignored --exact fdp_write_stream_on_the_ssd_model --nocapture\n",
    );
    let cpio = dir.path().join("initrd.cpio");
    initrd.pack(&cpio);
    let vm = Vm {
        qemu: assets.qemu.clone(),
        kernel,
        initrd: cpio,
        namespaces: vec![Namespace::Fdp {
            image: dir.path().join("fdp.img"),
            size: 256 << 20,
            reclaim_unit: 16 << 20,
            handles: 8,
        }],
        memory_mib: 1024,
        timeout: Duration::from_secs(300),
    };
    let run = vm.run();
    if run.status != Some(0) {
        return Some(Err(format!("the FDP VM failed:\n{}", run.tail())));
    }
    // The line follows the test harness's "test ... " on the same console line.
    let line = run
        .console
        .lines()
        .filter_map(|l| {
            l.split_once("SSD-MODEL ")
                .map(|(_, rest)| rest.trim_end().to_string())
        })
        .next_back();
    let Some(line) = line else {
        return Some(Err(format!(
            "no SSD-MODEL line from the VM:\n{}",
            run.tail()
        )));
    };
    Some(Ok(line
        .split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()))
}
