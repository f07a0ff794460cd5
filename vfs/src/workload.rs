//! The LSM-shaped trace of the WAF command (`examples/waf.rs`) and of the comparison report,
//! replayed on the store and, laid out as a conventional filesystem would lay it out, on the
//! conventional-SSD model ([`crate::ftl`]).
//!
//! The trace is RocksDB's FIFO-compaction shape: a write-ahead log (`*.log`) is appended in
//! small records and deleted when its memtable is flushed as a table (`*.sst`, written once);
//! the oldest tables are deleted whenever live data would pass the target utilization. With
//! WAL and tables in separate streams zones hold data that dies together; in one stream they
//! mix short- and long-lived data and GC has to move the survivors. On the SSD model, files
//! are first-fit 1 MiB extents with TRIM on delete; with more than one reclaim-unit handle
//! each write carries the placement identifier the FDP resolver derives from the file's hint.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::device::{Geometry, MemoryDevice, ZonedDevice};
use crate::ftl::{Ftl, FtlConfig};
use crate::resolver;
use crate::{
    FileHandle, Hint, OpenOptions, OpenReason, Placement, PlacementRequest, Store, StoreConfig,
};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
const MEMTABLE: u64 = 8 * MIB;
const WAL_RECORD: usize = 4000;
const SST_WRITE: usize = 64 * 1024;

/// One run of the trace: the device, the layout and how much is written.
#[derive(Clone, Debug)]
pub struct LsmTrace {
    /// Everything in one stream (and one lifetime group) instead of WAL and tables apart.
    pub single_stream: bool,
    /// Peak live data as a fraction of the data zones' capacity (0.05..=0.95).
    pub utilization: f64,
    /// Over-provisioning of the conventional-SSD model the same trace is laid out on.
    pub ftl_op: f64,
    /// Bytes written, in device capacities.
    pub passes: f64,
    pub seed: u64,
    /// Reclaim-unit handles of the SSD model (1: a plain block SSD; more: FDP).
    pub fdp_ruhs: u32,
    /// Data zones of 15 MiB (two metadata zones come on top).
    pub data_zones: u32,
}

impl Default for LsmTrace {
    fn default() -> Self {
        LsmTrace {
            single_stream: false,
            utilization: 0.8,
            ftl_op: 0.07,
            passes: 3.0,
            seed: 1,
            fdp_ruhs: 1,
            data_zones: 64,
        }
    }
}

/// WAL and tables in their own streams, or everything in one. The WAL and the tables also
/// get lifetime groups of their own, which is all an FDP resolver looks at.
struct LsmPlacement {
    single_stream: bool,
}

impl Placement for LsmPlacement {
    fn place(&self, request: &PlacementRequest<'_>) -> Hint {
        let (stream, group) = if self.single_stream {
            (0, 0)
        } else if request.path.ends_with(".log") {
            (1, 1)
        } else {
            (2, 2)
        };
        Hint {
            group,
            ..Hint::zoned(stream)
        }
    }
}

/// A conventional filesystem's view of the same trace: files as first-fit 1 MiB extents
/// (ext4's preallocation does much the same) on an SSD whose erase unit is an 8 MiB
/// superblock, which sees each 4 KiB block written once and TRIMs on delete.
struct FsOnSsd {
    ftl: Ftl,
    free: BTreeSet<u64>,
    files: BTreeMap<String, (Vec<u64>, u64)>,
    placement: LsmPlacement,
    ruhs: u32,
}

const FS_EXTENT: u64 = MIB;
const ERASE_UNIT_PAGES: u32 = (8 * MIB / BLOCK) as u32;

impl FsOnSsd {
    fn new(
        logical_bytes: u64,
        op: f64,
        ruhs: u32,
        placement: LsmPlacement,
    ) -> Result<Self, String> {
        let config = FtlConfig {
            pages_per_block: ERASE_UNIT_PAGES,
            ..FtlConfig::fdp(logical_bytes, op, ruhs)
        };
        let ftl = Ftl::new(config).map_err(|e| e.to_string())?;
        Ok(FsOnSsd {
            ftl,
            free: (0..logical_bytes / FS_EXTENT).collect(),
            files: BTreeMap::new(),
            placement,
            ruhs,
        })
    }

    /// The placement identifier the FDP resolver gives the file's hint.
    fn placement_id(&self, file: &str) -> u32 {
        let hint = self.placement.place(&PlacementRequest {
            tenant: 0,
            path: file,
            reason: OpenReason::Create,
            size: 0,
        });
        // Three streams: general, WAL, tables.
        resolver::placement_id(hint.stream, hint.group, 3, self.ruhs)
    }

    /// The file grew to `size` bytes: write the blocks that are now complete (or all of
    /// them at `close`).
    fn grow(&mut self, file: &str, size: u64, close: bool) -> Result<(), String> {
        let pid = self.placement_id(file);
        let (extents, written) = self.files.entry(file.to_string()).or_default();
        let upto = if close {
            size.div_ceil(BLOCK)
        } else {
            size / BLOCK
        };
        while *written < upto {
            let block = *written;
            let index = (block * BLOCK / FS_EXTENT) as usize;
            if index == extents.len() {
                let extent = self.free.pop_first().ok_or("filesystem model is full")?;
                extents.push(extent);
            }
            let lba = extents[index] * FS_EXTENT + block * BLOCK % FS_EXTENT;
            self.ftl.write(lba, BLOCK, pid).map_err(|e| e.to_string())?;
            *written += 1;
        }
        Ok(())
    }

    fn delete(&mut self, file: &str) -> Result<(), String> {
        let (extents, _) = self.files.remove(file).unwrap_or_default();
        for extent in extents {
            self.ftl
                .trim(extent * FS_EXTENT, FS_EXTENT)
                .map_err(|e| e.to_string())?;
            self.free.insert(extent);
        }
        Ok(())
    }
}

/// A small deterministic generator (xorshift*), so runs repeat exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// What one run of the trace measured.
#[derive(Clone, Debug, PartialEq)]
pub struct LsmTraceResult {
    pub single_stream: bool,
    /// Peak live data over the data zones' capacity.
    pub utilization: f64,
    pub host_bytes: u64,
    pub device_bytes: u64,
    pub gc_bytes_moved: u64,
    pub waf: f64,
    pub zone_resets: u64,
    pub meta_bytes: u64,
    pub ftl_op: f64,
    pub ftl_fdp_ruhs: u32,
    /// WAF of the same trace on the SSD model.
    pub ftl_waf: f64,
    pub ftl_gc_bytes_moved: u64,
}

impl LsmTraceResult {
    /// One JSON line (the WAF command's output).
    pub fn to_json(&self) -> String {
        format!(
            "{{\"mode\":\"{}\",\"utilization\":{:.3},\"host_bytes\":{},\
             \"device_bytes\":{},\"gc_bytes_moved\":{},\"waf\":{:.4},\"zone_resets\":{},\
             \"meta_bytes\":{},\"ftl_op\":{},\"ftl_fdp_ruhs\":{},\"ftl_waf\":{:.4},\
             \"ftl_gc_bytes_moved\":{}}}",
            if self.single_stream {
                "single-stream"
            } else {
                "wal-sst-streams"
            },
            self.utilization,
            self.host_bytes,
            self.device_bytes,
            self.gc_bytes_moved,
            self.waf,
            self.zone_resets,
            self.meta_bytes,
            self.ftl_op,
            self.ftl_fdp_ruhs,
            self.ftl_waf,
            self.ftl_gc_bytes_moved,
        )
    }
}

impl LsmTrace {
    /// Checks the parameters the trace cannot run with.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.05..=0.95).contains(&self.utilization) {
            return Err("utilization must be within 0.05..=0.95".into());
        }
        Ok(())
    }

    /// Runs the trace on an in-memory device and on the SSD model.
    pub fn run(&self) -> Result<LsmTraceResult, Box<dyn std::error::Error>> {
        self.validate()?;
        // ZN540-like limits on a smaller device: 2 metadata + 64 data zones of 15 MiB.
        let geometry = Geometry {
            zone_count: self.data_zones + 2,
            zone_size: 16 * MIB,
            zone_capacity: 15 * MIB,
            block_size: BLOCK as u32,
            max_open: 14,
            max_active: 14,
        };
        let data_capacity = (geometry.zone_count as u64 - 2) * geometry.zone_capacity;
        let device = Arc::new(MemoryDevice::new(geometry)?);
        let store = Store::open(device as Arc<dyn ZonedDevice>, StoreConfig::default())?;
        let (tenant, root) = store.tenant("lsm")?;
        store.set_placement(
            tenant,
            Arc::new(LsmPlacement {
                single_stream: self.single_stream,
            }),
        );
        let mut fs = FsOnSsd::new(
            data_capacity,
            self.ftl_op,
            self.fdp_ruhs,
            LsmPlacement {
                single_stream: self.single_stream,
            },
        )?;

        let live_target = (self.utilization * data_capacity as f64) as u64;
        let total = (self.passes * data_capacity as f64) as u64;
        let mut rng = Rng(self.seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut record = vec![0u8; WAL_RECORD];
        let chunk = vec![0x5au8; SST_WRITE];
        let mut tables: VecDeque<(String, u64)> = VecDeque::new();
        let mut live_tables = 0u64;
        let mut written = 0u64;
        let mut seq = 0u64;
        // The table being flushed in the background while the next WAL fills:
        // (name, handle, size, bytes written, WAL it replaces).
        let mut flushing: Option<(String, FileHandle, u64, u64, String)> = None;
        let mut peak_live = 0u64;
        while written < total {
            seq += 1;
            let wal = format!("{seq:06}.log");
            let f = store.open_file(root, &wal, OpenOptions::create())?;
            let mut size = 0u64;
            while size < MEMTABLE {
                record.fill(rng.next() as u8);
                f.write_at(&record, size)?;
                size += WAL_RECORD as u64;
                fs.grow(&wal, size, false)?;
                written += WAL_RECORD as u64;
                let in_flight = flushing.as_ref().map_or(MEMTABLE, |f| f.3 + MEMTABLE);
                peak_live = peak_live.max(live_tables + size + in_flight);
                // One table chunk per 16 records: the flush ends before the WAL is full.
                if size % (16 * WAL_RECORD as u64) != 0 {
                    continue;
                }
                let Some((sst, handle, table_size, done, _)) = flushing.as_mut() else {
                    continue;
                };
                let n = (*table_size - *done).min(SST_WRITE as u64) as usize;
                handle.write_at(&chunk[..n], *done)?;
                *done += n as u64;
                written += n as u64;
                fs.grow(sst, *done, false)?;
                if *done == *table_size {
                    let (sst, handle, table_size, _, old_wal) = flushing.take().expect("flushing");
                    handle.close()?;
                    fs.grow(&sst, table_size, true)?;
                    tables.push_back((sst, table_size));
                    live_tables += table_size;
                    // The table is durable: its WAL goes.
                    store.unlink(root, &old_wal)?;
                    fs.delete(&old_wal)?;
                }
            }
            f.close()?;
            fs.grow(&wal, size, true)?;

            // The memtable becomes a table of roughly its size (overwritten entries shrink it).
            let table_size = MEMTABLE / 2 + (rng.next() % (MEMTABLE / 2 / BLOCK)) * BLOCK;
            // FIFO compaction: the oldest tables go once live data would pass the target.
            while live_tables + table_size + 2 * MEMTABLE > live_target {
                let Some((old, old_size)) = tables.pop_front() else {
                    break;
                };
                store.unlink(root, &old)?;
                fs.delete(&old)?;
                live_tables -= old_size;
            }
            seq += 1;
            let sst = format!("{seq:06}.sst");
            let handle = store.open_file(root, &sst, OpenOptions::create())?;
            flushing = Some((sst, handle, table_size, 0, wal));
        }
        store.sync()?;
        let fsck = store.fsck()?;
        if !fsck.is_clean() {
            return Err(format!("fsck after the run: {:?}", fsck.problems).into());
        }
        let stats = store.stats();
        let ftl = fs.ftl.stats();
        // Live data at its peak: tables, the WAL being filled, the table and WAL being flushed.
        let peak_utilization = peak_live as f64 / data_capacity as f64;
        Ok(LsmTraceResult {
            single_stream: self.single_stream,
            utilization: peak_utilization,
            host_bytes: stats.host_bytes,
            device_bytes: stats.device_bytes,
            gc_bytes_moved: stats.gc_bytes_moved,
            waf: stats.waf,
            zone_resets: stats.zone_resets,
            meta_bytes: stats.meta_bytes,
            ftl_op: self.ftl_op,
            ftl_fdp_ruhs: self.fdp_ruhs,
            ftl_waf: ftl.waf(),
            ftl_gc_bytes_moved: ftl.gc_pages_moved * BLOCK,
        })
    }
}
