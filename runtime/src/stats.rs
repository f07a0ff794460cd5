//! The human summary `--stats` prints at exit.

use valet_vfs::Stats;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// A few lines: bytes, WAF, GC and zones per stream.
pub fn summary(stats: &Stats) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "valet: host {} written, device {}, GC moved {}, WAF {:.3} (with metadata {:.3})\n",
        mib(stats.host_bytes),
        mib(stats.device_bytes),
        mib(stats.gc_bytes_moved),
        stats.waf,
        stats.waf_with_meta
    ));
    out.push_str(&format!(
        "valet: zones {} free of {}, {} resets, {} finishes, {} device syncs ({} writeback rounds, {:.1} ms; {} hand-offs, {:.1} ms), {} live, {} conventional\n",
        stats.free_zones,
        stats.zones,
        stats.zone_resets,
        stats.zone_finishes,
        stats.device_syncs,
        stats.writebacks,
        stats.writeback_ns as f64 / 1e6,
        stats.handoffs,
        stats.handoff_ns as f64 / 1e6,
        mib(stats.live_bytes),
        mib(stats.conventional_bytes)
    ));
    for s in &stats.streams {
        out.push_str(&format!(
            "valet:   {}/stream {}: host {}, device {}, GC {}, {} zones, WAF {:.3}\n",
            s.tenant_name,
            s.stream,
            mib(s.host_bytes),
            mib(s.device_bytes),
            mib(s.gc_bytes_moved),
            s.zones,
            s.waf
        ));
    }
    out
}
