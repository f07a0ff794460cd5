//! The registry of loaded policies: which modules are loaded, which tenant uses which, and
//! the trace recorder their calls feed. The admin server and `valet-run` itself change it;
//! the store asks the placement it hands out. It also counts the guests running per tenant
//! (`valet-run`'s, its tenants', the node agent's pods), so that the admin API removes a
//! tenant's files only while none runs, unless forced, and keeps each tenant's quota.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use valet_vfs::{Store, TenantId};
use wasmtime::Engine;

use crate::cpu_limit::CpuAccount;
use crate::guest_memory::MemoryAccount;
use crate::policy::{self, Limits, PolicyModule, WasmPlacement};
use crate::quota::Quota;
use crate::remove::{self, Removal, RemoveRequest, TenantBusy, TenantUsage};
use crate::trace::{Recorder, TraceOut};

/// A loaded policy as the API lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub sha256: String,
    pub tenants: Vec<String>,
}

/// Most policy modules loaded at once (built-ins compiled on use count too): each holds its
/// compiled code, so uploads cannot grow the process without bound.
pub const MAX_POLICIES: usize = 64;

/// A policy neither loaded nor built in.
#[derive(Debug)]
pub struct NoPolicy(pub String);

impl std::fmt::Display for NoPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no policy named {} is loaded", self.0)
    }
}

impl std::error::Error for NoPolicy {}

/// An upload refused because [`MAX_POLICIES`] are loaded.
#[derive(Debug)]
pub struct TooManyPolicies;

impl std::fmt::Display for TooManyPolicies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{MAX_POLICIES} policy modules are loaded, the most this process keeps: \
             delete one no tenant uses first (DELETE /policies/NAME)"
        )
    }
}

impl std::error::Error for TooManyPolicies {}

/// A policy that cannot be deleted because tenants use it.
#[derive(Debug)]
pub struct PolicyInUse {
    pub policy: String,
    pub tenants: Vec<String>,
}

impl std::fmt::Display for PolicyInUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "policy {} is the policy of {}: activate another for them first",
            self.policy,
            self.tenants.join(", ")
        )
    }
}

impl std::error::Error for PolicyInUse {}

/// The policy a tenant runs: its name and the module its placement was made from.
struct Active {
    policy: String,
    module: Arc<PolicyModule>,
}

/// Loaded policies and which tenant uses which.
pub struct Registry {
    engine: Engine,
    pub(super) limits: Limits,
    store: Store,
    max_streams: u32,
    modules: Mutex<BTreeMap<String, Arc<PolicyModule>>>,
    /// Built-ins not compiled yet: each is compiled the first time it is named, so a start
    /// loads only the policies it uses.
    builtins: Mutex<BTreeMap<String, &'static [u8]>>,
    /// Each tenant's policy. Held while a placement is swapped in, so that the store's
    /// placement and this map change together.
    active: Mutex<BTreeMap<String, Active>>,
    recorder: Mutex<Option<(TraceOut, Instant)>>,
    /// Guests running now, by tenant. Only ever held for a moment, so that the counts
    /// (`GET /tenants`, `/metrics`) never wait behind a removal.
    guests: Mutex<BTreeMap<String, usize>>,
    /// Held for a whole removal, and by a guest's start: a guest that starts meanwhile
    /// waits for the removal to end. Lock order: `removing`, then `guests`.
    removing: Mutex<()>,
    /// Each tenant's quota, by tenant name: one per tenant, shared by its guests.
    quotas: Mutex<BTreeMap<String, Arc<Quota>>>,
    /// The CPU time of each tenant whose guests are metered, by tenant name.
    cpu: Mutex<BTreeMap<String, Arc<CpuAccount>>>,
    /// The linear memory of each tenant's running guests, by tenant name.
    memory: Mutex<BTreeMap<String, Arc<MemoryAccount>>>,
}

/// A guest counted as running (see [`Registry::guest_running`]) until this is dropped.
pub struct RunningGuest {
    registry: Arc<Registry>,
    tenant: String,
}

impl Drop for RunningGuest {
    fn drop(&mut self) {
        let mut guests = self.registry.lock_guests();
        if let Some(n) = guests.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                guests.remove(&self.tenant);
            }
        }
    }
}

impl Registry {
    /// A registry for `store`, whose device keeps `max_streams` streams apart per tenant.
    pub fn new(store: Store, max_streams: u32, limits: Limits) -> Result<Arc<Self>> {
        Ok(Arc::new(Registry {
            engine: policy::engine()?,
            limits,
            store,
            max_streams,
            modules: Mutex::new(BTreeMap::new()),
            builtins: Mutex::new(BTreeMap::new()),
            active: Mutex::new(BTreeMap::new()),
            recorder: Mutex::new(None),
            guests: Mutex::new(BTreeMap::new()),
            removing: Mutex::new(()),
            quotas: Mutex::new(BTreeMap::new()),
            cpu: Mutex::new(BTreeMap::new()),
            memory: Mutex::new(BTreeMap::new()),
        }))
    }

    /// A registry holding the built-in policies, ready to use by name (each compiled when
    /// first used).
    pub fn with_builtins(store: Store, max_streams: u32, limits: Limits) -> Result<Arc<Self>> {
        let registry = Registry::new(store, max_streams, limits)?;
        registry.lock_builtins().extend(
            valet_policies::BUILTIN
                .iter()
                .map(|(name, bytes)| (name.to_string(), *bytes)),
        );
        Ok(registry)
    }

    /// The policy loaded as `name`, compiling it first if it is a built-in not used yet.
    fn loaded(&self, name: &str) -> Result<Option<Arc<PolicyModule>>> {
        if let Some(module) = self.lock_modules().get(name) {
            return Ok(Some(module.clone()));
        }
        let Some(bytes) = self.lock_builtins().get(name).copied() else {
            return Ok(None);
        };
        let module = Arc::new(PolicyModule::new(&self.engine, name, bytes, self.limits)?);
        let mut builtins = self.lock_builtins();
        let mut modules = self.lock_modules();
        // Unless a module was loaded under this name meanwhile (it came later, so it wins)
        // or another call compiled the built-in first.
        if builtins.remove(name).is_some() {
            modules.insert(name.to_string(), module);
        }
        Ok(modules.get(name).cloned())
    }

    /// Whether a policy of that name is loaded or built in.
    fn knows(&self, name: &str) -> bool {
        let builtins = self.lock_builtins();
        builtins.contains_key(name) || self.lock_modules().contains_key(name)
    }

    // Lock order: `active`, then `builtins`, then `modules`.
    fn lock_builtins(&self) -> MutexGuard<'_, BTreeMap<String, &'static [u8]>> {
        self.builtins.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_modules(&self) -> MutexGuard<'_, BTreeMap<String, Arc<PolicyModule>>> {
        self.modules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records every placement call of the tenants activated from now on into `out`.
    pub fn record_into(&self, out: TraceOut) {
        *self.recorder.lock().unwrap_or_else(|p| p.into_inner()) = Some((out, Instant::now()));
    }

    /// Loads what `--policy` names: a `.wasm` (or `.wat` text) file, loaded under its file
    /// stem, or a policy already loaded (a built-in). Returns the policy's name.
    pub fn resolve(&self, spec: &str) -> Result<String> {
        match PolicySpec::parse(spec, |name| self.knows(name)) {
            PolicySpec::File { path, name } => {
                self.load(&name, &read_policy(path)?)?;
                Ok(name)
            }
            PolicySpec::Name(name) if self.knows(&name) => Ok(name),
            PolicySpec::Name(name) => {
                let builtins = self.lock_builtins();
                let modules = self.lock_modules();
                let known = builtins.keys().chain(modules.keys());
                Err(unknown(&name, known.map(String::as_str)))
            }
        }
    }

    /// Validates and loads a module as `name` (replacing a policy of that name for later
    /// activations; tenants using the old one keep it until they are switched).
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<Arc<PolicyModule>> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!("policy name {name:?} must be letters, digits, '-', '_' or '.'");
        }
        let full = |modules: &BTreeMap<String, Arc<PolicyModule>>| {
            modules.len() >= MAX_POLICIES && !modules.contains_key(name)
        };
        if full(&self.lock_modules()) {
            return Err(TooManyPolicies.into());
        }
        let module = Arc::new(PolicyModule::new(&self.engine, name, bytes, self.limits)?);
        // A module loaded under a built-in's name replaces the built-in.
        let mut builtins = self.lock_builtins();
        let mut modules = self.lock_modules();
        if full(&modules) {
            return Err(TooManyPolicies.into());
        }
        builtins.remove(name);
        modules.insert(name.to_string(), module.clone());
        Ok(module)
    }

    /// Unloads a policy no tenant uses (a built-in's name goes back to the built-in).
    /// Errors: [`NoPolicy`], [`PolicyInUse`].
    pub fn unload(&self, name: &str) -> Result<()> {
        let active = self.lock_active();
        let users: Vec<String> = active
            .iter()
            .filter(|(_, a)| a.policy == name)
            .map(|(t, _)| t.clone())
            .collect();
        if !users.is_empty() {
            return Err(PolicyInUse {
                policy: name.to_string(),
                tenants: users,
            }
            .into());
        }
        let mut builtins = self.lock_builtins();
        if self.lock_modules().remove(name).is_none() {
            return Err(NoPolicy(name.to_string()).into());
        }
        if let Some((_, bytes)) = valet_policies::BUILTIN.iter().find(|(n, _)| *n == name) {
            builtins.insert(name.to_string(), *bytes);
        }
        Ok(())
    }

    fn lock_active(&self) -> MutexGuard<'_, BTreeMap<String, Active>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes a loaded policy the tenant's placement from now on, creating the tenant if
    /// it is new (`valet-run`'s tenants, the node agent's pods). Activating the module the
    /// tenant already runs changes nothing: its instance, and what it learned, stay.
    /// Returns whether the placement was swapped.
    pub fn activate(&self, tenant: &str, policy: &str) -> Result<bool> {
        let module = self.module(policy)?;
        let (id, _) = self.store.tenant(tenant)?;
        self.swap(tenant, id, policy, module)
    }

    /// [`Registry::activate`] for a tenant the store already has (the admin API: naming a
    /// tenant must not create one). Errors: [`NoTenant`](crate::remove::NoTenant),
    /// [`NoPolicy`], or the policy failing to load, or the store failing.
    pub fn activate_existing(&self, tenant: &str, policy: &str) -> Result<bool> {
        let (id, _) = remove::existing_tenant(&self.store, tenant)?;
        let module = self.module(policy)?;
        self.swap(tenant, id, policy, module)
    }

    fn swap(
        &self,
        tenant: &str,
        id: TenantId,
        policy: &str,
        module: Arc<PolicyModule>,
    ) -> Result<bool> {
        let runs = |active: &BTreeMap<String, Active>| {
            active
                .get(tenant)
                .is_some_and(|a| a.policy == policy && Arc::ptr_eq(&a.module, &module))
        };
        if runs(&self.lock_active()) {
            return Ok(false);
        }
        // Loading the instance runs the policy's start code: not under the lock.
        let mut placement: Arc<dyn valet_vfs::Placement> =
            Arc::new(WasmPlacement::new(module.clone(), self.max_streams)?);
        if let Some((out, start)) = &*self.recorder.lock().unwrap_or_else(|p| p.into_inner()) {
            placement = Arc::new(Recorder::new(placement, out.clone(), *start));
        }
        let mut active = self.lock_active();
        if runs(&active) {
            return Ok(false);
        }
        // Unloaded meanwhile: a tenant must not run a policy the registry no longer lists.
        let listed = self
            .lock_modules()
            .get(policy)
            .is_some_and(|m| Arc::ptr_eq(m, &module));
        if !listed {
            return Err(NoPolicy(policy.to_string()).into());
        }
        self.store.set_placement(id, placement);
        active.insert(
            tenant.to_string(),
            Active {
                policy: policy.to_string(),
                module,
            },
        );
        Ok(true)
    }

    /// A loaded policy by name ([`NoPolicy`] if there is none).
    pub fn module(&self, name: &str) -> Result<Arc<PolicyModule>> {
        self.loaded(name)?
            .ok_or_else(|| NoPolicy(name.to_string()).into())
    }

    pub fn list(&self) -> Vec<PolicyInfo> {
        let active: Vec<(String, String)> = self
            .lock_active()
            .iter()
            .map(|(t, a)| (t.clone(), a.policy.clone()))
            .collect();
        let info = |name: &str, sha256: String| PolicyInfo {
            name: name.to_string(),
            sha256,
            tenants: active
                .iter()
                .filter(|(_, p)| p.as_str() == name)
                .map(|(t, _)| t.clone())
                .collect(),
        };
        let builtins = self.lock_builtins();
        let mut all: Vec<PolicyInfo> = builtins
            .iter()
            .map(|(name, bytes)| info(name, policy::sha256_hex(bytes)))
            .collect();
        all.extend(
            self.lock_modules()
                .values()
                .map(|m| info(&m.name, m.sha256.clone())),
        );
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn lock_removing(&self) -> MutexGuard<'_, ()> {
        self.removing.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_guests(&self) -> MutexGuard<'_, BTreeMap<String, usize>> {
        self.guests.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The quota of tenant `name` (`tenant` on the store), made at its first guest with a
    /// quota and shared by the later ones; the latest `limit` holds.
    pub fn quota(&self, name: &str, tenant: TenantId, limit: u64) -> Arc<Quota> {
        let mut quotas = self.quotas.lock().unwrap_or_else(|p| p.into_inner());
        let q = quotas
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Quota::new(self.store.clone(), tenant, limit)));
        q.set_limit(limit);
        q.clone()
    }

    /// The quota of tenant `name`, if a guest of it ever had one.
    pub fn quota_of(&self, name: &str) -> Option<Arc<Quota>> {
        let quotas = self.quotas.lock().unwrap_or_else(|p| p.into_inner());
        quotas.get(name).cloned()
    }

    /// Every tenant's quota, by tenant name (tenants without one left out).
    pub fn quotas(&self) -> BTreeMap<String, Arc<Quota>> {
        self.quotas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The CPU account of tenant `name`, made at its first metered guest.
    pub fn cpu_account(&self, name: &str) -> Arc<CpuAccount> {
        let mut accounts = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        accounts.entry(name.to_string()).or_default().clone()
    }

    /// Every metered tenant's CPU account, by tenant name.
    pub fn cpu_accounts(&self) -> BTreeMap<String, Arc<CpuAccount>> {
        self.cpu.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The memory account of tenant `name`, made at its first guest.
    pub fn memory_account(&self, name: &str) -> Arc<MemoryAccount> {
        let mut accounts = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        accounts.entry(name.to_string()).or_default().clone()
    }

    /// Every tenant's memory account that a guest ever joined, by tenant name.
    pub fn memory_accounts(&self) -> BTreeMap<String, Arc<MemoryAccount>> {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many guests of each tenant run now (tenants with none may be left out).
    pub fn guests_running(&self) -> BTreeMap<String, usize> {
        self.lock_guests().clone()
    }

    /// Counts a guest of `tenant` as running until the mark is dropped (waits while a
    /// removal runs).
    pub fn guest_running(self: &Arc<Self>, tenant: &str) -> RunningGuest {
        let _no_removal = self.lock_removing();
        *self.lock_guests().entry(tenant.to_string()).or_default() += 1;
        RunningGuest {
            registry: self.clone(),
            tenant: tenant.to_string(),
        }
    }

    /// Every tenant of the store with its use, its guests running now and its quota.
    pub fn tenants(&self) -> Result<Vec<TenantUsage>> {
        let mut all = TenantUsage::of_store(&self.store)?;
        let quotas = self.quotas();
        let guests = self.guests_running();
        for t in &mut all {
            t.guests = guests.get(&t.name).copied().unwrap_or(0);
            t.quota = quotas.get(&t.name).map(|q| q.limit());
        }
        Ok(all)
    }

    /// Removes what `request` names in `tenant`'s namespace and makes the removal durable
    /// (the metadata only: other files' buffered data stays where it is). Refused with
    /// [`TenantBusy`] while a guest of the tenant runs, unless forced; no guest starts
    /// until it is done.
    pub fn remove(&self, tenant: &str, request: &RemoveRequest) -> Result<Removal> {
        let _no_guest_starts = self.lock_removing();
        let running = self.lock_guests().get(tenant).copied().unwrap_or(0);
        if running > 0 && !request.force {
            return Err(TenantBusy {
                tenant: tenant.to_string(),
                guests: running,
            }
            .into());
        }
        let removal = remove::remove(&self.store, tenant, &request.path, request.recursive)
            .with_context(|| format!("rm {}", request.path))?;
        self.store
            .sync_metadata()
            .context("committing the removal")?;
        Ok(removal)
    }

    /// Streams a policy may use on this device: the active zones the store may fill at once.
    pub fn streams_for(store: &Store) -> u32 {
        store
            .device()
            .geometry()
            .max_active
            .saturating_sub(2)
            .max(1)
    }
}

/// What a policy named on the command line or in the admin API is.
enum PolicySpec<'a> {
    /// A module file (`.wasm`, `.wat` text, or any path with a `/`), loaded under its stem.
    File { path: &'a Path, name: String },
    /// A policy loaded or built in, by name.
    Name(String),
}

impl<'a> PolicySpec<'a> {
    /// `known` tells the names of policies loaded or built in: `rocks.wasm` where no such
    /// file exists is the built-in `rocks`.
    fn parse(spec: &'a str, known: impl Fn(&str) -> bool) -> Self {
        let path = Path::new(spec);
        if !(spec.ends_with(".wasm") || spec.ends_with(".wat") || spec.contains('/')) {
            return PolicySpec::Name(spec.to_string());
        }
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        if !path.exists() && !spec.contains('/') {
            if let Some(stem) = stem.clone().filter(|s| known(s)) {
                return PolicySpec::Name(stem);
            }
        }
        let name = stem.unwrap_or_else(|| spec.to_string());
        PolicySpec::File { path, name }
    }
}

fn read_policy(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read policy {}", path.display()))
}

fn unknown<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> anyhow::Error {
    let mut known: Vec<&str> = known.collect();
    known.sort();
    anyhow!(
        "no policy named {name} (known: {}; or give a FILE.wasm)",
        known.join(", ")
    )
}

/// Checks a policy named on the command line (`--policy`, a tenants file's `policy`)
/// before any store is mounted, so that a mistake there creates nothing on disk: a
/// built-in's name, or a module file that reads and passes [`PolicyModule::new`]. The
/// registry that uses it compiles it again, from the policy engine's cache.
pub fn check_before_mount(spec: &str, limits: Limits) -> Result<()> {
    let builtin = |name: &str| valet_policies::BUILTIN.iter().any(|(n, _)| *n == name);
    match PolicySpec::parse(spec, builtin) {
        PolicySpec::File { path, name } => {
            PolicyModule::new(&policy::engine()?, &name, &read_policy(path)?, limits)?;
            Ok(())
        }
        PolicySpec::Name(name) if builtin(&name) => Ok(()),
        PolicySpec::Name(name) => Err(unknown(
            &name,
            valet_policies::BUILTIN.iter().map(|(n, _)| *n),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use valet_vfs::device::{Geometry, MemoryDevice};
    use valet_vfs::StoreConfig;

    fn registry() -> Arc<Registry> {
        let geometry = Geometry {
            zone_count: 16,
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            block_size: 4096,
            max_open: 6,
            max_active: 6,
        };
        let device = Arc::new(MemoryDevice::new(geometry).unwrap());
        let store = Store::open(device, StoreConfig::default()).unwrap();
        Registry::with_builtins(store, 4, Limits::default()).unwrap()
    }

    fn builtin(name: &str) -> &'static [u8] {
        valet_policies::BUILTIN
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, bytes)| *bytes)
            .unwrap()
    }

    #[test]
    fn built_ins_are_compiled_when_first_used() {
        let registry = registry();
        assert!(registry.lock_modules().is_empty(), "none compiled at start");
        let listed: Vec<String> = registry.list().into_iter().map(|p| p.name).collect();
        let all: Vec<&str> = valet_policies::BUILTIN.iter().map(|(n, _)| *n).collect();
        assert_eq!(listed.len(), all.len(), "{listed:?}");
        assert_eq!(registry.resolve("rocks").unwrap(), "rocks");
        assert_eq!(registry.resolve("rocks.wasm").unwrap(), "rocks");
        assert!(
            registry.lock_modules().is_empty(),
            "naming one compiles nothing"
        );
        registry.activate("app", "rocks").unwrap();
        let compiled: Vec<String> = registry.lock_modules().keys().cloned().collect();
        assert_eq!(compiled, ["rocks"]);
        let info = registry.list().into_iter().find(|p| p.name == "rocks");
        assert_eq!(info.unwrap().tenants, ["app"]);
        assert!(registry.resolve("no-such-policy").is_err());
    }

    /// Every pod start activates its tenant's policy: the one it runs already stays, with
    /// its instance and whatever it learned; another one, or a new version, is swapped in.
    #[test]
    fn activating_the_policy_a_tenant_runs_keeps_its_instance() {
        let registry = registry();
        let store = registry.store().clone();
        assert!(
            registry.activate("app", "rocks").unwrap(),
            "first: swapped in"
        );
        let (_, root) = store.tenant("app").unwrap();
        // A fresh placement starts counting its decisions from 0.
        let decisions = |name: &str| {
            let f = store.open_file(root, name, valet_vfs::OpenOptions::create());
            f.unwrap().close().unwrap();
            let stats = store.stats();
            let p = stats.policies.iter().find(|p| p.name == "rocks").unwrap();
            p.decisions
        };
        assert_eq!(decisions("1.log"), 1);
        assert!(!registry.activate("app", "rocks").unwrap(), "same: kept");
        assert_eq!(decisions("2.log"), 2, "the same instance");
        registry.load("rocks", builtin("default")).unwrap();
        assert!(
            registry.activate("app", "rocks").unwrap(),
            "a new version: swapped"
        );
        assert_eq!(decisions("3.log"), 1, "a new instance");
        assert!(registry.activate("app", "default").unwrap());
    }

    /// The admin API names tenants that must exist; unknown names are typed errors.
    #[test]
    fn activating_through_the_api_needs_an_existing_tenant() {
        let registry = registry();
        let e = registry.activate_existing("ghost", "rocks").unwrap_err();
        assert!(e.is::<crate::remove::NoTenant>(), "{e:#}");
        assert!(registry
            .store()
            .tenants()
            .iter()
            .all(|(_, n, _)| n != "ghost"));
        registry.store().tenant("app").unwrap();
        let e = registry.activate_existing("app", "nope").unwrap_err();
        assert!(e.is::<NoPolicy>(), "{e:#}");
        assert!(registry.activate_existing("app", "rocks").unwrap());
    }

    #[test]
    fn uploads_stop_at_the_cap_and_unused_policies_unload() {
        let registry = registry();
        let bytes = builtin("default");
        for i in 0..MAX_POLICIES {
            registry.load(&format!("p{i}"), bytes).unwrap();
        }
        let e = registry
            .load("one-more", bytes)
            .err()
            .expect("over the cap");
        assert!(e.is::<TooManyPolicies>(), "{e:#}");
        registry
            .load("p0", bytes)
            .expect("replacing one is no new module");
        registry.activate("app", "p1").unwrap();
        assert!(registry.unload("p1").unwrap_err().is::<PolicyInUse>());
        assert!(registry.unload("nope").unwrap_err().is::<NoPolicy>());
        registry.unload("p0").unwrap();
        registry.load("one-more", bytes).unwrap();
        assert!(registry
            .module("p0")
            .err()
            .expect("unloaded")
            .is::<NoPolicy>());
    }

    /// A removal holds off guests' starts, not the counts of those running.
    #[test]
    fn counts_of_running_guests_do_not_wait_behind_a_removal() {
        let registry = registry();
        let guest = registry.guest_running("app");
        let removal = registry.lock_removing();
        // With the removal's lock held here, these return at once (they used to take it).
        assert_eq!(registry.guests_running().get("app"), Some(&1));
        assert!(registry.tenants().is_ok());
        drop(guest);
        assert_eq!(registry.guests_running().get("app"), None);
        drop(removal);
    }

    #[test]
    fn a_module_loaded_under_a_built_ins_name_replaces_it() {
        let registry = registry();
        registry.load("rocks", builtin("default")).unwrap();
        let sha = policy::sha256_hex(builtin("default"));
        assert_eq!(registry.module("rocks").unwrap().sha256, sha);
        let listed = registry.list();
        let rocks: Vec<&PolicyInfo> = listed.iter().filter(|p| p.name == "rocks").collect();
        assert_eq!(rocks.len(), 1, "{listed:?}");
        assert_eq!(rocks[0].sha256, sha);
    }
}
