//! The registry of loaded policies: which modules are loaded, which tenant uses which, and
//! the trace recorder their calls feed. The admin server and `valet-run` itself change it;
//! the store asks the placement it hands out.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use valet_vfs::Store;
use wasmtime::Engine;

use crate::policy::{self, Limits, PolicyModule, WasmPlacement};
use crate::trace::{Recorder, TraceOut};

/// A loaded policy as the API lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub sha256: String,
    pub tenants: Vec<String>,
}

/// Loaded policies and which tenant uses which.
pub struct Registry {
    engine: Engine,
    pub(super) limits: Limits,
    store: Store,
    max_streams: u32,
    modules: Mutex<BTreeMap<String, Arc<PolicyModule>>>,
    active: Mutex<BTreeMap<String, String>>,
    recorder: Mutex<Option<(TraceOut, Instant)>>,
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
            active: Mutex::new(BTreeMap::new()),
            recorder: Mutex::new(None),
        }))
    }

    /// A registry holding the built-in policies, ready to use by name.
    pub fn with_builtins(store: Store, max_streams: u32, limits: Limits) -> Result<Arc<Self>> {
        let registry = Registry::new(store, max_streams, limits)?;
        for (name, module) in valet_policies::BUILTIN {
            registry.load(name, module)?;
        }
        Ok(registry)
    }

    /// Records every placement call of the tenants activated from now on into `out`.
    pub fn record_into(&self, out: TraceOut) {
        *self.recorder.lock().unwrap_or_else(|p| p.into_inner()) = Some((out, Instant::now()));
    }

    /// Loads what `--policy` names: a `.wasm` (or `.wat` text) file, loaded under its file
    /// stem, or a policy already loaded (a built-in). Returns the policy's name.
    pub fn resolve(&self, spec: &str) -> Result<String> {
        let path = Path::new(spec);
        if spec.ends_with(".wasm") || spec.ends_with(".wat") || spec.contains('/') {
            // `--policy rocks.wasm` where no such file exists: the built-in of that name.
            if !path.exists() && !spec.contains('/') {
                let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
                let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(stem) = stem.filter(|s| modules.contains_key(s.as_str())) {
                    return Ok(stem);
                }
            }
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read policy {spec}"))?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.to_string());
            self.load(&name, &bytes)?;
            return Ok(name);
        }
        let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if modules.contains_key(spec) {
            return Ok(spec.to_string());
        }
        let known: Vec<&str> = modules.keys().map(String::as_str).collect();
        bail!(
            "no policy named {spec} (known: {}; or give a FILE.wasm)",
            known.join(", ")
        )
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
        let module = Arc::new(PolicyModule::new(&self.engine, name, bytes, self.limits)?);
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), module.clone());
        Ok(module)
    }

    /// Makes a loaded policy the tenant's placement from now on.
    pub fn activate(&self, tenant: &str, policy: &str) -> Result<()> {
        let module = self
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(policy)
            .cloned()
            .ok_or_else(|| anyhow!("no policy named {policy} is loaded"))?;
        let mut placement: Arc<dyn valet_vfs::Placement> =
            Arc::new(WasmPlacement::new(module, self.max_streams)?);
        if let Some((out, start)) = &*self.recorder.lock().unwrap_or_else(|p| p.into_inner()) {
            placement = Arc::new(Recorder::new(placement, out.clone(), *start));
        }
        let (id, _) = self.store.tenant(tenant)?;
        self.store.set_placement(id, placement);
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tenant.to_string(), policy.to_string());
        Ok(())
    }

    /// A loaded policy by name.
    pub fn module(&self, name: &str) -> Result<Arc<PolicyModule>> {
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow!("no policy named {name} is loaded"))
    }

    pub fn list(&self) -> Vec<PolicyInfo> {
        let active = self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|m| PolicyInfo {
                name: m.name.clone(),
                sha256: m.sha256.clone(),
                tenants: active
                    .iter()
                    .filter(|(_, p)| **p == m.name)
                    .map(|(t, _)| t.clone())
                    .collect(),
            })
            .collect()
    }

    pub fn store(&self) -> &Store {
        &self.store
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
