//! `valet-run`: run an unmodified WASI application on Valet's zoned store.
//!
//!     valet-run [OPTIONS] APP.wasm [-- ARGS...]      one guest
//!     valet-run [OPTIONS] --tenants FILE.toml        several guests, one tenant each
//!     valet-run fs ls|cat|import|export|fsck|tenants --device PATH ...
//!     valet-run policy check|push|list ...
//!     valet-run node [--device PATH] [--socket PATH]   the node agent for containerd pods
//!
//! The guest's stdout and stderr pass through and its exit code is ours. A failure of our
//! own, command-line mistakes included, is one line `valet-run: error: ...` on stderr and
//! exit code 125; a guest that traps exits with 134. With `--tenants` the exit code is
//! described in [`valet_runtime::tenants`]; `fs` commands in [`valet_runtime::fs_cmd`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};
use valet_runtime::admin::{self, Registry};
use valet_runtime::cpu_limit::{self, CpuLimit, CpuMetering};
use valet_runtime::device::DeviceSpec;
use valet_runtime::fs_cmd::{self, FsCommand, NewDeviceArgs};
use valet_runtime::host::{self, GuestExit, GuestSpec, Preopen, Stop};
use valet_runtime::policy_cmd::{self, PolicyCommand};
use valet_runtime::tenants;
use valet_runtime::termination;
use valet_vfs::device::IoMode;

/// Exit code for failures of valet-run itself (as `env` and container runtimes do).
const EXIT_OURS: u8 = 125;
/// Exit code when the guest traps (128 + SIGABRT, what an aborted native program gives).
const EXIT_TRAP: u8 = tenants::EXIT_TRAP;
/// Exit code when `--timeout` stopped the guest (as `timeout` gives).
const EXIT_TIMEOUT: u8 = 124;

#[derive(Parser)]
#[command(
    name = "valet-run",
    version,
    about = "Run a WASI application on Valet's zoned store, placing its data by policy",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect an existing store and copy data in and out of it, without running a guest.
    #[command(subcommand)]
    Fs(FsCommand),
    /// Check placement policies, and upload them to a running valet-run.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run as the node agent: own the node's device and run the guest of every Valet
    /// container (containerd-shim-valet-v1) on it, each pod a tenant.
    Node(NodeArgs),
}

/// `valet-run node`.
#[derive(Args)]
struct NodeArgs {
    #[command(flatten)]
    device: DeviceArgs,

    /// The Unix socket the shims connect to.
    #[arg(long, default_value = valet_runtime::node::proto::DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,

    /// Serve the admin API too (upload policies pods can then name), on a loopback
    /// IP:PORT or a Unix socket path.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,

    /// Serve Prometheus metrics (GET /metrics, read-only, no token) on IP:PORT.
    #[arg(long, value_name = "IP:PORT")]
    metrics: Option<std::net::SocketAddr>,
}

/// Running guests (the command without a subcommand).
#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    device: DeviceArgs,

    /// Placement policy: a built-in (default, rocks, cachelib, fdp-dirs, learn, one-stream)
    /// or a module.
    #[arg(long, default_value = "default", value_name = "FILE.wasm|NAME")]
    policy: String,

    /// Serve the admin API (upload and swap policies, read stats) on a loopback IP:PORT or
    /// a Unix socket path; its token is written to DEVICE/admin.token.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,

    /// Serve Prometheus metrics (GET /metrics: the store's counters, each tenant's sync
    /// latency; read-only, no token) on IP:PORT.
    #[arg(long, value_name = "IP:PORT")]
    metrics: Option<std::net::SocketAddr>,

    /// Record every placement call and file event as a JSON-lines trace.
    #[arg(long, value_name = "FILE")]
    record_trace: Option<PathBuf>,

    /// Where the store appears in the guest.
    #[arg(long, default_value = "/data", value_name = "GUEST_PATH")]
    mount: String,

    /// The tenant whose namespace and streams the guest uses.
    #[arg(long, default_value = "default")]
    tenant: String,

    /// A plain host directory for the guest, outside the store.
    #[arg(long = "dir", value_name = "HOST::GUEST")]
    dirs: Vec<String>,

    /// An environment variable for the guest.
    #[arg(long = "env", value_name = "K=V")]
    envs: Vec<String>,

    /// Imports nothing provides trap with their name when called, instead of refusing the
    /// module.
    #[arg(long)]
    trap_unknown_imports: bool,

    /// The most threads a wasi-threads guest may run at once, its first included: a
    /// `thread-spawn` past it fails (`pthread_create` returns EAGAIN). With `--tenants`,
    /// for each tenant that sets no `max_threads` of its own.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_threads: Option<u32>,

    /// The most bytes the tenant's files may hold (`512M`, `2G`; powers of 1024): a write
    /// past it fails with ENOSPC, as at a full disk. With `--tenants`, for each tenant that
    /// sets no `quota` of its own.
    #[arg(long, value_name = "SIZE", value_parser = parse_quota)]
    quota: Option<u64>,

    /// The most CPU the guest may use, in cores (`0.5`, `2`), as a container's CPU limit:
    /// its threads pause at their epoch checks once they used that many cores' worth of CPU
    /// time in a 100 ms period. The guest is then compiled with epoch checks, which cost
    /// CPU-bound code 10-20 %. With `--tenants`, for each tenant that sets no `cpus` of its
    /// own.
    #[arg(long, value_name = "CORES", value_parser = cpu_limit::parse_cores)]
    cpus: Option<CpuLimit>,

    /// A TCP listener for the guest (IP:PORT), preopened as a descriptor after the
    /// directories, for `sock_accept`.
    #[arg(long = "tcplisten", value_name = "ADDR")]
    tcplisten: Vec<std::net::SocketAddr>,

    /// Print a summary of bytes, WAF, GC and zones per stream to stderr at exit.
    #[arg(long)]
    stats: bool,

    /// Write the store's accounting as JSON at exit.
    #[arg(long, value_name = "FILE")]
    stats_json: Option<PathBuf>,

    /// Stop the guest after this long (`500ms`, `90s`, `5m`, `2h`; a bare number is
    /// seconds), as `timeout` stops a command: every thread of the guest ends at its next
    /// WASI call or epoch check, what it synced stays, the store is synced, and valet-run
    /// exits with 124. The guest is then compiled with epoch checks, which cost CPU-bound
    /// code 10-20 %.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    timeout: Option<Duration>,

    /// Run the tenants a TOML file lists, at once, instead of one APP.
    #[arg(
        long,
        value_name = "FILE.toml",
        conflicts_with_all = ["app", "mount", "tenant", "dirs", "envs", "tcplisten", "timeout"]
    )]
    tenants: Option<PathBuf>,

    /// The WASI program (wasm32-wasip1 or wasm32-wasip1-threads).
    #[arg(value_name = "APP.wasm", required_unless_present = "tenants")]
    app: Option<PathBuf>,

    /// Arguments for the program.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<String>,
}

/// Which device to use, and its geometry when it has to be created.
#[derive(Args, Clone)]
struct DeviceArgs {
    /// Directory of the embedded default device (`zones.img`, created on first use, and the
    /// conventional area).
    #[arg(long, default_value = "valet-data", value_name = "PATH")]
    device: PathBuf,

    /// Use a zonefs mount of a real ZNS drive instead of the image (mount it with
    /// `mount -t zonefs -o errors=repair /dev/nvmeXnY MOUNT`); zone size, capacity, open and
    /// active limits and block size are read from the drive.
    #[arg(long, value_name = "MOUNT", conflicts_with = "fdp")]
    zonefs: Option<PathBuf>,

    /// Zone capacity in bytes of an emulated zonefs layout (a real mount's must agree with
    /// the drive's zone report).
    #[arg(long, value_name = "BYTES")]
    zonefs_capacity: Option<u64>,

    /// Use an NVMe namespace with FDP instead of the image: its generic char device
    /// `/dev/ngXnY` (or `/dev/nvmeXnY`). A blank namespace is formatted in zones of one
    /// reclaim unit; writes carry the placement identifier of their stream.
    #[arg(long, value_name = "DEVICE")]
    fdp: Option<PathBuf>,

    #[command(flatten)]
    new_device: NewDeviceArgs,

    /// Device I/O engine of the image: plain syscalls (`sync`) or io_uring for large
    /// writes (`uring`, or `auto` where the kernel allows it).
    #[arg(long, default_value = "sync", value_name = "sync|uring|auto")]
    io: IoMode,

    /// Make what the guests wrote and did not sync durable this often (`500ms`, `5s`,
    /// `1m`), so that a crash of valet-run (SIGKILL, the OOM killer) or of the host loses
    /// at most about that much, as the kernel's writeback (dirty data written after 30 s)
    /// bounds it for native programs; `off`: only their syncs, closes and the exit do.
    #[arg(long, default_value = "30s", value_name = "DURATION|off", value_parser = parse_writeback)]
    writeback: Writeback,

    /// Hand what the guests wrote and did not sync to the host this often: written to the
    /// device and journaled without a flush, so that valet-run killed by SIGKILL or the OOM
    /// killer loses at most about that much (a power cut still up to --writeback); `off`:
    /// only the --writeback rounds.
    #[arg(long, default_value = "5s", value_name = "DURATION|off", value_parser = parse_writeback)]
    handoff: Writeback,
}

fn parse_quota(text: &str) -> std::result::Result<u64, String> {
    valet_runtime::node::pod::parse_size(text).map_err(|e| e.to_string())
}

/// `--writeback` and `--handoff`: an interval, or `off`.
#[derive(Clone, Copy)]
struct Writeback(Option<Duration>);

fn parse_writeback(text: &str) -> std::result::Result<Writeback, String> {
    match text {
        "off" => Ok(Writeback(None)),
        _ => parse_duration(text).map(|d| Writeback(Some(d))),
    }
}

impl DeviceArgs {
    fn spec(&self) -> Result<DeviceSpec> {
        let geometry = self.new_device.geometry()?;
        let spec = DeviceSpec {
            dir: self.device.clone(),
            zonefs: self.zonefs.clone(),
            zonefs_capacity: self.zonefs_capacity,
            fdp: self.fdp.clone(),
            geometry,
            io: self.io,
            writeback: self.writeback.0,
            handoff: self.handoff.0,
        };
        self.new_device.agree_with_existing(&spec)?;
        Ok(spec)
    }
}

fn parse_env(kv: &str) -> Result<(String, String)> {
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("--env {kv}: expected K=V"))?;
    Ok((k.to_string(), v.to_string()))
}

/// `500ms`, `90s`, `5m`, `2h`, or a bare number of seconds.
fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (500ms, 90s, 5m, 2h)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{text:?}: must be more than zero"))
}

/// Stops the guest through `stop` once `limit` has passed, unless the returned sender is
/// dropped first (the guest ended). SIGALRM is what `timeout` would have sent.
fn arm_timeout(stop: Arc<Stop>, limit: Duration) -> mpsc::Sender<()> {
    let (ended, wait) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("valet-timeout".into())
        .spawn(move || {
            if wait.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                stop.stop(libc::SIGALRM);
            }
        })
        .expect("starting the timeout thread");
    ended
}

fn parse_dir(spec: &str) -> Preopen {
    let (host, guest) = spec.split_once("::").unwrap_or((spec, spec));
    Preopen::Host {
        host_path: PathBuf::from(host),
        guest_path: guest.to_string(),
    }
}

fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Some(Command::Fs(command)) => fs_cmd::run(command),
        Some(Command::Policy(command)) => policy_cmd::run(command),
        Some(Command::Node(args)) => {
            valet_runtime::node::serve(valet_runtime::node::NodeConfig {
                device: args.device.spec()?,
                socket: args.socket,
                admin: args.admin,
                metrics: args.metrics,
            })?;
            Ok(0)
        }
        None => run_guests(cli.run),
    }
}

/// Runs one guest, or every tenant of a tenants file, then syncs and reports.
fn run_guests(cli: RunArgs) -> Result<u8> {
    let device = cli.device.spec()?;
    // One guest ends with the process, so its code needs no epoch checks unless a timeout
    // may have to stop it or a CPU limit pause it (tenants choose theirs, see
    // `tenants::run`).
    let engine = host::engine(if cli.timeout.is_some() || cli.cpus.is_some() {
        host::Stopping::EpochChecks
    } else {
        host::Stopping::NoChecks
    })?;
    // A bad app is reported before anything is created on disk.
    let app_module = match (&cli.tenants, &cli.app) {
        (None, Some(app)) => {
            if app.as_os_str() == "fs" && !app.exists() {
                bail!(
                    "`fs` takes its options after the command: valet-run fs ls --device PATH ..."
                );
            }
            Some(host::load(&engine, app)?)
        }
        _ => None,
    };
    let tenant_list = match &cli.tenants {
        Some(file) => {
            let mut list = tenants::load(file)?;
            for t in &mut list {
                t.max_threads = t.max_threads.or(cli.max_threads);
                t.quota = t.quota.or(cli.quota);
                t.cpus = t.cpus.or(cli.cpus);
            }
            list
        }
        None => Vec::new(),
    };
    // So is a bad policy.
    let limits = valet_runtime::policy::Limits::default();
    match &cli.tenants {
        Some(_) => {
            for t in &tenant_list {
                let policy = t.policy.as_deref().unwrap_or("default");
                admin::check_before_mount(policy, limits)
                    .with_context(|| format!("tenant {}", t.name))?;
            }
        }
        None => admin::check_before_mount(&cli.policy, limits)?,
    }
    // And so are the other options that name things: the admin address, the trace file
    // (created here), host directories, environment variables.
    let admin_addr = cli
        .admin
        .as_deref()
        .map(admin::AdminAddr::parse)
        .transpose()?;
    let trace = cli
        .record_trace
        .as_deref()
        .map(valet_runtime::trace::Recorder::create)
        .transpose()?;
    let envs = cli
        .envs
        .iter()
        .map(|e| parse_env(e))
        .collect::<Result<Vec<_>>>()?;
    let dirs: Vec<Preopen> = cli.dirs.iter().map(|d| parse_dir(d)).collect();
    for dir in &dirs {
        if let Preopen::Host { host_path, .. } = dir {
            std::fs::read_dir(host_path)
                .with_context(|| format!("cannot open host directory {}", host_path.display()))?;
        }
    }
    let store = device.mount()?;
    // Each guest's stop (one, or one per tenant) serves a termination signal; the single
    // guest's also serves `--timeout`.
    let stop = Arc::new(Stop::default());
    let stops: Vec<Arc<Stop>> = match cli.tenants {
        Some(_) => tenant_list.iter().map(|_| Arc::default()).collect(),
        None => vec![stop.clone()],
    };
    let stop_all = stops.clone();
    termination::keep_writes_of(&store, move |signal| {
        for stop in stop_all {
            stop.stop(signal);
        }
    });
    let registry = Registry::with_builtins(store.clone(), Registry::streams_for(&store), limits)?;
    if let Some(trace) = trace {
        registry.record_into(trace);
    }
    if let Some(addr) = admin_addr {
        let server = admin::start(&addr, &device.dir.join("admin.token"), registry.clone())?;
        eprintln!(
            "valet-run: admin API on {} (token in {})",
            server.addr,
            server.token_path.display()
        );
    }
    if let Some(addr) = cli.metrics {
        let addr = valet_runtime::metrics::serve(addr, registry.clone())?;
        eprintln!("valet-run: metrics on http://{addr}/metrics");
    }
    let code = if cli.tenants.is_some() {
        let exits = tenants::run(&store, &registry, &tenant_list, &stops)?;
        tenants::exit_code(exits)
    } else {
        let app = cli.app.clone().context("no APP.wasm given")?;
        let module = app_module.context("no APP.wasm given")?;
        let policy = registry.resolve(&cli.policy)?;
        registry.activate(&cli.tenant, &policy)?;
        let (tenant, root) = store.tenant(&cli.tenant)?;
        let space_limit = cli
            .quota
            .map(|limit| -> Arc<dyn valet_runtime::wasi::SpaceLimit> {
                registry.quota(&cli.tenant, tenant, limit)
            });

        let mut preopens = vec![Preopen::Store {
            ino: root,
            guest_path: cli.mount.clone(),
        }];
        preopens.extend(dirs);
        for addr in &cli.tcplisten {
            preopens.push(Preopen::TcpListen(*addr));
        }
        let program = app
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "app.wasm".into());
        let spec = GuestSpec {
            args: std::iter::once(program)
                .chain(cli.args.iter().cloned())
                .collect(),
            env: envs,
            preopens,
            trap_unknown_imports: cli.trap_unknown_imports,
            thread_limit: cli.max_threads,
            cpu: cli.cpus.map(|limit| CpuMetering {
                limit: Some(limit),
                account: registry.cpu_account(&cli.tenant),
                store_work: Some(store.tenant_work(tenant)),
            }),
            memory: Some(registry.memory_account(&cli.tenant)),
            space_limit,
            stop: Some(stop.clone()),
            ..GuestSpec::default()
        };
        let timer = cli
            .timeout
            .zip(spec.stop.clone())
            .map(|(limit, stop)| arm_timeout(stop, limit));
        let running = registry.guest_running(&cli.tenant);
        let exit = host::run(&engine, &module, &spec, &store)?;
        drop((timer, running));
        if let (true, Some(limit)) = (cli.stats, cli.cpus) {
            let account = registry.cpu_account(&cli.tenant);
            eprintln!(
                "valet:   {}: the guest was charged {:.3} s of CPU (the store's work for it \
                 included) and paused {:.3} s for its limit of {} cores",
                cli.tenant,
                account.used().as_secs_f64(),
                account.paused().as_secs_f64(),
                limit.quota.as_secs_f64() / limit.period.as_secs_f64()
            );
        }
        // A guest that ended just before the timer fired keeps its own exit.
        let stopped = spec
            .stop
            .as_ref()
            .is_some_and(|s| s.signal() == Some(libc::SIGALRM));
        let code = match exit {
            GuestExit::Code(code) if stopped && code == 128 + libc::SIGALRM => {
                let limit = cli.timeout.unwrap_or_default();
                eprintln!("valet-run: the guest ran past --timeout {limit:?} and was stopped");
                EXIT_TIMEOUT
            }
            GuestExit::Code(code) => code as u8,
            GuestExit::Trap(trap) => {
                eprintln!("valet-run: guest trapped: {trap}");
                EXIT_TRAP
            }
        };
        Ok(code)
    };
    // Whatever the guests left open or unsynced is made durable, and the journal sealed,
    // before we report, even when one of them failed.
    // The stats are printed even when that fails: they show why (a full device, say).
    let stats_of = store.clone();
    let unmounted = store.unmount().context("syncing the store at exit");
    let stats = stats_of.stats();
    if cli.stats {
        eprint!("{}", valet_runtime::stats::summary(&stats));
    }
    if let Some(path) = &cli.stats_json {
        let json = serde_json::to_string_pretty(&stats)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    unmounted?;
    code
}

/// One line, whatever the layers below put in their messages.
fn error_line(msg: &str) -> String {
    let words: Vec<&str> = msg.split_whitespace().collect();
    format!("valet-run: error: {}", words.join(" "))
}

/// Parses the command line; a mistake in it is our usual one-line error.
fn parse() -> std::result::Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        if matches!(
            e.kind(),
            ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        ) {
            e.exit();
        }
        // clap's text: "error: WHAT\n  detail\n\nUsage: ...": keep what comes before Usage.
        let text = e.render().to_string();
        let what: Vec<&str> = text
            .lines()
            .take_while(|l| !l.starts_with("Usage:"))
            .collect();
        let what = what.join(" ");
        let what = what.trim().trim_start_matches("error:");
        eprintln!("{} (see --help)", error_line(what));
        ExitCode::from(EXIT_OURS)
    })
}

fn main() -> ExitCode {
    // Before any thread starts, so that every thread leaves the signals to one.
    if let Err(e) = termination::install() {
        eprintln!("{}", error_line(&format!("cannot watch for signals: {e}")));
        return ExitCode::from(EXIT_OURS);
    }
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = run(cli);
    // A run that a termination signal stopped ends by that signal, as a native one would
    // (its store was unmounted on the way out).
    if let Some(sig) = termination::received() {
        termination::end_by(sig);
    }
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("{}", error_line(&format!("{e:#}")));
            ExitCode::from(EXIT_OURS)
        }
    }
}
