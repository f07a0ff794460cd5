//! The metadata journal: crc32c-checked records in two metadata zones.
//!
//! A record is a 32-byte header and a postcard payload, padded to whole blocks:
//!
//! ```text
//! magic "VJRN" | kind u8 | unflushed u24 | seq u64 | payload len u32 | payload crc u32 | header crc u32 | 4 pad
//! ```
//!
//! The payload follows the header in its block; every block after that starts with the
//! 4-byte mark "VJR+" and holds the next piece of the payload. So no block but a record's
//! first starts with the magic: a payload carries tenants' bytes (inline tails, names,
//! link targets), and a forged header there, once block aligned, could pass for a record
//! when recovery reads or scans past the end of the valid ones (an honest record after a
//! torn one, or damage). The kind byte has [`MARKED`] set in records laid out this way;
//! records written before it (their payload contiguous after the header) are still read.
//!
//! `unflushed` counts the records just before this one that were not known durable when it
//! was written (no device flush had completed since they were written): 0 for a record
//! written right after a commit's flush, more after hand-offs (records written without a
//! flush, see the store's writeback). A power cut can lose or tear any of those and this
//! one, so recovery checks each against its data, and a torn one among them followed by
//! valid records is a torn tail, not damage (stores before the field wrote 0 there).
//!
//! Each metadata zone starts with a checkpoint (a [`Snapshot`]) followed by transactions
//! (lists of [`MetaOp`]) with consecutive sequence numbers. When the active zone is full the
//! next checkpoint goes to the other zone, which then becomes active; recovery takes the zone
//! whose checkpoint is newest and replays its transactions up to the first torn record.

use std::sync::Arc;

use super::state::{MetaOp, Snapshot};
use crate::device::{ZoneId, ZonedDevice};
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"VJRN";
const HEADER_LEN: usize = 32;
/// What every block of a record after its first starts with.
const MARK: &[u8; 4] = b"VJR+";
/// In the kind byte: the record's blocks after its first start with [`MARK`].
const MARKED: u8 = 0x80;

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Checkpoint = 1,
    Transaction = 2,
}

/// A record read back from a metadata zone.
pub struct Record {
    pub kind: RecordKind,
    pub seq: u64,
    /// Records just before this one that may not have been durable when it was written.
    pub unflushed: u32,
    pub payload: Vec<u8>,
}

/// Most records an `unflushed` count says (it is a 24-bit field; more is counted as this).
const MAX_UNFLUSHED: u64 = (1 << 24) - 1;

/// The blocks a record of `payload_len` bytes takes; laid out with marks (see the module
/// docs) or, as before them, contiguous.
fn record_blocks(payload_len: u64, block_size: u64, marked: bool) -> u64 {
    let first = block_size - HEADER_LEN as u64;
    match marked {
        true if payload_len <= first => 1,
        true => 1 + (payload_len - first).div_ceil(block_size - MARK.len() as u64),
        false => (HEADER_LEN as u64 + payload_len).div_ceil(block_size),
    }
}

/// Lays out one record, padded to `block_size`.
pub fn encode(
    kind: RecordKind,
    seq: u64,
    unflushed: u64,
    payload: &[u8],
    block_size: u64,
) -> Vec<u8> {
    let bs = block_size as usize;
    let blocks = record_blocks(payload.len() as u64, block_size, true) as usize;
    let mut out = vec![0u8; blocks * bs];
    let first = payload.len().min(bs - HEADER_LEN);
    out[HEADER_LEN..HEADER_LEN + first].copy_from_slice(&payload[..first]);
    for (block, piece) in out[bs..]
        .chunks_exact_mut(bs)
        .zip(payload[first..].chunks(bs - MARK.len()))
    {
        block[..MARK.len()].copy_from_slice(MARK);
        block[MARK.len()..MARK.len() + piece.len()].copy_from_slice(piece);
    }
    out[0..4].copy_from_slice(MAGIC);
    out[4] = kind as u8 | MARKED;
    out[5..8].copy_from_slice(&(unflushed.min(MAX_UNFLUSHED) as u32).to_le_bytes()[..3]);
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    out[20..24].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let header_crc = crc32c::crc32c(&out[0..24]);
    out[24..28].copy_from_slice(&header_crc.to_le_bytes());
    out
}

struct Header {
    kind: RecordKind,
    /// Laid out with marks (see the module docs).
    marked: bool,
    seq: u64,
    unflushed: u32,
    payload_len: u64,
    payload_crc: u32,
}

impl Header {
    /// Whether record `seq` may have been unflushed when this record was written: then a
    /// power cut may have torn it while this one reached the device.
    fn written_before_flush_of(&self, seq: u64) -> bool {
        seq < self.seq && seq >= self.seq.saturating_sub(self.unflushed as u64)
    }
}

fn decode_header(b: &[u8]) -> Option<Header> {
    let word = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().unwrap());
    if &b[0..4] != MAGIC || word(24..28) != crc32c::crc32c(&b[0..24]) {
        return None;
    }
    let kind = match b[4] & !MARKED {
        1 => RecordKind::Checkpoint,
        2 => RecordKind::Transaction,
        _ => return None,
    };
    Some(Header {
        kind,
        marked: b[4] & MARKED != 0,
        seq: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        unflushed: u32::from_le_bytes([b[5], b[6], b[7], 0]),
        payload_len: word(16..20) as u64,
        payload_crc: word(20..24),
    })
}

/// The valid records of a metadata zone, up to the first torn one.
pub struct ZoneRecords {
    pub records: Vec<Record>,
    /// Where the valid records end (the zone's real write pointer as far as they tell).
    pub end: u64,
}

/// Reads the valid records of a metadata zone: its checkpoint and the transactions that
/// continue its sequence, stopping at the first torn or foreign one. Only the records no
/// flush had covered can be torn by a crash, so a newer record after the stopping point
/// means damage unless the torn one was among those it was written after (its
/// `unflushed`); [`recover`] looks for one with [`newest_after`].
///
/// On a device with lazy write pointers the records synced last may lie past the zone's
/// write pointer: reading goes on past it as long as the records continue the sequence.
/// Bytes of the zone's earlier life may be there too (a reset for rewrite leaves them), but
/// their sequence numbers are older, so they never continue it.
pub fn read_zone(device: &dyn ZonedDevice, zone: ZoneId) -> Result<ZoneRecords> {
    let geometry = device.geometry();
    let bs = geometry.block_size as u64;
    let wp = device.zone_info(zone)?.write_pointer;
    let limit = match device.lazy_write_pointers() {
        true => geometry.zone_capacity,
        false => wp,
    };
    let mut records: Vec<Record> = Vec::new();
    let mut pos = 0u64;
    let mut block = vec![0u8; bs as usize];
    while pos + bs <= limit {
        device.read_unwritten(zone, pos, &mut block)?;
        let Some(h) = decode_header(&block) else {
            break;
        };
        let continues = match records.last() {
            None => h.kind == RecordKind::Checkpoint,
            Some(last) => {
                h.kind == RecordKind::Transaction && Some(h.seq) == last.seq.checked_add(1)
            }
        };
        // Records of one zone's life follow each other; anything else is the end (or, past
        // the last record, bytes of the zone's earlier life, which a reset for rewrite
        // leaves in place: their sequence numbers are older).
        if !continues {
            break;
        }
        let total = record_blocks(h.payload_len, bs, h.marked) * bs;
        if pos + total > limit {
            break;
        }
        let Some(payload) = read_payload(device, zone, pos, &block, &h)? else {
            break;
        };
        records.push(Record {
            kind: h.kind,
            seq: h.seq,
            unflushed: h.unflushed,
            payload,
        });
        pos += total;
    }
    Ok(ZoneRecords { records, end: pos })
}

/// The payload of the record at `pos` of `zone`, whose first block is `first_block` and
/// header `h`; `None` if it is torn (a block without its mark, a wrong checksum).
fn read_payload(
    device: &dyn ZonedDevice,
    zone: ZoneId,
    pos: u64,
    first_block: &[u8],
    h: &Header,
) -> Result<Option<Vec<u8>>> {
    let bs = first_block.len();
    let len = h.payload_len as usize;
    let first = (bs - HEADER_LEN).min(len);
    let mut payload = Vec::with_capacity(len);
    payload.extend_from_slice(&first_block[HEADER_LEN..HEADER_LEN + first]);
    if len > first {
        let blocks = record_blocks(h.payload_len, bs as u64, h.marked) as usize - 1;
        let mut rest = vec![0u8; blocks * bs];
        device.read_unwritten(zone, pos + bs as u64, &mut rest)?;
        match h.marked {
            true => {
                for block in rest.chunks_exact(bs) {
                    if &block[..MARK.len()] != MARK {
                        return Ok(None);
                    }
                    let take = (len - payload.len()).min(bs - MARK.len());
                    payload.extend_from_slice(&block[MARK.len()..MARK.len() + take]);
                }
            }
            false => payload.extend_from_slice(&rest[..len - first]),
        }
    }
    Ok((crc32c::crc32c(&payload) == h.payload_crc).then_some(payload))
}

/// The newest sequence number of a record header in `zone` after its valid records, which
/// end at `end`, below its write pointer (the block at `end` is the torn one, if any, and
/// `torn` the sequence number it would have had). Newer than the zone's current life began,
/// it means damage, not a torn tail (see [`recover`]), unless `torn` was among the records
/// not yet flushed when it was written: a power cut may have kept it and lost those. Read
/// in pieces of up to [`SCAN_PIECE`] bytes: a retired zone is full, and scanning it a block
/// per call took 24,000 reads at every mount of a device of 128 MiB zones.
///
/// On a device with lazy write pointers the records synced since the pointer was last kept
/// lie past it, so the scan goes at least [`LAZY_SCAN`] past the torn record: a damaged
/// record there with valid ones after it would otherwise pass for the end of the journal,
/// and the mount would silently drop every record after it (and reuse the space of the
/// files they made). The record after a damaged one starts right after it, so the scan
/// meets it unless the damage spans more than [`LAZY_SCAN`]; reading the rest of the zone
/// instead would cost every mount a read of 96 MiB (the default zones' capacity).
pub fn newest_after(
    device: &dyn ZonedDevice,
    zone: ZoneId,
    end: u64,
    torn: u64,
) -> Result<Option<u64>> {
    let geometry = device.geometry();
    let bs = geometry.block_size as u64;
    let wp = device.zone_info(zone)?.write_pointer;
    let limit = match device.lazy_write_pointers() {
        true => wp.max((end + bs + LAZY_SCAN).min(geometry.zone_capacity)),
        false => wp,
    };
    let mut newest: Option<u64> = None;
    let mut scan = end + bs;
    let mut piece = Vec::new();
    while scan + bs <= limit {
        let len = (limit - scan).min(SCAN_PIECE) / bs * bs;
        piece.resize(len as usize, 0);
        device.read_unwritten(zone, scan, &mut piece)?;
        for block in piece.chunks_exact(bs as usize) {
            if let Some(h) = decode_header(block) {
                if !h.written_before_flush_of(torn) {
                    newest = newest.max(Some(h.seq));
                }
            }
        }
        scan += len;
    }
    Ok(newest)
}

/// How much of a metadata zone [`newest_after`] reads at a time.
const SCAN_PIECE: u64 = 1 << 20;

/// How far past a torn record [`newest_after`] looks for newer ones on a device with lazy
/// write pointers.
const LAZY_SCAN: u64 = 1 << 20;

/// Which metadata zones are retired. A zone whose valid checkpoint is older than the other
/// zone's valid checkpoint was retired before that one was written, and every record of
/// its life is older still: whatever follows its valid records, the newer checkpoint holds
/// their effect, so [`recover`] scans only the other zone for damage.
fn superseded(reads: &[ZoneRecords; 2]) -> [bool; 2] {
    let valid_checkpoint = |read: &ZoneRecords| {
        read.records
            .first()
            .filter(|r| r.kind == RecordKind::Checkpoint)
            .map(|r| r.seq)
    };
    [0, 1].map(|i| {
        let (this, other) = (valid_checkpoint(&reads[i]), valid_checkpoint(&reads[1 - i]));
        this.zip(other).is_some_and(|(this, other)| this < other)
    })
}

/// Damage in the retired metadata zone, which [`recover`] does not look for: nothing
/// depends on those records, but a damaged one says the medium is failing. For the deep
/// fsck; the caller keeps checkpoints from moving meanwhile.
pub fn retired_damage(device: &dyn ZonedDevice) -> Result<Option<String>> {
    let reads = [
        read_zone(device, META_ZONES[0])?,
        read_zone(device, META_ZONES[1])?,
    ];
    for (i, retired) in superseded(&reads).into_iter().enumerate() {
        let read = &reads[i];
        let last = read.records.last().map_or(0, |r| r.seq);
        let newest = newest_after(device, META_ZONES[i], read.end, last.saturating_add(1))?;
        if retired && newest.is_some_and(|s| s > last) {
            return Ok(Some(format!(
                "metadata zone {} (retired: the other zone's checkpoint supersedes it): the \
                 record at byte {} is damaged and valid records follow it",
                META_ZONES[i], read.end
            )));
        }
    }
    Ok(None)
}

/// The writer side: which metadata zone is active and the next sequence number.
pub struct Journal {
    device: Arc<dyn ZonedDevice>,
    /// Which of [`META_ZONES`] holds the newest checkpoint.
    active: usize,
    next_seq: u64,
    /// The newest record a completed device flush covers (see [`Journal::note_flushed`]).
    flushed_through: u64,
    /// Bytes of metadata records written (accounting).
    pub bytes_written: u64,
    /// Bytes of the newest checkpoint record.
    pub checkpoint_len: u64,
    /// At most what the transactions appended after it add to the next checkpoint (see
    /// [`GROWTH_PER_BYTE`]).
    grown_since_checkpoint: u64,
    /// The newest record is a transaction that recovery would check against its data (see
    /// [`Journal::seal`]).
    unsealed: bool,
    /// A commit failed: no record may be vouched for any more.
    failed: bool,
}

/// What a transaction's operations add to a checkpoint, at most, per byte of their
/// encoding: a new inode takes about twice the bytes of its `CreateInode` operation in a
/// snapshot, an extent with its checksum unit about its `MapExtent`, inline bytes and link
/// targets themselves. Counted on the encoding, not on the record padded to a block: a
/// sync's record of a few dozen bytes takes a whole block, and counting the block made a
/// store near its metadata line checkpoint after a few dozen syncs.
const GROWTH_PER_BYTE: u64 = 4;

/// At most what `record`, laid out by [`encode`], adds to the next checkpoint.
fn growth(record: &[u8]) -> u64 {
    let payload = u32::from_le_bytes(record[16..20].try_into().expect("a record header"));
    payload as u64 * GROWTH_PER_BYTE
}

/// How large a checkpoint may be, as a share of a metadata zone's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointRoom {
    /// A running store: half, so that transactions have room after it.
    Running,
    /// A mount: three quarters, so that a store whose metadata outgrew half a zone still
    /// mounts, and its files can be removed (each removal a small transaction).
    Mount,
}

/// The metadata zones: the first two zones of the device.
pub const META_ZONES: [ZoneId; 2] = [0, 1];

impl Journal {
    pub fn new(device: Arc<dyn ZonedDevice>, active: usize, next_seq: u64) -> Self {
        Journal {
            device,
            active,
            next_seq,
            // A mount syncs the device before it writes anything.
            flushed_through: next_seq - 1,
            bytes_written: 0,
            checkpoint_len: 0,
            grown_since_checkpoint: 0,
            unsealed: false,
            failed: false,
        }
    }

    /// Lays out a transaction record with the next sequence number (nothing written yet).
    pub fn encode_transaction(&self, ops: &[MetaOp]) -> Result<Vec<u8>> {
        let payload = postcard::to_stdvec(ops)
            .map_err(|e| Error::Corrupt(format!("encoding a transaction: {e}")))?;
        let bs = self.device.geometry().block_size as u64;
        let (seq, unflushed) = (self.next_seq, self.unflushed());
        Ok(encode(
            RecordKind::Transaction,
            seq,
            unflushed,
            &payload,
            bs,
        ))
    }

    /// Records written that no completed device flush covers yet.
    pub fn unflushed(&self) -> u64 {
        (self.next_seq - 1).saturating_sub(self.flushed_through)
    }

    /// A device flush that began after every record written so far has completed. Call
    /// only then: a record is counted durable from here on.
    pub fn note_flushed(&mut self) {
        self.flushed_through = self.next_seq - 1;
    }

    /// Whether a record of `len` bytes fits the active zone. Never fill the zone to the end:
    /// a full zone is no longer active, and recovery tells the current journal zone from a
    /// retired one by exactly that (see [`recover`]); the zone is finished only once the
    /// next checkpoint is durable.
    pub fn fits(&self, len: usize) -> Result<bool> {
        let zone = META_ZONES[self.active];
        let wp = self.device.zone_info(zone)?.write_pointer;
        Ok(wp + (len as u64) < self.device.geometry().zone_capacity)
    }

    /// Whether `record` should go after a new checkpoint instead: when it does not fit, or
    /// when the transactions since the last checkpoint could have grown the metadata past
    /// `full` bytes ([`GROWTH_PER_BYTE`]), but at most every 1/32 of a zone of such growth.
    /// So the store's view of its metadata's size, taken at each checkpoint, is never more
    /// than 1/32 of a zone behind once past `full`, and never past `full` before.
    pub fn checkpoint_due(&self, record: &[u8], full: u64) -> Result<bool> {
        let capacity = self.device.geometry().zone_capacity;
        let room = full.saturating_sub(self.checkpoint_len).max(capacity / 32);
        let grown = self.grown_since_checkpoint + growth(record);
        Ok(!self.fits(record.len())? || grown > room)
    }

    /// Appends a record made by [`Journal::encode_transaction`] that [`Journal::fits`].
    /// Not durable until the device syncs.
    pub fn append_record(&mut self, record: &[u8]) -> Result<()> {
        let zone = META_ZONES[self.active];
        let wp = self.device.zone_info(zone)?.write_pointer;
        self.device.write(zone, wp, record)?;
        self.bytes_written += record.len() as u64;
        self.grown_since_checkpoint += growth(record);
        self.next_seq += 1;
        self.unsealed = true;
        Ok(())
    }

    /// At a clean stop, once every record is durable: appends an empty transaction, so that
    /// the transaction before it is no longer the newest. Recovery checks the newest
    /// transaction's data against its checksums and drops it on a mismatch, since its sync
    /// may never have completed; a transaction followed by another one was durable (a
    /// commit writes its record only after the previous commit's flush). Without the seal, a
    /// block of the last commit damaged after a clean stop would make the next mount drop
    /// that whole commit, files and all, and `fs fsck --deep` would have nothing to report.
    /// Not synced here: the store's unmount syncs it; if it is lost all the same (a crash in
    /// between), recovery checks that transaction as before.
    pub fn seal(&mut self) -> Result<()> {
        if !self.unsealed || self.failed {
            return Ok(());
        }
        let record = self.encode_transaction(&[])?;
        if self.fits(record.len())? {
            self.append_record(&record)?;
        }
        self.unsealed = false;
        Ok(())
    }

    /// Appends a transaction, or returns `Ok(false)` when it does not fit the active zone
    /// (the caller then writes a checkpoint instead). Not durable until the device syncs.
    #[cfg(test)]
    pub fn append(&mut self, ops: &[MetaOp]) -> Result<bool> {
        let record = self.encode_transaction(ops)?;
        if !self.fits(record.len())? {
            return Ok(false);
        }
        self.append_record(&record)?;
        Ok(true)
    }

    /// Writes a checkpoint into the other metadata zone and makes it the active one. The
    /// record holds the snapshot and, after it, `carry`: operations that rebuild what the
    /// state holds but a snapshot does not (the inline bytes, see [`MetaOp::Inline`]), in
    /// the same record so that one cannot be durable without the other.
    ///
    /// Everything the checkpoint refers to must already be durable: the caller syncs the
    /// device before (so the data) and after (so the checkpoint). The zone it replaces is
    /// finished once the new checkpoint is durable, see [`Journal::retire_previous`].
    pub fn checkpoint(
        &mut self,
        snapshot: &Snapshot,
        carry: &[MetaOp],
        room: CheckpointRoom,
    ) -> Result<()> {
        let encoding = |e: postcard::Error| Error::Corrupt(format!("encoding a checkpoint: {e}"));
        let mut payload = postcard::to_stdvec(snapshot).map_err(encoding)?;
        if !carry.is_empty() {
            payload.extend(postcard::to_stdvec(carry).map_err(encoding)?);
        }
        let geometry = self.device.geometry();
        // The caller synced the device: every record before this one is durable.
        self.note_flushed();
        let record = encode(
            RecordKind::Checkpoint,
            self.next_seq,
            0,
            &payload,
            geometry.block_size as u64,
        );
        // Leave room for transactions after the checkpoint, or we would checkpoint forever.
        let (limit, share) = match room {
            CheckpointRoom::Running => (geometry.zone_capacity / 2, "half"),
            CheckpointRoom::Mount => (geometry.zone_capacity / 4 * 3, "three quarters"),
        };
        if record.len() as u64 > limit {
            return Err(Error::NoSpace(format!(
                "metadata checkpoint of {} bytes exceeds {share} of a metadata zone ({limit} \
                 bytes)",
                record.len(),
            )));
        }
        let next = 1 - self.active;
        let zone = META_ZONES[next];
        self.device.reset_for_rewrite(zone)?;
        self.device.write(zone, 0, &record)?;
        self.bytes_written += record.len() as u64;
        self.checkpoint_len = record.len() as u64;
        self.grown_since_checkpoint = 0;
        self.next_seq += 1;
        self.active = next;
        self.unsealed = false;
        Ok(())
    }

    /// A commit failed (its write or flush): its record may be on the device without its
    /// data, so nothing may seal it.
    pub fn note_failure(&mut self) {
        self.failed = true;
    }

    /// Finishes the metadata zone that the last checkpoint replaced, so it stops holding an
    /// active-zone resource. Call after the checkpoint is durable.
    pub fn retire_previous(&mut self) -> Result<()> {
        let old = META_ZONES[1 - self.active];
        let info = self.device.zone_info(old)?;
        if info.state.is_active() {
            self.device.finish(old)?;
        }
        Ok(())
    }
}

/// What recovery found in the metadata zones.
pub struct Recovered {
    pub snapshot: Snapshot,
    /// Operations the checkpoint carries after its snapshot (applied before the journal).
    pub carry: Vec<MetaOp>,
    pub transactions: Vec<Vec<MetaOp>>,
    /// How many of the last transactions may not have been durable when the newest one was
    /// written, besides the newest itself (its `unflushed`, at most the transactions
    /// before it): recovery checks each of them against its data.
    pub unflushed: usize,
    /// Index of the zone (0 or 1) the checkpoint came from.
    pub active: usize,
    pub last_seq: u64,
    /// Where the journal goes on: past `last_seq` by the most records one zone's life can
    /// hold. Records written after a torn one that no flush covered (a hand-off's) are not
    /// recovered but stay on the device, since a reset for rewrite leaves a zone's bytes in
    /// place; were their numbers used again, a stale one would look newer than a later
    /// checkpoint torn by another crash, and recovery would refuse a valid store. All
    /// such records belong to the zone life that holds the torn one (a checkpoint into the
    /// other zone follows a flush, and a flush leaves nothing torn), so none is numbered
    /// this high.
    pub next_seq: u64,
}

/// Finds the newest checkpoint and the transactions after it.
///
/// A metadata zone that holds data but no readable checkpoint is a checkpoint torn by a
/// crash only while the other zone is still active (it is finished once the new checkpoint
/// is durable); otherwise the newest metadata was damaged and recovering from the older zone
/// would silently roll the store back, so recovery refuses.
pub fn recover(device: &dyn ZonedDevice) -> Result<Option<Recovered>> {
    let mut best: Option<(usize, Vec<Record>)> = None;
    let mut unreadable: Option<ZoneId> = None;
    let reads = [
        read_zone(device, META_ZONES[0])?,
        read_zone(device, META_ZONES[1])?,
    ];
    let checkpoint_seq = |read: &ZoneRecords| read.records.first().map_or(0, |r| r.seq);
    let floors = [0, 1].map(|i| {
        let last = reads[i].records.last();
        last.map_or(checkpoint_seq(&reads[1 - i]), |r| r.seq)
    });
    let superseded = superseded(&reads);
    let mut newest = [None, None];
    for i in [0, 1] {
        if !superseded[i] {
            let torn = reads[i]
                .records
                .last()
                .map_or(0, |r| r.seq.saturating_add(1));
            newest[i] = newest_after(device, META_ZONES[i], reads[i].end, torn)?;
        }
    }
    for (i, (zone, read)) in META_ZONES.iter().zip(reads).enumerate() {
        // Records synced past a lazily kept write pointer: the pointer goes to their end.
        device.restore_write_pointer(*zone, read.end)?;
        // A record of the zone's current life after its valid ones is damage. Those are
        // newer than its last valid record or, when not even its checkpoint is valid,
        // than the other zone's checkpoint: the zone's earlier life ended before that one
        // was written, and a reset for rewrite leaves its bytes in place.
        if newest[i].is_some_and(|seq| seq > floors[i]) {
            let at = read.end;
            let what = if at == 0 {
                "its checkpoint".to_string()
            } else {
                format!("the record at byte {at}")
            };
            return Err(Error::Corrupt(format!(
                "metadata zone {zone}: {what} is damaged and valid records follow it"
            )));
        }
        let records = read.records;
        let Some(first) = records.first() else {
            if device.zone_info(*zone)?.write_pointer > 0 {
                unreadable = Some(*zone);
            }
            continue;
        };
        if first.kind != RecordKind::Checkpoint {
            unreadable = Some(*zone);
            continue;
        }
        if best.as_ref().is_none_or(|(_, b)| b[0].seq < first.seq) {
            best = Some((i, records));
        }
    }
    let Some((active, records)) = best else {
        if let Some(zone) = unreadable {
            return Err(Error::Corrupt(format!(
                "metadata zone {zone} holds data but no readable checkpoint"
            )));
        }
        return Ok(None);
    };
    if let Some(zone) = unreadable {
        let chosen = device.zone_info(META_ZONES[active])?;
        if !chosen.state.is_active() {
            return Err(Error::Corrupt(format!(
                "the newest checkpoint (metadata zone {zone}) is damaged; refusing to roll \
                 back to the older one in zone {}",
                META_ZONES[active]
            )));
        }
    }
    let undecodable =
        |e: postcard::Error| Error::Corrupt(format!("checkpoint does not decode: {e}"));
    let (snapshot, rest): (Snapshot, &[u8]) =
        postcard::take_from_bytes(&records[0].payload).map_err(undecodable)?;
    let carry: Vec<MetaOp> = match rest.is_empty() {
        true => Vec::new(),
        false => postcard::from_bytes(rest).map_err(undecodable)?,
    };
    let mut last_seq = records[0].seq;
    let mut transactions = Vec::new();
    let mut unflushed = 0;
    for rec in &records[1..] {
        if rec.kind != RecordKind::Transaction || Some(rec.seq) != last_seq.checked_add(1) {
            return Err(Error::Corrupt(format!(
                "journal record {} follows {last_seq} out of order",
                rec.seq
            )));
        }
        let ops: Vec<MetaOp> = postcard::from_bytes(&rec.payload)
            .map_err(|e| Error::Corrupt(format!("transaction {} does not decode: {e}", rec.seq)))?;
        unflushed = (rec.unflushed as usize).min(transactions.len());
        transactions.push(ops);
        last_seq = rec.seq;
    }
    let next_seq = last_seq
        .checked_add(1 + device.geometry().blocks_per_zone())
        .ok_or_else(|| {
            Error::Corrupt(format!("journal sequence number {last_seq} is too large"))
        })?;
    Ok(Some(Recovered {
        snapshot,
        carry,
        transactions,
        unflushed,
        active,
        last_seq,
        next_seq,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_flipped_bits() {
        let rec = encode(RecordKind::Transaction, 42, 300, b"hello", 4096);
        assert_eq!(rec.len(), 4096);
        let h = decode_header(&rec).unwrap();
        assert_eq!(
            (h.kind, h.seq, h.unflushed, h.payload_len),
            (RecordKind::Transaction, 42, 300, 5)
        );
        for byte in [0, 4, 6, 9, 17, 21, 25] {
            let mut bad = rec.clone();
            bad[byte] ^= 0x10;
            assert!(decode_header(&bad).is_none(), "flip at {byte} accepted");
        }
    }

    /// A record as laid out before marks: the payload contiguous after the header.
    fn encode_contiguous(kind: RecordKind, seq: u64, payload: &[u8]) -> Vec<u8> {
        let marked = encode(kind, seq, 0, payload, 4096);
        let mut out = vec![0u8; (HEADER_LEN + payload.len()).div_ceil(4096) * 4096];
        out[..HEADER_LEN].copy_from_slice(&marked[..HEADER_LEN]);
        out[4] &= !MARKED;
        let crc = crc32c::crc32c(&out[0..24]);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
        out
    }

    fn small_device() -> crate::device::MemoryDevice {
        let geometry = crate::device::Geometry {
            zone_count: 4,
            zone_size: 64 * 4096,
            zone_capacity: 64 * 4096,
            block_size: 4096,
            max_open: 4,
            max_active: 4,
        };
        crate::device::MemoryDevice::new(geometry).unwrap()
    }

    /// Found by review: a payload holds tenants' bytes, and a forged header in them that
    /// fell on a block boundary passed for a record of its own when recovery scanned past
    /// the valid ones, so one tenant could make the store refuse to mount. With marks, no
    /// block but a record's first can start with the magic.
    #[test]
    fn a_payload_never_passes_for_a_record_header() {
        let forged = encode(RecordKind::Transaction, 1 << 62, 0, b"", 4096);
        let mut payload = vec![7u8; 3 * 4096];
        for at in [4096 - HEADER_LEN, 2 * 4096 - HEADER_LEN, 2 * 4096 - 4] {
            payload[at..at + HEADER_LEN].copy_from_slice(&forged[..HEADER_LEN]);
        }
        let blocks_decoding = |record: &[u8]| {
            record[4096..]
                .chunks_exact(4096)
                .filter(|b| decode_header(b).is_some())
                .count()
        };
        let old = encode_contiguous(RecordKind::Transaction, 5, &payload);
        assert!(
            blocks_decoding(&old) > 0,
            "the test's forgery works on the old layout"
        );
        let record = encode(RecordKind::Transaction, 5, 0, &payload, 4096);
        assert_eq!(blocks_decoding(&record), 0);
    }

    /// Records round-trip at sizes around the blocks' edges, in both layouts.
    #[test]
    fn records_of_both_layouts_read_back() {
        let device = small_device();
        let sizes = [0usize, 4064, 4065, 4092 + 4064, 4092 + 4065, 3 * 4096 + 5];
        let payloads: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| (0..n).map(|i| (i % 251) as u8).collect())
            .collect();
        let mut at = 0;
        for (i, payload) in payloads.iter().enumerate() {
            let (kind, seq) = match i {
                0 => (RecordKind::Checkpoint, 10),
                _ => (RecordKind::Transaction, 10 + i as u64),
            };
            let record = match i % 2 {
                0 => encode(kind, seq, 0, payload, 4096),
                _ => encode_contiguous(kind, seq, payload),
            };
            device.write(0, at, &record).unwrap();
            at += record.len() as u64;
        }
        let read = read_zone(&device, 0).unwrap();
        assert_eq!(read.end, at);
        let back: Vec<Vec<u8>> = read.records.into_iter().map(|r| r.payload).collect();
        assert_eq!(back, payloads);
    }

    /// A block of a marked record that lost its mark is a torn record.
    #[test]
    fn a_marked_record_missing_a_mark_is_torn() {
        let device = small_device();
        let checkpoint = encode(RecordKind::Checkpoint, 1, 0, b"snapshot", 4096);
        let mut record = encode(RecordKind::Transaction, 2, 0, &[9u8; 6000], 4096);
        record[4096] = 0;
        device.write(0, 0, &checkpoint).unwrap();
        device.write(0, 4096, &record).unwrap();
        let read = read_zone(&device, 0).unwrap();
        assert_eq!((read.records.len(), read.end), (1, 4096));
    }

    /// A power cut can keep a record written after a hand-off's and lose the hand-off's:
    /// a valid record after a torn one is a torn tail when the torn one was among those not
    /// yet flushed when the valid one was written, and damage otherwise.
    #[test]
    fn a_record_after_a_torn_one_is_damage_only_if_a_flush_covered_the_torn_one() {
        use crate::device::{Geometry, MemoryDevice};
        let geometry = Geometry {
            zone_count: 4,
            zone_size: 16 * 4096,
            zone_capacity: 16 * 4096,
            block_size: 4096,
            max_open: 4,
            max_active: 4,
        };
        for (unflushed, damage) in [(0, true), (1, false), (2, false)] {
            let device = MemoryDevice::new(geometry).unwrap();
            let records = [
                encode(RecordKind::Checkpoint, 1, 0, b"snapshot", 4096),
                encode(RecordKind::Transaction, 2, 0, b"synced", 4096),
                vec![0u8; 4096], // record 3, lost
                encode(RecordKind::Transaction, 4, unflushed, b"kept", 4096),
            ];
            for (i, r) in records.iter().enumerate() {
                device.write(0, i as u64 * 4096, r).unwrap();
            }
            let read = read_zone(&device, 0).unwrap();
            assert_eq!(read.records.len(), 2);
            assert_eq!(read.end, 2 * 4096);
            let newest = newest_after(&device, 0, read.end, 3).unwrap();
            assert_eq!(
                newest.is_some(),
                damage,
                "unflushed {unflushed}: {newest:?}"
            );
        }
    }

    /// Found by the crash test: a transaction that filled the active zone to the end made
    /// it Full, so a crash during the next checkpoint looked like a damaged newest
    /// checkpoint next to a retired zone, and recovery refused the store.
    #[test]
    fn appends_never_fill_the_active_zone() {
        use crate::device::{Geometry, MemoryDevice};
        let geometry = Geometry {
            zone_count: 4,
            zone_size: 8 * 4096,
            zone_capacity: 8 * 4096,
            block_size: 4096,
            max_open: 4,
            max_active: 4,
        };
        let device: Arc<dyn ZonedDevice> = Arc::new(MemoryDevice::new(geometry).unwrap());
        let mut journal = Journal::new(device.clone(), 0, 1);
        let op = MetaOp::SetAttr {
            ino: 1,
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        };
        // One block per transaction: the eighth would fill the zone exactly.
        let mut appended = 0;
        while journal.append(std::slice::from_ref(&op)).unwrap() {
            appended += 1;
        }
        assert_eq!(appended, 7);
        let info = device.zone_info(META_ZONES[0]).unwrap();
        assert!(info.state.is_active(), "{info:?}");
    }
}
