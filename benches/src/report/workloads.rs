//! Which guests the report runs, with which arguments, at which scale, under which policy.

/// How big the runs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// A few minutes on a 2-core machine.
    Small,
    /// What the README's table quotes.
    Full,
}

impl Scale {
    pub fn parse(s: &str) -> Option<Scale> {
        match s {
            "small" => Some(Scale::Small),
            "full" => Some(Scale::Full),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scale::Small => "small",
            Scale::Full => "full",
        }
    }

    /// `small` at this scale.
    fn pick(self, small: u64, full: u64) -> u64 {
        match self {
            Scale::Small => small,
            Scale::Full => full,
        }
    }

    /// Zones of the device each store run gets (16 MiB zones, 12 MiB capacity; sparse).
    pub fn zones(self) -> u32 {
        self.pick(130, 514) as u32
    }

    /// Seconds a single run may take before it is killed.
    pub fn timeout_secs(self) -> u64 {
        self.pick(300, 3600)
    }
}

/// Zone size of every store run, in MiB (capacity is 3/4 of it, as valet-run makes it).
pub const ZONE_MIB: u64 = 16;
/// Zone capacity that [`ZONE_MIB`] gives.
pub const ZONE_CAPACITY: u64 = ZONE_MIB * 3 / 4 * (1 << 20);
/// Zones valet-run keeps for metadata.
pub const META_ZONES: u32 = 2;

/// Where the guest's data goes: the store's mount in the guest, or a host directory.
pub const DATA: &str = "{data}";

/// One guest run with fixed arguments.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The guest (`valet_guests::wasm(guest)`).
    pub guest: &'static str,
    /// How the report names this run (`leveldb`, `leveldb sync`).
    pub label: String,
    /// The matching placement policy.
    pub policy: &'static str,
    /// Arguments after the program name; [`DATA`] stands for the data directory.
    pub args: Vec<String>,
    /// Every write is synced (the targets differ).
    pub sync: bool,
}

impl Workload {
    fn new(guest: &'static str, label: &str, policy: &'static str, args: &[String]) -> Self {
        Workload {
            guest,
            label: label.to_string(),
            policy,
            args: args.to_vec(),
            sync: label.ends_with("sync") && !label.ends_with("nosync"),
        }
    }

    /// The arguments with the data directory filled in.
    pub fn args_for(&self, data: &str) -> Vec<String> {
        self.args.iter().map(|a| a.replace(DATA, data)).collect()
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The guest table at `scale`, in report order. Guests that were not built are skipped by
/// the caller.
pub fn all(scale: Scale) -> Vec<Workload> {
    let n = scale.pick(20_000, 200_000).to_string();
    let n_sync = scale.pick(2_000, 20_000).to_string();
    let n_sql = scale.pick(5_000, 50_000).to_string();
    let n_bunt = scale.pick(5_000, 50_000).to_string();
    let cache_ops = scale.pick(50_000, 500_000).to_string();
    let cache_keys = scale.pick(20_000, 200_000).to_string();
    let leveldb = |sync: &str, benchmarks: &str, num: &str| {
        args(&[
            &format!("--benchmarks={benchmarks}"),
            "--num",
            num,
            "--value_size",
            "400",
            "--sync",
            sync,
            "--db",
            &format!("{DATA}/db"),
        ])
    };
    let lsm = |sync: bool, num: &str| {
        let mut a = args(&["--dir", &format!("{DATA}/db"), "--num", num]);
        a.extend(args(&["--benchmarks", "fillrandom,overwrite,readrandom"]));
        if sync {
            a.push("--sync".into());
        }
        a
    };
    vec![
        Workload::new(
            "leveldb",
            "leveldb",
            "rocks",
            &leveldb(
                "0",
                "fillseq,fillrandom,overwrite,readrandom,readwhilewriting",
                &n,
            ),
        ),
        Workload::new(
            "leveldb",
            "leveldb sync",
            "rocks",
            &leveldb("1", "fillseq,fillrandom,overwrite", &n_sync),
        ),
        Workload::new("lsm_sim", "lsm_sim", "rocks", &lsm(false, &n)),
        Workload::new("lsm_sim", "lsm_sim sync", "rocks", &lsm(true, &n_sync)),
        Workload::new(
            "rusty_leveldb",
            "rusty_leveldb",
            "rocks",
            &args(&["--num", &n]),
        ),
        Workload::new(
            "sqlite_bench",
            "sqlite wal",
            "default",
            &args(&[
                "--journal",
                "wal",
                "--num",
                &n_sql,
                "--db",
                &format!("{DATA}/sqlite/bench.db"),
            ]),
        ),
        Workload::new(
            "sqlite_bench",
            "sqlite delete",
            "default",
            &args(&[
                "--journal",
                "delete",
                "--num",
                &n_sql,
                "--db",
                &format!("{DATA}/sqlite/bench.db"),
            ]),
        ),
        Workload::new(
            "buntdb_bench",
            "buntdb",
            "default",
            &args(&["--dir", &format!("{DATA}/buntdb"), "--num", &n_bunt]),
        ),
        Workload::new(
            "cache",
            "cache",
            "cachelib",
            &cache_args(&cache_ops, &cache_keys, scale.pick(256, 1024)),
        ),
    ]
}

/// Arguments of the cache guest with `flash_mib` of flash.
pub fn cache_args(ops: &str, keys: &str, flash_mib: u64) -> Vec<String> {
    args(&[
        "--dir",
        &format!("{DATA}/cache"),
        "--ops",
        ops,
        "--keys",
        keys,
        "--flash-mib",
        &flash_mib.to_string(),
    ])
}

/// Operations and keys of the cache guest in the over-provisioning sweep at `scale`.
pub fn cache_sweep_size(scale: Scale) -> (u64, u64) {
    (scale.pick(60_000, 600_000), scale.pick(20_000, 200_000))
}

/// Data zones of the device in the over-provisioning sweep at `scale`.
pub fn cache_sweep_zones(scale: Scale) -> u32 {
    scale.pick(22, 86) as u32
}

/// The LSM guest and the cache guest of the multi-tenant run: the first built of each list.
pub const TENANT_DB: &[&str] = &["leveldb", "lsm_sim"];
pub const TENANT_CACHE: &[&str] = &["cache", "cache_sim"];

/// The workload the zone map shows: the first LSM run whose guest was built.
pub const ZONE_MAP_LABELS: &[&str] = &["leveldb", "lsm_sim"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_placeholder_is_filled_in() {
        let w = all(Scale::Small);
        let leveldb = w.iter().find(|w| w.label == "leveldb").unwrap();
        let a = leveldb.args_for("/data");
        assert!(a.contains(&"/data/db".to_string()), "{a:?}");
        assert!(!leveldb.sync);
        assert!(w.iter().find(|w| w.label == "leveldb sync").unwrap().sync);
        assert!(w
            .iter()
            .all(|w| !w.args_for("/x").iter().any(|a| a.contains(DATA))));
    }
}
