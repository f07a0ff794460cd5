//! `default`: placement by directory and file extension.
//!
//! The policy a tenant gets when nobody chose one, and a sensible start for most programs:
//!
//! - **conventional** (updated in place, in the host directory): the tiny files databases
//!   rewrite in place — `LOCK`, `CURRENT`, `IDENTITY`, `LOG`, `LOG.old*`, `OPTIONS*`,
//!   `*.lock`, `*.pid` — and configuration (`*.conf`, `*.ini`, `*.toml`, `*.json`) anywhere
//!   below a `conf` or `config` directory. Sequential zones gain nothing from them;
//! - **stream 1**, logs: `*.log`, `*.wal`, `*.journal` and SQLite's `-wal` / `-journal`
//!   files. They are appended and die in the order they were written;
//! - **stream 2**, tables: `*.sst`, `*.ldb`, `*.blob`. Written once, dropped by compaction;
//! - **stream 0**, everything else.
//!
//! Why: logs and tables have very different lifetimes, and a zone that mixes them can only
//! be reset when the longest-lived of them dies. The lifetime group is a stable hash
//! (FNV-1a) of the parent directory, so files of different directories (two databases, a
//! database and its backups) form different groups: a device that places by group (FDP)
//! keeps them apart too. Streams beyond what the device can keep apart (`max_streams` from
//! `valet_init`) fold onto the last one it has.

use valet_policy_sdk::{export_policy, Decision, Policy, Request};

/// Everything that is neither a log nor a table.
pub const STREAM_GENERAL: u32 = 0;
/// Append-only logs.
pub const STREAM_LOG: u32 = 1;
/// Write-once tables.
pub const STREAM_TABLE: u32 = 2;

/// Streams assumed until the host says how many the device has.
const ASSUMED_STREAMS: u32 = 4;

/// The policy: its only state is the device's stream budget.
#[derive(Clone, Copy, Debug)]
pub struct DefaultPolicy {
    max_streams: u32,
}

impl Default for DefaultPolicy {
    fn default() -> Self {
        DefaultPolicy {
            max_streams: ASSUMED_STREAMS,
        }
    }
}

pub use valet_policy_sdk::fnv1a;

/// (parent directory, file name); the directory is empty for a file in the root.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn extension(name: &str) -> &str {
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => ext,
        _ => "",
    }
}

/// Small files rewritten in place.
fn in_place(dir: &str, name: &str) -> bool {
    if matches!(name, "LOCK" | "CURRENT" | "IDENTITY" | "LOG" | "LOG.old")
        || name.starts_with("LOG.old.")
        || name.starts_with("OPTIONS")
        || name.ends_with(".lock")
        || name.ends_with(".pid")
    {
        return true;
    }
    matches!(extension(name), "conf" | "ini" | "toml" | "json")
        && dir.split('/').any(|c| c == "conf" || c == "config")
}

fn is_log(name: &str) -> bool {
    [".log", ".wal", ".journal", "-wal", "-journal"]
        .iter()
        .any(|s| name.ends_with(s))
}

fn is_table(name: &str) -> bool {
    matches!(extension(name), "sst" | "ldb" | "blob")
}

impl DefaultPolicy {
    /// A stream the device has: streams past the budget fold onto the last one.
    fn fold(&self, stream: u32) -> u32 {
        stream.min(self.max_streams.saturating_sub(1))
    }

    /// The decision for `path` (the policy is the same for every tenant, reason and size).
    pub fn decide(&self, path: &str) -> Decision {
        let (dir, name) = split(path);
        if in_place(dir, name) {
            return Decision::conventional();
        }
        let stream = if is_log(name) {
            STREAM_LOG
        } else if is_table(name) {
            STREAM_TABLE
        } else {
            STREAM_GENERAL
        };
        Decision::zoned(self.fold(stream)).group(fnv1a(dir.as_bytes()))
    }
}

impl Policy for DefaultPolicy {
    fn init(&mut self, max_streams: u32) {
        self.max_streams = max_streams;
    }

    fn place(&mut self, request: &Request) -> Option<Decision> {
        Some(self.decide(request.path))
    }
}

export_policy!(DefaultPolicy, DefaultPolicy::default());

#[cfg(test)]
mod tests {
    use super::*;
    use valet_policy_sdk::{Class, Reason};

    fn place(max_streams: u32, path: &str) -> Decision {
        let mut p = DefaultPolicy::default();
        p.init(max_streams);
        p.place(&Request {
            tenant: 0,
            reason: Reason::Create,
            size: 0,
            path,
        })
        .expect("default always decides")
    }

    fn stream(path: &str) -> u32 {
        let d = place(8, path);
        assert_eq!(d.class, Class::Zoned, "{path}");
        d.stream
    }

    #[test]
    fn leveldb_layout() {
        assert_eq!(stream("db/000005.log"), STREAM_LOG);
        assert_eq!(stream("db/000007.ldb"), STREAM_TABLE);
        assert_eq!(stream("db/MANIFEST-000004"), STREAM_GENERAL);
        for f in [
            "db/CURRENT",
            "db/LOCK",
            "db/LOG",
            "db/LOG.old",
            "db/IDENTITY",
        ] {
            assert_eq!(place(8, f), Decision::conventional(), "{f}");
        }
    }

    #[test]
    fn rocksdb_layout() {
        assert_eq!(stream("rocks/000012.sst"), STREAM_TABLE);
        assert_eq!(stream("rocks/blobs/000013.blob"), STREAM_TABLE);
        assert_eq!(place(8, "rocks/OPTIONS-000005"), Decision::conventional());
        assert_eq!(
            place(8, "rocks/LOG.old.1700000000"),
            Decision::conventional()
        );
    }

    #[test]
    fn other_logs_locks_and_config() {
        assert_eq!(stream("pg/pg_wal/000000010000000000000001.wal"), STREAM_LOG);
        assert_eq!(stream("app/data.db-wal"), STREAM_LOG);
        assert_eq!(stream("app/data.db-journal"), STREAM_LOG);
        assert_eq!(stream("var/sys.journal"), STREAM_LOG);
        assert_eq!(stream("app/data.db"), STREAM_GENERAL);
        assert_eq!(stream("notes.txt"), STREAM_GENERAL);
        assert_eq!(place(8, "run/app.pid"), Decision::conventional());
        assert_eq!(place(8, "app/.lock"), Decision::conventional());
        assert_eq!(place(8, "app/config/app.toml"), Decision::conventional());
        assert_eq!(place(8, "etc/conf/nested/x.ini"), Decision::conventional());
        // Configuration-like names outside a config directory are ordinary data.
        assert_eq!(stream("data/report.json"), STREAM_GENERAL);
        // And a config directory's other files too.
        assert_eq!(stream("config/blob.bin"), STREAM_GENERAL);
    }

    #[test]
    fn groups_follow_the_parent_directory() {
        let a = place(8, "a/000001.log").group;
        assert_eq!(
            place(8, "a/000002.sst").group,
            a,
            "same directory, same group"
        );
        assert_ne!(place(8, "b/000001.log").group, a);
        assert_ne!(place(8, "a/sub/000001.log").group, a);
        assert_eq!(place(8, "top.txt").group, fnv1a(b""));
        assert_eq!(fnv1a(b"a"), 0xe40c_292c, "FNV-1a reference value");
    }

    #[test]
    fn streams_fold_onto_the_device_budget() {
        assert_eq!(place(2, "db/1.sst").stream, 1);
        assert_eq!(place(2, "db/1.log").stream, 1);
        assert_eq!(place(1, "db/1.sst").stream, 0);
        assert_eq!(place(1, "db/1.log").stream, 0);
        assert_eq!(place(0, "db/1.log").stream, 0);
        for max in 1..4 {
            for p in ["x/1.log", "x/1.sst", "x/y", "z.journal"] {
                assert!(place(max, p).stream < max);
            }
        }
    }
}
