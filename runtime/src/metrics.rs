//! Prometheus metrics (`valet-run --metrics ADDR`, `valet-run node --metrics ADDR`): the
//! store's stats in the text exposition format, on `GET /metrics` of a listener of its own.
//!
//! The listener is read-only and asks for no token (as node exporters do), so it may listen
//! on any address a scraper reaches, unlike the admin API. A scrape takes the store's lock
//! for about as long as `--stats` does: it copies counters and walks nothing (the names and
//! bytes a tenant holds are counted by the store as they change). Connections are bounded
//! as [`http_serve`] says (10 s for a request's headers, 64 at once).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use valet_vfs::{
    PolicyStats, Stats, StreamStats, SyncLatency, TenantStats, SYNC_LATENCY_BOUNDS_NS,
};

use crate::admin::Registry;
use crate::http_serve::{self, Bounds};

/// What a scrape reports of each tenant beyond the store's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantGauges {
    pub name: String,
    /// Names in its tree (kept as they change: no walk).
    pub names: u64,
    /// Bytes its files hold (kept as they change).
    pub bytes: u64,
    /// Its guests running now.
    pub guests: usize,
    /// Its quota, if it has one: the limit in bytes and the writes refused.
    pub quota: Option<(u64, u64)>,
    /// Its guests' CPU time and the time they spent paused for their CPU limits, if its
    /// guests are metered (every pod of the node agent; `--cpus`).
    pub cpu: Option<(Duration, Duration)>,
    /// The linear memory of its guests running now, and the part of it in RAM, if a guest
    /// of it ever ran here.
    pub memory: Option<(u64, u64)>,
}

/// Binds `addr` and serves `GET /metrics` on a thread of its own until the process ends;
/// returns where it listens (a port of 0 resolved).
pub fn serve(addr: SocketAddr, registry: Arc<Registry>) -> Result<SocketAddr> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the metrics runtime")?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("--metrics {addr}: cannot listen"))?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(health))
        .with_state(registry);
    std::thread::Builder::new()
        .name("valet-metrics".into())
        .spawn(move || runtime.block_on(http_serve::serve(listener, app, Bounds::default())))
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

/// 200 while the store takes writes, 503 with the reason once it refuses them (a failed
/// device flush): a readiness probe's answer.
async fn health(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    match registry.store().health() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

/// The exposition of `registry`'s store now.
pub fn scrape(registry: &Registry) -> String {
    let store = registry.store();
    let guests = registry.guests_running();
    let quotas = registry.quotas();
    let cpu = registry.cpu_accounts();
    let memory = registry.memory_accounts();
    let tenants: Vec<TenantGauges> = store
        .tenants()
        .into_iter()
        .map(|(id, name, _)| TenantGauges {
            names: store.tenant_entries(id).unwrap_or(0),
            bytes: store.tenant_bytes(id).unwrap_or(0),
            guests: guests.get(&name).copied().unwrap_or(0),
            quota: quotas.get(&name).map(|q| (q.limit(), q.refusals())),
            cpu: cpu
                .get(&name)
                .map(|a| (a.used_with(&store.tenant_work(id)), a.paused())),
            memory: memory.get(&name).map(|a| (a.bytes(), a.resident())),
            name,
        })
        .collect();
    let failed = store.health().is_err();
    let mut text = render(&store.stats(), &tenants, failed);
    text.push_str(&process_metrics());
    text
}

/// The standard `process_*` metrics of Prometheus' client libraries, of this process: under
/// the node agent every pod's guest and the store, which the agent's own container (its
/// cgroup) shows too. Read from `/proc/self` and `getrusage`; a figure that cannot be read
/// is left out.
pub fn process_metrics() -> String {
    let mut out = Exposition::default();
    let mut gauge = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(value) = value {
            out.family(name, kind, help);
            out.sample(name, &[], value);
        }
    };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: Vec<f64> = statm
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    gauge(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        cpu_seconds(),
    );
    gauge(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        pages.get(1).map(|p| p * page),
    );
    gauge(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        pages.first().map(|p| p * page),
    );
    gauge(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64),
    );
    gauge(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        max_fds(),
    );
    gauge(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        start_time(),
    );
    out.text
}

fn cpu_seconds() -> Option<f64> {
    // SAFETY: all-zero is a valid rusage, which getrusage fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to a local rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

fn max_fds() -> Option<f64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a pointer to a local rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    Some(limit.rlim_cur as f64)
}

/// The boot time (`btime` of `/proc/stat`) plus the process's start in clock ticks since
/// boot (field 22 of `/proc/self/stat`).
fn start_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which may hold spaces and is closed by the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| boot + ticks / hz as f64)
}

/// A family of samples of `T`: name, type, help text, and each sample's value.
type Family<'a, T> = (&'a str, &'a str, &'a str, fn(&T) -> f64);

/// The text exposition format (version 0.0.4) of `stats`, `tenants`, and whether the
/// store has `failed` (see [`valet_vfs::Store::health`]).
pub fn render(stats: &Stats, tenants: &[TenantGauges], failed: bool) -> String {
    let mut out = Exposition::default();
    let name = "valet_store_failed";
    out.family(
        name,
        "gauge",
        "1 once the store refuses writes (a failed device flush, until it is mounted again).",
    );
    out.sample(name, &[], if failed { 1.0 } else { 0.0 });
    let store: &[Family<Stats>] = &[
        (
            "valet_host_bytes_total",
            "counter",
            "Bytes guests wrote to zoned files.",
            |s| s.host_bytes as f64,
        ),
        (
            "valet_device_bytes_total",
            "counter",
            "Bytes written to data zones: extents padded to blocks, and GC copies.",
            |s| s.device_bytes as f64,
        ),
        (
            "valet_gc_bytes_moved_total",
            "counter",
            "Bytes GC copied out of zones it reclaimed.",
            |s| s.gc_bytes_moved as f64,
        ),
        (
            "valet_metadata_bytes_total",
            "counter",
            "Bytes of journal records and checkpoints.",
            |s| s.meta_bytes as f64,
        ),
        (
            "valet_conventional_bytes_total",
            "counter",
            "Bytes written to conventional-area files (host files, not zones).",
            |s| s.conventional_bytes as f64,
        ),
        ("valet_zone_resets_total", "counter", "Zones reset.", |s| {
            s.zone_resets as f64
        }),
        (
            "valet_zone_finishes_total",
            "counter",
            "Zones finished.",
            |s| s.zone_finishes as f64,
        ),
        (
            "valet_device_flushes_total",
            "counter",
            "Device cache flushes.",
            |s| s.device_syncs as f64,
        ),
        (
            "valet_group_commits_total",
            "counter",
            "Commits run, each one journal write and one flush at most.",
            |s| s.group_commits as f64,
        ),
        (
            "valet_syncs_joined_total",
            "counter",
            "Syncs made durable by a commit another one led.",
            |s| s.syncs_joined as f64,
        ),
        (
            "valet_buffer_waits_total",
            "counter",
            "Writes that waited for a write buffer (back-pressure).",
            |s| s.buffer_waits as f64,
        ),
        (
            "valet_buffer_wait_seconds_total",
            "counter",
            "Time writes waited for a write buffer.",
            |s| seconds(s.buffer_wait_ns),
        ),
        (
            "valet_background_flushes_total",
            "counter",
            "Full write buffers written by the background writer.",
            |s| s.background_flushes as f64,
        ),
        (
            "valet_inline_syncs_total",
            "counter",
            "Syncs whose small tail went into the journal record.",
            |s| s.inline_syncs as f64,
        ),
        (
            "valet_gc_reclaimer_passes_total",
            "counter",
            "GC passes the background reclaimer ran.",
            |s| s.gc_background_passes as f64,
        ),
        (
            "valet_gc_allocation_passes_total",
            "counter",
            "GC passes run on an allocating call (the device full, or the reclaimer behind).",
            |s| s.gc_foreground_passes as f64,
        ),
        (
            "valet_defrag_bytes_moved_total",
            "counter",
            "Bytes copied to make fragmented files' extents fewer.",
            |s| s.defrag_bytes_moved as f64,
        ),
        (
            "valet_defrag_passes_total",
            "counter",
            "Defragmentation passes (by the reclaimer, on syncs, on flushes).",
            |s| (s.defrag_passes + s.defrag_sync_passes + s.defrag_flush_passes) as f64,
        ),
        (
            "valet_allocation_stalls_total",
            "counter",
            "Allocations that waited 10 s for room (each one a stall a guest felt).",
            |s| s.allocation_stalls as f64,
        ),
        (
            "valet_writebacks_total",
            "counter",
            "Periodic writeback rounds that made unsynced writes durable.",
            |s| s.writebacks as f64,
        ),
        (
            "valet_writeback_seconds_total",
            "counter",
            "Time the writeback rounds took.",
            |s| seconds(s.writeback_ns),
        ),
        (
            "valet_handoffs_total",
            "counter",
            "Hand-offs of unsynced writes to the device, with no flush.",
            |s| s.handoffs as f64,
        ),
        (
            "valet_handoff_seconds_total",
            "counter",
            "Time the hand-offs took.",
            |s| seconds(s.handoff_ns),
        ),
        (
            "valet_checksum_failures_total",
            "counter",
            "Written units whose data did not match its checksum when read back.",
            |s| s.checksum_failures as f64,
        ),
        ("valet_zones", "gauge", "Zones of the device.", |s| {
            s.zones.into()
        }),
        (
            "valet_free_zones",
            "gauge",
            "Zones empty and ready to write.",
            |s| s.free_zones.into(),
        ),
        (
            "valet_zone_capacity_bytes",
            "gauge",
            "Writable bytes of a zone.",
            |s| s.zone_capacity as f64,
        ),
        (
            "valet_live_bytes",
            "gauge",
            "Bytes of valid data on the device.",
            |s| s.live_bytes as f64,
        ),
        (
            "valet_write_amplification",
            "gauge",
            "Device bytes per host byte since the mount.",
            |s| s.waf,
        ),
        (
            "valet_write_amplification_with_metadata",
            "gauge",
            "Device and metadata bytes per host byte since the mount.",
            |s| s.waf_with_meta,
        ),
    ];
    out.families(store, std::slice::from_ref(stats), |_| vec![]);

    let gauges: &[Family<TenantGauges>] = &[
        (
            "valet_tenant_names",
            "gauge",
            "Names (files, directories, links) in a tenant's tree.",
            |t| t.names as f64,
        ),
        (
            "valet_tenant_bytes",
            "gauge",
            "Bytes a tenant's files hold (their sizes, each file once, open unlinked files included): what its quota counts.",
            |t| t.bytes as f64,
        ),
        (
            "valet_tenant_guests",
            "gauge",
            "A tenant's guests running now.",
            |t| t.guests as f64,
        ),
    ];
    out.families(gauges, tenants, |t| vec![("tenant", t.name.clone())]);
    let quotas: Vec<(&str, u64, u64)> = tenants
        .iter()
        .filter_map(|t| {
            t.quota
                .map(|(limit, refused)| (t.name.as_str(), limit, refused))
        })
        .collect();
    let quota: &[Family<(&str, u64, u64)>] = &[
        (
            "valet_tenant_quota_bytes",
            "gauge",
            "A tenant's quota: the most bytes its files may hold (tenants with a quota only).",
            |q| q.1 as f64,
        ),
        (
            "valet_tenant_quota_refusals_total",
            "counter",
            "Writes refused with ENOSPC because they would pass the tenant's quota.",
            |q| q.2 as f64,
        ),
    ];
    out.families(quota, &quotas, |q| vec![("tenant", q.0.to_string())]);
    let metered: Vec<(&str, Duration, Duration)> = tenants
        .iter()
        .filter_map(|t| t.cpu.map(|(used, paused)| (t.name.as_str(), used, paused)))
        .collect();
    let cpu: &[Family<(&str, Duration, Duration)>] = &[
        (
            "valet_tenant_cpu_seconds_total",
            "counter",
            "CPU time a tenant's guests used, the store's threads' work for its files included \
             (metered tenants only: every pod of the node agent, guests with --cpus).",
            |c| c.1.as_secs_f64(),
        ),
        (
            "valet_tenant_cpu_throttled_seconds_total",
            "counter",
            "Time a tenant's guest threads spent paused for their CPU limits, summed over threads.",
            |c| c.2.as_secs_f64(),
        ),
    ];
    out.families(cpu, &metered, |c| vec![("tenant", c.0.to_string())]);
    let memory: Vec<(&str, (u64, u64))> = tenants
        .iter()
        .filter_map(|t| t.memory.map(|m| (t.name.as_str(), m)))
        .collect();
    let per_memory: &[Family<(&str, (u64, u64))>] = &[
        (
            "valet_tenant_memory_bytes",
            "gauge",
            "Linear memory of a tenant's guests running now (what a pod's memory limit bounds).",
            |m| m.1 .0 as f64,
        ),
        (
            "valet_tenant_memory_resident_bytes",
            "gauge",
            "The part of valet_tenant_memory_bytes in RAM (pages the guests touched).",
            |m| m.1 .1 as f64,
        ),
    ];
    out.families(per_memory, &memory, |m| vec![("tenant", m.0.to_string())]);

    let per_tenant: &[Family<TenantStats>] = &[
        (
            "valet_tenant_host_bytes_total",
            "counter",
            "Bytes a tenant's guests wrote to zoned files.",
            |t| t.host_bytes as f64,
        ),
        (
            "valet_tenant_device_bytes_total",
            "counter",
            "Bytes written to a tenant's zones.",
            |t| t.device_bytes as f64,
        ),
        (
            "valet_tenant_gc_bytes_moved_total",
            "counter",
            "Bytes GC copied of a tenant's data.",
            |t| t.gc_bytes_moved as f64,
        ),
        (
            "valet_tenant_conventional_bytes_total",
            "counter",
            "Bytes a tenant's guests wrote to conventional-area files.",
            |t| t.conventional_bytes as f64,
        ),
        (
            "valet_tenant_store_cpu_seconds_total",
            "counter",
            "CPU time the store's own threads spent on a tenant's files (device writes of its \
             buffers, hand-offs, GC of its zones); part of valet_tenant_cpu_seconds_total for \
             a metered tenant.",
            |t| t.store_cpu_ns as f64 / 1e9,
        ),
    ];
    out.families(per_tenant, &stats.tenants, |t| {
        vec![("tenant", t.name.clone())]
    });

    let per_stream: &[Family<StreamStats>] = &[
        (
            "valet_stream_host_bytes_total",
            "counter",
            "Bytes a tenant's guests wrote to files of a stream.",
            |s| s.host_bytes as f64,
        ),
        (
            "valet_stream_device_bytes_total",
            "counter",
            "Bytes written to a stream's zones.",
            |s| s.device_bytes as f64,
        ),
        (
            "valet_stream_zones",
            "gauge",
            "Zones a stream owns now.",
            |s| s.zones.into(),
        ),
    ];
    out.families(per_stream, &stats.streams, |s| {
        vec![
            ("tenant", s.tenant_name.clone()),
            ("stream", s.stream.to_string()),
        ]
    });

    let per_policy: &[Family<PolicyStats>] = &[
        (
            "valet_policy_decisions_total",
            "counter",
            "Placement decisions of a tenant's policy.",
            |p| p.decisions as f64,
        ),
        (
            "valet_policy_faults_total",
            "counter",
            "Policy calls that trapped, timed out or answered nonsense (the default decided).",
            |p| p.faults as f64,
        ),
    ];
    out.families(per_policy, &stats.policies, |p| {
        vec![
            ("tenant", p.tenant_name.clone()),
            ("policy", p.name.clone()),
        ]
    });

    let failures: &[Family<SyncLatency>] = &[(
        "valet_sync_failures_total",
        "counter",
        "A tenant's fsync and fdatasync calls that failed (data its guest was told is not durable).",
        |l| l.failures as f64,
    )];
    out.families(failures, &stats.sync_latency, |l| {
        vec![("tenant", l.name.clone())]
    });

    let name = "valet_sync_duration_seconds";
    out.family(
        name,
        "histogram",
        "Time of a tenant's successful fsync and fdatasync calls, to durable.",
    );
    let bucket = format!("{name}_bucket");
    for latency in &stats.sync_latency {
        let tenant = ("tenant", latency.name.as_str());
        let mut cumulative = 0;
        for (i, bound) in SYNC_LATENCY_BOUNDS_NS.iter().enumerate() {
            cumulative += latency.buckets.get(i).copied().unwrap_or(0);
            let le = seconds(*bound).to_string();
            out.sample(&bucket, &[tenant, ("le", &le)], cumulative as f64);
        }
        let count = latency.count as f64;
        out.sample(&bucket, &[tenant, ("le", "+Inf")], count);
        out.sample(&format!("{name}_sum"), &[tenant], seconds(latency.sum_ns));
        out.sample(&format!("{name}_count"), &[tenant], count);
    }
    out.text
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
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

    /// Each of `families`, with a sample of each of `items` labelled by `labels`.
    fn families<T>(
        &mut self,
        families: &[Family<T>],
        items: &[T],
        labels: impl Fn(&T) -> Vec<(&'static str, String)>,
    ) {
        for (name, kind, help, value) in families {
            self.family(name, kind, help);
            for item in items {
                let labels = labels(item);
                let labels: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                self.sample(name, &labels, value(item));
            }
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
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

    #[test]
    fn label_values_are_escaped() {
        let tenants = [TenantGauges {
            name: "a\"b\\c\nd".into(),
            names: 3,
            guests: 1,
            ..Default::default()
        }];
        let text = render(&Stats::default(), &tenants, false);
        assert!(
            text.contains("valet_tenant_names{tenant=\"a\\\"b\\\\c\\nd\"} 3\n"),
            "{text}"
        );
    }

    #[test]
    fn the_process_metrics_are_this_process_s() {
        let text = process_metrics();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
                .parse()
                .unwrap()
        };
        // Touched pages are resident: 128 MiB of them more than before (other tests of
        // this process may free some meanwhile, so the bound is lower).
        let before = value("process_resident_memory_bytes");
        let touched = vec![1u8; 128 << 20];
        let after = process_metrics();
        let resident: f64 = after
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            resident >= before + 100.0 * (1 << 20) as f64,
            "{before} → {resident}"
        );
        drop(std::hint::black_box(touched));
        assert!(value("process_virtual_memory_bytes") >= before);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} at {now}"
        );
        assert!(value("process_cpu_seconds_total") > 0.0);
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
        let text = render(&stats, &[], false);
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
                store_cpu_ns: 250_000_000,
                ..Default::default()
            }],
            ..Default::default()
        };
        let tenants = [
            TenantGauges {
                name: "t".into(),
                names: 1,
                bytes: 700,
                guests: 0,
                quota: Some((1000, 2)),
                cpu: Some((Duration::from_millis(1500), Duration::from_millis(250))),
                memory: Some((3 << 20, 1 << 20)),
            },
            TenantGauges {
                name: "u".into(),
                ..Default::default()
            },
        ];
        let text = render(&stats, &tenants, true) + &process_metrics();
        assert!(text.contains("valet_store_failed 1\n"), "{text}");
        assert!(text.contains("valet_tenant_store_cpu_seconds_total{tenant=\"t\"} 0.25\n"));
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
        assert!(text.contains("valet_tenant_bytes{tenant=\"t\"} 700\n"));
        assert!(text.contains("valet_tenant_quota_bytes{tenant=\"t\"} 1000\n"));
        assert!(text.contains("valet_tenant_quota_refusals_total{tenant=\"t\"} 2\n"));
        assert!(text.contains("valet_tenant_bytes{tenant=\"u\"} 0\n"));
        assert!(
            !text.contains("valet_tenant_quota_bytes{tenant=\"u\"}"),
            "u has no quota"
        );
        assert!(text.contains("valet_tenant_cpu_seconds_total{tenant=\"t\"} 1.5\n"));
        assert!(text.contains("valet_tenant_memory_bytes{tenant=\"t\"} 3145728\n"));
        assert!(text.contains("valet_tenant_memory_resident_bytes{tenant=\"t\"} 1048576\n"));
        assert!(!text.contains("valet_tenant_memory_bytes{tenant=\"u\"}"));
        assert!(text.contains("process_resident_memory_bytes "));
        assert!(text.contains("valet_tenant_cpu_throttled_seconds_total{tenant=\"t\"} 0.25\n"));
        assert!(
            !text.contains("valet_tenant_cpu_seconds_total{tenant=\"u\"}"),
            "u is not metered"
        );
    }
}
