//! Hints and the placement interface: what a policy decides for a file.

use serde::{Deserialize, Serialize};

/// Where a file's data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Class {
    /// Appended to zones of the file's stream; in-place writes are remapped.
    Zoned,
    /// Kept in the conventional area (a host directory) and updated in place.
    Conventional,
}

/// A placement decision: class, stream and lifetime group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Hint {
    pub class: Class,
    /// One logical writer of the tenant; streams never share a zone.
    pub stream: u32,
    /// Temporal slice of the stream: data written together, expected to die together.
    pub group: u32,
    /// When the stream moves on to a new group, start it in a fresh zone.
    pub group_starts_zone: bool,
    /// Start a new lifetime group every this many MiB the tenant writes to the stream
    /// (0 = never). Policies have no clock or byte counter of their own: the store rotates.
    pub rotate_mib: u32,
    /// Start a new lifetime group every this many seconds (0 = never).
    pub rotate_secs: u32,
}

impl Hint {
    /// Zoned data in `stream`, group 0.
    pub const fn zoned(stream: u32) -> Hint {
        Hint {
            class: Class::Zoned,
            stream,
            group: 0,
            group_starts_zone: false,
            rotate_mib: 0,
            rotate_secs: 0,
        }
    }

    /// A file of the conventional area.
    pub const fn conventional() -> Hint {
        Hint {
            class: Class::Conventional,
            ..Hint::zoned(0)
        }
    }

    /// The lifetime group data written now belongs to: the hint's group, moved on by one
    /// for every `rotate_mib` the stream has taken and every `rotate_secs` elapsed.
    pub fn group_at(&self, stream_bytes: u64, now_secs: u64) -> u32 {
        let mut epoch = 0u64;
        if self.rotate_mib > 0 {
            epoch += stream_bytes / ((self.rotate_mib as u64) << 20);
        }
        if self.rotate_secs > 0 {
            epoch += now_secs / self.rotate_secs as u64;
        }
        self.group.wrapping_add(epoch as u32)
    }
}

/// Why the store asks for a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpenReason {
    Create,
    OpenForWrite,
    Rename,
}

/// What the store tells a policy about an open, a create or a rename.
#[derive(Clone, Copy, Debug)]
pub struct PlacementRequest<'a> {
    pub tenant: u32,
    /// Path from the tenant's root, `/`-separated, without a leading `/`.
    pub path: &'a str,
    pub reason: OpenReason,
    /// Size of the file when opened (0 for a create).
    pub size: u64,
}

/// What a policy may learn from: events about files it placed.
#[derive(Clone, Copy, Debug)]
pub enum FileEvent<'a> {
    /// Bytes the guest wrote to a file since the last report (reported at flush).
    Written {
        tenant: u32,
        path: &'a str,
        bytes: u64,
    },
    /// A file was fsynced or fdatasynced.
    Synced { tenant: u32, path: &'a str },
    /// The last handle of a file was closed.
    Closed {
        tenant: u32,
        path: &'a str,
        size: u64,
    },
    /// A file's last link went away.
    Deleted {
        tenant: u32,
        path: &'a str,
        hint: Hint,
        /// Host bytes written to the whole tenant between the file's creation and its death.
        lifetime_bytes: u64,
        lifetime_secs: f64,
    },
}

/// Decides hints. Implemented by the runtime's policy host and by [`DefaultPlacement`].
pub trait Placement: Send + Sync {
    /// The hint for a file being created, opened for writing or renamed.
    fn place(&self, request: &PlacementRequest<'_>) -> Hint;

    /// Feedback for policies that learn; ignored by default.
    fn event(&self, _event: &FileEvent<'_>) {}

    /// Name for the stats.
    fn name(&self) -> String {
        "default".into()
    }

    /// Decisions asked of it so far.
    fn decisions(&self) -> u64 {
        0
    }

    /// Decisions that fell back to the default because the placement failed.
    fn faults(&self) -> u64 {
        0
    }
}

/// The built-in decision: tiny in-place files conventional, logs and tables apart.
///
/// Used when no policy is configured and whenever a policy fails.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultPlacement;

impl DefaultPlacement {
    /// Streams used by the default decision.
    pub const STREAM_GENERAL: u32 = 0;
    pub const STREAM_LOG: u32 = 1;
    pub const STREAM_TABLE: u32 = 2;
}

impl Placement for DefaultPlacement {
    fn place(&self, request: &PlacementRequest<'_>) -> Hint {
        let name = request.path.rsplit('/').next().unwrap_or(request.path);
        let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
        const IN_PLACE: [&str; 5] = ["LOCK", "CURRENT", "IDENTITY", "LOG", "LOG.old"];
        if IN_PLACE.contains(&name) || name.starts_with("OPTIONS") {
            return Hint::conventional();
        }
        match ext {
            "log" | "wal" | "journal" => Hint::zoned(Self::STREAM_LOG),
            "sst" | "ldb" | "blob" => Hint::zoned(Self::STREAM_TABLE),
            _ => Hint::zoned(Self::STREAM_GENERAL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(path: &str) -> Hint {
        DefaultPlacement.place(&PlacementRequest {
            tenant: 0,
            path,
            reason: OpenReason::Create,
            size: 0,
        })
    }

    #[test]
    fn rotation_moves_the_group_by_bytes_and_time() {
        let mut h = Hint::zoned(1);
        h.group = 10;
        assert_eq!(h.group_at(5 << 30, 1_000), 10, "no rotation asked");
        h.rotate_mib = 64;
        assert_eq!(h.group_at(63 << 20, 0), 10);
        assert_eq!(h.group_at(64 << 20, 0), 11);
        h.rotate_secs = 30;
        assert_eq!(h.group_at(0, 59), 11);
        assert_eq!(h.group_at(128 << 20, 60), 14);
    }

    #[test]
    fn default_separates_logs_tables_and_in_place_files() {
        assert_eq!(place("db/000012.log").stream, DefaultPlacement::STREAM_LOG);
        assert_eq!(
            place("db/000013.ldb").stream,
            DefaultPlacement::STREAM_TABLE
        );
        assert_eq!(place("db/CURRENT").class, Class::Conventional);
        assert_eq!(place("db/LOCK").class, Class::Conventional);
        assert_eq!(
            place("notes.txt"),
            Hint::zoned(DefaultPlacement::STREAM_GENERAL)
        );
    }
}
