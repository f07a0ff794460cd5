//! valet-shim: `containerd-shim-valet-v1`, the containerd shim that runs a container's WASI
//! module on the node's Valet store.
//!
//! The node's device has one owner, the node agent (`valet-run node`, a DaemonSet in a
//! cluster; see `valet_runtime::node` for why and how it runs pods). This shim runs no
//! guest: for each container it reads the bundle's OCI spec (`config.json`: process args
//! and env, rootfs, annotations, the memory limit, which caps the guest's linear memory, and
//! the pids limit, which bounds its threads),
//! checks the `valet.io/*` annotations
//! (`valet_runtime::node::pod`), and hands the agent, over its Unix socket, the request and
//! the container's rootfs directory and stdio fifos as open descriptors. The agent prepares
//! everything at create time (tenant, policy, quota, the compiled module) so that a mistake
//! is one clear line on the container's stderr and a failed create, before anything runs.
//! `start` asks the agent to run the guest, `kill` forwards the signal, and the exit code
//! comes back from the agent. The shim closing its connection (it died, or the container
//! was deleted) stops the guest.
//!
//! The agent's socket is `$VALET_NODE_SOCKET` in containerd's environment (shims inherit
//! it), else `/run/valet/node.sock`.
//!
//! Built on `containerd-shimkit`, the lower layer of runwasi's `containerd-shim-wasm` 1.x
//! (its `Instance` trait and `shim_main`), not on `containerd-shim-wasm`'s `Shim`/`Sandbox`:
//! that layer runs the module inside a youki container process after the root switch, where
//! the node's device is out of reach (a second process cannot mount the store), and its
//! `RuntimeContext` hides the container's id and annotations. Here the guest runs in the
//! agent, confined by WebAssembly and by the store's tenants rather than by the container's
//! namespaces and cgroup.
//!
//! Kubernetes' pod sandbox (the pause container, annotation
//! `io.kubernetes.cri.container-type: sandbox`) runs nothing: it lives until it is killed,
//! which is all a pause process does. The module is a file in the image's rootfs, named by
//! the entrypoint (`Entrypoint: ["/app.wasm"]`), or, in the wasm OCI artifact form, the
//! image's layer of media type `application/wasm` (containerd 1.7+; 1.6 cannot import such
//! an image), read from containerd's content store.
//!
//! Compiled modules are kept in containerd's content store ([`content`]): the agent asks
//! for one when it does not hold the module, and hands over what it compiled.

pub mod content;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use chrono::{DateTime, Utc};
use containerd_shimkit::sandbox::sync::WaitableCell;
use containerd_shimkit::sandbox::{Error, Instance, InstanceConfig};
use content::ContentStore;
use oci_spec::runtime::Spec;
use valet_runtime::node::pod::PodConfig;
use valet_runtime::node::proto::{self, CpuQuota, Create, FromAgent, ToAgent};

/// Exit code when the agent failed the container after it started (as `valet-run`'s own
/// failures).
pub const EXIT_OURS: u32 = 125;
/// Exit code when the agent went away while the guest ran (as a SIGKILL).
pub const EXIT_AGENT_GONE: u32 = 137;

/// The annotation CRI sets on a pod's sandbox (pause) container.
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

/// The agent's socket for this shim.
pub fn socket_path() -> PathBuf {
    std::env::var_os("VALET_NODE_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(proto::DEFAULT_SOCKET))
}

/// One container of the pod this shim serves.
pub struct ValetInstance {
    id: String,
    /// The agent connection; `None` for a pod sandbox, which runs nothing.
    conn: Option<UnixStream>,
    exit: WaitableCell<(u32, DateTime<Utc>)>,
    /// The container's stderr, for our own one-line messages.
    stderr: Arc<Mutex<Option<File>>>,
}

impl ValetInstance {
    fn say(&self, line: &str) {
        say(&self.stderr, line);
    }
}

/// Writes one line of ours to the container's stderr (and containerd's log).
fn say(stderr: &Mutex<Option<File>>, line: &str) {
    log::error!("{line}");
    if let Some(f) = &*stderr.lock().unwrap_or_else(|p| p.into_inner()) {
        let _ = writeln!(&*f, "valet: {line}");
    }
}

fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

impl Instance for ValetInstance {
    async fn new(id: String, cfg: &InstanceConfig) -> Result<Self, Error> {
        let stderr = Arc::new(Mutex::new(cfg.open_stderr().ok()));
        let instance = |conn| ValetInstance {
            id: id.clone(),
            conn,
            exit: WaitableCell::new(),
            stderr: stderr.clone(),
        };
        let spec = match Spec::load(cfg.bundle.join("config.json")) {
            Ok(s) => s,
            Err(e) => {
                let line = format!("cannot read the container's OCI spec: {e}");
                say(&stderr, &line);
                return Err(Error::InvalidArgument(line));
            }
        };
        let annotations: BTreeMap<String, String> = spec
            .annotations()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        if annotations.get(CONTAINER_TYPE).map(String::as_str) == Some("sandbox") {
            return Ok(instance(None));
        }
        match create(&id, cfg, &spec, annotations).await {
            Ok(conn) => Ok(instance(Some(conn))),
            Err(e) => {
                let line = one_line(&e);
                say(&stderr, &line);
                Err(Error::InvalidArgument(line))
            }
        }
    }

    async fn start(&self) -> Result<u32, Error> {
        let pid = std::process::id();
        let Some(conn) = &self.conn else {
            return Ok(pid);
        };
        let started = proto::send(conn, &ToAgent::Start, &[])
            .map_err(anyhow::Error::from)
            .and_then(|()| match proto::recv::<FromAgent>(conn)? {
                Some((FromAgent::Started, _)) => Ok(()),
                Some((FromAgent::Failed { message }, _)) => Err(anyhow!(message)),
                Some((other, _)) => Err(anyhow!("the node agent answered {other:?} to start")),
                None => Err(anyhow!("the node agent closed the connection")),
            });
        if let Err(e) = started {
            let line = one_line(&e.context(format!("starting container {}", self.id)));
            self.say(&line);
            return Err(Error::Others(line));
        }
        let conn = conn.try_clone().map_err(Error::Stdio)?;
        let exit = self.exit.clone();
        let stderr = self.stderr.clone();
        std::thread::Builder::new()
            .name("valet-exit".into())
            .spawn(move || {
                let code = match proto::recv::<FromAgent>(&conn) {
                    Ok(Some((FromAgent::Exited { code }, _))) => code as u32,
                    Ok(Some((FromAgent::Failed { message }, _))) => {
                        say(&stderr, &message);
                        EXIT_OURS
                    }
                    Ok(Some((other, _))) => {
                        say(&stderr, &format!("unexpected message from the node agent: {other:?}"));
                        EXIT_OURS
                    }
                    Ok(None) | Err(_) => {
                        say(
                            &stderr,
                            "the node agent went away; the guest was stopped (what it had synced is on the store)",
                        );
                        EXIT_AGENT_GONE
                    }
                };
                let _ = exit.set((code, Utc::now()));
                // Our copy of the fifo goes, so the reader sees the end of the stream.
                stderr.lock().unwrap_or_else(|p| p.into_inner()).take();
            })
            .map_err(Error::Stdio)?;
        Ok(pid)
    }

    async fn kill(&self, signal: u32) -> Result<(), Error> {
        match &self.conn {
            // The agent answers with the guest's exit (or has already gone: then the exit
            // is set by the reader).
            Some(conn) => {
                let _ = proto::send(
                    conn,
                    &ToAgent::Kill {
                        signal: signal as i32,
                    },
                    &[],
                );
            }
            None => {
                let _ = self.exit.set((128 + signal, Utc::now()));
            }
        }
        Ok(())
    }

    async fn delete(&self) -> Result<(), Error> {
        if let Some(conn) = &self.conn {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        Ok(())
    }

    async fn wait(&self) -> (u32, DateTime<Utc>) {
        *self.exit.wait().await
    }
}

/// The container's memory limit (`linux.resources.memory.limit`, which kubelet sets from
/// the pod's `resources.limits.memory`); none, zero or -1 is no limit.
fn memory_limit(spec: &Spec) -> Option<u64> {
    let limit = spec
        .linux()
        .as_ref()?
        .resources()
        .as_ref()?
        .memory()
        .as_ref()?
        .limit()?;
    u64::try_from(limit).ok().filter(|&l| l > 0)
}

/// The container's pids limit (`linux.resources.pids.limit`, which kubelet sets from its
/// pod pids limit): the most threads its guest may run; none, zero or -1 is no limit.
fn pids_limit(spec: &Spec) -> Option<u32> {
    let limit = spec
        .linux()
        .as_ref()?
        .resources()
        .as_ref()?
        .pids()
        .as_ref()?
        .limit();
    u32::try_from(limit.max(0)).ok().filter(|&l| l > 0)
}

/// Reads what the container runs, checks it, and has the agent prepare it.
async fn create(
    id: &str,
    cfg: &InstanceConfig,
    spec: &Spec,
    annotations: BTreeMap<String, String>,
) -> Result<UnixStream> {
    // Checked here first, so the message needs no agent; the agent checks again.
    PodConfig::from_annotations(id, &annotations)?;
    let process = spec
        .process()
        .as_ref()
        .context("the OCI spec has no process")?;
    let args = process.args().clone().unwrap_or_default();
    let Some(arg0) = args.first() else {
        bail!("no process args: the first must be the module's path (e.g. /app.wasm)");
    };
    // runwasi's `path#function`: only `_start` is supported.
    let module = match arg0.split_once('#') {
        Some((path, "_start")) => path.to_string(),
        Some((_, func)) => bail!("entry function {func:?}: only _start is supported"),
        None => arg0.clone(),
    };
    let env = process
        .env()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (kv, String::new()),
        })
        .collect();
    let root = spec.root().as_ref().context("the OCI spec has no root")?;
    let rootfs = if root.path().is_absolute() {
        root.path().clone()
    } else {
        cfg.bundle.join(root.path())
    };
    // Connected on first need: a module the agent holds, in the rootfs, needs no content
    // store.
    let mut store: Option<ContentStore> = None;
    // The module is a file of the rootfs, or (the wasm OCI artifact form, which containerd
    // 1.7+ leaves out of the rootfs) the image's wasm layer.
    let in_rootfs = rootfs
        .join(module.trim_start_matches('/'))
        .symlink_metadata()
        .is_ok();
    let mut module_file = None;
    if !in_rootfs {
        let layer = match content_store(&mut store, cfg).await {
            Ok(s) => s.wasm_layer(id).await,
            Err(e) => Err(e),
        };
        match layer {
            Ok(Some(bytes)) => module_file = Some(proto::memfd_with(&bytes)?),
            // The agent says the module is missing.
            Ok(None) => {}
            Err(e) => log::warn!("no wasm layer read from containerd's content store: {e:#}"),
        }
    }
    let rootfs = File::open(&rootfs)
        .with_context(|| format!("cannot open the rootfs {}", rootfs.display()))?;
    let stdio = [
        cfg.open_stdin().ok(),
        cfg.open_stdout().ok(),
        cfg.open_stderr().ok(),
    ];
    let socket = socket_path();
    let conn = UnixStream::connect(&socket).with_context(|| {
        format!(
            "cannot reach the node agent at {} (is valet-run node running?)",
            socket.display()
        )
    })?;
    let request = ToAgent::Create(Create {
        id: id.to_string(),
        module,
        args,
        env,
        annotations,
        stdio: [stdio[0].is_some(), stdio[1].is_some(), stdio[2].is_some()],
        content_store: true,
        module_fd: module_file.is_some(),
        memory_limit: memory_limit(spec),
        pids_limit: pids_limit(spec),
        cpu_limit: cpu_limit(spec),
    });
    let mut fds = valet_runtime::node::create_fds(&rootfs, &stdio);
    fds.extend(module_file.as_ref().map(|f| f.as_fd()));
    proto::send(&conn, &request, &fds).context("sending the container to the node agent")?;
    loop {
        match proto::recv::<FromAgent>(&conn).context("waiting for the node agent")? {
            Some((FromAgent::Lookup { source, engine }, _)) => {
                let found = match content_store(&mut store, cfg).await {
                    Ok(s) => s.fetch(&source, &engine).await,
                    Err(e) => Err(e),
                };
                let file = match found {
                    Ok(Some(data)) => Some(proto::memfd_with(&data)?),
                    Ok(None) => None,
                    Err(e) => {
                        log::warn!("no compiled module from containerd's content store: {e:#}");
                        None
                    }
                };
                let fds: Vec<_> = file.iter().map(|f| f.as_fd()).collect();
                proto::send(&conn, &ToAgent::Precompiled, &fds)
                    .context("answering the node agent")?;
            }
            Some((FromAgent::Compiled { source, engine }, fds)) => {
                let Some(fd) = fds.into_iter().next() else {
                    bail!("the node agent sent no compiled module");
                };
                let data = proto::read_all(&File::from(fd))?;
                let kept = match content_store(&mut store, cfg).await {
                    Ok(s) => s.keep(id, &source, &engine, &data).await,
                    Err(e) => Err(e),
                };
                // A compiled module not kept costs a compilation later, not this pod.
                if let Err(e) = kept {
                    log::warn!(
                        "compiled module of {source} not kept in containerd's content store: {e:#}"
                    );
                }
            }
            Some((FromAgent::Created, _)) => return Ok(conn),
            Some((FromAgent::Failed { message }, _)) => return Err(anyhow!(message)),
            Some((other, _)) => bail!("the node agent answered {other:?} to create"),
            None => bail!("the node agent closed the connection while creating the container"),
        }
    }
}

/// containerd's content store for this container's namespace, connected once.
async fn content_store<'a>(
    store: &'a mut Option<ContentStore>,
    cfg: &InstanceConfig,
) -> Result<&'a ContentStore> {
    if store.is_none() {
        *store = Some(ContentStore::connect(&cfg.containerd_address, &cfg.namespace).await?);
    }
    Ok(store.as_ref().expect("just set"))
}

/// The container's CPU limit (`linux.resources.cpu.quota` per `period`, in µs, which kubelet
/// sets from the pod's `resources.limits.cpu`); no quota, zero or -1 is no limit, and no
/// period is the kernel's default, 100 ms.
fn cpu_limit(spec: &Spec) -> Option<CpuQuota> {
    let cpu = spec
        .linux()
        .as_ref()?
        .resources()
        .as_ref()?
        .cpu()
        .as_ref()?;
    let quota_us = u64::try_from(cpu.quota()?).ok().filter(|&q| q > 0)?;
    Some(CpuQuota {
        quota_us,
        period_us: cpu.period().filter(|&p| p > 0).unwrap_or(100_000),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(linux: serde_json::Value) -> Spec {
        serde_json::from_value(serde_json::json!({ "ociVersion": "1.0.2", "linux": linux }))
            .unwrap()
    }

    #[test]
    fn the_memory_limit_comes_from_the_spec_resources() {
        let limited = spec(serde_json::json!({ "resources": { "memory": { "limit": 67108864 } } }));
        assert_eq!(memory_limit(&limited), Some(64 << 20));
        for unlimited in [
            serde_json::json!({ "resources": { "memory": { "limit": -1 } } }),
            serde_json::json!({ "resources": { "memory": { "limit": 0 } } }),
            serde_json::json!({ "resources": { "memory": {} } }),
            serde_json::json!({ "resources": {} }),
            serde_json::json!({}),
        ] {
            assert_eq!(memory_limit(&spec(unlimited.clone())), None, "{unlimited}");
        }
    }

    #[test]
    fn the_cpu_limit_comes_from_the_spec_quota_and_period() {
        let half = spec(serde_json::json!({
            "resources": { "cpu": { "quota": 50000, "period": 100000 } }
        }));
        let expected = CpuQuota {
            quota_us: 50_000,
            period_us: 100_000,
        };
        assert_eq!(cpu_limit(&half), Some(expected));
        let no_period = spec(serde_json::json!({ "resources": { "cpu": { "quota": 50000 } } }));
        assert_eq!(cpu_limit(&no_period), Some(expected));
        for unlimited in [
            serde_json::json!({ "resources": { "cpu": { "quota": -1, "period": 100000 } } }),
            serde_json::json!({ "resources": { "cpu": { "quota": 0 } } }),
            serde_json::json!({ "resources": { "cpu": { "shares": 512 } } }),
            serde_json::json!({ "resources": {} }),
            serde_json::json!({}),
        ] {
            assert_eq!(cpu_limit(&spec(unlimited.clone())), None, "{unlimited}");
        }
    }

    #[test]
    fn the_thread_limit_comes_from_the_spec_pids_limit() {
        let limited = spec(serde_json::json!({ "resources": { "pids": { "limit": 32 } } }));
        assert_eq!(pids_limit(&limited), Some(32));
        let huge = spec(serde_json::json!({ "resources": { "pids": { "limit": 1u64 << 40 } } }));
        assert_eq!(pids_limit(&huge), None);
        for unlimited in [
            serde_json::json!({ "resources": { "pids": { "limit": -1 } } }),
            serde_json::json!({ "resources": { "pids": { "limit": 0 } } }),
            serde_json::json!({ "resources": {} }),
            serde_json::json!({}),
        ] {
            assert_eq!(pids_limit(&spec(unlimited.clone())), None, "{unlimited}");
        }
    }
}
