//! Accounting: what the host asked to write, what the device wrote, what GC moved.

use serde::{Deserialize, Serialize};

/// Counters of one stream of one tenant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamStats {
    pub tenant: u32,
    pub tenant_name: String,
    pub stream: u32,
    /// Bytes the guest wrote to files of this stream.
    pub host_bytes: u64,
    /// Bytes written to this stream's zones: flushed extents (padded to blocks) and GC copies.
    pub device_bytes: u64,
    pub gc_bytes_moved: u64,
    /// Zones the stream owns now.
    pub zones: u32,
    pub waf: f64,
}

/// Counters of one tenant (the sum of its streams, plus its conventional-area writes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantStats {
    pub tenant: u32,
    pub name: String,
    pub host_bytes: u64,
    pub device_bytes: u64,
    pub gc_bytes_moved: u64,
    pub conventional_bytes: u64,
    pub waf: f64,
    /// CPU time the store's own threads spent on the tenant's files (see
    /// [`crate::TenantWork`]).
    #[serde(default)]
    pub store_cpu_ns: u64,
}

/// A tenant's placement policy: how often it decided and how often it failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyStats {
    pub tenant: u32,
    #[serde(default)]
    pub tenant_name: String,
    pub name: String,
    pub decisions: u64,
    /// Calls that trapped, timed out or answered nonsense (the default decided instead).
    pub faults: u64,
}

/// Upper bounds, in nanoseconds, of the buckets of [`SyncLatency`]: from a sync with nothing
/// to do (a few µs) past a flush of a slow disk (4 ms here) to a stalled device.
pub const SYNC_LATENCY_BOUNDS_NS: [u64; 14] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
];

/// How long one tenant's fsync/fdatasync calls took that succeeded, from the call to the
/// data and metadata being durable (the wait for a group commit included): what its guest
/// felt; and how many failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncLatency {
    pub tenant: u32,
    pub name: String,
    /// Syncs that took at most `SYNC_LATENCY_BOUNDS_NS[i]` and more than the bound before
    /// (not cumulative); the last entry counts those over every bound.
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
    /// Syncs that failed (not in the buckets): each one data a guest was told is not
    /// durable.
    #[serde(default)]
    pub failures: u64,
}

impl SyncLatency {
    /// Counts one sync that took `ns`.
    pub fn record(&mut self, ns: u64) {
        if self.buckets.len() != SYNC_LATENCY_BOUNDS_NS.len() + 1 {
            self.buckets = vec![0; SYNC_LATENCY_BOUNDS_NS.len() + 1];
        }
        let bucket = SYNC_LATENCY_BOUNDS_NS.partition_point(|&bound| bound < ns);
        self.buckets[bucket] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// The bound of the first bucket holding the `q`-quantile (0 < q ≤ 1) of the syncs
    /// counted: the quantile is at most this. `None` with no syncs, or when it is over every
    /// bound.
    pub fn quantile_bound_ns(&self, q: f64) -> Option<u64> {
        let rank = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut cumulative = 0;
        for (bucket, bound) in self.buckets.iter().zip(SYNC_LATENCY_BOUNDS_NS) {
            cumulative += bucket;
            if cumulative >= rank {
                return Some(bound);
            }
        }
        None
    }
}

/// The store's accounting, as exported (`--stats-json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Bytes the guests asked to write to zoned files.
    pub host_bytes: u64,
    /// Bytes written to data zones: extents (padded to blocks) plus GC copies.
    pub device_bytes: u64,
    pub gc_bytes_moved: u64,
    /// Metadata journal and checkpoint bytes (not part of `waf`).
    pub meta_bytes: u64,
    /// Bytes written to conventional-area files (a host directory, not the zoned device).
    pub conventional_bytes: u64,
    pub zone_resets: u64,
    pub zone_finishes: u64,
    /// Device cache flushes: one per group commit that had something to make durable.
    pub device_syncs: u64,
    /// Commits run (each one journal write and one flush at most, for any number of syncs).
    #[serde(default)]
    pub group_commits: u64,
    /// Syncs made durable by a commit another thread or tenant led.
    #[serde(default)]
    pub syncs_joined: u64,
    /// Commits whose leader first waited for syncers it expected to join (see the store's
    /// group commit), and the time those waits took in nanoseconds.
    #[serde(default)]
    pub commit_batch_waits: u64,
    #[serde(default)]
    pub commit_batch_wait_ns: u64,
    /// Writes that waited for a write buffer to come back from the device (back-pressure).
    #[serde(default)]
    pub buffer_waits: u64,
    /// Time those writes waited, in nanoseconds.
    #[serde(default)]
    pub buffer_wait_ns: u64,
    /// Full buffers written by the background writer instead of the guest's call.
    #[serde(default)]
    pub background_flushes: u64,
    /// Queued buffers a write waiting for a buffer wrote itself instead of sleeping until
    /// the background writer got to them.
    #[serde(default)]
    pub flushes_while_waiting: u64,
    /// fsync/fdatasync calls whose small tail went into the journal record instead of a
    /// data block.
    #[serde(default)]
    pub inline_syncs: u64,
    /// GC passes the background reclaimer ran (free zones below the low watermark).
    #[serde(default)]
    pub gc_background_passes: u64,
    /// GC passes run on an allocating call because no zone outside the reserve was left
    /// (the device really full, or the reclaimer behind).
    #[serde(default)]
    pub gc_foreground_passes: u64,
    /// Bytes defragmentation copied to make a fragmented file's extents fewer (in
    /// `device_bytes` too), when the metadata neared what a checkpoint can hold.
    #[serde(default)]
    pub defrag_bytes_moved: u64,
    /// Defragmentation passes of the reclaimer, ones run by a sync of a fragmented file
    /// because the reclaimer was behind, and ones run by a flush because the metadata
    /// neared what a checkpoint can hold.
    #[serde(default)]
    pub defrag_passes: u64,
    #[serde(default)]
    pub defrag_sync_passes: u64,
    #[serde(default)]
    pub defrag_flush_passes: u64,
    /// The last failure of a defragmentation a sync ran (not the sync's: its data was
    /// durable), described. The reclaimer's failures are met again by the next write.
    #[serde(default)]
    pub last_defrag_failure: Option<String>,
    /// Allocations that waited 10 s for work in flight to give them room before looking
    /// elsewhere: each is a stall a guest felt, and a bug to look for.
    #[serde(default)]
    pub allocation_stalls: u64,
    /// Rounds of the periodic writeback that made unsynced writes durable (see
    /// `StoreConfig::writeback`).
    #[serde(default)]
    pub writebacks: u64,
    /// Time those rounds took, from their first sync to their commit's end.
    #[serde(default)]
    pub writeback_ns: u64,
    /// Hand-offs that wrote unsynced writes to the device and the journal with no flush
    /// (see `StoreConfig::handoff`), and their time.
    #[serde(default)]
    pub handoffs: u64,
    #[serde(default)]
    pub handoff_ns: u64,
    /// Hand-off rounds run, whether they found something to hand off or not.
    #[serde(default)]
    pub handoff_rounds: u64,
    /// Written units whose data did not match its checksum when GC read it (the zone is
    /// left alone; `fs fsck --deep` lists what is damaged).
    #[serde(default)]
    pub checksum_failures: u64,
    /// The last of those, described.
    #[serde(default)]
    pub last_checksum_failure: Option<String>,
    /// device_bytes / host_bytes (1.0 when nothing was written).
    pub waf: f64,
    /// (device_bytes + meta_bytes) / host_bytes.
    pub waf_with_meta: f64,
    pub zones: u32,
    pub free_zones: u32,
    pub zone_capacity: u64,
    /// Bytes of valid data on the device.
    pub live_bytes: u64,
    pub streams: Vec<StreamStats>,
    pub tenants: Vec<TenantStats>,
    pub policies: Vec<PolicyStats>,
    /// Per tenant that synced since the mount.
    #[serde(default)]
    pub sync_latency: Vec<SyncLatency>,
}

/// `num / den`, 1.0 for an empty denominator.
pub(crate) fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_is_counted_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let mut latency = SyncLatency::default();
        for ns in [1, 10_000, 10_001, 4_000_000, 20_000_000_000] {
            latency.record(ns);
        }
        let mut want = vec![0; SYNC_LATENCY_BOUNDS_NS.len() + 1];
        want[0] = 2; // 1 ns and exactly 10 µs
        want[1] = 1; // just over 10 µs
        want[8] = 1; // 4 ms: over 2.5 ms, at most 5 ms
        want[14] = 1; // over the last bound
        assert_eq!(latency.buckets, want);
        assert_eq!(latency.count, 5);
        assert_eq!(latency.sum_ns, 20_004_020_002);
        assert_eq!(latency.quantile_bound_ns(0.4), Some(10_000));
        assert_eq!(latency.quantile_bound_ns(0.5), Some(25_000));
        assert_eq!(latency.quantile_bound_ns(0.8), Some(5_000_000));
        assert_eq!(latency.quantile_bound_ns(0.99), None);
        assert_eq!(SyncLatency::default().quantile_bound_ns(0.5), None);
    }
}
