//! `valet-run --tenants FILE.toml`: several applications in one process on one device.
//!
//! ```toml
//! [[tenant]]
//! name = "db"                   # the store's tenant: its own namespace root and streams
//! app = "apps/db.wasm"          # relative paths are relative to the TOML file
//! args = ["--num", "1000"]      # optional
//! policy = "rocks"              # optional; a built-in name or FILE.wasm, as --policy
//! mount = "/data"               # optional; where the tenant's root appears in its guest
//! env = { K = "V" }             # optional
//! max_threads = 16              # optional; threads the guest may run at once (as --max-threads)
//! quota = "512M"                # optional; the most bytes its files may hold (as --quota)
//! cpus = 0.5                    # optional; the most CPU its guest may use, in cores (as --cpus)
//! ```
//!
//! Each tenant runs in its own thread with its own wasmtime store and WASI context, on one
//! shared [`Store`]. Isolation is the store's: a tenant's preopened directory is its own
//! root, `..` from a root is refused (EPERM), and the store keys streams by (tenant,
//! stream), so two tenants' writes never share a zone.
//!
//! Exit code: 0 when every tenant exits 0; otherwise the code of the first tenant *in file
//! order* whose code is not 0 (a trap counts as 134), so the result does not depend on
//! which guest finished first. A failure of valet-run itself in any tenant is reported
//! once every tenant has finished, as our usual one-line error with exit 125.
//!
//! Limits: guest stdout and stderr are the process's own and interleave line by line
//! between tenants. A threaded guest (wasm32-wasip1-threads) whose spawned thread traps or
//! calls `proc_exit` ends the whole process, other tenants included (see [`crate::host`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use valet_vfs::Store;
use wasmtime::{Engine, Module};

use crate::admin::Registry;
use crate::cpu_limit::{CpuLimit, CpuMetering};
use crate::host::{self, GuestExit, GuestSpec, Preopen, Stop, Stopping};
use crate::node::pod::parse_size;
use crate::wasi::SpaceLimit;

/// Exit code a trapped guest counts as (128 + SIGABRT, as `valet-run` gives for one guest).
pub const EXIT_TRAP: u8 = 134;

/// Native stack of each tenant's thread: room for wasmtime's guest stack and host frames.
const TENANT_STACK: usize = 8 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantConfig>,
}

/// One `[[tenant]]` table.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    pub app: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub mount: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The most threads the guest may run at once ([`GuestSpec::thread_limit`]); a tenant
    /// without one takes `valet-run --max-threads`, if given.
    #[serde(default)]
    pub max_threads: Option<u32>,
    /// The most bytes the tenant's files may hold ([`crate::quota`]), written as `--quota`
    /// takes it; a tenant without one takes `valet-run --quota`, if given.
    #[serde(default, deserialize_with = "size")]
    pub quota: Option<u64>,
    /// The most CPU the guest may use, in cores ([`GuestSpec::cpu`]); a tenant
    /// without one takes `valet-run --cpus`, if given.
    #[serde(default, deserialize_with = "cores")]
    pub cpus: Option<CpuLimit>,
}

/// A CPU limit in cores, as `--cpus` takes it (`0.5`, `2`).
fn cores<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> std::result::Result<Option<CpuLimit>, D::Error> {
    let cores = f64::deserialize(de)?;
    CpuLimit::cores(cores)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("cpus: {e}")))
}

/// A size as `--quota` takes it (`512M`).
fn size<'de, D: serde::Deserializer<'de>>(de: D) -> std::result::Result<Option<u64>, D::Error> {
    let text = String::deserialize(de)?;
    parse_size(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("quota {text:?}: {e}")))
}

impl TenantConfig {
    /// Where the tenant's root appears in its guest.
    pub fn mount(&self) -> &str {
        self.mount.as_deref().unwrap_or("/data")
    }
}

/// Reads and checks a tenants file: at least one tenant, unique non-empty names, known
/// policies. App paths come back resolved against the file's directory.
pub fn load(path: &Path) -> Result<Vec<TenantConfig>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: TenantsFile = toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    if file.tenant.is_empty() {
        bail!("{}: no [[tenant]] tables", path.display());
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let mut names = HashSet::new();
    let mut tenants = file.tenant;
    for t in &mut tenants {
        if t.name.is_empty() {
            bail!("{}: a tenant has an empty name", path.display());
        }
        if !names.insert(t.name.clone()) {
            bail!("{}: tenant {:?} is listed twice", path.display(), t.name);
        }
        if t.max_threads == Some(0) {
            bail!(
                "{}: tenant {:?}: max_threads must be at least 1",
                path.display(),
                t.name
            );
        }
        if t.app.is_relative() {
            t.app = base.join(&t.app);
        }
        // A missing app, like every other mistake here, is refused before a store is made
        // (it is compiled only once the store is up).
        std::fs::File::open(&t.app)
            .with_context(|| format!("tenant {}: cannot read {}", t.name, t.app.display()))?;
        // A policy file, like an app, is found relative to the tenants file.
        if let Some(policy) = &mut t.policy {
            if (policy.ends_with(".wasm") || policy.contains('/'))
                && Path::new(policy).is_relative()
            {
                *policy = base.join(&*policy).to_string_lossy().into_owned();
            }
        }
    }
    Ok(tenants)
}

/// How one tenant ended.
#[derive(Debug)]
pub struct TenantExit {
    pub name: String,
    /// The guest's end, or a failure of valet-run itself for this tenant.
    pub exit: Result<GuestExit>,
}

/// The module of `app` and the engine it was compiled for (one engine of each kind,
/// made when first needed); with `epoch_checks`, always an engine that has them.
fn compile(
    engines: &mut HashMap<Stopping, Engine>,
    app: &Path,
    epoch_checks: bool,
) -> Result<(Engine, Module)> {
    let bytes = host::read_module(app)?;
    let mut engine_for = |stopping: Stopping| -> Result<Engine> {
        if let Some(engine) = engines.get(&stopping) {
            return Ok(engine.clone());
        }
        let engine = host::engine(stopping)?;
        engines.insert(stopping, engine.clone());
        Ok(engine)
    };
    if !epoch_checks && !host::may_spawn_threads(&bytes) {
        let engine = engine_for(Stopping::NoChecks)?;
        let module = host::compile(&engine, app, &bytes)?;
        // The byte search is a shortcut; the module's own imports decide.
        if !host::is_threaded(&module) {
            return Ok((engine, module));
        }
    }
    let engine = engine_for(Stopping::EpochChecks)?;
    let module = host::compile(&engine, app, &bytes)?;
    Ok((engine, module))
}

/// Compiles every tenant's module, then runs all tenants at once on `store`, each in its own
/// thread, and waits for all of them. Nothing runs unless every module compiles. `stops`
/// holds one [`Stop`] per tenant, in order, to stop it from another thread (a termination
/// signal stops them all).
///
/// A threaded guest is compiled with epoch checks, so that its other threads stop when it
/// ends while the other tenants go on; a guest of one thread ends with that thread and is
/// compiled without them (see [`host::Stopping`]).
pub fn run(
    store: &Store,
    registry: &Arc<Registry>,
    tenants: &[TenantConfig],
    stops: &[Arc<Stop>],
) -> Result<Vec<TenantExit>> {
    if stops.len() != tenants.len() {
        bail!("{} tenants but {} stops", tenants.len(), stops.len());
    }
    for t in tenants {
        let policy = registry
            .resolve(t.policy.as_deref().unwrap_or("default"))
            .with_context(|| format!("tenant {}", t.name))?;
        registry
            .activate(&t.name, &policy)
            .with_context(|| format!("tenant {}", t.name))?;
    }
    let mut prepared = Vec::new();
    let mut engines: HashMap<Stopping, Engine> = HashMap::new();
    let mut modules: HashMap<(&Path, bool), (Engine, Module)> = HashMap::new();
    for (t, stop) in tenants.iter().zip(stops) {
        // Tenants running the same app share one compilation (one with a CPU limit needs
        // epoch checks, which keep it).
        let limited = t.cpus.is_some();
        let (engine, module) = match modules.get(&(t.app.as_path(), limited)) {
            Some(compiled) => compiled.clone(),
            None => {
                let compiled = compile(&mut engines, &t.app, limited)
                    .with_context(|| format!("tenant {}", t.name))?;
                modules.insert((&t.app, limited), compiled.clone());
                compiled
            }
        };
        let (tenant, root) = store
            .tenant(&t.name)
            .with_context(|| format!("tenant {}", t.name))?;
        let space_limit = t
            .quota
            .map(|limit| -> Arc<dyn SpaceLimit> { registry.quota(&t.name, tenant, limit) });
        let program = t
            .app
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "app.wasm".into());
        let spec = GuestSpec {
            args: std::iter::once(program)
                .chain(t.args.iter().cloned())
                .collect(),
            env: t.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            preopens: vec![Preopen::Store {
                ino: root,
                guest_path: t.mount().to_string(),
            }],
            trap_unknown_imports: false,
            thread_limit: t.max_threads,
            cpu: t.cpus.map(|limit| CpuMetering {
                limit: Some(limit),
                account: registry.cpu_account(&t.name),
                store_work: Some(store.tenant_work(tenant)),
            }),
            memory: Some(registry.memory_account(&t.name)),
            space_limit,
            stop: Some(stop.clone()),
            ..GuestSpec::default()
        };
        prepared.push((t.name.clone(), engine, module, spec));
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = prepared
            .iter()
            .map(|(name, engine, module, spec)| {
                let store = store.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("tenant-{name}"))
                    .stack_size(TENANT_STACK)
                    .spawn_scoped(scope, move || {
                        let _running = registry.guest_running(name);
                        host::run(engine, module, spec, &store)
                    })
                    .with_context(|| format!("tenant {name}: cannot start its thread"));
                (name.clone(), thread)
            })
            .collect();
        Ok(handles
            .into_iter()
            .map(|(name, thread)| {
                let exit = thread.and_then(|t| {
                    t.join()
                        .unwrap_or_else(|_| bail!("the host thread of tenant {name} panicked"))
                });
                TenantExit { name, exit }
            })
            .collect())
    })
}

/// The process's exit code for a set of tenant exits (see the module doc). Reports traps on
/// stderr; returns the first failure of our own as an error.
pub fn exit_code(exits: Vec<TenantExit>) -> Result<u8> {
    let mut code = 0u8;
    let mut ours = None;
    for TenantExit { name, exit } in exits {
        let this = match exit {
            Ok(GuestExit::Code(c)) => c as u8,
            Ok(GuestExit::Trap(trap)) => {
                eprintln!("valet-run: tenant {name}: guest trapped: {trap}");
                EXIT_TRAP
            }
            Err(e) => {
                ours.get_or_insert(e.context(format!("tenant {name}")));
                continue;
            }
        };
        if code == 0 {
            code = this;
        }
    }
    match ours {
        Some(e) => Err(e),
        None => Ok(code),
    }
}
