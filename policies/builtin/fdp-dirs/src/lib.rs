//! `fdp-dirs`: the directory names the placement, after FDPFS.
//!
//! FDPFS (Kim et al., LES '24) exposes each placement identifier of an FDP SSD as a directory
//! of a FUSE mount: a program segregates its data by choosing which directory it writes
//! into, with no device programming at all (their filebench oltp run put the database
//! writer and the log writer in two directories and lowered WAF by 0.31 on average).
//!
//! Here the first path component below the tenant's root names the placement:
//!
//! - lifetime group = FNV-1a(first component) mod 65536 — on an FDP device the group is what
//!   the resolver turns into a placement identifier;
//! - stream = group mod `max_streams` — so on ZNS and multi-stream devices different top
//!   directories get different zones too, as far as the device has streams;
//! - a file directly in the root gets group 0 and stream 0.
//!
//! Every file below one top directory shares its placement, however deep it sits. There are
//! no names or extensions in the rule: the operator decides by laying out directories.

use valet_policy_sdk::{export_policy, Decision, Policy, Request};

/// Streams assumed until the host says how many the device has.
const ASSUMED_STREAMS: u32 = 4;

/// The policy: its only state is the device's stream budget.
#[derive(Clone, Copy, Debug)]
pub struct FdpDirs {
    max_streams: u32,
}

impl Default for FdpDirs {
    fn default() -> Self {
        FdpDirs {
            max_streams: ASSUMED_STREAMS,
        }
    }
}

pub use valet_policy_sdk::fnv1a;

impl FdpDirs {
    /// The decision for `path` (the same for every tenant, reason and size).
    pub fn decide(&self, path: &str) -> Decision {
        let path = path.trim_start_matches('/');
        let Some((top, _)) = path.split_once('/') else {
            return Decision::zoned(0);
        };
        let group = fnv1a(top.as_bytes()) % 65536;
        Decision::zoned(group % self.max_streams.max(1)).group(group)
    }
}

impl Policy for FdpDirs {
    fn init(&mut self, max_streams: u32) {
        self.max_streams = max_streams;
    }

    fn place(&mut self, request: &Request) -> Option<Decision> {
        Some(self.decide(request.path))
    }
}

export_policy!(FdpDirs, FdpDirs::default());

#[cfg(test)]
mod tests {
    use super::*;
    use valet_policy_sdk::Reason;

    fn place(max_streams: u32, path: &str) -> Decision {
        let mut p = FdpDirs::default();
        p.init(max_streams);
        p.place(&Request {
            tenant: 0,
            reason: Reason::Create,
            size: 0,
            path,
        })
        .expect("fdp-dirs always decides")
    }

    #[test]
    fn top_directories_name_the_placement() {
        let a = place(8, "a/x");
        let b = place(8, "b/y");
        // FNV-1a("a") = 0xe40c292c, FNV-1a("b") = 0xe70c2de5.
        assert_eq!(a, Decision::zoned(0x292c % 8).group(0x292c));
        assert_eq!(b, Decision::zoned(0x2de5 % 8).group(0x2de5));
        assert_ne!(a.stream, b.stream);
        assert_ne!(a.group, b.group);
        assert_eq!(place(8, "top.txt"), Decision::zoned(0));
    }

    #[test]
    fn depth_below_the_top_does_not_matter() {
        let a = place(8, "a/x");
        assert_eq!(place(8, "a/deeper/still/z.log"), a);
        assert_eq!(place(8, "/a/x"), a, "a stray leading slash is ignored");
        assert_ne!(place(8, "ab/x"), a);
    }

    #[test]
    fn streams_stay_within_the_budget() {
        assert_eq!(place(1, "a/x").stream, 0);
        assert_eq!(place(0, "a/x").stream, 0);
        assert_eq!(place(1, "a/x").group, 0x292c, "the group survives");
        for max in 1..16 {
            for top in [
                "a",
                "b",
                "db",
                "logs",
                "0",
                "1",
                "a-very-long-directory-name",
            ] {
                let d = place(max, &format!("{top}/f"));
                assert!(d.stream < max);
                assert!(d.group < 65536);
            }
        }
    }
}
