//! The node agent (`valet-run node`): one process per node owns the node's device and runs
//! the guest of every Valet container on it, each container's pod a tenant of one store.
//!
//! Why one process: the store is the only writer of its device (it locks the image, owns
//! the journal, the zone table, allocation and GC), and a second process mounting the same
//! device is refused. So the device, its journal and its GC live in the agent, and every
//! pod's guest runs there too, through the same code as `valet-run`'s tenants
//! ([`crate::host::run`]: one engine, one WASI layer, group commit across pods): a pod's
//! write is a function call into the store, with no round trip per write. The other
//! direction weighed — the agent leasing zones to each pod's own process — needs the store
//! split into a metadata service and a data path in every pod; the journal, GC and the
//! inline small syncs all cross that line, so it is left for later.
//!
//! The containerd shim (`containerd-shim-valet-v1`, crate `valet-shim`) runs nothing
//! itself: it reads the container's OCI spec and annotations, then hands the agent, over a
//! Unix socket ([`proto`]), the module's path, args, env, the `valet.io/*` settings, the
//! rootfs directory and stdio as open descriptors. The agent compiles the module once per
//! distinct module: compiled modules are kept in memory by digest, in containerd's content
//! store beside the image (the shim fetches and keeps them there, see [`proto`]: a pod of an
//! image compiled before, by this agent or one before a restart, loads the compiled code),
//! and in wasmtime's disk cache. It runs the guest with:
//!
//! - the pod's `valet.io/mounts` (default `/data`) as store directories of its tenant,
//!   under its policy, within its quota ([`crate::quota`]: ENOSPC past it) and its limit of
//!   names (`valet.io/files`, kept by the store: ENOSPC past it too, so that one pod cannot
//!   take the room for names every pod on the store shares);
//! - the container's rootfs as an ordinary host directory at `/`;
//! - the container's own stdin, stdout and stderr (the fifos containerd gave the shim), so
//!   the guest writes straight to the container's log. The agent lets go of them when the
//!   guest ends (after its last line, a trap's say), before the shim hears of the exit and
//!   even while a thread of the guest is still to stop, so containerd sees their end;
//! - the container's module read only if it is a regular file in the rootfs (or the memory
//!   file the shim sent) of at most [`proto::MAX_MODULE`] (512 MiB), opened without
//!   blocking: an image cannot make the agent wait on a FIFO or fill its memory.
//!
//! Kill: the shim forwards containerd's signal and the guest stops at its next WASI call or
//! epoch check ([`crate::host::Stop`]), ending with 128 + the signal. The shim dying (its
//! connection closing) stops the guest the same way. Its open files are closed, so what it
//! wrote is on the store, and what it synced was durable before the sync returned. The
//! agent dying loses nothing acknowledged either: the store recovers from its journal at
//! the next mount, and the shims of the pods it ran report the loss (exit 137, one line on
//! the container's stderr). Stopped by SIGTERM, SIGINT or SIGHUP (its DaemonSet's pod
//! deleted), the agent first stops every guest with that signal, as a kill does, waits up
//! to [`STOP_GRACE`] for them to end (so each shim reports 128 + the signal), then unmounts
//! the store, and ends by the signal ([`crate::termination`]): what the pods wrote stays,
//! synced or not.
//!
//! Admission: tenants never share a zone, so a pod whose tenant is new to the store is
//! created only while the store has [`NEW_TENANT_ZONES`] spare zones for it
//! ([`Store::spare_zones`]: free beyond GC's reserve, or dead and waiting for their reset),
//! beyond those of the new tenants admitted before it that hold no zone yet and still have
//! a pod (a tenant takes its first zone when it first writes, so creates at the last spare
//! zones would otherwise all be admitted); otherwise its create fails with one line. Pods
//! of a tenant the store has are always admitted, and the store still refuses what does not
//! fit (ENOSPC) at the write. A create is checked (its module read and compiled) before
//! its tenant is admitted and its settings applied, so a create that fails changes no
//! running pod's policy, quota or limit of names. A pod with no `valet.io/quota` runs
//! under its tenant's quota when another pod of it set one.
//!
//! Isolation: a pod sees only its tenant's directories (the store refuses `..` out of a
//! preopen) and its own rootfs; tenants never share a stream, so never a zone. Under
//! Kubernetes a pod's tenant is always one of its namespace's (`NAMESPACE.T`, see [`pod`]):
//! naming a tenant shares it with the namespace's other pods, never another namespace's. The guest
//! is confined by WebAssembly, not by the container's namespaces or cgroup: its CPU and
//! memory are the agent's (give the agent's DaemonSet the node's budget for Valet pods).
//! The agent keeps the container's own limits for it: its memory limit bounds the guest's
//! linear memory, its pids limit the guest's threads, and its CPU limit the CPU time the
//! guest's threads use, charged and paused at their epoch checks ([`crate::cpu_limit`]).

pub mod pod;
pub mod proto;

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use valet_vfs::{FileKind, Ino, Store, TenantId};
use wasmtime::{Engine, Module};

use crate::admin::{self, Registry, RunningGuest};
use crate::cpu_limit::{CpuLimit, CpuMetering};
use crate::device::DeviceSpec;
use crate::host::{self, GuestExit, GuestSpec, Preopen, Stop};
use pod::PodConfig;
use proto::{Create, FromAgent, ToAgent};

/// Native stack of each guest's main thread (as `valet-run`'s tenants).
const GUEST_STACK: usize = 8 << 20;
/// How long a stopping agent waits for its guests to end (each stops at its next WASI call
/// or epoch check, so well within this) before it unmounts the store anyway.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// Compiled modules kept in memory; past this the cache starts over (wasmtime's disk cache
/// still spares the compilation).
const MAX_MODULES: usize = 64;

/// Spare zones a new tenant needs to be admitted: one for its first stream and one for its
/// GC's copies (a tenant with no zone to collect into cannot reclaim its own dead data).
pub const NEW_TENANT_ZONES: u32 = 2;

/// How the agent is started.
pub struct NodeConfig {
    pub device: DeviceSpec,
    /// The Unix socket shims connect to.
    pub socket: PathBuf,
    /// Serve the admin API here too (upload policies that pods then name).
    pub admin: Option<String>,
    /// Serve Prometheus metrics here (see [`crate::metrics`]).
    pub metrics: Option<std::net::SocketAddr>,
}

/// The agent's shared state.
pub struct Agent {
    engine: Engine,
    store: Store,
    registry: Arc<Registry>,
    modules: Mutex<HashMap<[u8; 32], Module>>,
    /// Held from a new tenant's admission check to its creation, so that two creates do
    /// not both take the last spare zones; holds the tenants this agent admitted as new
    /// that hold no zone yet (see [`Agent::admit`]).
    admission: Mutex<Vec<(TenantId, String)>>,
    running: Running,
}

/// The guests running now, so that a termination signal can stop them all.
#[derive(Default)]
struct Running {
    state: Mutex<RunningState>,
    /// Signalled when a guest ends.
    ended: Condvar,
}

#[derive(Default)]
struct RunningState {
    stops: HashMap<u64, Arc<Stop>>,
    next: u64,
    /// Set once the agent stops: a guest that starts after that stops at once.
    stopping: Option<i32>,
}

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunningState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a guest about to run; returns the key that [`Running::ended`] takes.
    fn started(&self, stop: &Arc<Stop>) -> u64 {
        let mut st = self.lock();
        if let Some(signal) = st.stopping {
            stop.stop(signal);
        }
        st.next += 1;
        let key = st.next;
        st.stops.insert(key, stop.clone());
        key
    }

    fn ended(&self, key: u64) {
        self.lock().stops.remove(&key);
        self.ended.notify_all();
    }

    /// Stops every guest with `signal` and waits up to `grace` for them to end; returns how
    /// many still run.
    fn stop_all(&self, signal: i32, grace: Duration) -> usize {
        let mut st = self.lock();
        st.stopping = Some(signal);
        for stop in st.stops.values() {
            stop.stop(signal);
        }
        let (st, _) = self
            .ended
            .wait_timeout_while(st, grace, |st| !st.stops.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        st.stops.len()
    }
}

/// Mounts the device and serves shims until the process is killed.
pub fn serve(config: NodeConfig) -> Result<()> {
    let engine = host::engine(host::Stopping::EpochChecks)?;
    // A bad address is refused before the store is mounted (or made).
    let admin_addr = config
        .admin
        .as_deref()
        .map(admin::AdminAddr::parse)
        .transpose()?;
    let store = config.device.mount()?;
    // Until the agent runs guests, a termination signal only unmounts the store.
    crate::termination::keep_writes_of(&store, |_| {});
    let registry = Registry::with_builtins(
        store.clone(),
        Registry::streams_for(&store),
        crate::policy::Limits::default(),
    )?;
    if let Some(addr) = admin_addr {
        let server = admin::start(
            &addr,
            &config.device.dir.join("admin.token"),
            registry.clone(),
        )?;
        eprintln!("valet-run node: admin API on {}", server.addr);
    }
    if let Some(addr) = config.metrics {
        let addr = crate::metrics::serve(addr, registry.clone())?;
        eprintln!("valet-run node: metrics on http://{addr}/metrics");
    }
    let listener = bind(&config.socket)?;
    eprintln!(
        "valet-run node: serving pods on {} (store {})",
        config.socket.display(),
        config.device.dir.display()
    );
    let agent = Arc::new(Agent {
        engine,
        store,
        registry,
        modules: Mutex::default(),
        admission: Mutex::default(),
        running: Running::default(),
    });
    let stopping = agent.clone();
    crate::termination::keep_writes_of(&agent.store, move |signal| {
        let left = stopping.running.stop_all(signal, STOP_GRACE);
        if left > 0 {
            eprintln!(
                "valet-run node: {left} guest(s) still running {STOP_GRACE:?} after signal \
                 {signal}; unmounting the store under them"
            );
        }
    });
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                eprintln!("valet-run node: accepting a shim: {e}");
                continue;
            }
        };
        let agent = agent.clone();
        let spawned = std::thread::Builder::new()
            .name("pod".into())
            .spawn(move || agent.serve_container(conn));
        if let Err(e) = spawned {
            eprintln!("valet-run node: cannot start a thread for a container: {e}");
        }
    }
    Ok(())
}

/// Listens on `path`, replacing a socket file no agent answers on (left by a killed one).
fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!("another node agent is serving on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    // Only root (containerd's shims) may ask the agent to run anything.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// A container ready to start.
struct Prepared {
    module: Module,
    spec: GuestSpec,
    /// The pod counts as its tenant's running guest from its create to its guest's end,
    /// so the admin API does not remove its store directories in between.
    _running: RunningGuest,
}

impl Agent {
    /// One container's conversation (see [`proto`]).
    fn serve_container(self: Arc<Self>, conn: UnixStream) {
        let (create, fds) = match proto::recv::<ToAgent>(&conn) {
            Ok(Some((ToAgent::Create(c), fds))) => (c, fds),
            Ok(Some(other)) => {
                reply(
                    &conn,
                    &failed(anyhow!("expected Create first, got {other:?}")),
                );
                return;
            }
            Ok(None) => return,
            Err(e) => {
                reply(&conn, &failed(anyhow!("reading the shim's request: {e}")));
                return;
            }
        };
        let id = create.id.clone();
        let mut prepared = match self.prepare(create, fds, &conn) {
            Ok(p) => p,
            Err(e) => {
                reply(&conn, &failed(e.context(format!("container {id}"))));
                return;
            }
        };
        if !reply(&conn, &FromAgent::Created) {
            return;
        }
        match proto::recv::<ToAgent>(&conn) {
            Ok(Some((ToAgent::Start, _))) => {}
            // Killed or deleted before it started: nothing ran.
            Ok(Some((ToAgent::Kill { signal }, _))) => {
                reply(&conn, &FromAgent::Exited { code: 128 + signal });
                return;
            }
            _ => return,
        }
        let stop = Arc::new(Stop::default());
        prepared.spec.stop = Some(stop.clone());
        let key = self.running.started(&stop);
        let out = match conn.try_clone() {
            Ok(c) => c,
            Err(e) => {
                self.running.ended(key);
                reply(&conn, &failed(anyhow!("container {id}: {e}")));
                return;
            }
        };
        let agent = self.clone();
        let guest = std::thread::Builder::new()
            .name(format!("guest-{id}"))
            .stack_size(GUEST_STACK)
            .spawn(move || {
                agent.run_guest(prepared, &out);
                agent.running.ended(key);
            });
        let guest = match guest {
            Ok(g) => g,
            Err(e) => {
                self.running.ended(key);
                reply(&conn, &failed(anyhow!("container {id}: no thread: {e}")));
                return;
            }
        };
        // Kills until the shim hangs up; a hang-up is a kill too (the shim died, or the
        // container was deleted).
        loop {
            match proto::recv::<ToAgent>(&conn) {
                Ok(Some((ToAgent::Kill { signal }, _))) => stop.stop(signal),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    stop.stop(libc::SIGKILL);
                    break;
                }
            }
        }
        guest.join().ok();
    }

    /// Runs the guest and tells the shim how it ended.
    fn run_guest(&self, prepared: Prepared, out: &UnixStream) {
        if !reply(out, &FromAgent::Started) {
            if let Some(stop) = &prepared.spec.stop {
                stop.stop(libc::SIGKILL);
            }
        }
        let exit = host::run(&self.engine, &prepared.module, &prepared.spec, &self.store);
        let msg = match exit {
            Ok(GuestExit::Code(code)) => FromAgent::Exited { code },
            // The trap went where the guest's own stderr goes (`trap_on_stderr`).
            Ok(GuestExit::Trap(_)) => FromAgent::Exited {
                code: crate::tenants::EXIT_TRAP as i32,
            },
            Err(e) => failed(e),
        };
        // The guest is done with its tenant, and its stdio closed, before the shim hears so.
        drop(prepared);
        reply(out, &msg);
    }

    /// Checks a container's request and makes everything it needs: its tenant, policy,
    /// quota, store directories, compiled module, rootfs and stdio.
    fn prepare(&self, req: Create, fds: Vec<OwnedFd>, conn: &UnixStream) -> Result<Prepared> {
        let config = PodConfig::from_annotations(&req.id, &req.annotations)?;
        let mut fds = fds.into_iter();
        let rootfs = fds.next().context("the shim sent no rootfs descriptor")?;
        let mut stdio: [Option<Arc<File>>; 3] = [None, None, None];
        for (slot, present) in stdio.iter_mut().zip(req.stdio) {
            if present {
                let fd = fds
                    .next()
                    .context("the shim sent too few stdio descriptors")?;
                *slot = Some(Arc::new(File::from(fd)));
            }
        }
        let module_file = match req.module_fd {
            true => Some(File::from(
                fds.next().context("the shim sent no module descriptor")?,
            )),
            false => None,
        };
        let rootfs = cap_std::fs::Dir::from_std_file(File::from(rootfs));
        let cpu_limit = req
            .cpu_limit
            .map(|q| {
                CpuLimit::new(
                    Duration::from_micros(q.quota_us),
                    Duration::from_micros(q.period_us),
                )
            })
            .transpose()
            .map_err(|why| anyhow!("the container's CPU limit: {why}"))?;
        // A policy is named, never a file: pods must not make the agent read host paths.
        self.registry.module(&config.policy).map_err(|_| {
            anyhow!(
                "annotation {}={:?}: no such policy in the node agent (built-ins, or upload one)",
                pod::POLICY,
                config.policy
            )
        })?;
        // The module first: a create that fails on it changes nothing of the tenant (its
        // running pods' settings) and leaves no new tenant behind.
        let bytes = match &module_file {
            Some(f) => proto::read_at_most(f, proto::MAX_MODULE)
                .context("reading the module the shim sent")?,
            None => read_module(&rootfs, &req.module)?,
        };
        let module = self.module(&bytes, &req.module, req.content_store.then_some(conn))?;
        drop(bytes);
        let running = self.registry.guest_running(&config.tenant);
        let (tenant, root) = self.admit(&config.tenant)?;
        self.registry.activate(&config.tenant, &config.policy)?;
        // As the space quota: one per tenant, the latest pod's holds.
        if config.files.is_some() {
            self.store.set_entry_limit(tenant, config.files)?;
        }
        // A pod that names no quota runs under its tenant's, if another pod set one.
        let space_limit: Option<Arc<dyn crate::wasi::SpaceLimit>> = match config.quota {
            Some(limit) => Some(self.registry.quota(&config.tenant, tenant, limit)),
            None => self
                .registry
                .quota_of(&config.tenant)
                .map(|q| q as Arc<dyn crate::wasi::SpaceLimit>),
        };
        let mut preopens = Vec::new();
        for mount in &config.mounts {
            let ino = mkdirs(&self.store, root, mount)
                .with_context(|| format!("making {mount} on the store"))?;
            preopens.push(Preopen::Store {
                ino,
                guest_path: mount.clone(),
            });
        }
        preopens.push(Preopen::HostDir {
            dir: Arc::new(rootfs),
            guest_path: "/".into(),
        });
        let spec = GuestSpec {
            args: req.args,
            env: req.env,
            preopens,
            stdio,
            space_limit,
            memory_limit: req.memory_limit,
            thread_limit: req.pids_limit,
            // Every pod is metered (its CPU is the agent's, which no cgroup of its shows).
            cpu: Some(CpuMetering {
                limit: cpu_limit,
                account: self.registry.cpu_account(&config.tenant),
                store_work: Some(self.store.tenant_work(tenant)),
            }),
            memory: Some(self.registry.memory_account(&config.tenant)),
            trap_on_stderr: true,
            ..GuestSpec::default()
        };
        Ok(Prepared {
            module,
            spec,
            _running: running,
        })
    }

    /// The root of `tenant`, created if the store has room for a new tenant (see the
    /// module docs). A new tenant takes no zone until it writes, so the spare zones of
    /// the tenants admitted before it that hold none yet and still have a pod are counted
    /// as taken: creates at the last spare zones are admitted only as far as they fit.
    fn admit(&self, tenant: &str) -> Result<(TenantId, Ino)> {
        let mut fresh = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((id, _, root)) = self.store.tenants().into_iter().find(|t| t.1 == tenant) {
            return Ok((id, root));
        }
        let owners: std::collections::HashSet<TenantId> = self
            .store
            .zone_owners()
            .into_iter()
            .map(|(_, owner, _)| owner)
            .collect();
        let running = self.registry.guests_running();
        fresh
            .retain(|(id, name)| !owners.contains(id) && running.get(name).is_some_and(|&n| n > 0));
        let reserved = fresh.len() as u32 * NEW_TENANT_ZONES;
        let spare = self.store.spare_zones().saturating_sub(reserved);
        if spare < NEW_TENANT_ZONES {
            let zones = if spare == 1 { "zone" } else { "zones" };
            bail!(
                "annotation {}={tenant:?}: the node's store has no room for another tenant \
                 ({spare} spare {zones} not promised to new tenants, a new tenant needs \
                 {NEW_TENANT_ZONES}; tenants never share a zone: run this pod in an existing \
                 tenant, or free space)",
                pod::TENANT
            );
        }
        let (id, root) = self.store.tenant(tenant)?;
        fresh.push((id, tenant.to_string()));
        Ok((id, root))
    }

    /// The compiled module of `bytes` (named `path`), compiled once per distinct content:
    /// from memory, else from containerd's content store through the shim (`shim`, when it
    /// can reach it), else compiled here (and handed to the shim to keep).
    fn module(&self, bytes: &[u8], path: &str, shim: Option<&UnixStream>) -> Result<Module> {
        let key: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(m) = self
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(m.clone());
        }
        let source = format!(
            "sha256:{}",
            key.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let engine = engine_tag(&self.engine);
        let kept = match shim {
            Some(conn) => self.precompiled(conn, &source, &engine)?,
            None => None,
        };
        let module = match kept {
            Some(m) => m,
            None => {
                let start = std::time::Instant::now();
                let module = Module::new(&self.engine, bytes)
                    .map_err(|e| anyhow!("{path}: not a valid WebAssembly module: {e:#}"))?;
                eprintln!(
                    "valet-run node: compiled {source} in {} ms",
                    start.elapsed().as_millis()
                );
                if let Some(conn) = shim {
                    hand_over(conn, &module, source, engine)?;
                }
                module
            }
        };
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if modules.len() >= MAX_MODULES {
            modules.clear();
        }
        modules.insert(key, module.clone());
        Ok(module)
    }

    /// Asks the shim for the module compiled from `source`; `None` when containerd's
    /// content store has none, or one this engine cannot load (then it is compiled again).
    fn precompiled(&self, conn: &UnixStream, source: &str, engine: &str) -> Result<Option<Module>> {
        let ask = FromAgent::Lookup {
            source: source.to_string(),
            engine: engine.to_string(),
        };
        proto::send(conn, &ask, &[]).context("asking the shim for a compiled module")?;
        let fds = match proto::recv::<ToAgent>(conn).context("waiting for the shim")? {
            Some((ToAgent::Precompiled, fds)) => fds,
            Some((other, _)) => bail!("the shim answered {other:?} to a module lookup"),
            None => bail!("the shim closed the connection"),
        };
        let Some(fd) = fds.into_iter().next() else {
            return Ok(None);
        };
        let data = proto::read_all(&File::from(fd)).context("reading a compiled module")?;
        // SAFETY: the bytes are what an agent's `Module::serialize` wrote, kept in
        // containerd's content store (root's) under the digest of their source and checked
        // against their own digest by the shim as they were read; wasmtime refuses code of
        // another version or configuration, which is then compiled afresh.
        match unsafe { Module::deserialize(&self.engine, &data) } {
            Ok(m) => {
                eprintln!(
                    "valet-run node: loaded {source} compiled, from containerd's content store"
                );
                Ok(Some(m))
            }
            Err(e) => {
                eprintln!(
                    "valet-run node: the compiled module of {source} does not load here ({e:#}); compiling it"
                );
                Ok(None)
            }
        }
    }
}

/// The module at `path` in the container's rootfs (cap-std keeps every step of the path,
/// symbolic links included, inside it): a regular file of at most [`proto::MAX_MODULE`]
/// bytes. Anything else is refused before it is opened (a device may act when opened)
/// and again once open, without blocking (a FIFO would hold the create forever, a device
/// such as `/dev/zero` or a huge sparse file would fill the agent's memory).
fn read_module(rootfs: &cap_std::fs::Dir, path: &str) -> Result<Vec<u8>> {
    use cap_std::fs::OpenOptionsExt;
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        bail!("no module: the container's first argument must be the .wasm file's path");
    }
    let context = || format!("cannot read the module {path} in the container's rootfs");
    if !rootfs.metadata(rel).with_context(context)?.is_file() {
        return Err(anyhow!("not a regular file")).with_context(context);
    }
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true).custom_flags(libc::O_NONBLOCK);
    let file = rootfs.open_with(rel, &options).with_context(context)?;
    proto::read_at_most(&file.into_std(), proto::MAX_MODULE).with_context(context)
}

/// Hands a module compiled here to the shim, to keep in containerd's content store.
fn hand_over(conn: &UnixStream, module: &Module, source: String, engine: String) -> Result<()> {
    let data = module
        .serialize()
        .map_err(|e| anyhow!("serializing a compiled module: {e:#}"))?;
    let file = proto::memfd_with(&data).context("a memory file for a compiled module")?;
    proto::send(
        conn,
        &FromAgent::Compiled { source, engine },
        &[file.as_fd()],
    )
    .context("handing the compiled module to the shim")
}

/// What a compiled module must have been made by to load here: this wasmtime with this
/// configuration, for this machine (wasmtime's own compatibility hash).
pub fn engine_tag(engine: &Engine) -> String {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same tag in every process of this build.
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("wasmtime-{:016x}", h.finish())
}

/// The store directory for guest path `mount` under a tenant's root (`/var/log` is
/// `var/log`), made if missing.
fn mkdirs(store: &Store, root: Ino, mount: &str) -> Result<Ino> {
    let mut dir = root;
    for part in mount.split('/').filter(|p| !p.is_empty()) {
        dir = match store.lookup(dir, part) {
            Ok(ino) => ino,
            // Another pod of the tenant may make it at the same moment.
            Err(_) => match store.create_dir(dir, part) {
                Ok(ino) => ino,
                Err(e) => store.lookup(dir, part).map_err(|_| e)?,
            },
        };
        if store.metadata(dir)?.kind != FileKind::Dir {
            bail!("{part} exists on the store and is not a directory");
        }
    }
    Ok(dir)
}

fn failed(e: anyhow::Error) -> FromAgent {
    let words: Vec<String> = format!("{e:#}")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    FromAgent::Failed {
        message: words.join(" "),
    }
}

/// Sends a reply; false when the shim is gone.
fn reply(conn: &UnixStream, msg: &FromAgent) -> bool {
    proto::send(conn, msg, &[]).is_ok()
}

/// The descriptors a shim sends with its request, in order (see [`proto::Create`]).
pub fn create_fds<'a>(
    rootfs: &'a File,
    stdio: &'a [Option<File>; 3],
) -> Vec<std::os::fd::BorrowedFd<'a>> {
    std::iter::once(rootfs.as_fd())
        .chain(stdio.iter().flatten().map(|f| f.as_fd()))
        .collect()
}
