//! CPU limits of guests: a pod's `resources.limits.cpu` (the OCI spec's CPU quota and
//! period), `valet-run --cpus`, a tenant's `cpus`; and the CPU time each tenant's guests
//! use, which the node agent meters for every pod (a pod's CPU is the agent's, so no
//! cgroup of the pod's shows it), limited or not.
//!
//! Guests run as threads of one process (the node agent runs every pod of its node), so
//! the kernel's CPU controller cannot tell one pod's threads from another's, and a thread
//! throttled at an arbitrary instant could be stopped while it holds a lock of the store
//! that other pods' writes wait for. So a guest keeps its limit itself, at safe points:
//! while a metered guest runs, the epoch clock ([`crate::epoch_clock`]) ticks, and at each
//! tick every thread of the guest is interrupted in its own code (at an epoch check: never
//! inside a WASI call, so never holding a lock of the store). It reads its thread's CPU
//! clock, which counts the time its WASI calls took as well, and charges what it used
//! since its last check to the guest's [`CpuBudget`]. A guest over its budget pauses there
//! until the debt is paid, as the kernel's CFS bandwidth control throttles a cgroup: at
//! most `quota` of CPU time per `period`, the overrun of one period charged to the next.
//!
//! Accuracy: a thread is charged at the first tick after it used the time, so a guest may
//! overrun a period by about a tick for each of its busy threads, and pays it back in the
//! next; over several periods it gets its quota. Time a thread waits in a WASI call (a
//! sleep, a read, a flush of its sync) is not CPU time and is not charged. A guest needs
//! an engine with epoch checks ([`crate::host::Stopping::EpochChecks`]) to be limited.
//!
//! The store's own threads work for the guests too: they write full buffers to the device,
//! hand unsynced tails off and collect zones. The store counts that CPU time per tenant
//! ([`TenantWork`]), and a check charges what was counted since the last one as the guest's
//! own time, so a guest that writes fast cannot make the store's threads spend more CPU
//! than its limit allows (measured before: about a whole core under a quarter's limit).
//!
//! Each guest's budget charges its tenant's [`CpuAccount`] too (kept by the admin
//! registry, one per tenant): the CPU time used and the time paused, which the metrics
//! serve. A guest metered without a limit is charged the same way and never pauses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use valet_vfs::{thread_cpu_time, TenantWork};

/// The period of a limit given in cores (`--cpus`), as Kubernetes and Docker set it.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);

/// The longest a paused thread sleeps before it looks again whether its guest is ending
/// (a pod killed while paused ends within about this).
const PAUSE_SLICE: Duration = Duration::from_millis(10);

/// At most `quota` of CPU time in every `period` of wall time, summed over the guest's
/// threads (a quota over the period lets several threads run at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuLimit {
    pub quota: Duration,
    pub period: Duration,
}

impl CpuLimit {
    /// A limit of `quota` per `period`; both must be at least a millisecond (the kernel's
    /// own bounds for `cpu.max`), and the period at most a second.
    pub fn new(quota: Duration, period: Duration) -> Result<CpuLimit, String> {
        let ms = Duration::from_millis(1);
        if quota < ms || period < ms || period > Duration::from_secs(1) {
            return Err(format!(
                "a CPU limit of {quota:?} per {period:?}: the quota must be at least 1 ms and \
                 the period 1 ms to 1 s"
            ));
        }
        Ok(CpuLimit { quota, period })
    }

    /// `cores` cores' worth (`0.5`, `2`), per [`DEFAULT_PERIOD`].
    pub fn cores(cores: f64) -> Result<CpuLimit, String> {
        if !cores.is_finite() || cores <= 0.0 || cores > 1024.0 {
            return Err(format!("{cores} cores: give a number of cores above 0"));
        }
        CpuLimit::new(DEFAULT_PERIOD.mul_f64(cores), DEFAULT_PERIOD)
    }
}

/// Parses `--cpus`: a number of cores (`0.5`, `2`).
pub fn parse_cores(text: &str) -> Result<CpuLimit, String> {
    let cores: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: give a number of cores, such as 0.5 or 2"))?;
    CpuLimit::cores(cores)
}

/// A tenant's CPU time, over all its guests that were metered.
#[derive(Debug, Default)]
pub struct CpuAccount {
    used_ns: AtomicU64,
    paused_ns: AtomicU64,
    /// How much of the store's work for the tenant was charged so far (its
    /// [`TenantWork`] counts on).
    store_seen_ns: AtomicU64,
}

impl CpuAccount {
    /// CPU time the guests' threads were charged.
    pub fn used(&self) -> Duration {
        Duration::from_nanos(self.used_ns.load(Ordering::Relaxed))
    }

    /// Time the guests' threads spent paused for their CPU limits (summed over threads).
    pub fn paused(&self) -> Duration {
        Duration::from_nanos(self.paused_ns.load(Ordering::Relaxed))
    }

    /// CPU time the guests' threads were charged, with the store's `work` for the tenant
    /// that no guest was charged yet (done since their last check, or after they ended):
    /// what the tenant used, as the metrics serve it. Takes nothing from the guests.
    pub fn used_with(&self, work: &TenantWork) -> Duration {
        let seen = self.store_seen_ns.load(Ordering::Relaxed);
        let pending = duration_ns(work.cpu()).saturating_sub(seen);
        self.used() + Duration::from_nanos(pending)
    }

    /// The part of `work` (the store's count for the tenant) not charged yet, taken: each
    /// nanosecond is charged once, whichever of the tenant's guests looks first.
    fn take_store_work(&self, work: &TenantWork) -> Duration {
        let total = duration_ns(work.cpu());
        let seen = self.store_seen_ns.fetch_max(total, Ordering::Relaxed);
        Duration::from_nanos(total.saturating_sub(seen))
    }
}

/// How a guest's CPU time is kept: charged to its tenant's `account`, and held to `limit`
/// when there is one. The store's threads' work for the tenant (`store_work`: the
/// background writer's device writes of its buffers, hand-offs, GC of its zones) is
/// charged as the guest's own: without it a guest limited to a quarter of a core that
/// writes fast kept a whole core busy.
#[derive(Clone, Debug)]
pub struct CpuMetering {
    pub limit: Option<CpuLimit>,
    pub account: Arc<CpuAccount>,
    pub store_work: Option<Arc<TenantWork>>,
}

/// One guest's CPU budget, shared by its threads.
pub struct CpuBudget {
    limit: Option<CpuLimit>,
    account: Arc<CpuAccount>,
    store_work: Option<Arc<TenantWork>>,
    window: Mutex<Window>,
}

/// The current period: when it began, and what was charged against it (the debt of
/// earlier periods included).
struct Window {
    start: Instant,
    charged: u64,
}

impl CpuBudget {
    pub fn new(metering: CpuMetering) -> Arc<CpuBudget> {
        // The store's work for the tenant while none of its guests ran (its last writes'
        // hand-off, GC of its zones) is the tenant's, not this guest's to pay for.
        if let Some(work) = &metering.store_work {
            let before = metering.account.take_store_work(work);
            metering
                .account
                .used_ns
                .fetch_add(duration_ns(before), Ordering::Relaxed);
        }
        Arc::new(CpuBudget {
            limit: metering.limit,
            account: metering.account,
            store_work: metering.store_work,
            window: Mutex::new(Window {
                start: Instant::now(),
                charged: 0,
            }),
        })
    }

    /// Charges `used` CPU time at `now`; returns when the thread that used it may run
    /// again, or `None` when the guest is within its budget (or has no limit).
    fn charge(&self, used: Duration, now: Instant) -> Option<Instant> {
        let used = duration_ns(used);
        self.account.used_ns.fetch_add(used, Ordering::Relaxed);
        let limit = self.limit?;
        let quota = duration_ns(limit.quota);
        let period = duration_ns(limit.period);
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = duration_ns(now.saturating_duration_since(w.start));
        if elapsed >= period {
            // Each period that passed gave a quota back; unused quota is not saved up.
            let periods = elapsed / period;
            w.charged = w.charged.saturating_sub(periods.saturating_mul(quota));
            w.start += Duration::from_nanos(periods * period);
        }
        w.charged = w.charged.saturating_add(used);
        if w.charged <= quota {
            return None;
        }
        let periods = (w.charged - quota).div_ceil(quota);
        Some(w.start + Duration::from_nanos(periods.saturating_mul(period)))
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One thread of a metered guest (one wasmtime store): the thread CPU time it was charged
/// up to. The first check only reads the clock, as a store may be made on another thread
/// than the one that runs it (a threaded guest's main thread).
pub struct ThreadMeter {
    budget: Arc<CpuBudget>,
    charged_to: Option<Duration>,
}

impl ThreadMeter {
    pub fn new(budget: Arc<CpuBudget>) -> ThreadMeter {
        ThreadMeter {
            budget,
            charged_to: None,
        }
    }

    /// At an epoch check of this thread: charges what it used since the last and, while
    /// the guest is over its budget, pauses, unless `ending` says the guest is ending.
    pub fn check(&mut self, ending: impl Fn() -> bool) {
        let now = thread_cpu_time();
        let Some(last) = self.charged_to.replace(now) else {
            return;
        };
        let mut used = now.saturating_sub(last);
        if let Some(work) = &self.budget.store_work {
            used += self.budget.account.take_store_work(work);
        }
        let Some(until) = self.budget.charge(used, Instant::now()) else {
            return;
        };
        let paused = Instant::now();
        while !ending() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(PAUSE_SLICE));
        }
        self.budget
            .account
            .paused_ns
            .fetch_add(duration_ns(paused.elapsed()), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn limited(quota: Duration, period: Duration) -> Arc<CpuBudget> {
        CpuBudget::new(CpuMetering {
            limit: Some(CpuLimit::new(quota, period).unwrap()),
            account: Arc::default(),
            store_work: None,
        })
    }

    #[test]
    fn cores_are_a_quota_per_hundred_milliseconds() {
        let half = parse_cores("0.5").unwrap();
        assert_eq!((half.quota, half.period), (50 * MS, 100 * MS));
        assert_eq!(parse_cores("2").unwrap().quota, 200 * MS);
        for bad in ["0", "-1", "nan", "inf", "lots", "0.001"] {
            assert!(parse_cores(bad).is_err(), "{bad}");
        }
        assert!(CpuLimit::new(10 * MS, 2 * Duration::from_secs(1)).is_err());
    }

    #[test]
    fn a_guest_within_its_quota_runs_on_and_one_over_it_waits_for_the_next_period() {
        let budget = limited(20 * MS, 100 * MS);
        let start = budget.window.lock().unwrap().start;
        assert_eq!(budget.charge(10 * MS, start + 5 * MS), None);
        assert_eq!(budget.charge(10 * MS, start + 15 * MS), None);
        // 25 ms used of 20: the next period pays for the rest.
        assert_eq!(
            budget.charge(5 * MS, start + 25 * MS),
            Some(start + 100 * MS)
        );
        // In the next period, 5 ms are owed already: 15 more are free.
        assert_eq!(budget.charge(15 * MS, start + 110 * MS), None);
        assert_eq!(budget.account.used(), 40 * MS);
    }

    #[test]
    fn a_debt_of_several_quotas_waits_several_periods() {
        let budget = limited(10 * MS, 100 * MS);
        let start = budget.window.lock().unwrap().start;
        // A long WASI call used 35 ms: three more periods pay for 25 of them.
        assert_eq!(
            budget.charge(35 * MS, start + 40 * MS),
            Some(start + 300 * MS)
        );
        // Idle periods do not save quota up: after a second of nothing, one quota.
        let later = start + Duration::from_secs(2);
        assert_eq!(budget.charge(10 * MS, later), None);
        assert!(budget.charge(MS, later + MS).is_some());
    }

    #[test]
    fn a_thread_is_charged_its_own_cpu_time_and_pauses_when_over() {
        let budget = limited(MS, 50 * MS);
        let mut meter = ThreadMeter::new(budget.clone());
        meter.check(|| false);
        let used = || budget.account.used();
        assert_eq!(
            used(),
            Duration::ZERO,
            "the first check only reads the clock"
        );
        let cpu = thread_cpu_time();
        while thread_cpu_time() < cpu + 5 * MS {
            std::hint::black_box(Instant::now());
        }
        let checked = Instant::now();
        meter.check(|| false);
        assert!(used() >= 5 * MS, "{:?}", used());
        assert!(checked.elapsed() >= 20 * MS, "{:?}", checked.elapsed());
        assert!(
            budget.account.paused() >= 20 * MS,
            "{:?}",
            budget.account.paused()
        );
        // A guest that is ending does not wait.
        let mut meter = ThreadMeter::new(budget.clone());
        meter.charged_to = Some(Duration::ZERO);
        let checked = Instant::now();
        meter.check(|| true);
        assert!(checked.elapsed() < 20 * MS, "{:?}", checked.elapsed());
    }

    #[test]
    fn the_stores_work_for_a_tenant_is_charged_once_to_its_guests() {
        let account = Arc::new(CpuAccount::default());
        let work = Arc::new(TenantWork::default());
        // Before any guest of the tenant ran: its account's, no guest's budget.
        work.add(3 * MS);
        let metering = CpuMetering {
            limit: None,
            account: account.clone(),
            store_work: Some(work.clone()),
        };
        let budget = CpuBudget::new(metering.clone());
        assert_eq!(account.used(), 3 * MS);
        assert_eq!(budget.window.lock().unwrap().charged, 0);
        // Two guests of the tenant: whichever looks first takes the new work, once.
        let other = CpuBudget::new(metering);
        let mut meters = [ThreadMeter::new(budget), ThreadMeter::new(other)];
        for m in &mut meters {
            m.check(|| false);
        }
        let before = account.used();
        work.add(5 * MS);
        for m in &mut meters {
            m.check(|| false);
        }
        let charged = account.used() - before;
        // Plus the two checks' own few microseconds of this thread's CPU time.
        assert!(charged >= 5 * MS && charged < 6 * MS, "{charged:?}");
        assert_eq!(account.take_store_work(&work), Duration::ZERO);
        // Work no guest has been charged yet counts for the tenant all the same.
        work.add(2 * MS);
        assert_eq!(account.used_with(&work), account.used() + 2 * MS);
        assert_eq!(account.take_store_work(&work), 2 * MS);
    }

    #[test]
    fn a_guest_without_a_limit_is_charged_and_never_waits() {
        let account = Arc::new(CpuAccount::default());
        let budget = CpuBudget::new(CpuMetering {
            limit: None,
            account: account.clone(),
            store_work: None,
        });
        let start = budget.window.lock().unwrap().start;
        assert_eq!(budget.charge(Duration::from_secs(5), start + MS), None);
        assert_eq!(account.used(), Duration::from_secs(5));
        assert_eq!(account.paused(), Duration::ZERO);
    }
}
