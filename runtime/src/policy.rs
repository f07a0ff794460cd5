//! The policy host: loads placement policies (WebAssembly core modules speaking
//! `policies/ABI.md`), checks them before they take effect, runs them sandboxed and answers
//! the store's placement questions with their decisions.
//!
//! The sandbox: a policy may import nothing (so no WASI and no host calls); every call —
//! the start function, `valet_init`, `valet_place`, `valet_event` — runs on a fuel budget;
//! its memory is capped; its module size is capped. A policy that traps, runs out of fuel or
//! memory, or answers nonsense never reaches the application: that decision is `default`'s,
//! the fault is counted, and the first one is logged. After a fault the instance is thrown
//! away and a fresh one made, so a policy cannot stay wedged in a broken state; but not at
//! once: after each fault in a row the policy rests, its tenant getting `default`'s
//! decisions without a call, for 100 ms doubling up to 60 s ([`backoff`]), so a policy that
//! faults at every call costs a load now and then, not one per call. A load (the start
//! function, the handshake, `valet_init`) has one CPU-time budget for all its steps.
//!
//! A policy runs on the threads of its own tenant only. The store raises some events on its
//! own threads (the background writer's flushes, shared by every tenant): those are queued,
//! a bounded number per tenant, and delivered at the tenant's next call, on its thread;
//! past the bound they are dropped and counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use valet_policy_sdk as abi;
use valet_vfs::{
    is_store_thread, thread_cpu_time, Class, DefaultPlacement, FileEvent, Hint, OpenReason,
    Placement, PlacementRequest,
};
use wasmtime::{
    Cache, CacheConfig, Config, Engine, ExternType, Instance, Memory, Module, Store, StoreLimits,
    StoreLimitsBuilder, TypedFunc, UpdateDeadline, ValType,
};

use crate::epoch_clock::{self, Running};

/// What a policy may use.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Fuel (about one unit per instruction) for each call. Measured on the LSM and cache
    /// traces the tests record (`valet-run policy check NAME --trace T` prints it): the
    /// built-ins use at most 3,900 for a decision (`cachelib`) and 22,500 for an event
    /// (`learn`). The budget is about 40 times that: room for policies that think harder,
    /// and a spinning one is stopped within about a millisecond of CPU.
    pub fuel_per_call: u64,
    /// Bound of each call in milliseconds of the calling thread's CPU time (checked at
    /// epoch ticks): a policy slowed down by anything fuel does not count (bulk memory
    /// operations, memory growth) still answers, or faults, in time. CPU time rather than
    /// wall-clock time, so that a call whose thread the host merely did not run (a loaded
    /// machine, a slow emulated CPU shared by many threads) is not a fault: a fault throws
    /// the instance and its state away. A call runs on the thread of the tenant that asked,
    /// with no store lock held (never on the store's own threads: see the module's doc),
    /// so a slow policy costs its own tenant only.
    pub deadline_ms: u64,
    /// Largest linear memory.
    pub memory_bytes: usize,
    /// Largest module.
    pub module_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel_per_call: 1_000_000,
            deadline_ms: 20,
            memory_bytes: 32 << 20,
            module_bytes: 16 << 20,
        }
    }
}

/// CPU-time bound of loading a policy, all its steps together (each call is bounded by
/// fuel too).
const LOAD_DEADLINE: Duration = Duration::from_secs(2);

/// The first rest after a fault, doubled at each fault in a row up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest rest after faults in a row.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Events raised on the store's own threads that may wait for the tenant's next call.
pub const PENDING_EVENTS: usize = 128;

/// How long a policy rests after `faults` faults in a row (at least one).
pub fn backoff(faults: u32) -> Duration {
    let doublings = faults.saturating_sub(1).min(20);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
}

/// The engine policies run on: fuel metering and epoch deadlines on, nothing else the ABI
/// does not need. Its epoch advances while a policy call runs ([`epoch_clock`]).
///
/// Compiled policies are cached on disk like guests (wasmtime's cache, keyed by the module's
/// bytes and this configuration): every `valet-run` loads the built-ins, and compiling them
/// all took about 0.4 CPU-seconds at each start.
pub fn engine() -> Result<Engine> {
    let mut config = Config::new();
    config.consume_fuel(true);
    config.epoch_interruption(true);
    config.max_wasm_stack(512 << 10);
    config.wasm_threads(false);
    config.cache(Cache::new(CacheConfig::new()).ok());
    let engine = Engine::new(&config)
        .map_err(anyhow::Error::from)
        .context("creating the policy engine")?;
    epoch_clock::register(&engine);
    Ok(engine)
}

/// A checked, compiled policy module.
pub struct PolicyModule {
    pub name: String,
    /// SHA-256 of the module bytes, hex.
    pub sha256: String,
    module: Module,
    limits: Limits,
}

/// SHA-256 of a module's bytes, hex: how the admin API names a policy's version.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn func_type_matches(ty: &ExternType, params: &[ValType], results: &[ValType]) -> bool {
    let ExternType::Func(f) = ty else {
        return false;
    };
    let same = |a: &mut dyn ExactSizeIterator<Item = ValType>, b: &[ValType]| {
        a.len() == b.len() && a.zip(b).all(|(x, y)| ValType::eq(&x, y))
    };
    same(&mut f.params(), params) && same(&mut f.results(), results)
}

impl PolicyModule {
    /// Validates and compiles a policy; every refusal is one line naming the policy.
    pub fn new(engine: &Engine, name: &str, bytes: &[u8], limits: Limits) -> Result<Self> {
        if bytes.len() > limits.module_bytes {
            bail!(
                "policy {name}: {} bytes is over the {}-byte limit for a policy module",
                bytes.len(),
                limits.module_bytes
            );
        }
        // Anything without the binary header is parsed as WAT text; bytes that are neither
        // would otherwise be refused as "not valid utf-8", which hides what is wrong.
        if !bytes.starts_with(b"\0asm") && std::str::from_utf8(bytes).is_err() {
            bail!(
                "policy {name}: not a valid WebAssembly module: no \\0asm header, and not WAT text"
            );
        }
        let module = Module::new(engine, bytes).map_err(|e| {
            let first = format!("{e}");
            anyhow!("policy {name}: not a valid WebAssembly module: {first}")
        })?;
        if let Some(import) = module.imports().next() {
            bail!(
                "policy {name}: imports {}::{}; a policy may import nothing (no WASI, no host calls)",
                import.module(),
                import.name()
            );
        }
        use ValType::I32;
        let required: [(&str, &[ValType], &[ValType]); 3] = [
            ("valet_abi_version", &[], &[I32]),
            ("valet_buffer", &[], &[I32]),
            ("valet_place", &[I32], &[I32]),
        ];
        let optional: [(&str, &[ValType], &[ValType]); 2] =
            [("valet_init", &[I32], &[]), ("valet_event", &[I32], &[])];
        for (export, params, results) in required {
            let ty = module
                .get_export(export)
                .ok_or_else(|| anyhow!("policy {name}: missing export {export}"))?;
            if !func_type_matches(&ty, params, results) {
                bail!("policy {name}: export {export} has the wrong type (see policies/ABI.md)");
            }
        }
        for (export, params, results) in optional {
            if let Some(ty) = module.get_export(export) {
                if !func_type_matches(&ty, params, results) {
                    bail!(
                        "policy {name}: export {export} has the wrong type (see policies/ABI.md)"
                    );
                }
            }
        }
        match module.get_export("memory") {
            Some(ExternType::Memory(m)) => {
                if m.is_shared() || m.is_64() {
                    bail!("policy {name}: memory must be a plain 32-bit memory");
                }
                if m.minimum().saturating_mul(65536) > limits.memory_bytes as u64 {
                    bail!(
                        "policy {name}: memory starts at {} pages, over the {}-byte cap",
                        m.minimum(),
                        limits.memory_bytes
                    );
                }
            }
            _ => bail!("policy {name}: missing export memory"),
        }
        let policy = PolicyModule {
            name: name.to_string(),
            sha256: sha256_hex(bytes),
            module,
            limits,
        };
        // It must also start, answer the ABI version and accept its init, within limits.
        PolicyInstance::new(&policy, 8)?;
        Ok(policy)
    }
}

struct State {
    limits: StoreLimits,
    /// The running call's CPU-time budget and the thread's CPU time when it started.
    cpu_budget: Duration,
    cpu_at_start: Duration,
}

/// Epoch ticks of `budget`, at least one.
fn ticks(budget: Duration) -> u64 {
    (budget.as_millis() / epoch_clock::TICK.as_millis()).max(1) as u64
}

/// The thread's CPU time is only known on it, so the deadline is an epoch deadline set for
/// the wall-clock time of the budget, and when it passes the callback (on the calling
/// thread) looks at the CPU time the call used: a call that used its budget faults, one that
/// waited for a core goes on for what is left of it.
fn watch_cpu_time(store: &mut Store<State>) {
    store.epoch_deadline_callback(|ctx| {
        let st = ctx.data();
        let used = thread_cpu_time().saturating_sub(st.cpu_at_start);
        match st.cpu_budget.checked_sub(used) {
            Some(left) if !left.is_zero() => Ok(UpdateDeadline::Continue(ticks(left))),
            _ => Err(wasmtime::Error::msg(format!(
                "ran past its {} ms of CPU time",
                st.cpu_budget.as_millis()
            ))),
        }
    });
}

/// Arms `store` for one call of at most `budget` of CPU time.
fn arm_deadline(store: &mut Store<State>, budget: Duration) {
    let st = store.data_mut();
    st.cpu_budget = budget;
    st.cpu_at_start = thread_cpu_time();
    store.set_epoch_deadline(ticks(budget));
}

/// Sets the epoch deadline for what is left of the running load's budget (armed once, at
/// its start); an error once it is used up.
fn rearm_load_deadline(store: &mut Store<State>) -> Result<()> {
    let st = store.data();
    let used = thread_cpu_time().saturating_sub(st.cpu_at_start);
    match st.cpu_budget.checked_sub(used) {
        Some(left) if !left.is_zero() => {
            store.set_epoch_deadline(ticks(left));
            Ok(())
        }
        _ => bail!(
            "loading ran past its {} ms of CPU time",
            st.cpu_budget.as_millis()
        ),
    }
}

/// One live instance of a policy.
struct PolicyInstance {
    store: Store<State>,
    memory: Memory,
    buffer: usize,
    place: TypedFunc<i32, i32>,
    event: Option<TypedFunc<i32, ()>>,
    fuel: u64,
    /// CPU time each call may take.
    budget: Duration,
}

impl PolicyInstance {
    fn new(policy: &PolicyModule, max_streams: u32) -> Result<Self> {
        let name = &policy.name;
        let limits = StoreLimitsBuilder::new()
            .memory_size(policy.limits.memory_bytes)
            .instances(1)
            .memories(1)
            .tables(4)
            .table_elements(100_000)
            .build();
        let state = State {
            limits,
            cpu_budget: LOAD_DEADLINE,
            cpu_at_start: Duration::ZERO,
        };
        // Loading runs guest code (the start function, the handshake, `valet_init`).
        let _clock = Running::start();
        let mut store = Store::new(policy.module.engine(), state);
        store.limiter(|s| &mut s.limits);
        let fuel = policy.limits.fuel_per_call;
        let budget = Duration::from_millis(policy.limits.deadline_ms.max(1));
        // Loading (instantiation, the ABI handshake, `valet_init`) runs once, before any
        // placement waits on it: fuel bounds it, and a deadline meant for placement calls
        // would refuse a sound policy in a debug build.
        // One CPU-time budget for all the steps: each step gets what the earlier ones left.
        store.set_fuel(fuel)?;
        watch_cpu_time(&mut store);
        arm_deadline(&mut store, LOAD_DEADLINE);
        let instance = Instance::new(&mut store, &policy.module, &[])
            .map_err(|e| anyhow!("policy {name}: start failed: {}", trap_line(&e)))?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| anyhow!("policy {name}: missing export memory"))?;
        let call = |store: &mut Store<State>, export: &str| -> Result<i32> {
            store.set_fuel(fuel)?;
            rearm_load_deadline(store).map_err(|e| anyhow!("policy {name}: {export}: {e}"))?;
            instance
                .get_typed_func::<(), i32>(&mut *store, export)?
                .call(&mut *store, ())
                .map_err(|e| anyhow!("policy {name}: {export} failed: {}", trap_line(&e)))
        };
        let version = call(&mut store, "valet_abi_version")?;
        if version != abi::ABI_VERSION {
            bail!(
                "policy {name}: speaks ABI version {version}, this host speaks {}",
                abi::ABI_VERSION
            );
        }
        let buffer = call(&mut store, "valet_buffer")? as u32 as usize;
        if buffer % 8 != 0 || buffer + abi::BUFFER_LEN > memory.data_size(&store) {
            bail!("policy {name}: valet_buffer {buffer:#x} is not an aligned 4 KiB region of its memory");
        }
        if let Ok(init) = instance.get_typed_func::<i32, ()>(&mut store, "valet_init") {
            store.set_fuel(fuel)?;
            rearm_load_deadline(&mut store)
                .map_err(|e| anyhow!("policy {name}: valet_init: {e}"))?;
            init.call(&mut store, max_streams as i32)
                .map_err(|e| anyhow!("policy {name}: valet_init failed: {}", trap_line(&e)))?;
        }
        Ok(PolicyInstance {
            place: instance.get_typed_func(&mut store, "valet_place")?,
            event: instance.get_typed_func(&mut store, "valet_event").ok(),
            store,
            memory,
            buffer,
            fuel,
            budget,
        })
    }

    /// Arms the budgets for one call.
    fn arm(&mut self) -> Result<()> {
        self.store.set_fuel(self.fuel)?;
        arm_deadline(&mut self.store, self.budget);
        Ok(())
    }

    /// Fuel the last call used.
    fn used(&self) -> u64 {
        self.fuel - self.store.get_fuel().unwrap_or(0)
    }

    fn buffer(&mut self) -> Result<&mut [u8]> {
        let at = self.buffer;
        self.memory
            .data_mut(&mut self.store)
            .get_mut(at..at + abi::BUFFER_LEN)
            .ok_or_else(|| anyhow!("exchange buffer outside memory"))
    }

    /// The policy's decision, None for "no opinion"; an error for a fault.
    fn place(
        &mut self,
        request: &abi::Request<'_>,
        max_streams: u32,
    ) -> Result<Option<abi::Decision>> {
        let len = request.encode(self.buffer()?);
        let _clock = Running::start();
        self.arm()?;
        let rc = self
            .place
            .call(&mut self.store, len as i32)
            .map_err(|e| anyhow!("valet_place failed: {}", trap_line(&e)))?;
        if rc != 0 {
            return Ok(None);
        }
        abi::Decision::decode(self.buffer()?, max_streams)
            .map(Some)
            .ok_or_else(|| {
                anyhow!(
                    "valet_place answered nonsense (unknown class or stream, or reserved bits set)"
                )
            })
    }

    /// Delivers an event already encoded (see [`abi::Event::encode`]).
    fn event(&mut self, encoded: &[u8]) -> Result<()> {
        let Some(f) = self.event.clone() else {
            return Ok(());
        };
        let len = encoded.len();
        self.buffer()?[..len].copy_from_slice(encoded);
        let _clock = Running::start();
        self.arm()?;
        f.call(&mut self.store, len as i32)
            .map_err(|e| anyhow!("valet_event failed: {}", trap_line(&e)))
    }
}

/// The first line of a trap, which says what happened (the rest is a backtrace).
fn trap_line(e: &wasmtime::Error) -> String {
    let root = e.root_cause().to_string();
    let text = if root.is_empty() { e.to_string() } else { root };
    text.lines().next().unwrap_or("trap").to_string()
}

/// Decisions and faults of one placement, and the most fuel a call of each kind used.
#[derive(Default)]
pub struct Counters {
    pub decisions: AtomicU64,
    /// Calls that faulted, and calls not made because the policy was resting after faults
    /// (`rested` counts those alone): each of them got `default`'s answer.
    pub faults: AtomicU64,
    pub rested: AtomicU64,
    /// Instances made: the first, and one after each fault whose rest is over.
    pub instances: AtomicU64,
    /// Calls into the policy (`valet_place` and `valet_event`).
    pub calls: AtomicU64,
    /// Events raised on a store thread and queued for the tenant's next call, and those
    /// dropped because the queue was full.
    pub events_queued: AtomicU64,
    pub events_dropped: AtomicU64,
    pub max_fuel_place: AtomicU64,
    pub max_fuel_event: AtomicU64,
}

/// The live instance of a placement and its faults in a row.
struct Slot {
    instance: Option<PolicyInstance>,
    /// Faults since the last call that succeeded.
    faults_in_row: u32,
    /// No call into the policy before then.
    resting_until: Option<Instant>,
}

/// A policy as the store's [`Placement`] for one tenant.
pub struct WasmPlacement {
    module: Arc<PolicyModule>,
    slot: Mutex<Slot>,
    /// Events raised on the store's threads, encoded, waiting for the tenant's next call.
    pending: Mutex<VecDeque<Vec<u8>>>,
    max_streams: u32,
    pub counters: Counters,
    logged: AtomicBool,
}

impl WasmPlacement {
    /// An instance of `module` for a device that keeps `max_streams` streams apart.
    pub fn new(module: Arc<PolicyModule>, max_streams: u32) -> Result<Self> {
        let instance = PolicyInstance::new(&module, max_streams)?;
        let counters = Counters::default();
        counters.instances.store(1, Ordering::Relaxed);
        Ok(WasmPlacement {
            module,
            slot: Mutex::new(Slot {
                instance: Some(instance),
                faults_in_row: 0,
                resting_until: None,
            }),
            pending: Mutex::new(VecDeque::new()),
            max_streams,
            counters,
            logged: AtomicBool::new(false),
        })
    }

    pub fn module(&self) -> &Arc<PolicyModule> {
        &self.module
    }

    fn fault(&self, slot: &mut Slot, what: &anyhow::Error) {
        self.counters.faults.fetch_add(1, Ordering::Relaxed);
        slot.faults_in_row = slot.faults_in_row.saturating_add(1);
        slot.resting_until = Some(Instant::now() + backoff(slot.faults_in_row));
        if !self.logged.swap(true, Ordering::Relaxed) {
            eprintln!(
                "valet-run: policy {}: {what}; using the default placement for this call \
                 (later faults are only counted)",
                self.module.name
            );
        }
    }

    fn lock_slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on a live instance, making a fresh one after a fault once the rest after it
    /// is over; None (a fault, counted) while resting or when `f` or the load fails.
    fn with_instance<R>(&self, f: impl FnOnce(&mut PolicyInstance) -> Result<R>) -> Option<R> {
        let mut slot = self.lock_slot();
        if slot
            .resting_until
            .is_some_and(|until| Instant::now() < until)
        {
            self.counters.faults.fetch_add(1, Ordering::Relaxed);
            self.counters.rested.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let slot = &mut *slot;
        if slot.instance.is_none() {
            self.counters.instances.fetch_add(1, Ordering::Relaxed);
            match PolicyInstance::new(&self.module, self.max_streams) {
                Ok(i) => slot.instance = Some(i),
                Err(e) => {
                    self.fault(slot, &e);
                    return None;
                }
            }
        }
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        match f(slot.instance.as_mut().expect("just made")) {
            Ok(r) => {
                slot.faults_in_row = 0;
                slot.resting_until = None;
                Some(r)
            }
            Err(e) => {
                slot.instance = None;
                self.fault(slot, &e);
                None
            }
        }
    }

    /// Calls `valet_event` with an encoded event.
    fn deliver(&self, encoded: &[u8]) {
        self.with_instance(|i| {
            let done = i.event(encoded);
            let used = i.used();
            self.counters
                .max_fuel_event
                .fetch_max(used, Ordering::Relaxed);
            done
        });
    }

    /// Delivers the events the store's threads queued, on the calling (tenant's) thread.
    fn deliver_pending(&self) {
        loop {
            let next = self
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            match next {
                Some(encoded) => self.deliver(&encoded),
                None => return,
            }
        }
    }

    /// Queues an event raised on one of the store's threads for the tenant's next call,
    /// or drops it (counted) when [`PENDING_EVENTS`] already wait.
    fn defer(&self, encoded: Vec<u8>) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.len() < PENDING_EVENTS {
            pending.push_back(encoded);
            self.counters.events_queued.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An event, delivered now on a tenant's thread, queued on a store thread.
    fn event_on(&self, event: &abi::Event<'_>, store_thread: bool) {
        if self.module.module.get_export("valet_event").is_none() {
            return;
        }
        let mut buf = [0u8; abi::BUFFER_LEN];
        let len = event.encode(&mut buf);
        if store_thread {
            self.defer(buf[..len].to_vec());
        } else {
            self.deliver_pending();
            self.deliver(&buf[..len]);
        }
    }
}

fn to_hint(d: abi::Decision) -> Hint {
    Hint {
        class: match d.class {
            abi::Class::Zoned => Class::Zoned,
            abi::Class::Conventional => Class::Conventional,
        },
        stream: d.stream,
        group: d.group,
        group_starts_zone: d.group_starts_zone,
        rotate_mib: d.rotate_mib,
        rotate_secs: d.rotate_secs,
    }
}

impl Placement for WasmPlacement {
    fn place(&self, request: &PlacementRequest<'_>) -> Hint {
        self.counters.decisions.fetch_add(1, Ordering::Relaxed);
        let req = abi::Request {
            tenant: request.tenant,
            reason: match request.reason {
                OpenReason::Create => abi::Reason::Create,
                OpenReason::OpenForWrite => abi::Reason::OpenForWrite,
                OpenReason::Rename => abi::Reason::Rename,
            },
            size: request.size,
            path: request.path,
        };
        self.deliver_pending();
        let decided = self.with_instance(|i| {
            let decision = i.place(&req, self.max_streams);
            let used = i.used();
            self.counters
                .max_fuel_place
                .fetch_max(used, Ordering::Relaxed);
            decision
        });
        match decided {
            Some(Some(decision)) => to_hint(decision),
            _ => DefaultPlacement.place(request),
        }
    }

    fn event(&self, event: &FileEvent<'_>) {
        let ev = match *event {
            FileEvent::Written {
                tenant,
                path,
                bytes,
            } => abi::Event::Written {
                tenant,
                path,
                bytes,
            },
            FileEvent::Synced { tenant, path } => abi::Event::Synced { tenant, path },
            FileEvent::Closed { tenant, path, size } => abi::Event::Closed { tenant, path, size },
            FileEvent::Deleted {
                tenant,
                path,
                hint,
                lifetime_bytes,
                lifetime_secs,
            } => abi::Event::Deleted {
                tenant,
                path,
                lifetime_bytes,
                lifetime_secs,
                stream: hint.stream,
                group: hint.group,
            },
        };
        // The store's threads flush every tenant's data: a policy must not run on them.
        self.event_on(&ev, is_store_thread());
    }

    fn name(&self) -> String {
        self.module.name.clone()
    }

    fn faults(&self) -> u64 {
        self.counters.faults.load(Ordering::Relaxed)
    }

    fn decisions(&self) -> u64 {
        self.counters.decisions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy with no opinion whose `valet_event` is `event_body`.
    fn placement(event_body: &str) -> WasmPlacement {
        let text = format!(
            r#"(module
              (memory (export "memory") 1)
              (func (export "valet_abi_version") (result i32) i32.const 1)
              (func (export "valet_buffer") (result i32) i32.const 1024)
              (func (export "valet_place") (param i32) (result i32) i32.const 1)
              (func (export "valet_event") (param i32) {event_body}))"#
        );
        let bytes = wat::parse_str(text).unwrap();
        let module = PolicyModule::new(&engine().unwrap(), "hostile", &bytes, Limits::default());
        WasmPlacement::new(Arc::new(module.unwrap()), 8).unwrap()
    }

    fn closed(path: &str) -> FileEvent<'_> {
        FileEvent::Closed {
            tenant: 0,
            path,
            size: 1,
        }
    }

    fn count(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    #[test]
    fn rests_grow_with_the_faults_in_a_row() {
        assert_eq!(backoff(1), BACKOFF_FIRST);
        assert_eq!(backoff(2), BACKOFF_FIRST * 2);
        assert_eq!(backoff(4), BACKOFF_FIRST * 8);
        assert_eq!(backoff(30), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    /// A policy whose every event traps is not called, nor made again, at every event:
    /// it rests after each fault, and the calls meanwhile count as faults.
    #[test]
    fn a_faulting_policy_rests_instead_of_loading_at_every_call() {
        let p = placement("unreachable");
        for i in 0..200 {
            p.event(&closed(&format!("{i}.log")));
        }
        let (calls, instances) = (count(&p.counters.calls), count(&p.counters.instances));
        // Without rests: 200 calls and 200 instances. With them, one per rest that ended,
        // and each rest is twice the one before.
        assert!(calls <= 10, "{calls} calls");
        assert!(instances <= 10, "{instances} instances");
        assert_eq!(p.faults(), 200);
        assert_eq!(count(&p.counters.rested), 200 - calls);
    }

    /// A call that succeeds ends the rests: the next fault rests the shortest time again.
    #[test]
    fn a_successful_call_ends_the_faults_in_a_row() {
        let p = placement("");
        p.lock_slot().faults_in_row = 5;
        p.event(&closed("a.log"));
        let slot = p.lock_slot();
        assert_eq!((slot.faults_in_row, slot.resting_until), (0, None));
    }

    /// Events raised on the store's threads never call the policy there: they wait for the
    /// tenant's next call (a bounded number; the rest dropped and counted).
    #[test]
    fn events_on_store_threads_wait_for_the_tenants_next_call() {
        let p = placement("");
        let raised = PENDING_EVENTS as u64 + 50;
        for i in 0..raised {
            let path = format!("{i}.log");
            let ev = abi::Event::Closed {
                tenant: 0,
                path: &path,
                size: 1,
            };
            p.event_on(&ev, true);
        }
        assert_eq!(count(&p.counters.calls), 0, "no call on a store thread");
        assert_eq!(count(&p.counters.events_queued), PENDING_EVENTS as u64);
        assert_eq!(count(&p.counters.events_dropped), 50);
        p.place(&PlacementRequest {
            tenant: 0,
            path: "x.log",
            reason: OpenReason::Create,
            size: 0,
        });
        // The queued events, then the decision.
        assert_eq!(count(&p.counters.calls), PENDING_EVENTS as u64 + 1);
        assert!(p.pending.lock().unwrap().is_empty());
    }

    /// On a tenant's own thread an event calls the policy at once.
    #[test]
    fn events_on_a_tenants_thread_call_the_policy_at_once() {
        assert!(!is_store_thread());
        let p = placement("");
        p.event(&closed("a.log"));
        assert_eq!(count(&p.counters.calls), 1);
    }
}
