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

    let (code, _) =
        client::request(&server.addr, &token, "PUT", "/tenants/app/policy", b"nope").unwrap();
    assert_eq!(code, 404);
    let (code, _) =
        client::request(&server.addr, &token, "PUT", "/tenants/app/policy", b"two").unwrap();
    assert_eq!(code, 200);

    let (_, root) = store.tenant("app").unwrap();
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
