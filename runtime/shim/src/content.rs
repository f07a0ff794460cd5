//! Compiled modules kept in containerd's content store, so that a pod of an image whose
//! module was compiled once (by any agent, before any restart) does not compile again.
//!
//! The agent compiles; the shim, which can talk to containerd, keeps the result. A blob
//! holds the module as the agent's wasmtime serialized it, with one label per module source
//! it was compiled from (`valet.io/precompiled.<sha256 of the .wasm>=<engine tag>`, see
//! [`source_label`]: modules that differ only in custom sections compile to the same bytes,
//! so one blob can serve several sources); the
//! image's target (its manifest or index) gets a `containerd.io/gc.ref.content.*` label
//! naming the blob, so containerd's garbage collector keeps the blob as long as the image
//! and removes it with the image. A lease holds the blob between its commit and that label.
//! Lookup is by label. The blob's digest is checked when it is read back; wasmtime checks
//! that it was made by a compatible engine, and the agent compiles afresh when it was not.
//!
//! Failing to keep or fetch a compiled module costs a compilation, never a pod: callers log
//! the error and go on.
//!
//! The content store also holds the module of an image in the wasm OCI artifact form (the
//! module as a layer of media type `application/wasm`, or runwasi's
//! [`WASM_LAYER_TYPES`]): containerd 1.7+ leaves such layers out of the rootfs, and
//! [`ContentStore::wasm_layer`] reads the module from there.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context, Result};
use containerd_client::services::v1::{
    containers_client::ContainersClient, content_client::ContentClient,
    images_client::ImagesClient, leases_client::LeasesClient, CreateRequest, DeleteRequest,
    GetContainerRequest, GetImageRequest, Info, ListContentRequest, ReadContentRequest,
    UpdateRequest, WriteAction, WriteContentRequest,
};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tonic::Request;

/// The label a blob compiled from module `source` (`sha256:HEX` of the `.wasm`) carries;
/// its value is the tag of the engine that compiled it.
pub fn source_label(source: &str) -> String {
    format!(
        "valet.io/precompiled.{}",
        source.trim_start_matches("sha256:")
    )
}
/// Media types of layers that are a WebAssembly module rather than a filesystem tar.
pub const WASM_LAYER_TYPES: [&str; 2] = [
    "application/wasm",
    "application/vnd.bytecodealliance.wasm.component.layer.v0+wasm",
];

/// Chunk size of writes (containerd takes gRPC messages up to 16 MiB).
const CHUNK: usize = 1 << 20;

/// containerd's API for one namespace.
pub struct ContentStore {
    channel: Channel,
    namespace: String,
}

impl ContentStore {
    pub async fn connect(address: &str, namespace: &str) -> Result<ContentStore> {
        let channel = containerd_client::connect(address)
            .await
            .with_context(|| format!("connecting to containerd at {address}"))?;
        Ok(ContentStore {
            channel,
            namespace: namespace.to_string(),
        })
    }

    fn request<T>(&self, msg: T, lease: Option<&str>) -> Request<T> {
        let mut req = Request::new(msg);
        let md = req.metadata_mut();
        if let Ok(ns) = self.namespace.parse() {
            md.insert("containerd-namespace", ns);
        }
        if let Some(lease) = lease.and_then(|l| l.parse().ok()) {
            md.insert("containerd-lease", lease);
        }
        req
    }

    /// The newest compiled module of `source` (`sha256:...`) made by an engine of tag
    /// `engine`, checked against its digest.
    pub async fn fetch(&self, source: &str, engine: &str) -> Result<Option<Vec<u8>>> {
        let mut content = ContentClient::new(self.channel.clone());
        let filter = format!("labels.\"{}\"==\"{engine}\"", source_label(source));
        let mut stream = content
            .list(self.request(
                ListContentRequest {
                    filters: vec![filter],
                },
                None,
            ))
            .await
            .context("listing containerd's content")?
            .into_inner();
        let mut newest: Option<Info> = None;
        while let Some(resp) = stream.message().await.context("listing content")? {
            for info in resp.info {
                let key = |i: &Info| i.created_at.as_ref().map(|t| (t.seconds, t.nanos));
                if newest.as_ref().is_none_or(|n| key(&info) > key(n)) {
                    newest = Some(info);
                }
            }
        }
        let Some(info) = newest else {
            return Ok(None);
        };
        let data = self.read(&info.digest).await?;
        Ok(Some(data))
    }

    /// The module of container `id`'s image when the image carries it as a wasm layer
    /// (the first such layer), else `None`.
    pub async fn wasm_layer(&self, id: &str) -> Result<Option<Vec<u8>>> {
        let target = self.image_target(id).await?;
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&self.read(&target.digest).await?)
                .context("parsing the image's manifest")?;
        // An index: this machine's manifest, or a wasm one, or the only one.
        if manifest.get("manifests").is_some() {
            let arch = match std::env::consts::ARCH {
                "x86_64" => "amd64",
                "aarch64" => "arm64",
                other => other,
            };
            let entries = manifest["manifests"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            fn platform(e: &serde_json::Value) -> (&str, &str) {
                let p = &e["platform"];
                (
                    p["os"].as_str().unwrap_or(""),
                    p["architecture"].as_str().unwrap_or(""),
                )
            }
            let chosen = entries
                .iter()
                .find(|e| matches!(platform(e), ("linux", a) if a == arch))
                .or_else(|| entries.iter().find(|e| platform(e).1 == "wasm"))
                .or(entries.first())
                .context("the image's index lists no manifest")?;
            let digest = chosen["digest"]
                .as_str()
                .context("a manifest without digest")?;
            manifest = serde_json::from_slice(&self.read(digest).await?)
                .context("parsing the image's manifest")?;
        }
        let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
        let Some(layer) = layers
            .iter()
            .find(|l| WASM_LAYER_TYPES.contains(&l["mediaType"].as_str().unwrap_or("")))
        else {
            return Ok(None);
        };
        let digest = layer["digest"].as_str().context("a layer without digest")?;
        Ok(Some(self.read(digest).await?))
    }

    /// The descriptor container `id`'s image points at (its manifest or index).
    async fn image_target(&self, id: &str) -> Result<containerd_client::types::Descriptor> {
        let container = ContainersClient::new(self.channel.clone())
            .get(self.request(GetContainerRequest { id: id.to_string() }, None))
            .await
            .context("looking up the container")?
            .into_inner()
            .container
            .context("no container")?;
        let image = ImagesClient::new(self.channel.clone())
            .get(self.request(
                GetImageRequest {
                    name: container.image.clone(),
                },
                None,
            ))
            .await
            .with_context(|| format!("looking up image {:?}", container.image))?
            .into_inner()
            .image
            .context("no image")?;
        image.target.context("the image has no target")
    }

    /// A blob of the content store, checked against its digest.
    async fn read(&self, digest: &str) -> Result<Vec<u8>> {
        let mut stream = ContentClient::new(self.channel.clone())
            .read(self.request(
                ReadContentRequest {
                    digest: digest.to_string(),
                    offset: 0,
                    size: 0,
                },
                None,
            ))
            .await
            .with_context(|| format!("reading {digest}"))?
            .into_inner();
        let mut data = Vec::new();
        while let Some(chunk) = stream.message().await.context("reading content")? {
            data.extend_from_slice(&chunk.data);
        }
        if self::digest(&data) != digest {
            return Err(anyhow!("{digest} read back with another digest"));
        }
        Ok(data)
    }

    /// Keeps `compiled` (compiled from `source` by an engine of tag `engine`) for the image
    /// of container `id`.
    pub async fn keep(&self, id: &str, source: &str, engine: &str, compiled: &[u8]) -> Result<()> {
        let blob = digest(compiled);
        let lease = format!("valet-precompile-{}", &blob["sha256:".len()..][..16]);
        let mut leases = LeasesClient::new(self.channel.clone());
        let expire = humantime_rfc3339(SystemTime::now() + Duration::from_secs(3600));
        leases
            .create(self.request(
                CreateRequest {
                    id: lease.clone(),
                    labels: HashMap::from([("containerd.io/gc.expire".into(), expire)]),
                },
                None,
            ))
            .await
            .context("creating a lease")?;
        let kept = self
            .write_and_link(id, [source, engine], compiled, &blob, &lease)
            .await;
        let _ = leases
            .delete(self.request(
                DeleteRequest {
                    id: lease,
                    sync: false,
                },
                None,
            ))
            .await;
        kept
    }

    async fn write_and_link(
        &self,
        id: &str,
        [source, engine]: [&str; 2],
        compiled: &[u8],
        blob: &str,
        lease: &str,
    ) -> Result<()> {
        let mut content = ContentClient::new(self.channel.clone());
        let label = source_label(source);
        let labels = HashMap::from([(label.clone(), engine.to_string())]);
        let total = compiled.len() as i64;
        let mut msgs = Vec::new();
        let chunks: Vec<&[u8]> = compiled.chunks(CHUNK).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            msgs.push(WriteContentRequest {
                action: if last {
                    WriteAction::Commit
                } else {
                    WriteAction::Write
                } as i32,
                r#ref: format!("valet-precompiled-{blob}"),
                total,
                expected: blob.to_string(),
                offset: (i * CHUNK) as i64,
                data: chunk.to_vec(),
                labels: if last { labels.clone() } else { HashMap::new() },
            });
        }
        match content
            .write(self.request(tokio_stream::iter(msgs), Some(lease)))
            .await
        {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                while stream
                    .message()
                    .await
                    .context("writing the compiled module")?
                    .is_some()
                {}
            }
            // The same bytes are there already (kept for this source or another one).
            Err(s) if s.code() == tonic::Code::AlreadyExists => {}
            Err(s) => return Err(anyhow!("writing the compiled module: {}", s.message())),
        }
        // The label of this source, also on a blob that was already there.
        content
            .update(self.request(
                UpdateRequest {
                    info: Some(Info {
                        digest: blob.to_string(),
                        labels: labels.clone(),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask {
                        paths: vec![format!("labels.{label}")],
                    }),
                },
                None,
            ))
            .await
            .context("labelling the compiled module")?;
        // Tie the blob's life to the image's.
        let target = self.image_target(id).await?;
        let key = format!(
            "containerd.io/gc.ref.content.valet.precompiled.{}",
            &source.trim_start_matches("sha256:")[..12.min(source.len())]
        );
        content
            .update(self.request(
                UpdateRequest {
                    info: Some(Info {
                        digest: target.digest,
                        labels: HashMap::from([(key.clone(), blob.to_string())]),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask {
                        paths: vec![format!("labels.{key}")],
                    }),
                },
                None,
            ))
            .await
            .context("labelling the image")?;
        Ok(())
    }
}

/// `sha256:HEX` of `data`.
pub fn digest(data: &[u8]) -> String {
    let hex: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// An RFC 3339 UTC time, as containerd's `gc.expire` label wants.
fn humantime_rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
