//! `rocks`: placement for RocksDB and LevelDB directory layouts.
//!
//! An LSM tree writes a handful of file kinds whose lifetimes differ by orders of
//! magnitude; keeping each kind in its own stream lets whole zones die together:
//!
//! - **stream 1**, the write-ahead log (`*.log`): appended, then dropped whole once its
//!   memtable is flushed, oldest first. A new lifetime group every 64 MiB of the stream
//!   (`rotate_every_mib(64)`, about one memtable), so a device that places by group (FDP)
//!   keeps consecutive logs apart;
//! - **stream 2**, tables (`*.sst`, `*.ldb`): written once by flushes and compactions, dropped
//!   by later compactions. Tables written in the same 30 s window tend to be compacted
//!   away together, so the group is the time window (`rotate_every_secs(30)`) and each new
//!   window starts a new zone (`group_starts_zone`), as Valet's heuristic placement does;
//! - **stream 3**, `MANIFEST-*`: a small log of version edits, rewritten on rollover;
//! - **stream 4**, BlobDB's value files (`*.blob`);
//! - **conventional**: `CURRENT`, `LOCK`, `OPTIONS*`, `IDENTITY`, the info log `LOG` and
//!   `LOG.old*`, and the `*.dbtmp` files that become `CURRENT` or `OPTIONS-*` by rename;
//! - **stream 0**, anything else.
//!
//! When the device keeps fewer streams apart (`max_streams` from `valet_init`), a kind whose
//! stream does not exist takes the whole decision of the last kind that does (stream
//! `max_streams - 1`), so every stream carries one shape of decision: mixing a
//! `group_starts_zone` hint with a plain one in a stream would seal a zone at every switch.

use valet_policy_sdk::{export_policy, Decision, Policy, Request};

pub const STREAM_OTHER: u32 = 0;
pub const STREAM_WAL: u32 = 1;
pub const STREAM_TABLE: u32 = 2;
pub const STREAM_MANIFEST: u32 = 3;
pub const STREAM_BLOB: u32 = 4;

/// The decision of each kind of file, indexed by its stream.
const KINDS: [Decision; 5] = [
    Decision::zoned(STREAM_OTHER),
    Decision::zoned(STREAM_WAL).rotate_every_mib(64),
    Decision::zoned(STREAM_TABLE)
        .rotate_every_secs(30)
        .group_starts_zone(),
    Decision::zoned(STREAM_MANIFEST),
    Decision::zoned(STREAM_BLOB),
];

/// Streams assumed until the host says how many the device has.
const ASSUMED_STREAMS: u32 = 4;

/// The policy: its only state is the device's stream budget.
#[derive(Clone, Copy, Debug)]
pub struct Rocks {
    max_streams: u32,
}

impl Default for Rocks {
    fn default() -> Self {
        Rocks {
            max_streams: ASSUMED_STREAMS,
        }
    }
}

fn in_place(name: &str) -> bool {
    matches!(name, "CURRENT" | "LOCK" | "IDENTITY" | "LOG" | "LOG.old")
        || name.starts_with("LOG.old.")
        || name.starts_with("OPTIONS")
        || name.ends_with(".dbtmp")
}

impl Rocks {
    /// The decision for `path` (the same for every tenant, reason and size).
    pub fn decide(&self, path: &str) -> Decision {
        let name = path.rsplit('/').next().unwrap_or(path);
        if in_place(name) {
            return Decision::conventional();
        }
        let stream = if name.ends_with(".log") {
            STREAM_WAL
        } else if name.ends_with(".sst") || name.ends_with(".ldb") {
            STREAM_TABLE
        } else if name.starts_with("MANIFEST") {
            STREAM_MANIFEST
        } else if name.ends_with(".blob") {
            STREAM_BLOB
        } else {
            STREAM_OTHER
        };
        let have = self.max_streams.max(1);
        KINDS[stream.min(have - 1) as usize]
    }
}

impl Policy for Rocks {
    fn init(&mut self, max_streams: u32) {
        self.max_streams = max_streams;
    }

    fn place(&mut self, request: &Request) -> Option<Decision> {
        Some(self.decide(request.path))
    }
}

export_policy!(Rocks, Rocks::default());

#[cfg(test)]
mod tests {
    use super::*;
    use valet_policy_sdk::Reason;

    fn place(max_streams: u32, path: &str) -> Decision {
        let mut p = Rocks::default();
        p.init(max_streams);
        p.place(&Request {
            tenant: 0,
            reason: Reason::Create,
            size: 0,
            path,
        })
        .expect("rocks always decides")
    }

    #[test]
    fn leveldb_layout() {
        let wal = place(8, "db/000005.log");
        assert_eq!(wal, Decision::zoned(1).rotate_every_mib(64));
        let table = place(8, "db/000007.ldb");
        assert_eq!(
            table,
            Decision::zoned(2).rotate_every_secs(30).group_starts_zone()
        );
        assert_eq!(place(8, "db/MANIFEST-000004"), Decision::zoned(3));
        for f in [
            "db/CURRENT",
            "db/LOCK",
            "db/LOG",
            "db/LOG.old",
            "db/000003.dbtmp",
        ] {
            assert_eq!(place(8, f), Decision::conventional(), "{f}");
        }
    }

    #[test]
    fn rocksdb_layout() {
        assert_eq!(place(8, "rdb/000012.sst").stream, STREAM_TABLE);
        assert_eq!(place(8, "rdb/archive/000010.log").stream, STREAM_WAL);
        assert_eq!(place(8, "rdb/000042.blob"), Decision::zoned(4));
        for f in [
            "rdb/OPTIONS-000005",
            "rdb/OPTIONS-000007.dbtmp",
            "rdb/IDENTITY",
            "rdb/LOG.old.1700000000123",
        ] {
            assert_eq!(place(8, f), Decision::conventional(), "{f}");
        }
        assert_eq!(place(8, "rdb/notes.txt"), Decision::zoned(0));
        assert_eq!(place(8, "000005.log").stream, STREAM_WAL, "in the root too");
    }

    #[test]
    fn kinds_without_a_stream_take_the_last_kind_that_has_one() {
        // Four streams: blobs share the MANIFEST stream, and its decision.
        assert_eq!(place(4, "db/1.blob"), Decision::zoned(3));
        // Three: MANIFEST and blobs join the tables, with the tables' rotation.
        assert_eq!(place(3, "db/MANIFEST-000001"), KINDS[2]);
        assert_eq!(place(3, "db/1.blob"), KINDS[2]);
        // Two: everything but "other" is one stream.
        assert_eq!(place(2, "db/1.sst"), KINDS[1]);
        assert_eq!(place(1, "db/1.log"), Decision::zoned(0));
        assert_eq!(place(0, "db/1.log"), Decision::zoned(0));
        for max in 1..6 {
            for p in ["1.log", "1.sst", "MANIFEST-1", "1.blob", "x"] {
                assert!(place(max, p).stream < max, "{p} with {max} streams");
            }
        }
    }
}
