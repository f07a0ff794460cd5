//! Policies while the application runs: the registry of loaded policies, and the admin API
//! (`valet-run --admin ADDR`) that uploads, activates and lists them and reads the stats.
//!
//! The API is HTTP on a loopback TCP address or a Unix socket. Every request must carry
//! `Authorization: Bearer TOKEN`, where TOKEN is written at start to a file that only the
//! user running `valet-run` can read; anything else gets 401.
//!
//! | request | effect |
//! | --- | --- |
//! | `PUT /policies/NAME` (body: module bytes) | validate, then load as NAME (201, or 400 with the reason) |
//! | `PUT /tenants/TENANT/policy` (body: policy name) | make it TENANT's policy, atomically (200) |
//! | `GET /policies` | loaded policies: name, sha256, tenants using it |
//! | `GET /stats` | the store's accounting (JSON) |
//!
//! A swap affects files opened after it; files already open keep the placement they were
//! opened with (the store decides per open).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use valet_vfs::Store;
use wasmtime::Engine;

use crate::policy::{self, Limits, PolicyModule, WasmPlacement};
use crate::trace::{Recorder, TraceOut};

/// A loaded policy as the API lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub sha256: String,
    pub tenants: Vec<String>,
}

/// Loaded policies and which tenant uses which.
pub struct Registry {
    engine: Engine,
    limits: Limits,
    store: Store,
    max_streams: u32,
    modules: Mutex<BTreeMap<String, Arc<PolicyModule>>>,
    active: Mutex<BTreeMap<String, String>>,
    recorder: Mutex<Option<(TraceOut, Instant)>>,
}

impl Registry {
    /// A registry for `store`, whose device keeps `max_streams` streams apart per tenant.
    pub fn new(store: Store, max_streams: u32, limits: Limits) -> Result<Arc<Self>> {
        Ok(Arc::new(Registry {
            engine: policy::engine()?,
            limits,
            store,
            max_streams,
            modules: Mutex::new(BTreeMap::new()),
            active: Mutex::new(BTreeMap::new()),
            recorder: Mutex::new(None),
        }))
    }

    /// A registry holding the built-in policies, ready to use by name.
    pub fn with_builtins(store: Store, max_streams: u32, limits: Limits) -> Result<Arc<Self>> {
        let registry = Registry::new(store, max_streams, limits)?;
        for (name, module) in valet_policies::BUILTIN {
            registry.load(name, module)?;
        }
        Ok(registry)
    }

    /// Records every placement call of the tenants activated from now on into `out`.
    pub fn record_into(&self, out: TraceOut) {
        *self.recorder.lock().unwrap_or_else(|p| p.into_inner()) = Some((out, Instant::now()));
    }

    /// Loads what `--policy` names: a `.wasm` (or `.wat` text) file, loaded under its file
    /// stem, or a policy already loaded (a built-in). Returns the policy's name.
    pub fn resolve(&self, spec: &str) -> Result<String> {
        let path = Path::new(spec);
        if spec.ends_with(".wasm") || spec.ends_with(".wat") || spec.contains('/') {
            // `--policy rocks.wasm` where no such file exists: the built-in of that name.
            if !path.exists() && !spec.contains('/') {
                let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
                let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(stem) = stem.filter(|s| modules.contains_key(s.as_str())) {
                    return Ok(stem);
                }
            }
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read policy {spec}"))?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.to_string());
            self.load(&name, &bytes)?;
            return Ok(name);
        }
        let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if modules.contains_key(spec) {
            return Ok(spec.to_string());
        }
        let known: Vec<&str> = modules.keys().map(String::as_str).collect();
        bail!(
            "no policy named {spec} (known: {}; or give a FILE.wasm)",
            known.join(", ")
        )
    }

    /// Validates and loads a module as `name` (replacing a policy of that name for later
    /// activations; tenants using the old one keep it until they are switched).
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<Arc<PolicyModule>> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!("policy name {name:?} must be letters, digits, '-', '_' or '.'");
        }
        let module = Arc::new(PolicyModule::new(&self.engine, name, bytes, self.limits)?);
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), module.clone());
        Ok(module)
    }

    /// Makes a loaded policy the tenant's placement from now on.
    pub fn activate(&self, tenant: &str, policy: &str) -> Result<()> {
        let module = self
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(policy)
            .cloned()
            .ok_or_else(|| anyhow!("no policy named {policy} is loaded"))?;
        let mut placement: Arc<dyn valet_vfs::Placement> =
            Arc::new(WasmPlacement::new(module, self.max_streams)?);
        if let Some((out, start)) = &*self.recorder.lock().unwrap_or_else(|p| p.into_inner()) {
            placement = Arc::new(Recorder::new(placement, out.clone(), *start));
        }
        let (id, _) = self.store.tenant(tenant)?;
        self.store.set_placement(id, placement);
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tenant.to_string(), policy.to_string());
        Ok(())
    }

    /// A loaded policy by name.
    pub fn module(&self, name: &str) -> Result<Arc<PolicyModule>> {
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow!("no policy named {name} is loaded"))
    }

    pub fn list(&self) -> Vec<PolicyInfo> {
        let active = self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|m| PolicyInfo {
                name: m.name.clone(),
                sha256: m.sha256.clone(),
                tenants: active
                    .iter()
                    .filter(|(_, p)| **p == m.name)
                    .map(|(t, _)| t.clone())
                    .collect(),
            })
            .collect()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Streams a policy may use on this device: the active zones the store may fill at once.
    pub fn streams_for(store: &Store) -> u32 {
        store
            .device()
            .geometry()
            .max_active
            .saturating_sub(2)
            .max(1)
    }
}

/// Where the admin API listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl AdminAddr {
    /// A loopback `IP:PORT`, or a Unix socket path (anything with a `/`).
    pub fn parse(s: &str) -> Result<Self> {
        if s.contains('/') {
            return Ok(AdminAddr::Unix(PathBuf::from(s)));
        }
        let addr: SocketAddr = s
            .parse()
            .with_context(|| format!("--admin {s}: expected IP:PORT or a socket path"))?;
        if !addr.ip().is_loopback() {
            bail!("--admin {s}: the admin API listens on loopback addresses only");
        }
        Ok(AdminAddr::Tcp(addr))
    }
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAddr::Tcp(a) => write!(f, "{a}"),
            AdminAddr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A fresh random token, written to `path` readable by its owner only.
pub fn write_token(path: &Path) -> Result<String> {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| anyhow!("no randomness for the admin token: {e}"))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing the admin token to {}", path.display()))?;
    file.write_all(token.as_bytes())?;
    file.sync_all()?;
    Ok(token)
}

/// A running admin API.
pub struct AdminServer {
    /// Where it really listens (a TCP port of 0 is resolved).
    pub addr: AdminAddr,
    pub token_path: PathBuf,
}

#[derive(Clone)]
struct Api {
    registry: Arc<Registry>,
    token: Arc<String>,
}

/// Binds `addr` and serves the API on a thread of its own until the process ends.
pub fn start(addr: &AdminAddr, token_path: &Path, registry: Arc<Registry>) -> Result<AdminServer> {
    let token = write_token(token_path)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the admin API runtime")?;
    let api = Api {
        registry: registry.clone(),
        token: Arc::new(token),
    };
    let body_limit = registry.limits.module_bytes + (1 << 20);
    let app = Router::new()
        .route("/policies", get(list_policies))
        .route(
            "/policies/{name}",
            put(upload_policy).route_layer(middleware::from_fn_with_state(
                api.clone(),
                refuse_oversized_module,
            )),
        )
        .route("/tenants/{tenant}/policy", put(activate_policy))
        .route("/stats", get(stats))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(api.clone(), authorize))
        .with_state(api);
    let bound = match addr {
        AdminAddr::Tcp(a) => {
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind(a))
                .with_context(|| format!("--admin {a}: cannot listen"))?;
            let local = AdminAddr::Tcp(listener.local_addr()?);
            std::thread::spawn(move || {
                runtime.block_on(async { axum::serve(listener, app).await })
            });
            local
        }
        AdminAddr::Unix(path) => {
            let _ = std::fs::remove_file(path);
            let listener = {
                let _guard = runtime.enter();
                tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("--admin {}: cannot listen", path.display()))?
            };
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            std::thread::spawn(move || {
                runtime.block_on(async { axum::serve(listener, app).await })
            });
            addr.clone()
        }
    };
    Ok(AdminServer {
        addr: bound,
        token_path: token_path.to_path_buf(),
    })
}

/// Compares in time independent of where the strings differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(State(api): State<Api>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if same_secret(t.as_bytes(), api.token.as_bytes()) => next.run(request).await,
        _ => (StatusCode::UNAUTHORIZED, "missing or wrong admin token\n").into_response(),
    }
}

fn error(status: StatusCode, e: anyhow::Error) -> Response {
    let body = serde_json::json!({ "error": format!("{e:#}") });
    (status, Json(body)).into_response()
}

async fn list_policies(State(api): State<Api>) -> Response {
    Json(api.registry.list()).into_response()
}

/// Refuses a module over the size limit from its `Content-Length`, before reading the body
/// (a client sending `Expect: 100-continue` then never sends it).
async fn refuse_oversized_module(State(api): State<Api>, request: Request, next: Next) -> Response {
    let limit = api.registry.limits.module_bytes as u64;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(len) if len > limit => {
            let name = request.uri().path().trim_start_matches("/policies/");
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                anyhow!(
                    "policy {name}: a module of {len} bytes is too large (the limit is {limit} bytes)"
                ),
            )
        }
        _ => next.run(request).await,
    }
}

async fn upload_policy(
    State(api): State<Api>,
    UrlPath(name): UrlPath<String>,
    body: Bytes,
) -> Response {
    match api.registry.load(&name, &body) {
        Ok(m) => (
            StatusCode::CREATED,
            Json(serde_json::json!({ "name": m.name, "sha256": m.sha256 })),
        )
            .into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn activate_policy(
    State(api): State<Api>,
    UrlPath(tenant): UrlPath<String>,
    body: Bytes,
) -> Response {
    let policy = String::from_utf8_lossy(&body).trim().to_string();
    match api.registry.activate(&tenant, &policy) {
        Ok(()) => (
            StatusCode::OK,
            Json(serde_json::json!({ "tenant": tenant, "policy": policy })),
        )
            .into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

async fn stats(State(api): State<Api>) -> Response {
    Json(api.registry.store().stats()).into_response()
}

/// A minimal HTTP/1.1 client for `valet-run policy push|list` (one request per connection).
pub mod client {
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use anyhow::{bail, Context, Result};

    use super::AdminAddr;

    /// Sends one request; returns the status code and body.
    pub fn request(
        addr: &AdminAddr,
        token: &str,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>)> {
        // With a body, ask the server to look at the headers first: one that refuses the
        // request from them (a wrong token, a module over the size limit) answers before the
        // body is sent, instead of closing the connection under a client still writing it.
        let expect = if body.is_empty() {
            ""
        } else {
            "Expect: 100-continue\r\n"
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: valet\r\nAuthorization: Bearer {token}\r\n\
             Content-Length: {}\r\n{expect}Connection: close\r\n\r\n",
            body.len()
        );
        let mut response = Vec::new();
        let mut exchange = |s: &mut dyn Conn| -> std::io::Result<()> {
            s.write_all(head.as_bytes())?;
            if !body.is_empty() {
                if let Some(end) = interim(s, &mut response)? {
                    if status_of(&response[..end]) != Some(100) {
                        // The final answer, given without the body.
                        return s.read_to_end(&mut response).map(drop);
                    }
                    response.drain(..end + 4);
                }
                match s.write_all(body).and_then(|()| s.flush()) {
                    Ok(()) => {}
                    // The server answered early and closed; its answer may still be readable.
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
                        ) =>
                    {
                        let _ = s.read_to_end(&mut response);
                        return if response.is_empty() { Err(e) } else { Ok(()) };
                    }
                    Err(e) => return Err(e),
                }
            }
            s.read_to_end(&mut response)?;
            Ok(())
        };
        match addr {
            AdminAddr::Tcp(a) => {
                exchange(&mut TcpStream::connect(a).with_context(|| format!("connecting to {a}"))?)
            }
            AdminAddr::Unix(p) => exchange(
                &mut UnixStream::connect(p)
                    .with_context(|| format!("connecting to {}", p.display()))?,
            ),
        }
        .context("talking to the admin API")?;
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("malformed HTTP response")?;
        let status_line = String::from_utf8_lossy(&response[..split]);
        let Some(code) = status_of(&response[..split]) else {
            bail!("malformed HTTP status line");
        };
        let body = decode_body(&status_line, &response[split + 4..]);
        Ok((code, body))
    }

    /// Undoes chunked transfer encoding when the server used it.
    fn decode_body(head: &str, raw: &[u8]) -> Vec<u8> {
        if !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return raw.to_vec();
        }
        let mut out = Vec::new();
        let mut rest = raw;
        while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
                .unwrap_or(0);
            if size == 0 || eol + 2 + size > rest.len() {
                break;
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[(eol + 4 + size).min(rest.len())..];
        }
        out
    }

    /// How long to wait for `100 Continue` before sending the body anyway (RFC 9110 §10.1.1).
    const CONTINUE_WAIT: Duration = Duration::from_secs(2);

    /// The status code of a response head.
    fn status_of(head: &[u8]) -> Option<u16> {
        String::from_utf8_lossy(head)
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
    }

    /// Reads the server's first response head into `response`; returns where it ends (the
    /// `\r\n\r\n`), or None when the server said nothing within [`CONTINUE_WAIT`].
    fn interim(s: &mut dyn Conn, response: &mut Vec<u8>) -> std::io::Result<Option<usize>> {
        s.set_read_timeout(Some(CONTINUE_WAIT))?;
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") {
                break Some(end);
            }
            match s.read(&mut chunk) {
                Ok(0) => break None,
                Ok(n) => response.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if response.is_empty() {
                        break None;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        s.set_read_timeout(None)?;
        Ok(end)
    }

    /// A connection to the API.
    trait Conn: Read + Write {
        fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;
    }

    impl Conn for TcpStream {
        fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
            TcpStream::set_read_timeout(self, timeout)
        }
    }

    impl Conn for UnixStream {
        fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
            UnixStream::set_read_timeout(self, timeout)
        }
    }
}
