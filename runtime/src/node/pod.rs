//! What a pod asks of the node's store, read from its `valet.io/*` annotations. The shim
//! checks them when the container is created (so a mistake is one line on the container's
//! stderr before anything runs) and the agent checks them again (it trusts no shim).
//!
//! | annotation | value | default |
//! | --- | --- | --- |
//! | `valet.io/tenant` | the store tenant the pod's files belong to: 1–63 of `A-Z a-z 0-9 . _ -`, not starting with `.` | the pod (`NAMESPACE.NAME` under Kubernetes), else the container id |
//! | `valet.io/policy` | a placement policy loaded in the agent: a built-in (`default`, `rocks`, `cachelib`, ...) or a module uploaded through the agent's admin API | `default` |
//! | `valet.io/quota` | most bytes the tenant's files may hold: a number with an optional `K`, `M`, `G`, `T` (powers of 1024; `Ki`, `KiB`, `KB` are read the same) | none |
//! | `valet.io/files` | most names (files, directories, symbolic and hard links) the tenant's tree may hold, the directories of its mounts included: a number with an optional `K` or `M` (thousands, millions) | none |
//! | `valet.io/mounts` | comma-separated absolute paths of the guest that live on the store; `/data` is the tenant's directory `data`, `/var/log` its `var/log` | `/data` |
//!
//! Any other `valet.io/` key is refused, so a misspelt annotation is not silently ignored.

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
    /// are ignored, except the CRI's pod name for the default tenant). The error names the
    /// annotation and says what is wrong, in one line.
    pub fn from_annotations(id: &str, annotations: &BTreeMap<String, String>) -> Result<Self> {
        for key in annotations.keys() {
            let known = [TENANT, POLICY, QUOTA, FILES, MOUNTS];
            if key.starts_with(PREFIX) && !known.contains(&key.as_str()) {
                bail!("unknown annotation {key} (known: {})", known.join(", "));
            }
        }
        let tenant = match annotations.get(TENANT) {
            Some(t) => {
                check_name(t).map_err(|e| anyhow::anyhow!("annotation {TENANT}={t:?}: {e}"))?;
                t.clone()
            }
            None => default_tenant(id, annotations),
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

/// The pod under Kubernetes (CRI annotations), else the container: every character outside
/// the allowed set becomes '-', and the result is cut to 63.
fn default_tenant(id: &str, annotations: &BTreeMap<String, String>) -> String {
    let pod = match (
        annotations.get("io.kubernetes.cri.sandbox-namespace"),
        annotations.get("io.kubernetes.cri.sandbox-name"),
    ) {
        (Some(ns), Some(name)) => format!("{ns}.{name}"),
        _ => id.to_string(),
    };
    let mut name: String = pod
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    if name.is_empty() || name.starts_with('.') {
        name.insert(0, 'p');
        name.truncate(63);
    }
    name
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
        assert_eq!(c.tenant, "prod.db-0");
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
