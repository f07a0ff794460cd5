//! Prometheus metrics (`valet-run --metrics ADDR`, `valet-run node --metrics ADDR`): the
//! store's stats in the text exposition format, on `GET /metrics` of a listener of its own.
//!
//! The listener is read-only and asks for no token (as node exporters do), so it may listen
//! on any address a scraper reaches, unlike the admin API. A scrape takes the store's lock
//! for about as long as `--stats` does: it copies counters and walks nothing (no tenant's
//! files are counted, so the bytes a tenant's files hold are `fs tenants`' to tell).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use valet_vfs::{Stats, SYNC_LATENCY_BOUNDS_NS};

use crate::admin::Registry;

/// What a scrape reports of each tenant beyond the store's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantGauges {
    pub name: String,
    /// Names in its tree (kept as they change: no walk).
    pub names: u64,
    /// Its guests running now.
    pub guests: usize,
}

/// Binds `addr` and serves `GET /metrics` on a thread of its own until the process ends;
/// returns where it listens (a port of 0 resolved).
pub fn serve(addr: SocketAddr, registry: Arc<Registry>) -> Result<SocketAddr> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the metrics runtime")?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("--metrics {addr}: cannot listen"))?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry);
    std::thread::Builder::new()
        .name("valet-metrics".into())
        .spawn(move || runtime.block_on(async { axum::serve(listener, app).await }))
        .context("starting the metrics thread")?;
    Ok(local)
}

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let kind = [(
        header::CONTENT_TYPE,
        "text/plain; version=0.0.4; charset=utf-8",
    )];
    (kind, scrape(&registry))
}

/// The exposition of `registry`'s store now.
pub fn scrape(registry: &Registry) -> String {
    let store = registry.store();
    let guests = registry.guests_running();
    let tenants: Vec<TenantGauges> = store
        .tenants()
        .into_iter()
        .map(|(id, name, _)| TenantGauges {
            names: store.tenant_entries(id).unwrap_or(0),
            guests: guests.get(&name).copied().unwrap_or(0),
            name,
        })
        .collect();
    render(&store.stats(), &tenants)
}

/// The text exposition format (version 0.0.4) of `stats` and `tenants`.
pub fn render(stats: &Stats, tenants: &[TenantGauges]) -> String {
    let mut out = Exposition::default();
    let seconds = |ns: u64| ns as f64 / 1e9;

    for (name, help, value) in [
        (
            "valet_host_bytes_total",
            "Bytes guests wrote to zoned files.",
            stats.host_bytes,
        ),
        (
            "valet_device_bytes_total",
            "Bytes written to data zones: extents padded to blocks, and GC copies.",
            stats.device_bytes,
        ),
        (
            "valet_gc_bytes_moved_total",
            "Bytes GC copied out of zones it reclaimed.",
            stats.gc_bytes_moved,
        ),
        (
            "valet_metadata_bytes_total",
            "Bytes of journal records and checkpoints.",
            stats.meta_bytes,
        ),
        (
            "valet_conventional_bytes_total",
            "Bytes written to conventional-area files (host files, not zones).",
            stats.conventional_bytes,
        ),
        ("valet_zone_resets_total", "Zones reset.", stats.zone_resets),
        (
            "valet_zone_finishes_total",
            "Zones finished.",
            stats.zone_finishes,
        ),
        (
            "valet_device_flushes_total",
            "Device cache flushes.",
            stats.device_syncs,
        ),
        (
            "valet_group_commits_total",
            "Commits run, each one journal write and one flush at most.",
            stats.group_commits,
        ),
        (
            "valet_syncs_joined_total",
            "Syncs made durable by a commit another one led.",
            stats.syncs_joined,
        ),
        (
            "valet_buffer_waits_total",
            "Writes that waited for a write buffer (back-pressure).",
            stats.buffer_waits,
        ),
        (
            "valet_background_flushes_total",
            "Full write buffers written by the background writer.",
            stats.background_flushes,
        ),
        (
            "valet_inline_syncs_total",
            "Syncs whose small tail went into the journal record.",
            stats.inline_syncs,
        ),
        (
            "valet_defrag_bytes_moved_total",
            "Bytes copied to make fragmented files' extents fewer.",
            stats.defrag_bytes_moved,
        ),
        (
            "valet_allocation_stalls_total",
            "Allocations that waited 10 s for room (each one a stall a guest felt).",
            stats.allocation_stalls,
        ),
        (
            "valet_writebacks_total",
            "Periodic writeback rounds that made unsynced writes durable.",
            stats.writebacks,
        ),
        (
            "valet_handoffs_total",
            "Hand-offs of unsynced writes to the device, with no flush.",
            stats.handoffs,
        ),
        (
            "valet_checksum_failures_total",
            "Written units whose data did not match its checksum when read back.",
            stats.checksum_failures,
        ),
    ] {
        out.family(name, "counter", help);
        out.sample(name, &[], value);
    }
    for (name, help, ns) in [
        (
            "valet_buffer_wait_seconds_total",
            "Time writes waited for a write buffer.",
            stats.buffer_wait_ns,
        ),
        (
            "valet_writeback_seconds_total",
            "Time the writeback rounds took.",
            stats.writeback_ns,
        ),
        (
            "valet_handoff_seconds_total",
            "Time the hand-offs took.",
            stats.handoff_ns,
        ),
    ] {
        out.family(name, "counter", help);
        out.sample(name, &[], seconds(ns));
    }
    let name = "valet_gc_passes_total";
    out.family(
        name,
        "counter",
        "GC passes, by the reclaimer or on an allocating call.",
    );
    out.sample(name, &[("by", "reclaimer")], stats.gc_background_passes);
    out.sample(name, &[("by", "allocation")], stats.gc_foreground_passes);

    for (name, help, value) in [
        ("valet_zones", "Zones of the device.", stats.zones as f64),
        (
            "valet_free_zones",
            "Zones empty and ready to write.",
            stats.free_zones as f64,
        ),
        (
            "valet_zone_capacity_bytes",
            "Writable bytes of a zone.",
            stats.zone_capacity as f64,
        ),
        (
            "valet_live_bytes",
            "Bytes of valid data on the device.",
            stats.live_bytes as f64,
        ),
        (
            "valet_write_amplification",
            "Device bytes per host byte since the mount.",
            stats.waf,
        ),
        (
            "valet_write_amplification_with_metadata",
            "Device and metadata bytes per host byte since the mount.",
            stats.waf_with_meta,
        ),
    ] {
        out.family(name, "gauge", help);
        out.sample(name, &[], value);
    }

    let name = "valet_tenant_names";
    out.family(
        name,
        "gauge",
        "Names (files, directories, links) in a tenant's tree.",
    );
    for t in tenants {
        out.sample(name, &[("tenant", &t.name)], t.names);
    }
    let name = "valet_tenant_guests";
    out.family(name, "gauge", "A tenant's guests running now.");
    for t in tenants {
        out.sample(name, &[("tenant", &t.name)], t.guests);
    }
    type TenantValue = fn(&valet_vfs::TenantStats) -> u64;
    let per_tenant: [(&str, &str, TenantValue); 4] = [
        (
            "valet_tenant_host_bytes_total",
            "Bytes a tenant's guests wrote to zoned files.",
            |t| t.host_bytes,
        ),
        (
            "valet_tenant_device_bytes_total",
            "Bytes written to a tenant's zones.",
            |t| t.device_bytes,
        ),
        (
            "valet_tenant_gc_bytes_moved_total",
            "Bytes GC copied of a tenant's data.",
            |t| t.gc_bytes_moved,
        ),
        (
            "valet_tenant_conventional_bytes_total",
            "Bytes a tenant's guests wrote to conventional-area files.",
            |t| t.conventional_bytes,
        ),
    ];
    for (name, help, value) in per_tenant {
        out.family(name, "counter", help);
        for t in &stats.tenants {
            out.sample(name, &[("tenant", &t.name)], value(t));
        }
    }

    type StreamValue = fn(&valet_vfs::StreamStats) -> u64;
    let per_stream: [(&str, &str, &str, StreamValue); 3] = [
        (
            "valet_stream_host_bytes_total",
            "counter",
            "Bytes a tenant's guests wrote to files of a stream.",
            |s| s.host_bytes,
        ),
        (
            "valet_stream_device_bytes_total",
            "counter",
            "Bytes written to a stream's zones.",
            |s| s.device_bytes,
        ),
        (
            "valet_stream_zones",
            "gauge",
            "Zones a stream owns now.",
            |s| s.zones.into(),
        ),
    ];
    for (name, kind, help, value) in per_stream {
        out.family(name, kind, help);
        for s in &stats.streams {
            let stream = s.stream.to_string();
            let labels = [
                ("tenant", s.tenant_name.as_str()),
                ("stream", stream.as_str()),
            ];
            out.sample(name, &labels, value(s));
        }
    }

    let tenant_name = |id: u32| {
        stats
            .tenants
            .iter()
            .find(|t| t.tenant == id)
            .map(|t| t.name.clone())
            .or_else(|| tenants.get(id as usize).map(|t| t.name.clone()))
            .unwrap_or_else(|| id.to_string())
    };
    type PolicyValue = fn(&valet_vfs::PolicyStats) -> u64;
    let per_policy: [(&str, &str, PolicyValue); 2] = [
        (
            "valet_policy_decisions_total",
            "Placement decisions of a tenant's policy.",
            |p| p.decisions,
        ),
        (
            "valet_policy_faults_total",
            "Policy calls that trapped, timed out or answered nonsense (the default decided).",
            |p| p.faults,
        ),
    ];
    for (name, help, value) in per_policy {
        out.family(name, "counter", help);
        for p in &stats.policies {
            let tenant = tenant_name(p.tenant);
            let labels = [("tenant", tenant.as_str()), ("policy", p.name.as_str())];
            out.sample(name, &labels, value(p));
        }
    }

    let name = "valet_sync_duration_seconds";
    out.family(
        name,
        "histogram",
        "Time of a tenant's successful fsync and fdatasync calls, to durable.",
    );
    for latency in &stats.sync_latency {
        let tenant = [("tenant", latency.name.as_str())];
        let mut cumulative = 0;
        for (i, bound) in SYNC_LATENCY_BOUNDS_NS.iter().enumerate() {
            cumulative += latency.buckets.get(i).copied().unwrap_or(0);
            let le = seconds(*bound).to_string();
            out.sample(
                "valet_sync_duration_seconds_bucket",
                &[tenant[0], ("le", &le)],
                cumulative,
            );
        }
        out.sample(
            "valet_sync_duration_seconds_bucket",
            &[tenant[0], ("le", "+Inf")],
            latency.count,
        );
        out.sample(
            "valet_sync_duration_seconds_sum",
            &tenant,
            seconds(latency.sum_ns),
        );
        out.sample("valet_sync_duration_seconds_count", &tenant, latency.count);
    }
    out.text
}

/// The text being built: one `# HELP` and `# TYPE` per family, then its samples.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', r"\\").replace('\n', r"\n");
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let value = value
                    .replace('\\', r"\\")
                    .replace('"', "\\\"")
                    .replace('\n', r"\n");
                let _ = write!(self.text, "{label}=\"{value}\"");
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use valet_vfs::{SyncLatency, TenantStats};

    #[test]
    fn label_values_are_escaped() {
        let tenants = [TenantGauges {
            name: "a\"b\\c\nd".into(),
            names: 3,
            guests: 1,
        }];
        let text = render(&Stats::default(), &tenants);
        assert!(
            text.contains("valet_tenant_names{tenant=\"a\\\"b\\\\c\\nd\"} 3\n"),
            "{text}"
        );
    }

    #[test]
    fn a_histogram_is_cumulative_and_ends_with_its_count() {
        let mut latency = SyncLatency {
            name: "db".into(),
            ..Default::default()
        };
        for ns in [20_000, 20_000, 3_000_000, 20_000_000_000] {
            latency.record(ns);
        }
        let stats = Stats {
            sync_latency: vec![latency],
            tenants: vec![TenantStats {
                name: "db".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&stats, &[]);
        let bucket = |le: &str| {
            let line = format!("valet_sync_duration_seconds_bucket{{tenant=\"db\",le=\"{le}\"}} ");
            let at = text
                .find(&line)
                .unwrap_or_else(|| panic!("no {line} in {text}"));
            text[at + line.len()..].lines().next().unwrap().to_string()
        };
        assert_eq!(bucket("0.00001"), "0");
        assert_eq!(bucket("0.000025"), "2");
        assert_eq!(bucket("0.0025"), "2");
        assert_eq!(bucket("0.005"), "3");
        assert_eq!(bucket("10"), "3");
        assert_eq!(bucket("+Inf"), "4");
        assert!(text.contains("valet_sync_duration_seconds_count{tenant=\"db\"} 4\n"));
        let sum = text
            .lines()
            .find_map(|l| l.strip_prefix("valet_sync_duration_seconds_sum{tenant=\"db\"} "))
            .unwrap();
        assert!(
            (sum.parse::<f64>().unwrap() - 20.00304).abs() < 1e-9,
            "{sum}"
        );
    }

    /// Every family is announced once, before its samples, and every sample line is a
    /// name, optional labels and a number.
    #[test]
    fn every_sample_belongs_to_a_family_announced_before_it() {
        let stats = Stats {
            tenants: vec![TenantStats {
                name: "t".into(),
                host_bytes: 5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let tenants = [TenantGauges {
            name: "t".into(),
            names: 1,
            guests: 0,
        }];
        let text = render(&stats, &tenants);
        let mut announced = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(announced.insert(name.to_string()), "{name} announced twice");
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap();
            let name = &line[..name_end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|f| announced.contains(*f))
                .unwrap_or(name);
            assert!(announced.contains(family), "{line}: no family announced");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}: not a number");
        }
        assert!(text.contains("valet_tenant_host_bytes_total{tenant=\"t\"} 5\n"));
    }
}
