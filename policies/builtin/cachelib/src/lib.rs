//! `cachelib`: placement for a flash cache shaped like CacheLib's Navy engine.
//!
//! Navy keeps two very different kinds of data on flash:
//!
//! - **small objects** in a hashed bucket file ("BigHash"): fixed 4 KiB buckets rewritten in
//!   place whenever one of their objects changes. Sequential zones would turn every such
//!   update into a remap and garbage, so the bucket file is **conventional**. Recognised by
//!   a name containing `bighash` or `bucket`, or ending `.bh`;
//! - **large objects** in append-only regions ("BlockCache"), filled once and evicted whole,
//!   oldest first. Region files (`region-*`, `*.region`, or a name containing `blockcache`)
//!   go to **stream 1**, each region file its **own lifetime group** (the number in its
//!   name, else a hash of the name). Regions are written one after another and evicted
//!   oldest first, so in their own stream they free zones in order without moving a byte,
//!   which is the Zone-Cache result of the ZNS-cache study (WAF 1.0 against 1.15–1.39 for
//!   regions sharing zones with other data). Groups do not start zones: a 16 MiB region
//!   sealing a zone of a GiB would strand most of it. On FDP devices the groups keep
//!   regions apart as placement identifiers.
//!
//! Everything else (metadata, logs of the cache process) goes to stream 0. With a single
//! stream the regions fold onto stream 0 and keep their groups.

use valet_policy_sdk::{export_policy, Decision, Policy, Request};

pub const STREAM_OTHER: u32 = 0;
pub const STREAM_REGIONS: u32 = 1;

/// Streams assumed until the host says how many the device has.
const ASSUMED_STREAMS: u32 = 4;

/// The policy: its only state is the device's stream budget.
#[derive(Clone, Copy, Debug)]
pub struct CacheLib {
    max_streams: u32,
}

impl Default for CacheLib {
    fn default() -> Self {
        CacheLib {
            max_streams: ASSUMED_STREAMS,
        }
    }
}

pub use valet_policy_sdk::fnv1a;

fn is_bucket_file(name: &str) -> bool {
    name.contains("bighash") || name.contains("bucket") || name.ends_with(".bh")
}

fn is_region_file(name: &str) -> bool {
    name.starts_with("region-") || name.ends_with(".region") || name.contains("blockcache")
}

/// The value of the last run of digits in `name`, if there is one and it fits a u32.
fn number_in(name: &str) -> Option<u32> {
    let b = name.as_bytes();
    let end = b.iter().rposition(u8::is_ascii_digit)? + 1;
    let start = b[..end]
        .iter()
        .rposition(|c| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    b[start..end].iter().try_fold(0u32, |n, &c| {
        n.checked_mul(10)?.checked_add((c - b'0') as u32)
    })
}

impl CacheLib {
    /// The decision for `path` (the same for every tenant, reason and size).
    pub fn decide(&self, path: &str) -> Decision {
        let name = path.rsplit('/').next().unwrap_or(path);
        if is_bucket_file(name) {
            return Decision::conventional();
        }
        if is_region_file(name) {
            let group = number_in(name).unwrap_or_else(|| fnv1a(name.as_bytes()));
            let stream = STREAM_REGIONS.min(self.max_streams.saturating_sub(1));
            return Decision::zoned(stream).group(group);
        }
        Decision::zoned(STREAM_OTHER)
    }
}

impl Policy for CacheLib {
    fn init(&mut self, max_streams: u32) {
        self.max_streams = max_streams;
    }

    fn place(&mut self, request: &Request) -> Option<Decision> {
        Some(self.decide(request.path))
    }
}

export_policy!(CacheLib, CacheLib::default());

#[cfg(test)]
mod tests {
    use super::*;
    use valet_policy_sdk::Reason;

    fn place(max_streams: u32, path: &str) -> Decision {
        let mut p = CacheLib::default();
        p.init(max_streams);
        p.place(&Request {
            tenant: 0,
            reason: Reason::OpenForWrite,
            size: 1 << 30,
            path,
        })
        .expect("cachelib always decides")
    }

    #[test]
    fn bucket_file_is_updated_in_place() {
        for f in ["cache/bighash.dat", "cache/navy-buckets", "cache/small.bh"] {
            assert_eq!(place(8, f), Decision::conventional(), "{f}");
        }
    }

    #[test]
    fn each_region_is_its_own_group() {
        assert_eq!(place(8, "cache/region-0003"), Decision::zoned(1).group(3));
        assert_eq!(place(8, "cache/region-0004").group, 4);
        assert_eq!(place(8, "cache/17.region").group, 17);
        assert_eq!(
            place(8, "blockcache-7/r").stream,
            STREAM_OTHER,
            "only the name"
        );
        let named = place(8, "cache/blockcache");
        assert_eq!(named.stream, STREAM_REGIONS);
        assert_eq!(named.group, fnv1a(b"blockcache"));
        assert!(!named.group_starts_zone, "regions share zones in order");
        // A number too large for a group falls back to the hash.
        assert_eq!(
            place(8, "cache/region-99999999999").group,
            fnv1a(b"region-99999999999")
        );
    }

    #[test]
    fn other_files_and_folding() {
        assert_eq!(place(8, "cache/metadata"), Decision::zoned(0));
        assert_eq!(place(8, "cache.log"), Decision::zoned(0));
        let one = place(1, "cache/region-0003");
        assert_eq!(one.stream, 0);
        assert_eq!(one.group, 3);
        assert_eq!(place(0, "cache/region-0003").stream, 0);
    }

    #[test]
    fn number_in_takes_the_last_digit_run() {
        assert_eq!(number_in("region-0003"), Some(3));
        assert_eq!(number_in("r2-region-15"), Some(15));
        assert_eq!(number_in("region"), None);
        assert_eq!(number_in("4294967295"), Some(u32::MAX));
        assert_eq!(number_in("4294967296"), None);
    }
}
