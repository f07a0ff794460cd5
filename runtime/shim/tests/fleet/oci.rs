//! OCI image-layout tars for `ctr image import`, made here since nothing can be pulled: a
//! plain (uncompressed) tar layer with the files, a config, a manifest and an index.

use sha2::{Digest, Sha256};

/// A file of a layer: path inside the image, bytes, mode.
pub struct File<'a> {
    pub path: &'a str,
    pub data: &'a [u8],
    pub mode: u32,
}

/// Appends one ustar entry (typeflag `0` file, `5` directory).
fn entry(out: &mut Vec<u8>, path: &str, data: &[u8], mode: u32, typeflag: u8) {
    assert!(path.len() < 100, "short paths only: {path}");
    let mut h = [0u8; 512];
    h[..path.len()].copy_from_slice(path.as_bytes());
    let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}\0", w = width - 1);
        h[at..at + width].copy_from_slice(s.as_bytes());
    };
    octal(&mut h, 100, 8, mode as u64);
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, data.len() as u64);
    octal(&mut h, 136, 12, 1_700_000_000);
    h[148..156].copy_from_slice(b"        ");
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.resize(out.len() + 1024, 0);
    out
}

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An image-layout tar of one image named `name` (`docker.io/...:tag`) whose one layer holds
/// `files`, for `os`/`arch`, with `entrypoint`.
pub fn image_tar(name: &str, os: &str, arch: &str, entrypoint: &[&str], files: &[File]) -> Vec<u8> {
    let mut layer = Vec::new();
    for f in files {
        entry(
            &mut layer,
            f.path.trim_start_matches('/'),
            f.data,
            f.mode,
            b'0',
        );
    }
    let layer = finish(layer);
    let config = serde_json::json!({
        "architecture": arch,
        "os": os,
        "config": { "Entrypoint": entrypoint },
        "rootfs": { "type": "layers", "diff_ids": [sha(&layer)] },
    })
    .to_string()
    .into_bytes();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": sha(&layer),
            "size": layer.len(),
        }],
    })
    .to_string()
    .into_bytes();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha(&manifest),
            "size": manifest.len(),
            "platform": { "os": os, "architecture": arch },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap_or("latest"),
            },
        }],
    })
    .to_string()
    .into_bytes();
    let mut out = Vec::new();
    entry(
        &mut out,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
        b'0',
    );
    entry(&mut out, "index.json", &index, 0o644, b'0');
    entry(&mut out, "blobs/", &[], 0o755, b'5');
    entry(&mut out, "blobs/sha256/", &[], 0o755, b'5');
    for blob in [&layer, &config, &manifest] {
        let path = format!("blobs/sha256/{}", &sha(blob)["sha256:".len()..]);
        entry(&mut out, &path, blob, 0o644, b'0');
    }
    finish(out)
}

/// An image-layout tar of image `name` in the wasm OCI artifact form: an image config with
/// no filesystem layer (`os: wasip1`, `architecture: wasm`, `Entrypoint: ["/app.wasm"]`)
/// and the module itself as the one layer, of media type `application/wasm`. containerd
/// 1.7+ imports it and leaves the layer out of the rootfs; 1.6 refuses it.
pub fn wasm_artifact_tar(name: &str, wasm: &[u8]) -> Vec<u8> {
    let config = serde_json::json!({
        "architecture": "wasm",
        "os": "wasip1",
        "config": { "Entrypoint": ["/app.wasm"] },
        "rootfs": { "type": "layers", "diff_ids": [] },
    })
    .to_string()
    .into_bytes();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/wasm",
            "digest": sha(wasm),
            "size": wasm.len(),
        }],
    })
    .to_string()
    .into_bytes();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha(&manifest),
            "size": manifest.len(),
            "platform": { "os": "wasip1", "architecture": "wasm" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap_or("latest"),
            },
        }],
    })
    .to_string()
    .into_bytes();
    let mut out = Vec::new();
    entry(
        &mut out,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
        b'0',
    );
    entry(&mut out, "index.json", &index, 0o644, b'0');
    entry(&mut out, "blobs/", &[], 0o755, b'5');
    entry(&mut out, "blobs/sha256/", &[], 0o755, b'5');
    for blob in [wasm, &config[..], &manifest[..]] {
        let path = format!("blobs/sha256/{}", &sha(blob)["sha256:".len()..]);
        entry(&mut out, &path, blob, 0o644, b'0');
    }
    finish(out)
}

/// The module with a custom section appended: the same program, a new digest.
pub fn with_nonce(wasm: &[u8], nonce: u64) -> Vec<u8> {
    let name = b"valet-nonce";
    let payload = nonce.to_le_bytes();
    let mut out = wasm.to_vec();
    out.push(0);
    out.push((1 + name.len() + payload.len()) as u8);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}
