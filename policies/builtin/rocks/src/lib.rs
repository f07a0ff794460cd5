//! `rocks`: placement for RocksDB and LevelDB directory layouts.
//!
//! An LSM tree writes a handful of file kinds whose lifetimes differ by orders of
//! magnitude; keeping each kind in its own stream lets whole zones die together:
//!
//! - **stream 1**, the write-ahead log (`*.log`): appended, then dropped whole once its
//!   memtable is flushed, oldest first. A new lifetime group every 64 MiB of the stream
//!   (`rotate_every_mib(64)`, about one memtable), so a device that places by group (FDP)
//!   keeps consecutive logs apart;
//! - tables (`*.sst`, `*.ldb`), by the level they are written to, which the write pattern
//!   tells (WASI carries no hints):
//!   - **stream 2**, level 0: a flush's output. Every memtable switch starts a new log, and
//!     the next table created after it is that memtable's flush. Level-0 tables die
//!     together, at the next level-0 compaction;
//!   - **stream 5**, level 1: tables created while level 0 holds at least the compaction
//!     trigger's 4 tables (RocksDB's and LevelDB's default) are a level-0 compaction's
//!     output. They live until level 1 is compacted down, piece by piece;
//!   - **stream 6**, deeper levels: every other compaction output, the longest-lived data.
//!     Tables written in the same 30 s window tend to be compacted away together, so the
//!     group is the time window (`rotate_every_secs(30)`) and each window starts a new zone
//!     (`group_starts_zone`), as Valet's heuristic placement does;
//! - **stream 3**, `MANIFEST-*`: a small log of version edits, rewritten on rollover;
//! - **stream 4**, BlobDB's value files (`*.blob`);
//! - **conventional**: `CURRENT`, `LOCK`, `OPTIONS*`, `IDENTITY`, the info log `LOG` and
//!   `LOG.old*`, and the `*.dbtmp` files that become `CURRENT` or `OPTIONS-*` by rename;
//! - **stream 0**, anything else.
//!
//! Level 0 is counted from the policy's own decisions: a table it placed as level 0 stays
//! counted until its delete event. The first log of a process (the database's open) starts
//! no flush; tables written before the first switch are taken for the open's recovery
//! flushes (level 0).
//!
//! When the device keeps fewer streams apart (`max_streams` from `valet_init`), a kind whose
//! stream does not exist takes the whole decision of the kind it falls back to (deeper
//! levels to level 1, level 1 to level 0, every other kind to the stream below it), so every
//! stream carries one shape of decision: mixing a `group_starts_zone` hint with a plain one
//! in a stream would seal a zone at every switch.

use valet_policy_sdk::{export_policy, Decision, Event, Policy, Reason, Request};

pub const STREAM_OTHER: u32 = 0;
pub const STREAM_WAL: u32 = 1;
/// Level-0 tables (flush output).
pub const STREAM_TABLE: u32 = 2;
pub const STREAM_MANIFEST: u32 = 3;
pub const STREAM_BLOB: u32 = 4;
/// Level-1 tables (level-0 compaction output).
pub const STREAM_L1: u32 = 5;
/// Tables of deeper levels.
pub const STREAM_DEEP: u32 = 6;

/// The decision of each kind of file, indexed by its stream.
const KINDS: [Decision; 7] = [
    Decision::zoned(STREAM_OTHER),
    Decision::zoned(STREAM_WAL).rotate_every_mib(64),
    Decision::zoned(STREAM_TABLE),
    Decision::zoned(STREAM_MANIFEST),
    Decision::zoned(STREAM_BLOB),
    Decision::zoned(STREAM_L1),
    Decision::zoned(STREAM_DEEP)
        .rotate_every_secs(30)
        .group_starts_zone(),
];

/// The kind each kind folds onto when its stream does not exist.
const FALLBACK: [u32; 7] = [0, 0, 1, 2, 3, STREAM_TABLE, STREAM_L1];

/// Streams assumed until the host says how many the device has.
const ASSUMED_STREAMS: u32 = 4;

/// Level-0 tables that start a level-0 compaction (`level0_file_num_compaction_trigger`).
const L0_TRIGGER: usize = 4;

/// Level-0 tables remembered (by file number); more are not counted.
const L0_SLOTS: usize = 32;

/// Flushes expected at most at once (memtables waiting for a flush).
const MAX_PENDING_FLUSHES: u32 = 4;

/// The policy: the device's stream budget and what it has seen of the LSM tree.
#[derive(Clone, Copy, Debug)]
pub struct Rocks {
    max_streams: u32,
    /// Logs created so far (the first one opens the database; each later one is a switch).
    logs: u32,
    /// Memtable switches whose flush output has not been created yet.
    pending_flushes: u32,
    /// File numbers of live tables placed as level 0 (0 = free slot).
    level0: [u64; L0_SLOTS],
}

impl Default for Rocks {
    fn default() -> Self {
        Rocks {
            max_streams: ASSUMED_STREAMS,
            logs: 0,
            pending_flushes: 0,
            level0: [0; L0_SLOTS],
        }
    }
}

fn in_place(name: &str) -> bool {
    matches!(name, "CURRENT" | "LOCK" | "IDENTITY" | "LOG" | "LOG.old")
        || name.starts_with("LOG.old.")
        || name.starts_with("OPTIONS")
        || name.ends_with(".dbtmp")
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn is_table(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".ldb")
}

/// A table's file number (`000123.sst` -> 123); 0 if the name has none.
fn file_number(name: &str) -> u64 {
    let stem = name.split('.').next().unwrap_or("");
    stem.parse().unwrap_or(0)
}

impl Rocks {
    /// The kind (stream before folding) of `path`, from its name alone; tables are level 0.
    fn kind(name: &str) -> Option<u32> {
        if in_place(name) {
            return None;
        }
        Some(if name.ends_with(".log") {
            STREAM_WAL
        } else if is_table(name) {
            STREAM_TABLE
        } else if name.starts_with("MANIFEST") {
            STREAM_MANIFEST
        } else if name.ends_with(".blob") {
            STREAM_BLOB
        } else {
            STREAM_OTHER
        })
    }

    /// The decision for `kind` on this device: its own, or the one it folds onto.
    fn fold(&self, mut kind: u32) -> Decision {
        let have = self.max_streams.max(1);
        while kind >= have {
            kind = FALLBACK[kind as usize];
        }
        KINDS[kind as usize]
    }

    /// The decision for `path` from its name alone (no state read or changed).
    pub fn decide(&self, path: &str) -> Decision {
        match Self::kind(file_name(path)) {
            None => Decision::conventional(),
            Some(kind) => self.fold(kind),
        }
    }

    fn level0_count(&self) -> usize {
        self.level0.iter().filter(|&&n| n != 0).count()
    }

    /// The level a new table is written to: 0 for a flush, 1 for a level-0 compaction,
    /// 2 for deeper compactions; remembers level-0 tables.
    fn new_table_level(&mut self, number: u64) -> u32 {
        // Before the first switch, tables are the open's recovery flushes (level 0).
        if self.pending_flushes > 0 || self.logs <= 1 {
            self.pending_flushes = self.pending_flushes.saturating_sub(1);
            if let Some(slot) = self.level0.iter_mut().find(|n| **n == 0) {
                *slot = number.max(1);
            }
            0
        } else if self.level0_count() >= L0_TRIGGER {
            1
        } else {
            2
        }
    }
}

impl Policy for Rocks {
    fn init(&mut self, max_streams: u32) {
        self.max_streams = max_streams;
    }

    fn place(&mut self, request: &Request) -> Option<Decision> {
        let name = file_name(request.path);
        if request.reason == Reason::Create {
            if name.ends_with(".log") {
                if self.logs > 0 {
                    self.pending_flushes = (self.pending_flushes + 1).min(MAX_PENDING_FLUSHES);
                }
                self.logs = self.logs.saturating_add(1);
            } else if is_table(name) {
                let kind = match self.new_table_level(file_number(name)) {
                    0 => STREAM_TABLE,
                    1 => STREAM_L1,
                    _ => STREAM_DEEP,
                };
                return Some(self.fold(kind));
            }
        }
        Some(self.decide(request.path))
    }

    fn event(&mut self, event: &Event) {
        if let Event::Deleted { path, .. } = *event {
            let name = file_name(path);
            let number = file_number(name);
            if is_table(name) && number != 0 {
                if let Some(slot) = self.level0.iter_mut().find(|n| **n == number) {
                    *slot = 0;
                }
            }
        }
    }
}

export_policy!(Rocks, Rocks::default());

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> Request<'_> {
        Request {
            tenant: 0,
            reason: Reason::Create,
            size: 0,
            path,
        }
    }

    fn place(max_streams: u32, path: &str) -> Decision {
        let mut p = Rocks::default();
        p.init(max_streams);
        p.place(&request(path)).expect("rocks always decides")
    }

    fn deleted(p: &mut Rocks, path: &str) {
        p.event(&Event::Deleted {
            tenant: 0,
            path,
            lifetime_bytes: 0,
            lifetime_secs: 1.0,
            stream: 0,
            group: 0,
        });
    }

    #[test]
    fn leveldb_layout() {
        let wal = place(8, "db/000005.log");
        assert_eq!(wal, Decision::zoned(1).rotate_every_mib(64));
        // Before any log switch a table is a recovery flush: level 0.
        assert_eq!(place(8, "db/000007.ldb"), Decision::zoned(STREAM_TABLE));
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

    /// One LSM's life: flushes after log switches go to level 0; once level 0 holds four
    /// tables the compaction's outputs go to level 1, and when it deletes its inputs the
    /// next outputs are deeper.
    #[test]
    fn tables_by_level_from_the_write_pattern() {
        let mut p = Rocks::default();
        p.init(12);
        let stream = |p: &mut Rocks, path: &str| p.place(&request(path)).unwrap().stream;
        assert_eq!(
            stream(&mut p, "db/000003.log"),
            STREAM_WAL,
            "open: no flush"
        );
        // A table before the first switch: the open's recovery flush.
        assert_eq!(stream(&mut p, "db/000002.sst"), STREAM_TABLE);
        deleted(&mut p, "db/000002.sst");
        let mut file = 4;
        for _ in 0..4 {
            assert_eq!(stream(&mut p, &format!("db/{file:06}.log")), STREAM_WAL);
            assert_eq!(
                stream(&mut p, &format!("db/{:06}.sst", file + 1)),
                STREAM_TABLE
            );
            file += 2;
        }
        assert_eq!(p.level0_count(), 4);
        assert_eq!(stream(&mut p, "db/000020.sst"), STREAM_L1);
        assert_eq!(stream(&mut p, "db/000021.sst"), STREAM_L1);
        // A flush during the compaction is still level 0.
        assert_eq!(stream(&mut p, "db/000022.log"), STREAM_WAL);
        assert_eq!(stream(&mut p, "db/000023.sst"), STREAM_TABLE);
        for f in [5, 7, 9, 11] {
            deleted(&mut p, &format!("db/{f:06}.sst"));
        }
        assert_eq!(p.level0_count(), 1);
        assert_eq!(stream(&mut p, "db/000024.sst"), STREAM_DEEP);
        // Renames and reopens do not count as new tables.
        let reopen = p
            .place(&Request {
                reason: Reason::OpenForWrite,
                ..request("db/000023.sst")
            })
            .unwrap();
        assert_eq!(reopen.stream, STREAM_TABLE);
        assert_eq!(p.level0_count(), 1);
    }

    #[test]
    fn kinds_without_a_stream_fold_onto_their_fallback() {
        let deeper = |max_streams: u32| {
            let mut p = Rocks::default();
            p.init(max_streams);
            p.place(&request("db/1.log"));
            p.place(&request("db/2.log"));
            p.place(&request("db/3.sst")); // the flush of log 1
            p.place(&request("db/4.sst")).unwrap() // a compaction's output
        };
        assert_eq!(deeper(7), KINDS[STREAM_DEEP as usize]);
        // Four streams: blobs share the MANIFEST stream, and its decision.
        assert_eq!(place(4, "db/1.blob"), Decision::zoned(3));
        // Three: MANIFEST and blobs join the tables, with the tables' decision.
        assert_eq!(place(3, "db/MANIFEST-000001"), KINDS[2]);
        assert_eq!(place(3, "db/1.blob"), KINDS[2]);
        // Deeper tables fold onto level 1, level 1 onto level 0.
        assert_eq!(deeper(6), KINDS[STREAM_L1 as usize]);
        assert_eq!(deeper(5), KINDS[STREAM_TABLE as usize]);
        // Two: everything but "other" is one stream.
        assert_eq!(place(2, "db/1.sst"), KINDS[1]);
        assert_eq!(place(1, "db/1.log"), Decision::zoned(0));
        assert_eq!(place(0, "db/1.log"), Decision::zoned(0));
        for max in 1..9 {
            for p in ["1.log", "1.sst", "MANIFEST-1", "1.blob", "x"] {
                assert!(place(max, p).stream < max.max(1), "{p} with {max} streams");
            }
        }
    }
}
