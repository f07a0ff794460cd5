//! `fd_readdir` for both kinds of directory: cookies that name entries, and the packing of
//! `dirent` records into the guest's buffer.
//!
//! Cookies 1 and 2 follow `.` and `..`; cookie `FIRST + i` follows the entry called
//! `names[i]`. Listings come sorted by name, so resuming continues with the next name in
//! order even when that entry, or any other, was removed meanwhile (position cookies would
//! skip entries: `rm -r` and Rust's `remove_dir_all` delete while they list).

use std::collections::HashMap;
use std::sync::Mutex;

use super::abi::{filetype, Errno, DIRENT_SIZE};
use super::mem::GuestMem;

/// One entry of a listing.
pub struct Item {
    pub name: String,
    pub ino: u64,
    pub filetype: u8,
}

/// The cookies one directory descriptor has handed out.
#[derive(Default)]
pub struct Cookies {
    names: Vec<String>,
    by_name: HashMap<String, u64>,
}

impl Cookies {
    const FIRST: u64 = 3;
    /// A listing from the start forgets older cookies once this many names are held.
    const MAX: usize = 1 << 16;

    fn cookie(&mut self, name: &str) -> u64 {
        if let Some(&c) = self.by_name.get(name) {
            return c;
        }
        let c = Self::FIRST + self.names.len() as u64;
        self.names.push(name.to_string());
        self.by_name.insert(name.to_string(), c);
        c
    }
}

/// Where a listing resumes: `None` past the end (a cookie this descriptor never gave).
pub fn resume_after(cookies: &Mutex<Cookies>, cookie: u64) -> Option<Option<String>> {
    let mut c = cookies.lock().unwrap_or_else(|p| p.into_inner());
    if cookie < Cookies::FIRST {
        if cookie == 0 && c.names.len() > Cookies::MAX {
            *c = Cookies::default();
        }
        return Some(None);
    }
    c.names
        .get((cookie - Cookies::FIRST) as usize)
        .map(|n| Some(n.clone()))
}

/// Packs `.`, `..` and `items` (sorted by name) from `cookie` on into the guest's buffer;
/// returns the bytes used (== `buf_len` when more entries may follow).
#[allow(clippy::too_many_arguments)]
pub fn pack(
    cookies: &Mutex<Cookies>,
    mem: &GuestMem,
    buf: u32,
    buf_len: u32,
    cookie: u64,
    dot: u64,
    dotdot: u64,
    items: Vec<Item>,
) -> Result<u32, Errno> {
    let after = match resume_after(cookies, cookie) {
        Some(after) => after,
        None => return Ok(0),
    };
    let mut used = 0u32;
    let mut emit = |next: u64, ino: u64, name: &str, ty: u8| -> Result<bool, Errno> {
        let mut rec = Vec::with_capacity(DIRENT_SIZE + name.len());
        rec.extend_from_slice(&next.to_le_bytes());
        rec.extend_from_slice(&ino.to_le_bytes());
        rec.extend_from_slice(&(name.len() as u32).to_le_bytes());
        rec.extend_from_slice(&[ty, 0, 0, 0]);
        rec.extend_from_slice(name.as_bytes());
        let room = (buf_len - used) as usize;
        let n = rec.len().min(room);
        // A buffer that runs past the end of a 4 GiB memory ends there (EFAULT), not at 0.
        mem.write_bytes(buf.checked_add(used).ok_or(Errno::FAULT)?, &rec[..n])?;
        used += n as u32;
        Ok(used < buf_len)
    };
    if cookie < 1 && !emit(1, dot, ".", filetype::DIRECTORY)? {
        return Ok(used);
    }
    if cookie < 2 && !emit(2, dotdot, "..", filetype::DIRECTORY)? {
        return Ok(used);
    }
    let mut c = cookies.lock().unwrap_or_else(|p| p.into_inner());
    for item in items
        .iter()
        .filter(|i| after.as_ref().is_none_or(|a| i.name > *a))
    {
        let next = c.cookie(&item.name);
        if !emit(next, item.ino, &item.name, item.filetype)? {
            break;
        }
    }
    Ok(used)
}
