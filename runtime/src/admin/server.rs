//! The admin API server: its address, its token, and the HTTP routes over a [`Registry`].
//! One thread of its own runs a single-threaded tokio runtime with axum on it; the work on
//! the registry and the store runs on tokio's blocking threads, so no request waits behind
//! another's. Connections are bounded as [`http_serve`] says (10 s for a request's
//! headers, 64 at once).

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};

use super::registry::{NoPolicy, PolicyInUse, TooManyPolicies};
use super::Registry;
use serde::Deserialize;

use crate::http_serve::{self, Bounds};
use crate::inspect;
use crate::remove::{existing_tenant, NoTenant, RemoveRequest, TenantBusy};

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
        .enable_time()
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
            put(upload_policy)
                .route_layer(middleware::from_fn_with_state(
                    api.clone(),
                    refuse_oversized_module,
                ))
                .delete(unload_policy),
        )
        .route("/tenants", get(list_tenants))
        .route("/tenants/{tenant}/policy", put(activate_policy))
        .route("/tenants/{tenant}/rm", post(remove_files))
        .route("/tenants/{tenant}/ls", get(list_files))
        .route("/tenants/{tenant}/cat", get(read_file))
        .route("/fsck", get(fsck))
        .route("/zones", get(zones))
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
                runtime.block_on(http_serve::serve(listener, app, Bounds::default()))
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
                runtime.block_on(http_serve::serve(listener, app, Bounds::default()))
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
    match blocking(&api, |registry| Ok(registry.list())).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
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
    // Compiling and loading take CPU time: off the API's one thread.
    match blocking(&api, move |registry| registry.load(&name, &body)).await {
        Ok(m) => (
            StatusCode::CREATED,
            Json(serde_json::json!({ "name": m.name, "sha256": m.sha256 })),
        )
            .into_response(),
        Err(e) if e.is::<TooManyPolicies>() => error(StatusCode::INSUFFICIENT_STORAGE, e),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// Unloads a policy no tenant uses: 200, 404 if none is loaded by that name, 409 while a
/// tenant uses it.
async fn unload_policy(State(api): State<Api>, UrlPath(name): UrlPath<String>) -> Response {
    let policy = name.clone();
    match blocking(&api, move |registry| registry.unload(&policy)).await {
        Ok(()) => Json(serde_json::json!({ "unloaded": name })).into_response(),
        Err(e) if e.is::<PolicyInUse>() => error(StatusCode::CONFLICT, e),
        Err(e) if e.is::<NoPolicy>() => error(StatusCode::NOT_FOUND, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn activate_policy(
    State(api): State<Api>,
    UrlPath(tenant): UrlPath<String>,
    body: Bytes,
) -> Response {
    let policy = String::from_utf8_lossy(&body).trim().to_string();
    let (t, p) = (tenant.clone(), policy.clone());
    // Loading the instance runs the policy's start code: off the API's one thread.
    match blocking(&api, move |registry| registry.activate_existing(&t, &p)).await {
        Ok(swapped) => (
            StatusCode::OK,
            Json(serde_json::json!({ "tenant": tenant, "policy": policy, "swapped": swapped })),
        )
            .into_response(),
        // Only an unknown tenant or policy is "not found"; a policy that fails to load,
        // or the store failing, is the server's.
        Err(e) if e.is::<NoTenant>() || e.is::<NoPolicy>() => error(StatusCode::NOT_FOUND, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn list_tenants(State(api): State<Api>) -> Response {
    match blocking(&api, |registry| registry.tenants()).await {
        Ok(all) => Json(all).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn stats(State(api): State<Api>) -> Response {
    // The store's lock: off the API's one thread.
    match blocking(&api, |registry| Ok(registry.store().stats())).await {
        Ok(stats) => Json(stats).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// Runs `work` on the registry on a blocking thread (it waits for the store's locks, its
/// commits and its device reads); its error is the caller's to map.
async fn blocking<T: Send + 'static>(
    api: &Api,
    work: impl FnOnce(&Registry) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let registry = api.registry.clone();
    tokio::task::spawn_blocking(move || work(&registry))
        .await
        .map_err(|e| anyhow!("the request's work failed: {e}"))?
}

fn text(body: Vec<u8>) -> Response {
    let kind = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    (StatusCode::OK, kind, body).into_response()
}

/// Removes files of a tenant (see [`Registry::remove`]).
async fn remove_files(
    State(api): State<Api>,
    UrlPath(tenant): UrlPath<String>,
    body: Bytes,
) -> Response {
    // Any content type: the body is JSON whatever the client calls it.
    let request: RemoveRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, anyhow!("the request's JSON: {e}")),
    };
    match blocking(&api, move |registry| registry.remove(&tenant, &request)).await {
        Ok(removal) => (StatusCode::OK, Json(removal)).into_response(),
        Err(e) => error(status_of(&e), e),
    }
}

#[derive(Deserialize)]
struct LsQuery {
    #[serde(default = "root_path")]
    path: String,
    #[serde(default)]
    recursive: bool,
}

fn root_path() -> String {
    "/".into()
}

/// `fs ls` of a tenant's path, as text.
async fn list_files(
    State(api): State<Api>,
    UrlPath(tenant): UrlPath<String>,
    Query(q): Query<LsQuery>,
) -> Response {
    let listed = blocking(&api, move |registry| {
        let store = registry.store();
        let (_, root) = existing_tenant(store, &tenant)?;
        let mut out = Vec::new();
        inspect::ls(store, root, &q.path, q.recursive, &mut out)
            .with_context(|| format!("ls {}", q.path))?;
        Ok(out)
    })
    .await;
    match listed {
        Ok(out) => text(out),
        Err(e) => error(status_of(&e), e),
    }
}

#[derive(Deserialize)]
struct CatQuery {
    path: String,
    #[serde(default)]
    offset: u64,
    #[serde(default = "cat_chunk")]
    len: u64,
}

fn cat_chunk() -> u64 {
    inspect::CAT_CHUNK
}

/// Bytes of a tenant's file from `offset`, at most [`inspect::CAT_CHUNK`] of them.
async fn read_file(
    State(api): State<Api>,
    UrlPath(tenant): UrlPath<String>,
    Query(q): Query<CatQuery>,
) -> Response {
    let read = blocking(&api, move |registry| {
        let store = registry.store();
        let (_, root) = existing_tenant(store, &tenant)?;
        inspect::read_range(store, root, &q.path, q.offset, q.len)
            .with_context(|| format!("cat {}", q.path))
    })
    .await;
    match read {
        Ok(bytes) => {
            let kind = [(header::CONTENT_TYPE, "application/octet-stream")];
            (StatusCode::OK, kind, bytes).into_response()
        }
        Err(e) => error(status_of(&e), e),
    }
}

#[derive(Deserialize)]
struct FsckQuery {
    #[serde(default)]
    deep: bool,
}

/// fsck of the running store (deep: every live block read and verified, zone by zone,
/// while the guests go on), as JSON.
async fn fsck(State(api): State<Api>, Query(q): Query<FsckQuery>) -> Response {
    let checked = blocking(&api, move |registry| {
        let store = registry.store();
        Ok(match q.deep {
            true => store.fsck_deep()?,
            false => store.fsck()?,
        })
    })
    .await;
    match checked {
        Ok(report) => Json(report).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// `fs zones` of the running store, as text.
async fn zones(State(api): State<Api>) -> Response {
    let listed = blocking(&api, |registry| {
        let mut out = Vec::new();
        inspect::zones(registry.store(), &mut out)?;
        Ok(out)
    })
    .await;
    match listed {
        Ok(out) => text(out),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// 409 while the tenant's guests run, 404 for a tenant or path that is not there, 400 for
/// a path that cannot be used as asked, 500 for the store failing.
fn status_of(e: &anyhow::Error) -> StatusCode {
    if e.is::<TenantBusy>() {
        return StatusCode::CONFLICT;
    }
    if e.is::<NoTenant>() {
        return StatusCode::NOT_FOUND;
    }
    use valet_vfs::Error as E;
    match e.chain().find_map(|c| c.downcast_ref::<E>()) {
        Some(E::NotFound) => StatusCode::NOT_FOUND,
        Some(
            E::NotDir
            | E::IsDir
            | E::NotEmpty
            | E::NameTooLong
            | E::Invalid(_)
            | E::Escape
            | E::NotAllowed(_)
            | E::Loop,
        ) => StatusCode::BAD_REQUEST,
        Some(_) => StatusCode::INTERNAL_SERVER_ERROR,
        // Ours: a directory without `recursive`.
        None => StatusCode::BAD_REQUEST,
    }
}
