//! Kubernetes' path without a cluster: the test drives containerd's CRI API as kubelet does
//! (`RunPodSandbox` with host networking, `CreateContainer` with runtime handler `valet`,
//! `StartContainer`, wait by `ContainerStatus`, the container's log file, then stop and
//! remove), through the `k8s-cri` client, against a containerd it starts itself with the
//! runtime `valet` in its CRI config, and the node agent on a fresh store. Nothing can be
//! pulled here, so the test builds the sandbox (pause) image and the pod's image and imports
//! them into the CRI plugin's namespace (`k8s.io`). Needs root and containerd; skipped with
//! a message otherwise, failed instead under `VALET_REQUIRE_FLEET=1` (CI).

mod fleet;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleet::{oci, Agent, Containerd};
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatus, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListImagesRequest, ListPodSandboxRequest,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};
use valet_runtime::device::DeviceSpec;
use valet_vfs::device::{Geometry, IoMode};

const PAUSE: &str = "docker.io/valet/pause:1";
const IMAGE: &str = "docker.io/valet/pod-writer:1";
const RECORD: usize = 430;

/// The host's platform as OCI names it. containerd 1.6's CRI plugin only takes images of
/// its own platform, so the test images say linux/<arch> though their entrypoint is a
/// WebAssembly module (the shim does not care what the image claims).
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The pod sandbox's image. Valet's shim runs nothing for a sandbox (it waits to be
/// killed, as a pause process does), so its entrypoint is a module with no code.
fn pause_image() -> Vec<u8> {
    oci::image_tar(
        PAUSE,
        "linux",
        arch(),
        &["/pause"],
        &[oci::File {
            path: "pause",
            data: b"\0asm\x01\0\0\0",
            mode: 0o755,
        }],
    )
}

fn pod_image() -> Vec<u8> {
    let wasm = std::fs::read(valet_guests::POD_WRITER).expect("the pod_writer guest");
    oci::image_tar(
        IMAGE,
        "linux",
        arch(),
        &["/app.wasm"],
        &[
            oci::File {
                path: "app.wasm",
                data: &wasm,
                mode: 0o755,
            },
            oci::File {
                path: "etc/motd",
                data: b"from the image\n",
                mode: 0o644,
            },
        ],
    )
}

/// The CRI plugin's settings: the pause image, runc as the default runtime (the plugin
/// needs one) and the runtime `valet` passing the pods' `valet.io/*` annotations, as
/// `deploy/containerd.toml` says, and an empty CNI directory (pods use the host's network).
fn cri_config(dir: &Path) -> String {
    format!(
        r#"[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}/bin"
    conf_dir = "{cni}/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.valet]
    runtime_type = "io.containerd.valet.v1"
    pod_annotations = ["valet.io/*"]
"#,
        cni = dir.join("cni").display(),
    )
}

/// A gRPC channel to containerd's Unix socket.
async fn connect(socket: PathBuf) -> Channel {
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connecting to containerd's CRI API")
}

/// The pod's sandbox config, as kubelet sends it for a `hostNetwork: true` pod.
fn sandbox_config(name: &str, log_dir: &Path, annotations: &[(&str, &str)]) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_string(),
            uid: format!("uid-{name}"),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: log_dir.display().to_string(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Waits for a container to exit, as kubelet's status loop does.
async fn wait_exited(cri: &mut RuntimeServiceClient<Channel>, id: &str) -> ContainerStatus {
    let start = Instant::now();
    loop {
        let status = cri
            .container_status(ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .status
            .expect("a status");
        if status.state == ContainerState::ContainerExited as i32 {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the container did not exit: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn container_config(name: &str, args: &[&str], env: &[(&str, &str)]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.to_string(),
            ..Default::default()
        }),
        args: args.iter().map(|a| a.to_string()).collect(),
        envs: env
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

/// The lines of a CRI container log (`TIMESTAMP STREAM P|F TEXT`), as `STREAM TEXT`.
fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(4, ' ');
            let (_time, stream, _tag) = (parts.next()?, parts.next()?, parts.next()?);
            Some(format!("{stream} {}", parts.next().unwrap_or("")))
        })
        .collect()
}

fn device(dir: &Path) -> DeviceSpec {
    let mut geometry = Geometry::EMBEDDED_DEFAULT;
    geometry.zone_size = 64 << 20;
    geometry.zone_capacity = (64 << 20) / 4 * 3;
    geometry.zone_count = 64;
    DeviceSpec {
        dir: dir.to_path_buf(),
        zonefs: None,
        zonefs_capacity: None,
        fdp: None,
        geometry,
        io: IoMode::Auto,
        writeback: Some(valet_runtime::device::DEFAULT_WRITEBACK),
        handoff: Some(valet_runtime::device::DEFAULT_HANDOFF),
    }
}

/// How many whole records of `name` the tenant holds, each checked against what the guest
/// writes.
fn records(store: &valet_vfs::Store, tenant: &str, name: &str) -> u64 {
    let (_, root) = store.tenant(tenant).unwrap();
    let path = format!("data/{name}.log");
    let size = store
        .metadata(store.lookup(root, &path).unwrap())
        .unwrap()
        .size;
    let handle = store.open_file(root, &path, Default::default()).unwrap();
    let mut data = vec![0; size as usize];
    let mut at = 0;
    while at < data.len() {
        let n = handle.read_at(&mut data[at..], at as u64).unwrap();
        assert!(n > 0, "short read");
        at += n;
    }
    handle.close().unwrap();
    for (i, record) in data.chunks_exact(RECORD).enumerate() {
        let want = valet_guests::content::pod_record(name, i as u64, RECORD);
        assert!(
            record == &want[..],
            "{tenant}: record {i} of {name} damaged"
        );
    }
    (data.len() / RECORD) as u64
}

/// Deletes a pod as kubelet does: stop and remove its containers, then its sandbox.
async fn remove_pod(
    cri: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
    containers: &[&str],
    containerd: &Containerd,
) {
    for id in containers {
        cri.stop_container(StopContainerRequest {
            container_id: id.to_string(),
            timeout: 10,
        })
        .await
        .unwrap_or_else(|e| panic!("StopContainer: {e}\n{}", containerd.log_tail()));
        cri.remove_container(RemoveContainerRequest {
            container_id: id.to_string(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));
    }
    cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: sandbox.to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", containerd.log_tail()));
    cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: sandbox.to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
}

#[test]
fn kubelet_path_runs_a_pod_through_cri() {
    if !fleet::available() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("valet-cri")
        .tempdir_in("/tmp")
        .unwrap();
    let store_dir = dir.path().join("store");
    let mut agent = Some(Agent::start(&store_dir, &dir.path().join("node.sock")));
    let containerd = Containerd::start(&dir.path().join("node.sock"), &cri_config(dir.path()));
    containerd.import_into("k8s.io", &pause_image());
    containerd.import_into("k8s.io", &pod_image());
    let logs = dir.path().join("pods/default_db_uid-db");
    let bad_logs = dir.path().join("pods/default_bad_uid-bad");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::create_dir_all(&bad_logs).unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (status, hog_status, bad_start) = rt.block_on(async {
        let channel = connect(containerd.address.clone()).await;
        let mut images = ImageServiceClient::new(channel.clone());
        let mut cri = RuntimeServiceClient::new(channel);
        // The CRI plugin sees the imported images.
        let listed = images
            .list_images(ListImagesRequest::default())
            .await
            .unwrap_or_else(|e| panic!("ListImages: {e}\n{}", containerd.log_tail()))
            .into_inner();
        let tags: Vec<&String> = listed.images.iter().flat_map(|i| &i.repo_tags).collect();
        assert!(
            tags.iter().any(|t| *t == PAUSE) && tags.iter().any(|t| *t == IMAGE),
            "images the CRI plugin sees: {tags:?}"
        );

        let config = sandbox_config(
            "db",
            &logs,
            &[("valet.io/tenant", "cri-db"), ("valet.io/quota", "16Mi")],
        );
        let sandbox = cri
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: "valet".to_string(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", containerd.log_tail()))
            .into_inner()
            .pod_sandbox_id;

        let created = cri
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(container_config(
                    "writer",
                    &["w", "/data", "200", &RECORD.to_string()],
                    &[("POD_EXIT", "3")],
                )),
                sandbox_config: Some(config.clone()),
            })
            .await
            .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", containerd.log_tail()))
            .into_inner()
            .container_id;
        cri.start_container(StartContainerRequest {
            container_id: created.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", containerd.log_tail()));

        let status = wait_exited(&mut cri, &created).await;

        // A container with a memory limit (kubelet's `resources.limits.memory`) whose guest
        // asks for more: under 32 MiB it cannot have 64.
        let mut hog_config = container_config(
            "hog",
            &["h", "/data", "1", &RECORD.to_string()],
            &[("POD_ALLOC_MIB", "64")],
        );
        hog_config.linux = Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                memory_limit_in_bytes: 32 << 20,
                ..Default::default()
            }),
            ..Default::default()
        });
        let hog = cri
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(hog_config),
                sandbox_config: Some(config.clone()),
            })
            .await
            .unwrap_or_else(|e| panic!("CreateContainer (hog): {e}\n{}", containerd.log_tail()))
            .into_inner()
            .container_id;
        cri.start_container(StartContainerRequest {
            container_id: hog.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StartContainer (hog): {e}\n{}", containerd.log_tail()));
        let hog_status = wait_exited(&mut cri, &hog).await;

        remove_pod(&mut cri, &sandbox, &[&created, &hog], &containerd).await;

        // A pod whose annotation is wrong: its container fails at start (where CRI creates
        // the task), with the shim's one line in the error kubelet reports.
        let bad_config = sandbox_config("bad", &bad_logs, &[("valet.io/quota", "12X")]);
        let bad_sandbox = cri
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(bad_config.clone()),
                runtime_handler: "valet".to_string(),
            })
            .await
            .expect("RunPodSandbox (bad)")
            .into_inner()
            .pod_sandbox_id;
        let bad_id = cri
            .create_container(CreateContainerRequest {
                pod_sandbox_id: bad_sandbox.clone(),
                config: Some(container_config("w", &["w", "/data", "1", "430"], &[])),
                sandbox_config: Some(bad_config),
            })
            .await
            .expect("CreateContainer (bad)")
            .into_inner()
            .container_id;
        let bad_start = cri
            .start_container(StartContainerRequest {
                container_id: bad_id.clone(),
            })
            .await
            .map(|_| ())
            .map_err(|e| e.message().to_string());
        remove_pod(&mut cri, &bad_sandbox, &[&bad_id], &containerd).await;

        let left = cri
            .list_pod_sandbox(ListPodSandboxRequest::default())
            .await
            .expect("ListPodSandbox")
            .into_inner()
            .items;
        assert!(left.is_empty(), "sandboxes left: {left:?}");
        (status, hog_status, bad_start)
    });
    drop(rt);

    // The guest ran with its args and env, read its image's file, and wrote every record.
    let lines = log_lines(&logs.join("writer.log"));
    assert_eq!(
        status.exit_code,
        3,
        "exit: {status:?}\nlog: {lines:?}\nagent: {}",
        agent.as_ref().unwrap().log_text()
    );
    assert!(lines.iter().any(|l| l == "stdout ok 200"), "log: {lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("motd from the image")),
        "log: {lines:?}"
    );
    let hog_lines = log_lines(&logs.join("hog.log"));
    assert_ne!(hog_status.exit_code, 0, "{hog_lines:?}");
    assert!(
        hog_lines.iter().any(|l| l.contains("memory allocation")),
        "log: {hog_lines:?}"
    );
    let err = bad_start.expect_err("a bad annotation must fail the start");
    assert!(
        err.contains(r#"annotation valet.io/quota="12X": unknown unit"#),
        "StartContainer error: {err}"
    );
    let bad_lines = log_lines(&bad_logs.join("w.log"));
    assert!(
        bad_lines
            .iter()
            .any(|l| l.starts_with("stderr valet: annotation valet.io/quota")),
        "bad's log: {bad_lines:?}"
    );

    // No shim of this containerd is left once the pod is removed.
    fleet::wait_for(Duration::from_secs(10), "the pod's shim to exit", || {
        containerd.shims().is_empty()
    });
    drop(containerd);

    // The pod's files are on the node store, in the tenant its annotation named, which
    // is its namespace's.
    agent.take().unwrap().kill();
    let store = device(&store_dir)
        .mount_existing()
        .expect("mounting the store");
    assert_eq!(records(&store, "default.cri-db", "w"), 200);
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "fsck: {report:?}");
}
