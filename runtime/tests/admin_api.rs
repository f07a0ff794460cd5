//! The admin API: token-guarded upload, activation and listing of policies, and stats.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use valet_runtime::admin::{self, client, AdminAddr, Registry};
use valet_runtime::policy::Limits;
use valet_vfs::device::{Geometry, MemoryDevice, ZonedDevice};
use valet_vfs::{OpenOptions, Store, StoreConfig};

const GOOD: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "valet_abi_version") (result i32) i32.const 1)
  (func (export "valet_buffer") (result i32) i32.const 1024)
  (func (export "valet_place") (param i32) (result i32)
    (memory.fill (i32.const 1024) (i32.const 0) (i32.const 24))
    (i32.store (i32.const 1028) (i32.const 2))
    i32.const 0))"#;

fn store() -> Store {
    let g = Geometry {
        zone_count: 16,
        zone_size: 1 << 20,
        zone_capacity: 1 << 20,
        block_size: 4096,
        max_open: 8,
        max_active: 10,
    };
    let dev = Arc::new(MemoryDevice::new(g).unwrap()) as Arc<dyn ZonedDevice>;
    Store::open(dev, StoreConfig::default()).unwrap()
}

fn serve(addr: AdminAddr) -> (tempfile::TempDir, admin::AdminServer, String, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = store();
    let registry = Registry::new(store.clone(), 8, Limits::default()).unwrap();
    let server = admin::start(&addr, &dir.path().join("admin.token"), registry).unwrap();
    let token = std::fs::read_to_string(&server.token_path).unwrap();
    (dir, server, token, store)
}

#[test]
fn requests_need_the_token_and_the_token_file_is_private() {
    let (_dir, server, token, _) = serve(AdminAddr::parse("127.0.0.1:0").unwrap());
    let mode = std::fs::metadata(&server.token_path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "token readable by others: {mode:o}");
    for bad in ["", "wrong", &token[1..]] {
        let (code, _) = client::request(&server.addr, bad, "GET", "/stats", b"").unwrap();
        assert_eq!(code, 401);
        let (code, _) =
            client::request(&server.addr, bad, "PUT", "/policies/x", GOOD.as_bytes()).unwrap();
        assert_eq!(code, 401);
    }
    let (code, body) = client::request(&server.addr, &token, "GET", "/stats", b"").unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert!(AdminAddr::parse("10.1.2.3:80").is_err(), "loopback only");
}

#[test]
fn upload_validate_activate_and_list() {
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("admin.sock");
    let (_dir, server, token, store) = serve(AdminAddr::Unix(sock));
    let good = wat::parse_str(GOOD).unwrap();
    let (code, body) =
        client::request(&server.addr, &token, "PUT", "/policies/two", &good).unwrap();
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));

    let wasi = wat::parse_str(
        r#"(module (import "wasi_snapshot_preview1" "proc_exit" (func (param i32))))"#,
    )
    .unwrap();
    let (code, body) =
        client::request(&server.addr, &token, "PUT", "/policies/bad", &wasi).unwrap();
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("proc_exit"));

    // Naming a tenant the store does not have creates none.
    let (code, body) =
        client::request(&server.addr, &token, "PUT", "/tenants/app/policy", b"two").unwrap();
    assert_eq!(code, 404, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("no tenant"));
    assert!(store.tenants().iter().all(|(_, name, _)| name != "app"));

    let (_, root) = store.tenant("app").unwrap();
    let (code, _) =
        client::request(&server.addr, &token, "PUT", "/tenants/app/policy", b"nope").unwrap();
    assert_eq!(code, 404);
    let (code, _) =
        client::request(&server.addr, &token, "PUT", "/tenants/app/policy", b"two").unwrap();
    assert_eq!(code, 200);

    store
        .open_file(root, "f", OpenOptions::create())
        .unwrap()
        .close()
        .unwrap();
    assert_eq!(
        store
            .metadata(store.lookup(root, "f").unwrap())
            .unwrap()
            .hint
            .stream,
        2
    );

    let (code, body) = client::request(&server.addr, &token, "GET", "/policies", b"").unwrap();
    assert_eq!(code, 200);
    let list: Vec<admin::PolicyInfo> = serde_json::from_slice(&body).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, "two");
    assert_eq!(list[0].tenants, vec!["app".to_string()]);

    // A policy a tenant uses cannot be unloaded; an unused one can, once.
    let (code, _) = client::request(&server.addr, &token, "DELETE", "/policies/two", b"").unwrap();
    assert_eq!(code, 409);
    let (code, _) = client::request(&server.addr, &token, "PUT", "/policies/three", &good).unwrap();
    assert_eq!(code, 201);
    let (code, _) =
        client::request(&server.addr, &token, "DELETE", "/policies/three", b"").unwrap();
    assert_eq!(code, 200);
    let (code, _) =
        client::request(&server.addr, &token, "DELETE", "/policies/three", b"").unwrap();
    assert_eq!(code, 404);
}

/// `POST /tenants/T/rm`: what cannot be removed as asked is 400 and removes nothing; a
/// removal the store allows answers what it removed.
#[test]
fn remove_refuses_bad_requests_with_their_reason() {
    let (_dir, server, token, store) = serve(AdminAddr::parse("127.0.0.1:0").unwrap());
    let (_, root) = store.tenant("app").unwrap();
    store.create_dir(root, "db").unwrap();
    let f = store
        .open_file(root, "db/table", OpenOptions::create())
        .unwrap();
    f.write_at(&[7u8; 5000], 0).unwrap();
    f.close().unwrap();
    let rm = |body: &str| {
        let (code, answer) = client::request(
            &server.addr,
            &token,
            "POST",
            "/tenants/app/rm",
            body.as_bytes(),
        )
        .unwrap();
        (code, String::from_utf8_lossy(&answer).into_owned())
    };
    for (body, why) in [
        (r#"{"path": "/db"}"#, "is a directory"),
        (r#"{"path": "/../x"}"#, "rm /../x"),
        (r#"{"recursive": true}"#, "missing field `path`"),
        ("not json", "the request's JSON"),
    ] {
        let (code, answer) = rm(body);
        assert_eq!(code, 400, "{body}: {answer}");
        assert!(answer.contains(why), "{body}: {answer}");
    }
    assert!(store.lookup(root, "db/table").is_ok(), "nothing removed");
    let (code, answer) = rm(r#"{"path": "/db", "recursive": true}"#);
    assert_eq!(code, 200, "{answer}");
    let removal: valet_runtime::remove::Removal = serde_json::from_str(&answer).unwrap();
    assert_eq!((removal.files, removal.dirs), (1, 1));
    assert_eq!((removal.bytes_before, removal.bytes_after), (5000, 0));
    assert!(store.read_dir(root).unwrap().is_empty());
    assert!(store.fsck().unwrap().is_clean());
}

/// The value of the sample of `text` (a Prometheus exposition) whose name and labels are
/// `series`, e.g. `valet_tenant_guests{tenant="db"}`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

/// `GET /metrics` of the metrics listener: no token, the store's counters, each tenant's
/// guests and sync latency, as a Prometheus exposition; `GET /healthz`: ok.
#[test]
fn metrics_are_served_without_a_token_and_count_what_tenants_did() {
    let store = store();
    let registry = Registry::new(store.clone(), 8, Limits::default()).unwrap();
    let addr =
        valet_runtime::metrics::serve("127.0.0.1:0".parse().unwrap(), registry.clone()).unwrap();
    let (_, root) = store.tenant("db").unwrap();
    store.tenant("idle").unwrap();
    let _guest = registry.guest_running("db");
    let f = store.open_file(root, "log", OpenOptions::create()).unwrap();
    for i in 0..5u64 {
        f.write_at(&[7; 1000], i * 1000).unwrap();
        f.sync_data().unwrap();
    }
    let (code, body) = client::request(&AdminAddr::Tcp(addr), "", "GET", "/metrics", b"").unwrap();
    let text = String::from_utf8(body).unwrap();
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        sample(&text, "valet_tenant_host_bytes_total{tenant=\"db\"}"),
        5000.0
    );
    assert_eq!(sample(&text, "valet_host_bytes_total"), 5000.0);
    assert_eq!(sample(&text, "valet_tenant_guests{tenant=\"db\"}"), 1.0);
    assert_eq!(sample(&text, "valet_tenant_guests{tenant=\"idle\"}"), 0.0);
    assert_eq!(sample(&text, "valet_tenant_names{tenant=\"db\"}"), 1.0);
    assert_eq!(
        sample(&text, "valet_sync_duration_seconds_count{tenant=\"db\"}"),
        5.0
    );
    assert_eq!(
        sample(
            &text,
            "valet_sync_duration_seconds_bucket{tenant=\"db\",le=\"+Inf\"}"
        ),
        5.0
    );
    assert!(!text.contains("valet_sync_duration_seconds_count{tenant=\"idle\"}"));
    assert!(sample(&text, "valet_device_flushes_total") >= 1.0);
    assert_eq!(sample(&text, "valet_store_failed"), 0.0);
    let (code, body) = client::request(&AdminAddr::Tcp(addr), "", "GET", "/healthz", b"").unwrap();
    assert_eq!((code, body.as_slice()), (200, b"ok\n".as_slice()));
    let (code, _) = client::request(&AdminAddr::Tcp(addr), "", "GET", "/stats", b"").unwrap();
    assert_eq!(code, 404, "the metrics listener serves nothing else");
}

/// `valet-run --metrics`: a running guest's writes and syncs are there to scrape.
#[test]
fn valet_run_serves_metrics_while_its_guest_runs() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let tmp = tempfile::tempdir().unwrap();
    let mut guest = Command::new(env!("CARGO_BIN_EXE_valet-run"))
        .arg("--device")
        .arg(tmp.path().join("dev"))
        .args(["--metrics", "127.0.0.1:0"])
        .arg(valet_guests::WRITE_THEN_WAIT)
        .args(["--", "/data", "sync"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(guest.stderr.take().unwrap());
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "no address in: {seen}"
        );
        let found = line
            .trim()
            .strip_prefix("valet-run: metrics on http://")
            .and_then(|l| l.strip_suffix("/metrics"))
            .map(str::to_string);
        seen.push_str(&line);
        if let Some(addr) = found {
            break addr;
        }
    };
    let mut stdout = BufReader::new(guest.stdout.take().unwrap());
    let mut out = String::new();
    while !out.ends_with("synced\n") {
        assert!(stdout.read_line(&mut out).unwrap() > 0, "{out}");
    }
    let addr = AdminAddr::Tcp(addr.parse().unwrap());
    let (code, body) = client::request(&addr, "", "GET", "/metrics", b"").unwrap();
    let text = String::from_utf8(body).unwrap();
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        sample(
            &text,
            "valet_sync_duration_seconds_count{tenant=\"default\"}"
        ),
        3.0
    );
    assert_eq!(
        sample(&text, "valet_tenant_guests{tenant=\"default\"}"),
        1.0
    );
    assert!(sample(&text, "valet_tenant_host_bytes_total{tenant=\"default\"}") > 0.0);
    // The policy's decisions, one per file the guest made, under the tenant's name.
    let decisions = "valet_policy_decisions_total{tenant=\"default\",policy=\"default\"}";
    assert!(sample(&text, decisions) >= 3.0, "{text}");
    drop(guest.stdin.take());
    let status = guest.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{status}: {rest}");
}
