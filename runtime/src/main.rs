//! `valet-run`: run an unmodified WASI application on Valet's zoned store.
//!
//!     valet-run [OPTIONS] APP.wasm [-- ARGS...]
//!
//! The guest's stdout and stderr pass through and its exit code is ours. A failure of our
//! own is one line on stderr and exit code 125; a guest that traps exits with 134.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser};
use valet_runtime::device::DeviceSpec;
use valet_runtime::host::{self, GuestExit, GuestSpec, Preopen};
use valet_vfs::device::{Geometry, IoMode};

/// Exit code for failures of valet-run itself (as `env` and container runtimes do).
const EXIT_OURS: u8 = 125;
/// Exit code when the guest traps (128 + SIGABRT, what an aborted native program gives).
const EXIT_TRAP: u8 = 134;

#[derive(Parser)]
#[command(
    name = "valet-run",
    version,
    about = "Run a WASI application on Valet's zoned store, placing its data by policy"
)]
struct Cli {
    #[command(flatten)]
    device: DeviceArgs,

    /// Placement policy: a built-in name (until policy modules land: `default`).
    #[arg(long, default_value = "default", value_name = "FILE.wasm|NAME")]
    policy: String,

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

    /// Print a summary of bytes, WAF, GC and zones per stream to stderr at exit.
    #[arg(long)]
    stats: bool,

    /// Write the store's accounting as JSON at exit.
    #[arg(long, value_name = "FILE")]
    stats_json: Option<PathBuf>,

    /// The WASI program (wasm32-wasip1 or wasm32-wasip1-threads).
    #[arg(value_name = "APP.wasm")]
    app: PathBuf,

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

    /// Use a zonefs mount of a real zoned drive instead of the image.
    #[arg(long, value_name = "MOUNT")]
    zonefs: Option<PathBuf>,

    /// Zone capacity of the zonefs drive in bytes (zonefs does not report it).
    #[arg(long, value_name = "BYTES")]
    zonefs_capacity: Option<u64>,

    /// Zone size in MiB, when creating the image.
    #[arg(long, value_name = "MIB")]
    zone_size: Option<u64>,

    /// Number of zones, when creating the image.
    #[arg(long)]
    zones: Option<u32>,

    /// Most open zones, when creating the image.
    #[arg(long)]
    max_open: Option<u32>,

    /// Device I/O engine.
    #[arg(long, default_value = "auto", value_name = "auto|uring|sync")]
    io: IoMode,
}

impl DeviceArgs {
    fn spec(&self) -> Result<DeviceSpec> {
        let mut geometry = Geometry::EMBEDDED_DEFAULT;
        if let Some(mib) = self.zone_size {
            let size = mib
                .checked_mul(1 << 20)
                .context("--zone-size is too large")?;
            // Keep the default's capacity/size ratio (3/4), on whole blocks.
            geometry.zone_size = size;
            geometry.zone_capacity = size / 4 * 3 / 4096 * 4096;
        }
        if let Some(zones) = self.zones {
            geometry.zone_count = zones;
        }
        if let Some(max_open) = self.max_open {
            geometry.max_open = max_open;
            geometry.max_active = geometry.max_active.max(max_open);
        }
        geometry
            .validate()
            .context("the requested device geometry")?;
        Ok(DeviceSpec {
            dir: self.device.clone(),
            zonefs: self.zonefs.clone(),
            zonefs_capacity: self.zonefs_capacity,
            geometry,
            io: self.io,
        })
    }
}

fn parse_env(kv: &str) -> Result<(String, String)> {
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("--env {kv}: expected K=V"))?;
    Ok((k.to_string(), v.to_string()))
}

fn parse_dir(spec: &str) -> Result<Preopen> {
    let (host, guest) = spec.split_once("::").unwrap_or((spec, spec));
    Ok(Preopen::Host {
        host_path: PathBuf::from(host),
        guest_path: guest.to_string(),
    })
}

fn run(cli: Cli) -> Result<u8> {
    if cli.policy != "default" {
        bail!(
            "--policy {}: only the built-in `default` placement exists so far",
            cli.policy
        );
    }
    let device = cli.device.spec()?;
    let engine = host::engine()?;
    let module = host::load(&engine, &cli.app)?;
    let store = device.mount()?;
    let (_, root) = store.tenant(&cli.tenant)?;

    let mut preopens = vec![Preopen::Store {
        ino: root,
        guest_path: cli.mount.clone(),
    }];
    for d in &cli.dirs {
        preopens.push(parse_dir(d)?);
    }
    let program = cli
        .app
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "app.wasm".into());
    let spec = GuestSpec {
        module: cli.app.clone(),
        args: std::iter::once(program)
            .chain(cli.args.iter().cloned())
            .collect(),
        env: cli
            .envs
            .iter()
            .map(|e| parse_env(e))
            .collect::<Result<_>>()?,
        preopens,
    };
    let exit = host::run(&engine, &module, &spec, &store)?;
    // Whatever the guest left open or unsynced is made durable before we report.
    store.sync().context("syncing the store at exit")?;
    let stats = store.stats();
    if cli.stats {
        eprint!("{}", valet_runtime::stats::summary(&stats));
    }
    if let Some(path) = &cli.stats_json {
        let json = serde_json::to_string_pretty(&stats)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(match exit {
        GuestExit::Code(code) => code as u8,
        GuestExit::Trap(trap) => {
            eprintln!("valet-run: guest trapped: {trap:?}");
            EXIT_TRAP
        }
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // One line, whatever the layers below put in their messages.
            let msg = format!("{e:#}");
            let line: Vec<&str> = msg.split_whitespace().collect();
            eprintln!("valet-run: error: {}", line.join(" "));
            ExitCode::from(EXIT_OURS)
        }
    }
}
