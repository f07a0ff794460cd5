//! Guest linear memory as one host call sees it: bounds-checked loads and stores of the
//! little-endian values and byte ranges the WASIp1 ABI passes by pointer.
//!
//! A [`GuestMem`] is taken at the start of a call and dropped at its end. It holds the
//! memory's base and length as raw parts, so the host state can be borrowed at the same
//! time; this is sound because the host never grows a memory or re-enters the guest during
//! a call, so the base and length cannot change under it. A shared memory (wasip1-threads)
//! may be written by other guest threads at any moment: its bytes are never lent out as a
//! Rust slice, only copied in and out (through the caller's scratch buffer), and its length
//! only grows, so the length taken at the start stays in bounds.

use super::abi::Errno;

/// Most buffers one vectored call takes (Linux's `UIO_MAXIOV`): more is EINVAL.
pub const IOV_MAX: u32 = 1024;

/// Most bytes one call moves (Linux's `MAX_RW_COUNT`): more is a short transfer, and the
/// count always fits the guest's `ssize_t`.
pub const MAX_RW: u32 = 0x7fff_f000;

/// Most bytes one call moves through the scratch copy of a shared memory: a larger
/// transfer is short, so that no guest length sizes a host allocation (with many threads
/// and a large memory, a copy each the size of the memory could exhaust the host).
pub const SHARED_MAX: u32 = 16 << 20;

/// Linux's `PATH_MAX`, its NUL included: a path (or link target) of this many bytes or more
/// is ENAMETOOLONG, refused before it is copied, so no guest length sizes the copy (with
/// many threads and a large memory, copies each the size of the memory could exhaust the
/// host, outside the pod's memory limit).
pub const PATH_MAX: u32 = 4096;

/// Most bytes of an append's buffers gathered into one store write (see
/// [`GuestMem::gather`]).
pub const GATHER_MAX: u32 = 1 << 20;

/// One call's view of the guest's memory.
pub struct GuestMem {
    base: *mut u8,
    len: usize,
    shared: bool,
}

impl GuestMem {
    /// A plain (unshared) memory, borrowed for the call.
    pub fn plain(data: &mut [u8]) -> GuestMem {
        GuestMem {
            base: data.as_mut_ptr(),
            len: data.len(),
            shared: false,
        }
    }

    /// A shared memory: `base` and `len` as [`wasmtime::SharedMemory::data`] gives them.
    pub fn shared(base: *mut u8, len: usize) -> GuestMem {
        GuestMem {
            base,
            len,
            shared: true,
        }
    }

    /// No memory (a call made before the guest's memory is known).
    pub fn none() -> GuestMem {
        GuestMem {
            base: std::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
            shared: false,
        }
    }

    /// The offset of `ptr..ptr+len` in memory, or EFAULT.
    #[inline]
    fn check(&self, ptr: u32, len: usize) -> Result<usize, Errno> {
        let start = ptr as usize;
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(start),
            _ => Err(Errno::FAULT),
        }
    }

    /// EFAULT unless `count` records of `size` bytes from `ptr` lie in memory: checked
    /// before the host sizes anything by a count the guest gave.
    pub fn array(&self, ptr: u32, count: u32, size: u32) -> Result<(), Errno> {
        self.check(ptr, count as usize * size as usize).map(|_| ())
    }

    #[inline]
    fn load<const N: usize>(&self, ptr: u32) -> Result<[u8; N], Errno> {
        let at = self.check(ptr, N)?;
        let mut out = [0u8; N];
        // SAFETY: in bounds (checked); a raw copy never forms a reference to guest bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), out.as_mut_ptr(), N) };
        Ok(out)
    }

    #[inline]
    fn store<const N: usize>(&self, ptr: u32, bytes: [u8; N]) -> Result<(), Errno> {
        let at = self.check(ptr, N)?;
        // SAFETY: as in `load`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(at), N) };
        Ok(())
    }

    #[inline]
    pub fn u8(&self, ptr: u32) -> Result<u8, Errno> {
        Ok(self.load::<1>(ptr)?[0])
    }

    #[inline]
    pub fn u16(&self, ptr: u32) -> Result<u16, Errno> {
        Ok(u16::from_le_bytes(self.load(ptr)?))
    }

    #[inline]
    pub fn u32(&self, ptr: u32) -> Result<u32, Errno> {
        Ok(u32::from_le_bytes(self.load(ptr)?))
    }

    #[inline]
    pub fn u64(&self, ptr: u32) -> Result<u64, Errno> {
        Ok(u64::from_le_bytes(self.load(ptr)?))
    }

    #[inline]
    pub fn put_u8(&self, ptr: u32, v: u8) -> Result<(), Errno> {
        self.store(ptr, [v])
    }

    #[inline]
    pub fn put_u16(&self, ptr: u32, v: u16) -> Result<(), Errno> {
        self.store(ptr, v.to_le_bytes())
    }

    #[inline]
    pub fn put_u32(&self, ptr: u32, v: u32) -> Result<(), Errno> {
        self.store(ptr, v.to_le_bytes())
    }

    #[inline]
    pub fn put_u64(&self, ptr: u32, v: u64) -> Result<(), Errno> {
        self.store(ptr, v.to_le_bytes())
    }

    /// Checks an iovec array before any byte moves, as Linux's `readv` and `writev` do:
    /// EINVAL for more than [`IOV_MAX`] buffers, EFAULT unless the array and every buffer
    /// lie in memory (a bad buffer after a good one used to fail the call after the good
    /// one's bytes were written, and a retry wrote them twice).
    pub fn check_iovecs(&self, iovs: u32, n: u32) -> Result<(), Errno> {
        if n > IOV_MAX {
            return Err(Errno::INVAL);
        }
        self.array(iovs, n, 8)?;
        for i in 0..n {
            let (buf, len) = self.iovec(iovs, i)?;
            self.check(buf, len as usize)?;
        }
        Ok(())
    }

    /// How many of a buffer's `len` bytes a transfer that moved `done` so far may move: at
    /// most [`MAX_RW`] in all, as Linux's `MAX_RW_COUNT`, and through a shared memory's
    /// scratch at most [`SHARED_MAX`] (a short transfer, which callers loop over).
    #[inline]
    pub fn room(&self, done: u32, len: u32) -> u32 {
        let cap = if self.shared { SHARED_MAX } else { MAX_RW };
        len.min(cap.saturating_sub(done))
    }

    /// The `i`th `(buf, len)` pair of an iovec array at `iovs`.
    #[inline]
    pub fn iovec(&self, iovs: u32, i: u32) -> Result<(u32, u32), Errno> {
        let at = iovs.checked_add(i.checked_mul(8).ok_or(Errno::FAULT)?);
        let at = at.ok_or(Errno::FAULT)?;
        Ok((
            self.u32(at)?,
            self.u32(at.checked_add(4).ok_or(Errno::FAULT)?)?,
        ))
    }

    /// The buffers of the iovec array at `iovs` (checked by [`GuestMem::check_iovecs`]),
    /// one after another in `out`, as many as [`GuestMem::room`] lets one call move; false,
    /// and `out` left as it was, when that is more than `max` bytes. An append gathers its
    /// buffers so that they land as one write (as Linux's `writev` holds the inode lock for
    /// the whole call, no other append comes between them).
    pub fn gather(&self, iovs: u32, n: u32, max: u32, out: &mut Vec<u8>) -> Result<bool, Errno> {
        let mut total = 0u32;
        for i in 0..n {
            let (_, whole) = self.iovec(iovs, i)?;
            let len = self.room(total, whole);
            total += len;
            if total > max {
                return Ok(false);
            }
            if len < whole {
                break;
            }
        }
        out.clear();
        out.reserve(total as usize);
        let mut left = total;
        for i in 0..n {
            if left == 0 {
                break;
            }
            let (buf, whole) = self.iovec(iovs, i)?;
            let len = whole.min(left);
            let at = self.check(buf, len as usize)?;
            let end = out.len();
            // SAFETY: in bounds; a raw copy (a shared memory's bytes are never lent out)
            // into capacity reserved above, which then holds initialised bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.add(at),
                    out.as_mut_ptr().add(end),
                    len as usize,
                );
                out.set_len(end + len as usize);
            }
            left -= len;
        }
        Ok(true)
    }

    /// Guest bytes to read from. A plain memory lends them directly; a shared one copies
    /// them into `scratch` first.
    #[inline]
    pub fn bytes<'a>(
        &'a self,
        ptr: u32,
        len: u32,
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], Errno> {
        let at = self.check(ptr, len as usize)?;
        if !self.shared {
            // SAFETY: in bounds; an unshared memory is touched by no one else during the
            // call, and the slice lives no longer than this view.
            return Ok(unsafe { std::slice::from_raw_parts(self.base.add(at), len as usize) });
        }
        scratch.clear();
        scratch.resize(len as usize, 0);
        // SAFETY: in bounds; copied without forming a reference to shared bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(at), scratch.as_mut_ptr(), len as usize)
        };
        Ok(scratch)
    }

    /// A guest byte range to fill: `fill` gets a buffer of `len` bytes and returns how many
    /// it filled; those land at `ptr`. Plain memory is filled in place, shared memory
    /// through `scratch`.
    #[inline]
    pub fn fill<E: From<Errno>>(
        &self,
        ptr: u32,
        len: u32,
        scratch: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let at = self.check(ptr, len as usize)?;
        if !self.shared {
            // SAFETY: as in `bytes`, mutably: nothing else reads it during the call.
            let buf = unsafe { std::slice::from_raw_parts_mut(self.base.add(at), len as usize) };
            return fill(buf);
        }
        scratch.clear();
        scratch.resize(len as usize, 0);
        let n = fill(scratch)?.min(len as usize);
        // SAFETY: in bounds; a raw copy into shared memory.
        unsafe { std::ptr::copy_nonoverlapping(scratch.as_ptr(), self.base.add(at), n) };
        Ok(n)
    }

    /// Copies `data` to `ptr`.
    #[inline]
    pub fn write_bytes(&self, ptr: u32, data: &[u8]) -> Result<(), Errno> {
        let at = self.check(ptr, data.len())?;
        // SAFETY: in bounds; a raw copy.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(at), data.len()) };
        Ok(())
    }

    /// A guest string (a path): copied out, and EILSEQ unless it is UTF-8. EFAULT unless
    /// it lies in memory, then ENAMETOOLONG from [`PATH_MAX`] bytes on.
    pub fn string(&self, ptr: u32, len: u32) -> Result<String, Errno> {
        let at = self.check(ptr, len as usize)?;
        if len >= PATH_MAX {
            return Err(Errno::NAMETOOLONG);
        }
        let mut v = vec![0u8; len as usize];
        // SAFETY: in bounds; a raw copy.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), v.as_mut_ptr(), v.len()) };
        String::from_utf8(v).map_err(|_| Errno::ILSEQ)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_and_stores_are_bounds_checked() {
        let mut data = vec![0u8; 64];
        let m = GuestMem::plain(&mut data);
        m.put_u64(56, 0x0102_0304_0506_0708).unwrap();
        assert_eq!(m.u64(56).unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(m.u32(56).unwrap(), 0x0506_0708);
        assert_eq!(m.u64(57), Err(Errno::FAULT));
        assert_eq!(m.put_u32(61, 1), Err(Errno::FAULT));
        assert_eq!(m.u8(u32::MAX), Err(Errno::FAULT));
        let mut scratch = Vec::new();
        assert_eq!(m.bytes(60, 5, &mut scratch), Err(Errno::FAULT));
        assert_eq!(m.bytes(56, 2, &mut scratch).unwrap(), &[8, 7]);
        assert_eq!(m.string(0, 65), Err(Errno::FAULT));
        m.write_bytes(0, &[0xff, 0xfe]).unwrap();
        assert_eq!(m.string(0, 2), Err(Errno::ILSEQ));
    }

    /// A path of PATH_MAX bytes or more is refused before it is copied (the check of its
    /// bounds comes first, as a copy from user memory faults first).
    #[test]
    fn paths_from_path_max_on_are_too_long() {
        let mut data = vec![b'a'; 2 * PATH_MAX as usize];
        let m = GuestMem::plain(&mut data);
        assert_eq!(m.string(0, PATH_MAX - 1).unwrap().len(), 4095);
        assert_eq!(m.string(0, PATH_MAX), Err(Errno::NAMETOOLONG));
        assert_eq!(m.string(1, 2 * PATH_MAX - 1), Err(Errno::NAMETOOLONG));
        assert_eq!(m.string(1, 2 * PATH_MAX), Err(Errno::FAULT));
        assert_eq!(m.string(0, u32::MAX), Err(Errno::FAULT));
    }

    /// An append's buffers are gathered in order, up to what one call moves, and not at all
    /// past `max`.
    #[test]
    fn gather_copies_the_buffers_in_order() {
        let mut data = vec![0u8; 128];
        data[64..69].copy_from_slice(b"hello");
        data[80..86].copy_from_slice(b" world");
        for shared in [false, true] {
            let m = match shared {
                false => GuestMem::plain(&mut data),
                true => GuestMem::shared(data.as_mut_ptr(), data.len()),
            };
            // iovecs at 0: (64, 5), (100, 0), (80, 6)
            for (i, (buf, len)) in [(64, 5), (100, 0), (80, 6)].into_iter().enumerate() {
                m.put_u32(8 * i as u32, buf).unwrap();
                m.put_u32(8 * i as u32 + 4, len).unwrap();
            }
            let mut out = b"old".to_vec();
            assert_eq!(m.gather(0, 3, 10, &mut out), Ok(false));
            assert_eq!(out, b"old");
            assert_eq!(m.gather(0, 3, 11, &mut out), Ok(true));
            assert_eq!(out, b"hello world");
            assert_eq!(m.gather(0, 0, 11, &mut out), Ok(true));
            assert!(out.is_empty());
        }
    }

    #[test]
    fn shared_memory_goes_through_scratch() {
        let mut data = vec![7u8; 32];
        let m = GuestMem::shared(data.as_mut_ptr(), data.len());
        let mut scratch = Vec::new();
        assert_eq!(m.bytes(0, 4, &mut scratch).unwrap(), &[7, 7, 7, 7]);
        let n = m
            .fill(8, 4, &mut scratch, |b: &mut [u8]| -> Result<usize, Errno> {
                b[..2].copy_from_slice(&[1, 2]);
                Ok(2)
            })
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(&data[8..12], &[1, 2, 7, 7]);
    }
}
