//! Hint-only mode: files stay in a host directory and only get a write-life hint, the way
//! Valet runs over F2FS on multi-stream SSDs. No zones, no remapping.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use crate::resolver::{write_life, WriteLife};
use crate::Hint;

// From linux/fcntl.h (F_LINUX_SPECIFIC_BASE + 11 / + 12); not every libc crate exports them.
const F_GET_RW_HINT: libc::c_int = 1024 + 11;
const F_SET_RW_HINT: libc::c_int = 1024 + 12;

/// Sets the write-life hint the multi-stream resolver gives `hint` on an open host file.
pub fn apply(file: &File, hint: &Hint) -> io::Result<WriteLife> {
    let life = write_life(hint);
    set_write_life(file, life)?;
    Ok(life)
}

/// `fcntl(F_SET_RW_HINT)`: the hint applies to the file's inode.
pub fn set_write_life(file: &File, life: WriteLife) -> io::Result<()> {
    let mut value = life as u64;
    // SAFETY: F_SET_RW_HINT reads one u64 through the pointer, which outlives the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), F_SET_RW_HINT, &mut value as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fcntl(F_GET_RW_HINT)`.
pub fn write_life_of(file: &File) -> io::Result<WriteLife> {
    let mut value = 0u64;
    // SAFETY: F_GET_RW_HINT writes one u64 through the pointer, which outlives the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), F_GET_RW_HINT, &mut value as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    WriteLife::from_raw(value)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown write-life value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_reaches_the_host_inode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("000001.log");
        let file = File::create(&path).unwrap();
        let life = match apply(&file, &Hint::zoned(2)) {
            Ok(life) => life,
            // Kernels before 4.13 lack the call; nothing to check there.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            Err(e) => panic!("F_SET_RW_HINT: {e}"),
        };
        assert_eq!(life, WriteLife::Long);
        let again = File::open(&path).unwrap();
        assert_eq!(write_life_of(&again).unwrap(), WriteLife::Long);
    }
}
