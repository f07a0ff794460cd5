//! Inline tails: small synced bytes that live in the journal until they reach a data zone.
//!
//! A sync of a small tail (a log record, a commit) writes one journal page instead of a
//! data block and a journal page: the bytes travel in a [`MetaOp::Inline`] record while the
//! file's window keeps them. The window later reaches a data zone as one extent (when it
//! fills, is evicted or the file closes), and a [`MetaOp::InlineDone`] recorded with that
//! extent retires the pieces. After a crash, mount writes the pieces still here back into
//! their files.
//!
//! Every window gets a generation from a store-wide counter, and its pieces carry it. A
//! window's flush retires the pieces of its generation and older ones: the pieces of a newer
//! window of the same file (which may overwrite the same bytes) stay, so a sync never has
//! to wait for an older window's write to finish before inlining.
//!
//! [`MetaOp::Inline`]: super::state::MetaOp::Inline
//! [`MetaOp::InlineDone`]: super::state::MetaOp::InlineDone

use std::collections::BTreeMap;

use super::state::Ino;

/// Synced bytes of one file at `offset`, from the window of generation `gen`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub gen: u64,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// The pieces of every file, oldest first per file, and their total size.
#[derive(Clone, Debug, Default)]
pub struct InlineTails {
    files: BTreeMap<Ino, Vec<Piece>>,
    bytes: u64,
}

impl InlineTails {
    /// Adds a piece; one that continues the file's newest piece of the same window (a log
    /// synced record by record) grows it.
    pub fn add(&mut self, ino: Ino, gen: u64, offset: u64, data: &[u8]) {
        // No bytes, nothing to keep (and no window's flush would ever retire it).
        if data.is_empty() {
            return;
        }
        self.bytes += data.len() as u64;
        let pieces = self.files.entry(ino).or_default();
        match pieces.last_mut() {
            Some(p) if p.gen == gen && p.offset + p.data.len() as u64 == offset => {
                p.data.extend_from_slice(data)
            }
            _ => pieces.push(Piece {
                gen,
                offset,
                data: data.to_vec(),
            }),
        }
    }

    /// Retires the file's pieces of windows up to generation `gen` (now in data zones).
    pub fn done(&mut self, ino: Ino, gen: u64) {
        self.keep(ino, |p| p.gen > gen);
    }

    /// Drops bytes at or past `size` (a truncation).
    pub fn clip(&mut self, ino: Ino, size: u64) {
        let Some(pieces) = self.files.get_mut(&ino) else {
            return;
        };
        for p in pieces.iter_mut() {
            let keep = size.saturating_sub(p.offset).min(p.data.len() as u64) as usize;
            self.bytes -= (p.data.len() - keep) as u64;
            p.data.truncate(keep);
        }
        self.keep(ino, |p| !p.data.is_empty());
    }

    /// Forgets a file (freed).
    pub fn remove(&mut self, ino: Ino) {
        self.keep(ino, |_| false);
    }

    fn keep(&mut self, ino: Ino, keep: impl Fn(&Piece) -> bool) {
        let Some(pieces) = self.files.get_mut(&ino) else {
            return;
        };
        let before: u64 = pieces.iter().map(|p| p.data.len() as u64).sum();
        pieces.retain(|p| keep(p));
        let after: u64 = pieces.iter().map(|p| p.data.len() as u64).sum();
        self.bytes -= before - after;
        if pieces.is_empty() {
            self.files.remove(&ino);
        }
    }

    /// Whether the file has pieces of generation `gen` or older.
    pub fn has_up_to(&self, ino: Ino, gen: u64) -> bool {
        self.files
            .get(&ino)
            .is_some_and(|ps| ps.iter().any(|p| p.gen <= gen))
    }

    /// Total bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The newest generation of any piece (0 when there are none).
    pub fn max_gen(&self) -> u64 {
        self.files
            .values()
            .flatten()
            .map(|p| p.gen)
            .max()
            .unwrap_or(0)
    }

    /// The pieces of one file, oldest first (a later one wins where they overlap).
    pub fn of(&self, ino: Ino) -> &[Piece] {
        self.files.get(&ino).map_or(&[], Vec::as_slice)
    }

    /// Every file's pieces, oldest first.
    pub fn files(&self) -> impl Iterator<Item = (Ino, &[Piece])> {
        self.files.iter().map(|(&ino, ps)| (ino, ps.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `metadata_damaged_behind_valid_checksums_is_refused_or_mounts_consistent`:
    /// a journaled piece of no bytes was kept, no flush ever retired it, and the mount
    /// failed after it had written a checkpoint.
    #[test]
    fn a_piece_of_no_bytes_is_not_kept() {
        let mut t = InlineTails::default();
        t.add(7, 1, 300, &[]);
        assert_eq!(t.files().count(), 0);
        assert_eq!(t.bytes(), 0);
    }

    #[test]
    fn appends_grow_one_piece_and_generations_retire_in_order() {
        let mut t = InlineTails::default();
        t.add(7, 1, 0, b"abc");
        t.add(7, 1, 3, b"def");
        t.add(7, 2, 4, b"XY"); // a newer window overwrites bytes 4..6
        assert_eq!(t.files().next().unwrap().1.len(), 2);
        assert_eq!(t.bytes(), 8);
        assert!(t.has_up_to(7, 1));
        t.done(7, 1);
        assert_eq!(t.bytes(), 2);
        assert!(!t.has_up_to(7, 1) && t.has_up_to(7, 2));
        assert_eq!(t.max_gen(), 2);
        t.done(7, 2);
        assert!(t.files().next().is_none() && t.bytes() == 0);
    }

    #[test]
    fn clipping_and_removal_keep_the_count() {
        let mut t = InlineTails::default();
        t.add(1, 1, 100, &[1; 50]);
        t.add(1, 1, 200, &[2; 50]);
        t.add(2, 3, 0, &[3; 10]);
        t.clip(1, 120);
        assert_eq!(t.bytes(), 30);
        t.clip(1, 100);
        assert_eq!(t.bytes(), 10);
        assert!(!t.has_up_to(1, u64::MAX));
        t.remove(2);
        assert!(t.files().next().is_none() && t.bytes() == 0);
    }
}
