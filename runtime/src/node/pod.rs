//! What a pod asks of the node's store, read from its `valet.io/*` annotations. The shim
//! checks them when the container is created (so a mistake is one line on the container's
//! stderr before anything runs) and the agent checks them again (it trusts no shim).
//!
//! | annotation | value | default |
//! | --- | --- | --- |
//! | `valet.io/tenant` | the store tenant the pod's files belong to: 1–63 of `A-Z a-z 0-9 . _ -`, not starting with `.`; under Kubernetes the store tenant is `NAMESPACE.T` for `T`, so pods of one namespace share a tenant by naming it and no other namespace can reach it | the pod (`NAMESPACE.NAME` under Kubernetes), else the container id |
//! | `valet.io/policy` | a placement policy loaded in the agent: a built-in (`default`, `rocks`, `cachelib`, ...) or a module uploaded through the agent's admin API | `default` |
//! | `valet.io/quota` | most bytes the tenant's files may hold: a number with an optional `K`, `M`, `G`, `T` (powers of 1024; `Ki`, `KiB`, `KB` are read the same) | none |
//! | `valet.io/files` | most names (files, directories, symbolic and hard links) the tenant's tree may hold, the directories of its mounts included: a number with an optional `K` or `M` (thousands, millions) | none |
//! | `valet.io/mounts` | comma-separated absolute paths of the guest that live on the store; `/data` is the tenant's directory `data`, `/var/log` its `var/log` | `/data` |
//!
//! Any other `valet.io/` key is refused, so a misspelt annotation is not silently ignored.
//!
//! "Under Kubernetes" means the container has the CRI's annotation
//! `io.kubernetes.cri.sandbox-namespace`, which containerd's CRI plugin sets itself (a pod's
//! own annotations reach the shim only through the `pod_annotations` filter, `valet.io/*`).
//! Without it (plain `ctr`, run by the node's admins) a named tenant is taken as given. A
//! store tenant name that does not fit 63 characters, or whose characters had to be
//! replaced, is cut and ends with `-` and 16 hex digits of a hash of the full name, so
//! two distinct pods or namespaces never share a tenant by accident.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The annotations' prefix.
pub const PREFIX: &str = "valet.io/";
pub const TENANT: &str = "valet.io/tenant";
pub const POLICY: &str = "valet.io/policy";
pub const QUOTA: &str = "valet.io/quota";
pub const FILES: &str = "valet.io/files";
pub const MOUNTS: &str = "valet.io/mounts";
/// The CRI's annotation of the pod's Kubernetes namespace (set by containerd's CRI plugin).
pub const CRI_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
/// The CRI's annotation of the pod's name.
pub const CRI_NAME: &str = "io.kubernetes.cri.sandbox-name";

/// A pod's settings, checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodConfig {
    pub tenant: String,
    pub policy: String,
    pub quota: Option<u64>,
    /// Most entries of the tenant's tree (see [`valet_vfs::Store::set_entry_limit`]).
    #[serde(default)]
    pub files: Option<u64>,
    /// Absolute, normalised guest paths (no `.`, `..` or empty components), in order.
    pub mounts: Vec<String>,
}

impl PodConfig {
    /// Reads and checks the `valet.io/*` annotations of a container `id` (other annotations
    /// are ignored, except the CRI's pod namespace and name, which scope the tenant). The
    /// error names the annotation and says what is wrong, in one line.
    pub fn from_annotations(id: &str, annotations: &BTreeMap<String, String>) -> Result<Self> {
        for key in annotations.keys() {
            let known = [TENANT, POLICY, QUOTA, FILES, MOUNTS];
            if key.starts_with(PREFIX) && !known.contains(&key.as_str()) {
                bail!("unknown annotation {key} (known: {})", known.join(", "));
            }
        }
        let namespace = annotations.get(CRI_NAMESPACE);
        let tenant = match (annotations.get(TENANT), namespace) {
            (Some(t), ns) => {
                check_name(t).map_err(|e| anyhow::anyhow!("annotation {TENANT}={t:?}: {e}"))?;
                match ns {
                    Some(ns) => store_name(&format!("{ns}.{t}")),
                    None => t.clone(),
                }
            }
            (None, _) => default_tenant(id, annotations),
        };
        let policy = match annotations.get(POLICY) {
            Some(p) => {
                check_name(p).map_err(|e| anyhow::anyhow!("annotation {POLICY}={p:?}: {e}"))?;
                p.clone()
            }
            None => "default".to_string(),
        };
        let quota = match annotations.get(QUOTA) {
            Some(q) => {
                Some(parse_size(q).map_err(|e| anyhow::anyhow!("annotation {QUOTA}={q:?}: {e}"))?)
            }
            None => None,
        };
        let files = match annotations.get(FILES) {
            Some(f) => {
                Some(parse_count(f).map_err(|e| anyhow::anyhow!("annotation {FILES}={f:?}: {e}"))?)
            }
            None => None,
        };
        let mounts = match annotations.get(MOUNTS) {
            Some(m) => {
                parse_mounts(m).map_err(|e| anyhow::anyhow!("annotation {MOUNTS}={m:?}: {e}"))?
            }
            None => vec!["/data".to_string()],
        };
        Ok(PodConfig {
            tenant,
            policy,
            quota,
            files,
            mounts,
        })
    }
}

/// A tenant or policy name: safe as a store directory name and in logs.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 63 {
        bail!("must be 1 to 63 characters");
    }
    if name.starts_with('.') {
        bail!("must not start with '.'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-".contains(*c)))
    {
        bail!("{c:?} is not allowed (letters, digits, '.', '_', '-')");
    }
    Ok(())
}

/// The pod under Kubernetes (CRI annotations), else the container, as a store name.
fn default_tenant(id: &str, annotations: &BTreeMap<String, String>) -> String {
    match (annotations.get(CRI_NAMESPACE), annotations.get(CRI_NAME)) {
        (Some(ns), Some(name)) => store_name(&format!("{ns}.{name}")),
        _ => store_name(id),
    }
}

/// Longest store tenant name.
const MAX_NAME: usize = 63;
/// Hex digits of the hash that ends a name that had to be cut or changed.
const HASH_DIGITS: usize = 16;

/// `full` as a store tenant name: as it is when it is one; else every character outside
/// the allowed set becomes '-', a leading '.' or an empty name gets a 'p' before it, and
/// the result, cut to fit, ends with `-` and [`HASH_DIGITS`] hex digits of a SHA-256 of
/// `full`, so that distinct names never share a tenant.
fn store_name(full: &str) -> String {
    if check_name(full).is_ok() {
        return full.to_string();
    }
    let mut name: String = full
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with('.') {
        name.insert(0, 'p');
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(full.as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    name.truncate(MAX_NAME - 1 - HASH_DIGITS);
    format!("{name}-{}", &hash[..HASH_DIGITS])
}

/// The number `text` starts with, and the unit after it; `what` names what it should be.
fn number_and_unit<'a>(text: &'a str, what: &str) -> Result<(u64, &'a str)> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        bail!("not {what}");
    }
    Ok((t[..digits].parse()?, t[digits..].trim()))
}

/// `10G`, `512MiB`, `1000000`: bytes, more than zero.
pub fn parse_size(text: &str) -> Result<u64> {
    let (n, unit) = number_and_unit(text, "a size (bytes, or a number with K, M, G or T)")?;
    let shift = match unit {
        "" | "B" => 0,
        "K" | "Ki" | "KB" | "KiB" => 10,
        "M" | "Mi" | "MB" | "MiB" => 20,
        "G" | "Gi" | "GB" | "GiB" => 30,
        "T" | "Ti" | "TB" | "TiB" => 40,
        unit => bail!("unknown unit {unit:?} (K, M, G or T)"),
    };
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| anyhow::anyhow!("too large"))?;
    if bytes == 0 {
        bail!("must be more than zero");
    }
    Ok(bytes)
}

/// `100000`, `100K`, `2M`: a count, more than zero.
pub fn parse_count(text: &str) -> Result<u64> {
    let (n, unit) = number_and_unit(text, "a count (a number, or one with K or M)")?;
    let times = match unit {
        "" => 1,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        unit => bail!("unknown unit {unit:?} (K or M)"),
    };
    let count = n
        .checked_mul(times)
        .ok_or_else(|| anyhow::anyhow!("too large"))?;
    if count == 0 {
        bail!("must be more than zero");
    }
    Ok(count)
}

/// `/data,/var/log` → normalised absolute paths, none inside another.
fn parse_mounts(text: &str) -> Result<Vec<String>> {
    let mut mounts: Vec<String> = Vec::new();
    for raw in text.split(',') {
        let raw = raw.trim();
        if !raw.starts_with('/') {
            bail!("{raw:?} is not an absolute path");
        }
        let parts: Vec<&str> = raw.split('/').filter(|p| !p.is_empty()).collect();
        if parts.is_empty() {
            bail!("the root cannot live on the store (name a directory such as /data)");
        }
        if let Some(p) = parts.iter().find(|p| **p == "." || **p == "..") {
            bail!("{raw:?} holds {p:?}");
        }
        let path = format!("/{}", parts.join("/"));
        for m in &mounts {
            let (a, b) = (format!("{m}/"), format!("{path}/"));
            if a.starts_with(&b) || b.starts_with(&a) {
                bail!("{path} and {m} overlap");
            }
        }
        mounts.push(path);
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults() {
        let c = PodConfig::from_annotations("ctr-1", &BTreeMap::new()).unwrap();
        assert_eq!(c.tenant, "ctr-1");
        assert_eq!(c.policy, "default");
        assert_eq!(c.quota, None);
        assert_eq!(c.files, None);
        assert_eq!(c.mounts, vec!["/data"]);
        let cri = annotations(&[
            ("io.kubernetes.cri.sandbox-namespace", "prod"),
            ("io.kubernetes.cri.sandbox-name", "db/0"),
        ]);
        let c = PodConfig::from_annotations("abc", &cri).unwrap();
        assert!(c.tenant.starts_with("prod.db-0-"), "{}", c.tenant);
        let ok = annotations(&[(CRI_NAMESPACE, "prod"), (CRI_NAME, "db-0")]);
        assert_eq!(
            PodConfig::from_annotations("abc", &ok).unwrap().tenant,
            "prod.db-0"
        );
    }

    /// Under Kubernetes a named tenant is the namespace's: another namespace naming the
    /// same tenant, or one that looks like the first's store name, gets a tenant of its own.
    #[test]
    fn a_named_tenant_is_scoped_to_the_pods_namespace() {
        let pod = |ns: &str, tenant: &str| {
            let a = annotations(&[(CRI_NAMESPACE, ns), (CRI_NAME, "p"), (TENANT, tenant)]);
            PodConfig::from_annotations("id", &a).unwrap().tenant
        };
        assert_eq!(pod("prod", "db"), "prod.db");
        assert_eq!(pod("evil", "db"), "evil.db");
        assert_eq!(pod("evil", "prod.db"), "evil.prod.db");
        // The default tenant of pod `db` in `prod` is the one `prod` names `db`: one
        // namespace may share; no other reaches it.
        let default = annotations(&[(CRI_NAMESPACE, "prod"), (CRI_NAME, "db")]);
        assert_eq!(
            PodConfig::from_annotations("id", &default).unwrap().tenant,
            "prod.db"
        );
        // Without the CRI's annotations (plain `ctr`), a named tenant is as given.
        let plain = annotations(&[(TENANT, "prod.db")]);
        assert_eq!(
            PodConfig::from_annotations("id", &plain).unwrap().tenant,
            "prod.db"
        );
        // Too long together: cut, and still distinct, and still a valid name.
        let ns = "n".repeat(63);
        let (a, b) = (
            pod(&ns, &"t".repeat(63)),
            pod(&ns, &format!("{}u", "t".repeat(62))),
        );
        assert_ne!(a, b);
        for t in [&a, &b] {
            assert_eq!(t.len(), 63, "{t}");
            check_name(t).unwrap();
        }
    }

    /// Default tenants of long pod names that agree on their first 63 characters are
    /// distinct, and so are names that differ only in characters a tenant cannot hold.
    #[test]
    fn default_tenants_of_distinct_pods_never_collide() {
        let tenant = |ns: &str, name: &str| {
            let a = annotations(&[(CRI_NAMESPACE, ns), (CRI_NAME, name)]);
            PodConfig::from_annotations("id", &a).unwrap().tenant
        };
        let long = "a".repeat(70);
        let (a, b) = (tenant("prod", &long), tenant("prod", &format!("{long}b")));
        assert_ne!(a, b);
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert!(a.starts_with("prod.aaaa"), "{a}");
        check_name(&a).unwrap();
        assert_ne!(tenant("prod", "db/0"), tenant("prod", "db:0"));
        assert_ne!(tenant("prod", "db/0"), tenant("prod", "db-0"));
        // Container ids too.
        let id = |id: &str| {
            PodConfig::from_annotations(id, &BTreeMap::new())
                .unwrap()
                .tenant
        };
        assert_eq!(id("ctr-1"), "ctr-1");
        assert_ne!(id(&"c".repeat(64)), id(&"c".repeat(65)));
        assert!(id(".x").starts_with("p.x-"));
        check_name(&id(".x")).unwrap();
    }

    #[test]
    fn reads_every_annotation() {
        let a = annotations(&[
            (TENANT, "db"),
            (POLICY, "rocks"),
            (QUOTA, "64MiB"),
            (FILES, "20K"),
            (MOUNTS, "/data, /var//log/"),
            ("other.io/x", "ignored"),
        ]);
        let c = PodConfig::from_annotations("x", &a).unwrap();
        assert_eq!(c.tenant, "db");
        assert_eq!(c.policy, "rocks");
        assert_eq!(c.quota, Some(64 << 20));
        assert_eq!(c.files, Some(20_000));
        assert_eq!(c.mounts, vec!["/data", "/var/log"]);
    }

    #[test]
    fn refuses_bad_values_with_the_annotation_named() {
        for (key, value, says) in [
            (TENANT, "a/b", "valet.io/tenant"),
            (TENANT, "", "1 to 63"),
            (TENANT, "..", "must not start"),
            (POLICY, "../evil.wasm", "valet.io/policy"),
            (QUOTA, "12X", "unknown unit"),
            (QUOTA, "0", "more than zero"),
            (QUOTA, "lots", "not a size"),
            (QUOTA, "99999999999T", "too large"),
            (FILES, "10Ki", "unknown unit"),
            (FILES, "0", "more than zero"),
            (FILES, "many", "not a count"),
            (FILES, "99999999999999M", "too large"),
            (MOUNTS, "data", "not an absolute path"),
            (MOUNTS, "/", "root"),
            (MOUNTS, "/a/../b", "\"..\""),
            (MOUNTS, "/data,/data/x", "overlap"),
            ("valet.io/qouta", "1G", "unknown annotation"),
        ] {
            let err = PodConfig::from_annotations("x", &annotations(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{key}={value}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1").unwrap(), 1);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("3 GiB").unwrap(), 3 << 30);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        assert_eq!(parse_count("7").unwrap(), 7);
        assert_eq!(parse_count("5k").unwrap(), 5_000);
        assert_eq!(parse_count("2 M").unwrap(), 2_000_000);
    }
}
