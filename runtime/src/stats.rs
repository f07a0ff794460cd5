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
    let bound = |ns: Option<u64>| match ns {
        Some(ns) if ns < 1_000_000 => format!("≤ {} µs", ns / 1000),
        Some(ns) => format!("≤ {} ms", ns as f64 / 1e6),
        None => "over 10 s".to_string(),
    };
    for l in &stats.sync_latency {
        if l.count == 0 {
            let failed = l.failures;
            out.push_str(&format!(
                "valet:   {}: no sync succeeded, {failed} failed\n",
                l.name
            ));
            continue;
        }
        let mean_us = l.sum_ns as f64 / l.count as f64 / 1e3;
        out.push_str(&format!(
            "valet:   {}: {} syncs ({} failed), mean {:.0} µs, P50 {}, P99 {}, P99.99 {}\n",
            l.name,
            l.count,
            l.failures,
            mean_us,
            bound(l.quantile_bound_ns(0.5)),
            bound(l.quantile_bound_ns(0.99)),
            bound(l.quantile_bound_ns(0.9999)),
        ));
    }
    for t in stats.tenants.iter().filter(|t| t.store_cpu_ns > 0) {
        out.push_str(&format!(
            "valet:   {}: the store's threads used {:.3} s of CPU for its files\n",
            t.name,
            t.store_cpu_ns as f64 / 1e9
        ));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use valet_vfs::SyncLatency;

    #[test]
    fn the_summary_gives_each_tenants_sync_quantiles_by_their_bucket() {
        let mut db = SyncLatency {
            name: "db".into(),
            failures: 1,
            ..Default::default()
        };
        for ns in [20_000, 20_000, 20_000, 2_000_000] {
            db.record(ns);
        }
        let failing = SyncLatency {
            name: "bad".into(),
            failures: 2,
            ..Default::default()
        };
        let stats = Stats {
            sync_latency: vec![db, failing],
            ..Default::default()
        };
        let text = summary(&stats);
        assert!(
            text.contains(
                "valet:   db: 4 syncs (1 failed), mean 515 µs, P50 ≤ 25 µs, P99 ≤ 2.5 ms, \
                 P99.99 ≤ 2.5 ms\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("valet:   bad: no sync succeeded, 2 failed\n"),
            "{text}"
        );
    }
}
