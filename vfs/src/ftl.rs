//! The conventional-SSD model: a page-mapped flash translation layer (FTL) with greedy garbage
//! collection, used as the WAF baseline.
//!
//! Replay a write stream into an [`Ftl`] (the stream the zoned store issued, or the same
//! workload as a conventional filesystem would lay it out) and [`Ftl::stats`] tells how many
//! NAND pages a block-interface SSD would have programmed for it, GC copies included.
//!
//! What it models:
//! - a logical space of `logical_bytes`, mapped page by page onto a physical space that is
//!   larger by the over-provisioning factor (see [`FtlConfig::over_provisioning`]);
//! - erase blocks written page by page from the first page to the last, erased whole;
//! - greedy GC: when free erase blocks fall to a low watermark, the closed block holding the
//!   fewest valid pages is the victim; its valid pages are copied out and it is erased;
//! - discard (trim): trimmed pages stop being valid and are never copied again;
//! - NVMe Flexible Data Placement (FDP) when configured with more than one reclaim unit
//!   handle (RUH): each placement id writes into its own open erase block. GC copies from all
//!   RUHs go to one shared GC destination block (FDP's "initially isolated" handles).
//!
//! What it deliberately does not model: timing or throughput, read disturb, data retention,
//! wear levelling or per-block erase limits, bad blocks, multi-plane or multi-die parallelism
//! (a "block" here is the unit the device erases and reclaims at once, i.e. the superblock /
//! reclaim unit), write buffering in DRAM, or reads of any kind. Data contents are not
//! stored: only the mapping.
//!
//! ```
//! use valet_vfs::ftl::{Ftl, FtlConfig};
//!
//! let mut ssd = Ftl::new(FtlConfig::new(64 << 20, 0.07))?;
//! ssd.write(0, 64 << 20, 0)?; // fill the logical space once
//! ssd.write(4096, 8192, 0)?; // overwrite two pages
//! ssd.trim(0, 1 << 20)?; // discard the first MiB
//! assert_eq!(ssd.stats().host_pages, 16386);
//! assert_eq!(ssd.stats().waf(), 1.0); // no GC has run yet
//! # Ok::<(), valet_vfs::ftl::FtlError>(())
//! ```

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Marks an unmapped logical page (in the L2P map) or a physical page without valid data (in
/// the P2L map).
const UNMAPPED: u32 = u32::MAX;
/// Marks "no block" in the bucket lists and in an empty write frontier.
const NIL: u32 = u32::MAX;

const BLOCK_FREE: u8 = 0;
const BLOCK_OPEN: u8 = 1;
const BLOCK_CLOSED: u8 = 2;

/// Why an [`Ftl`] could not be built or could not carry out a command.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum FtlError {
    /// The configuration describes a device that cannot exist or could never collect garbage.
    #[error("invalid FTL configuration: {0}")]
    InvalidConfig(String),
    /// A write or trim reached past the logical capacity.
    #[error("range {offset}+{len} lies outside the {logical_bytes}-byte logical space")]
    OutOfRange {
        /// Byte offset of the command.
        offset: u64,
        /// Byte length of the command.
        len: u64,
        /// Logical capacity of the device.
        logical_bytes: u64,
    },
    /// GC found no block it could reclaim. Cannot happen with a validated configuration; kept
    /// as an error so a bug shows up as a failure, never as an endless loop.
    #[error("garbage collection cannot make progress: every closed block is fully valid")]
    NoReclaimableSpace,
}

/// Shape of the simulated SSD.
///
/// Over-provisioning follows the definition of the WAF literature the reference figures come
/// from: `physical = logical × (1 + over_provisioning)`, so `0.07` means the flash holds 7 %
/// more pages than the host can address (the closed-form greedy estimate
/// `(1 + op) / (2 × op)` of Agarwal & Marrow gives WAF 7.6 at 0.07 under uniform random
/// writes). The physical page count is rounded up to whole erase blocks; the open blocks and
/// the GC reserve come out of the spare space, as they do in a drive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FtlConfig {
    /// Capacity the host can address, in bytes; a multiple of `page_size`.
    pub logical_bytes: u64,
    /// Spare flash as a fraction of the logical capacity (`0.07` = 7 %); must be > 0.
    pub over_provisioning: f64,
    /// Flash page (program unit and mapping unit), in bytes; typically 4096.
    pub page_size: u32,
    /// Pages per erase block (e.g. 256 with 4 KiB pages = 1 MiB blocks).
    pub pages_per_block: u32,
    /// Open write blocks for host data: 1 = a plain SSD, > 1 = FDP with that many reclaim unit
    /// handles; a write's placement id is taken modulo this number.
    pub reclaim_unit_handles: u32,
    /// GC runs when the number of free erase blocks falls to this value (≥ 1).
    pub gc_low_watermark_blocks: u32,
}

impl FtlConfig {
    /// Page size used by [`FtlConfig::new`].
    pub const DEFAULT_PAGE_SIZE: u32 = 4096;
    /// Erase-block size, in pages, used by [`FtlConfig::new`] (1 MiB with 4 KiB pages).
    pub const DEFAULT_PAGES_PER_BLOCK: u32 = 256;
    /// GC low watermark used by [`FtlConfig::new`].
    pub const DEFAULT_GC_LOW_WATERMARK_BLOCKS: u32 = 2;

    /// A plain SSD (one RUH) of `logical_bytes` with the given over-provisioning, 4 KiB pages,
    /// 1 MiB erase blocks and a GC watermark of 2 free blocks.
    pub fn new(logical_bytes: u64, over_provisioning: f64) -> Self {
        FtlConfig {
            logical_bytes,
            over_provisioning,
            page_size: Self::DEFAULT_PAGE_SIZE,
            pages_per_block: Self::DEFAULT_PAGES_PER_BLOCK,
            reclaim_unit_handles: 1,
            gc_low_watermark_blocks: Self::DEFAULT_GC_LOW_WATERMARK_BLOCKS,
        }
    }

    /// Like [`FtlConfig::new`], with FDP and `reclaim_unit_handles` placement ids.
    pub fn fdp(logical_bytes: u64, over_provisioning: f64, reclaim_unit_handles: u32) -> Self {
        FtlConfig {
            reclaim_unit_handles,
            ..Self::new(logical_bytes, over_provisioning)
        }
    }

    /// Checks the configuration and derives the device's page and block counts.
    ///
    /// Fails when a size is zero, `logical_bytes` is not a whole number of pages,
    /// over-provisioning is not a positive finite number, the device has more pages than a
    /// 32-bit map can address, or the spare space cannot hold the open blocks (one per RUH plus
    /// the GC destination) and the free-block reserve with room to spare — in which case GC
    /// could find every candidate block fully valid and never free one.
    pub fn validate(&self) -> Result<FtlGeometry, FtlError> {
        let bad = |why: String| Err(FtlError::InvalidConfig(why));
        if self.page_size == 0 {
            return bad("page_size is 0".into());
        }
        if self.pages_per_block == 0 {
            return bad("pages_per_block is 0".into());
        }
        if self.logical_bytes == 0 {
            return bad("logical_bytes is 0".into());
        }
        if self.reclaim_unit_handles == 0 {
            return bad("reclaim_unit_handles is 0 (a plain SSD has 1)".into());
        }
        if self.gc_low_watermark_blocks == 0 {
            return bad("gc_low_watermark_blocks is 0: GC needs a free block to copy into".into());
        }
        if self.logical_bytes % self.page_size as u64 != 0 {
            return bad(format!(
                "logical_bytes {} is not a multiple of page_size {}",
                self.logical_bytes, self.page_size
            ));
        }
        if !self.over_provisioning.is_finite() || self.over_provisioning <= 0.0 {
            return bad(format!(
                "over_provisioning must be a finite number > 0 (got {}): without spare pages \
                 GC can never free a block",
                self.over_provisioning
            ));
        }
        let logical_pages = self.logical_bytes / self.page_size as u64;
        let ppb = self.pages_per_block as u64;
        let wanted = (logical_pages as f64 * (1.0 + self.over_provisioning)).ceil() as u64;
        let blocks = wanted.div_ceil(ppb);
        let physical_pages = blocks.saturating_mul(ppb);
        // Page numbers are u32 and u32::MAX marks "unmapped".
        if physical_pages >= u32::MAX as u64 {
            return bad(format!(
                "{physical_pages} physical pages do not fit the 32-bit page map; \
                 use larger pages or a smaller device"
            ));
        }
        // At GC time at most `watermark` blocks are free and `ruh + 1` are open; the rest are
        // closed. If the closed blocks could all be full of valid data, greedy GC could stall.
        let reserved = self.gc_low_watermark_blocks as u64 + self.reclaim_unit_handles as u64 + 1;
        let closed_at_gc = blocks.saturating_sub(reserved);
        if closed_at_gc * ppb <= logical_pages {
            return bad(format!(
                "over-provisioning too small: {blocks} erase blocks of {ppb} pages hold \
                 {logical_pages} logical pages, but {reserved} blocks are set aside \
                 ({} open for host writes, 1 GC destination, {} free-block watermark), \
                 leaving no spare page for GC",
                self.reclaim_unit_handles, self.gc_low_watermark_blocks
            ));
        }
        Ok(FtlGeometry {
            logical_pages: logical_pages as u32,
            physical_pages: physical_pages as u32,
            blocks: blocks as u32,
        })
    }
}

impl Default for FtlConfig {
    /// A 1 GiB plain SSD with 7 % over-provisioning.
    fn default() -> Self {
        Self::new(1 << 30, 0.07)
    }
}

/// Page and block counts derived from an [`FtlConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FtlGeometry {
    /// Pages the host can address.
    pub logical_pages: u32,
    /// Pages of flash (`blocks × pages_per_block`).
    pub physical_pages: u32,
    /// Erase blocks of flash.
    pub blocks: u32,
}

/// Counters of an [`Ftl`] since it was built or since [`Ftl::reset_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FtlStats {
    /// Pages the host wrote (each write rounded out to whole pages).
    pub host_pages: u64,
    /// `host_pages × page_size`.
    pub host_bytes: u64,
    /// Bytes the host asked to write, before rounding to pages.
    pub host_bytes_requested: u64,
    /// Pages programmed into flash: host pages plus GC copies.
    pub device_pages: u64,
    /// `device_pages × page_size`.
    pub device_bytes: u64,
    /// Valid pages GC copied out of victim blocks.
    pub gc_pages_moved: u64,
    /// Erase-block erases.
    pub erases: u64,
    /// Mapped pages that trims invalidated.
    pub trimmed_pages: u64,
}

impl FtlStats {
    /// Write amplification: device pages / host pages (1.0 when the host wrote nothing).
    pub fn waf(&self) -> f64 {
        if self.host_pages == 0 {
            1.0
        } else {
            self.device_pages as f64 / self.host_pages as f64
        }
    }
}

/// The open erase block a stream appends to.
#[derive(Clone, Copy, Debug)]
struct Frontier {
    /// Block being filled, or `NIL`.
    block: u32,
    /// Next page to program inside `block`.
    next_page: u32,
}

impl Frontier {
    const NONE: Frontier = Frontier {
        block: NIL,
        next_page: 0,
    };
}

/// A page-mapped FTL of a block-interface SSD (optionally with FDP) with greedy GC.
///
/// Host commands take byte offsets and lengths: a write covers every page it touches (a
/// partial page counts as a whole page program, as a drive's read-modify-write would), a trim
/// only the pages it covers completely.
#[derive(Clone)]
pub struct Ftl {
    config: FtlConfig,
    geometry: FtlGeometry,
    ppb: u32,
    /// Logical page → physical page, or `UNMAPPED`.
    l2p: Vec<u32>,
    /// Physical page → logical page it holds valid data for, or `UNMAPPED`.
    p2l: Vec<u32>,
    /// Valid pages per block.
    valid: Vec<u32>,
    /// `BLOCK_FREE`, `BLOCK_OPEN` or `BLOCK_CLOSED` per block.
    state: Vec<u8>,
    /// Erased blocks, taken from the end.
    free: Vec<u32>,
    /// One write frontier per reclaim unit handle.
    host_open: Vec<Frontier>,
    /// Where GC copies go.
    gc_open: Frontier,
    /// Closed blocks bucketed by valid count: `bucket_head[v]` starts a doubly linked list
    /// (through `next`/`prev`) of closed blocks holding exactly `v` valid pages.
    bucket_head: Vec<u32>,
    next: Vec<u32>,
    prev: Vec<u32>,
    /// No bucket below this one holds a block.
    min_bucket: u32,
    stats: FtlStats,
}

impl std::fmt::Debug for Ftl {
    /// Shape and counters only: the maps are far too large to print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ftl")
            .field("config", &self.config)
            .field("geometry", &self.geometry)
            .field("free_blocks", &self.free.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Ftl {
    /// Builds an empty (fully erased, nothing mapped) device.
    pub fn new(config: FtlConfig) -> Result<Self, FtlError> {
        let geometry = config.validate()?;
        let ppb = config.pages_per_block;
        let blocks = geometry.blocks as usize;
        Ok(Ftl {
            l2p: vec![UNMAPPED; geometry.logical_pages as usize],
            p2l: vec![UNMAPPED; geometry.physical_pages as usize],
            valid: vec![0; blocks],
            state: vec![BLOCK_FREE; blocks],
            // Reversed so blocks are first handed out in ascending order.
            free: (0..geometry.blocks).rev().collect(),
            host_open: vec![Frontier::NONE; config.reclaim_unit_handles as usize],
            gc_open: Frontier::NONE,
            bucket_head: vec![NIL; ppb as usize + 1],
            next: vec![NIL; blocks],
            prev: vec![NIL; blocks],
            min_bucket: ppb,
            stats: FtlStats::default(),
            ppb,
            geometry,
            config,
        })
    }

    /// The configuration the device was built with.
    pub fn config(&self) -> &FtlConfig {
        &self.config
    }

    /// Page and block counts of the device.
    pub fn geometry(&self) -> FtlGeometry {
        self.geometry
    }

    /// Counters since the device was built or last reset; byte figures derive from pages.
    pub fn stats(&self) -> FtlStats {
        let ps = self.config.page_size as u64;
        FtlStats {
            host_bytes: self.stats.host_pages * ps,
            device_bytes: self.stats.device_pages * ps,
            ..self.stats
        }
    }

    /// Zeroes the counters (not the mapping), e.g. to measure steady state after a warm-up.
    pub fn reset_stats(&mut self) {
        self.stats = FtlStats::default();
    }

    /// Erase blocks currently free.
    pub fn free_blocks(&self) -> u32 {
        self.free.len() as u32
    }

    /// Logical pages currently mapped (written and not trimmed since).
    pub fn valid_pages(&self) -> u64 {
        self.valid.iter().map(|&v| v as u64).sum()
    }

    /// Host write of `len` bytes at byte offset `lba_byte_offset`, rounded out to whole pages.
    ///
    /// `placement_id` chooses the reclaim unit handle (modulo their number) and is ignored by
    /// a plain SSD. A zero-length write does nothing. Fails if the range reaches past
    /// `logical_bytes`, before anything is written.
    pub fn write(
        &mut self,
        lba_byte_offset: u64,
        len: u64,
        placement_id: u32,
    ) -> Result<(), FtlError> {
        let end = self.check_range(lba_byte_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let ps = self.config.page_size as u64;
        let first = (lba_byte_offset / ps) as u32;
        let last = end.div_ceil(ps) as u32;
        let ruh = (placement_id % self.config.reclaim_unit_handles) as usize;
        self.stats.host_bytes_requested += len;
        for lpn in first..last {
            self.write_page(lpn, ruh)?;
        }
        Ok(())
    }

    /// Host discard of `len` bytes at byte offset `offset`: every page lying wholly inside the
    /// range becomes unmapped (partial pages at either end are left alone). Fails if the range
    /// reaches past `logical_bytes`.
    pub fn trim(&mut self, offset: u64, len: u64) -> Result<(), FtlError> {
        let end = self.check_range(offset, len)?;
        let ps = self.config.page_size as u64;
        let first = offset.div_ceil(ps) as u32;
        let last = (end / ps) as u32;
        for lpn in first..last {
            if self.invalidate(lpn) {
                self.stats.trimmed_pages += 1;
            }
        }
        Ok(())
    }

    /// Returns the end of `offset..offset+len` if it lies inside the logical space.
    fn check_range(&self, offset: u64, len: u64) -> Result<u64, FtlError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.config.logical_bytes => Ok(end),
            _ => Err(FtlError::OutOfRange {
                offset,
                len,
                logical_bytes: self.config.logical_bytes,
            }),
        }
    }

    /// Programs logical page `lpn` into the open block of reclaim unit handle `ruh`.
    fn write_page(&mut self, lpn: u32, ruh: usize) -> Result<(), FtlError> {
        // The old copy is stale from now on, so GC below never copies it.
        self.invalidate(lpn);
        if self.host_open[ruh].block == NIL {
            self.collect_until_above_watermark()?;
            self.host_open[ruh] = self.open_free_block()?;
        }
        let frontier = &mut self.host_open[ruh];
        let block = frontier.block;
        let ppn = block * self.ppb + frontier.next_page;
        frontier.next_page += 1;
        let full = frontier.next_page == self.ppb;
        if full {
            *frontier = Frontier::NONE;
        }
        self.program(ppn, lpn, block);
        self.stats.host_pages += 1;
        if full {
            self.close(block);
        }
        Ok(())
    }

    /// Maps `lpn` to `ppn` (inside `block`) and counts the page program.
    #[inline]
    fn program(&mut self, ppn: u32, lpn: u32, block: u32) {
        self.l2p[lpn as usize] = ppn;
        self.p2l[ppn as usize] = lpn;
        self.valid[block as usize] += 1;
        self.stats.device_pages += 1;
    }

    /// Drops the mapping of `lpn`, if any; returns whether it was mapped.
    #[inline]
    fn invalidate(&mut self, lpn: u32) -> bool {
        let ppn = self.l2p[lpn as usize];
        if ppn == UNMAPPED {
            return false;
        }
        self.l2p[lpn as usize] = UNMAPPED;
        self.p2l[ppn as usize] = UNMAPPED;
        let block = ppn / self.ppb;
        if self.state[block as usize] == BLOCK_CLOSED {
            self.unlink(block);
            self.valid[block as usize] -= 1;
            self.link(block);
        } else {
            self.valid[block as usize] -= 1;
        }
        true
    }

    /// Takes an erased block and makes it an open write frontier.
    fn open_free_block(&mut self) -> Result<Frontier, FtlError> {
        let block = self.free.pop().ok_or(FtlError::NoReclaimableSpace)?;
        self.state[block as usize] = BLOCK_OPEN;
        Ok(Frontier {
            block,
            next_page: 0,
        })
    }

    /// A full block becomes a GC candidate.
    fn close(&mut self, block: u32) {
        self.state[block as usize] = BLOCK_CLOSED;
        self.link(block);
    }

    /// Greedy GC until more than the watermark of blocks are free.
    fn collect_until_above_watermark(&mut self) -> Result<(), FtlError> {
        while self.free.len() <= self.config.gc_low_watermark_blocks as usize {
            self.collect_one()?;
        }
        Ok(())
    }

    /// Reclaims the closed block with the fewest valid pages.
    ///
    /// Takes at most one free block (for the GC destination) and always frees one, so the
    /// number of free blocks never drops by more than one while it runs.
    fn collect_one(&mut self) -> Result<(), FtlError> {
        let victim = self.pick_victim().ok_or(FtlError::NoReclaimableSpace)?;
        let mut remaining = self.valid[victim as usize];
        if remaining == self.ppb {
            return Err(FtlError::NoReclaimableSpace);
        }
        self.unlink(victim);
        let base = victim * self.ppb;
        let mut ppn = base;
        while remaining > 0 {
            let lpn = self.p2l[ppn as usize];
            if lpn != UNMAPPED {
                self.p2l[ppn as usize] = UNMAPPED;
                self.gc_copy(lpn)?;
                remaining -= 1;
            }
            ppn += 1;
        }
        self.valid[victim as usize] = 0;
        self.state[victim as usize] = BLOCK_FREE;
        self.free.push(victim);
        self.stats.erases += 1;
        Ok(())
    }

    /// Copies logical page `lpn` into the GC destination block.
    fn gc_copy(&mut self, lpn: u32) -> Result<(), FtlError> {
        if self.gc_open.block == NIL {
            self.gc_open = self.open_free_block()?;
        }
        let block = self.gc_open.block;
        let ppn = block * self.ppb + self.gc_open.next_page;
        self.gc_open.next_page += 1;
        let full = self.gc_open.next_page == self.ppb;
        if full {
            self.gc_open = Frontier::NONE;
        }
        self.program(ppn, lpn, block);
        self.stats.gc_pages_moved += 1;
        if full {
            self.close(block);
        }
        Ok(())
    }

    /// The closed block with the fewest valid pages, if any block is closed.
    fn pick_victim(&mut self) -> Option<u32> {
        for v in self.min_bucket..=self.ppb {
            let head = self.bucket_head[v as usize];
            if head != NIL {
                self.min_bucket = v;
                return Some(head);
            }
        }
        self.min_bucket = self.ppb;
        None
    }

    /// Puts closed `block` in the bucket of its valid count.
    #[inline]
    fn link(&mut self, block: u32) {
        let v = self.valid[block as usize];
        let head = self.bucket_head[v as usize];
        self.next[block as usize] = head;
        self.prev[block as usize] = NIL;
        if head != NIL {
            self.prev[head as usize] = block;
        }
        self.bucket_head[v as usize] = block;
        if v < self.min_bucket {
            self.min_bucket = v;
        }
    }

    /// Takes closed `block` out of the bucket of its (current) valid count.
    #[inline]
    fn unlink(&mut self, block: u32) {
        let v = self.valid[block as usize];
        let (p, n) = (self.prev[block as usize], self.next[block as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.bucket_head[v as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
    }
}

#[cfg(test)]
mod tests;
