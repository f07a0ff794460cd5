//! The cluster manifests and the containerd snippet in `deploy/` (which the README shows)
//! parse, say what the shim and agent expect, and the README carries them verbatim.

use std::collections::BTreeMap;

use valet_runtime::node::pod::PodConfig;
use yaml_rust2::{Yaml, YamlLoader};

fn deploy(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/");
    std::fs::read_to_string(format!("{path}{name}")).unwrap()
}

fn yaml(name: &str) -> Yaml {
    let docs = YamlLoader::load_from_str(&deploy(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(docs.len(), 1, "{name}: one document");
    docs.into_iter().next().unwrap()
}

fn str_at<'a>(y: &'a Yaml, path: &[&str]) -> &'a str {
    let mut at = y;
    for p in path {
        at = &at[*p];
    }
    at.as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string"))
}

#[test]
fn containerd_snippet_selects_the_shim_and_passes_annotations() {
    let t: toml::Table = deploy("containerd.toml").parse().unwrap();
    let valet = &t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["valet"];
    // containerd turns io.containerd.valet.v1 into the binary containerd-shim-valet-v1.
    assert_eq!(
        valet["runtime_type"].as_str(),
        Some("io.containerd.valet.v1")
    );
    let passed: Vec<&str> = valet["pod_annotations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(passed, ["valet.io/*"]);
}

#[test]
fn runtime_class_daemonset_and_pod_fit_together() {
    let rc = yaml("runtimeclass.yaml");
    assert_eq!(str_at(&rc, &["kind"]), "RuntimeClass");
    assert_eq!(str_at(&rc, &["apiVersion"]), "node.k8s.io/v1");
    assert_eq!(str_at(&rc, &["handler"]), "valet");

    let ds = yaml("daemonset.yaml");
    assert_eq!(str_at(&ds, &["kind"]), "DaemonSet");
    assert_eq!(str_at(&ds, &["apiVersion"]), "apps/v1");
    let spec = &ds["spec"]["template"]["spec"];
    let agent = &spec["containers"][0];
    let command: Vec<&str> = agent["command"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(&command[..2], ["valet-run", "node"]);
    let socket = command[command.iter().position(|a| *a == "--socket").unwrap() + 1];
    assert_eq!(socket, valet_runtime::node::proto::DEFAULT_SOCKET);
    // The socket's directory comes from the host, where the shims look for it.
    let mounts = agent["volumeMounts"].as_vec().unwrap();
    let socket_mount = mounts
        .iter()
        .find(|m| socket.starts_with(str_at(m, &["mountPath"])))
        .expect("the socket's directory is mounted");
    let volume = spec["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|v| v["name"] == socket_mount["name"])
        .unwrap();
    assert!(socket.starts_with(str_at(volume, &["hostPath", "path"])));
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    // The metrics address parses, and its port is the one the pod and its scrape
    // annotation name.
    let metrics = command[command.iter().position(|a| *a == "--metrics").unwrap() + 1];
    let metrics: std::net::SocketAddr = metrics.parse().unwrap();
    let port = agent["ports"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(port["containerPort"].as_i64(), Some(metrics.port().into()));
    let probe = &agent["readinessProbe"]["httpGet"];
    assert_eq!(str_at(probe, &["path"]), "/healthz");
    assert_eq!(str_at(probe, &["port"]), "metrics");
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        str_at(annotations, &["prometheus.io/port"]),
        metrics.port().to_string()
    );

    let pod = yaml("pod.yaml");
    assert_eq!(str_at(&pod, &["kind"]), "Pod");
    assert_eq!(
        str_at(&pod, &["spec", "runtimeClassName"]),
        str_at(&rc, &["metadata", "name"])
    );
    // The pod's annotations are ones the shim accepts.
    let annotations: BTreeMap<String, String> = pod["metadata"]["annotations"]
        .as_hash()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_string(),
                v.as_str().unwrap().to_string(),
            )
        })
        .collect();
    let config = PodConfig::from_annotations("leveldb", &annotations).unwrap();
    assert_eq!(config.tenant, "leveldb");
    assert_eq!(config.quota, Some(20 << 30));
    assert_eq!(config.files, Some(100_000));
}

#[test]
fn the_readme_shows_the_files_as_they_are() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    for name in [
        "containerd.toml",
        "runtimeclass.yaml",
        "daemonset.yaml",
        "pod.yaml",
    ] {
        assert!(
            readme.contains(&deploy(name)),
            "README.md does not show deploy/{name} as it is"
        );
    }
}
