//! What `valet-run fs ls|zones|fsck` show, written the same way whether the command mounted
//! the store itself or asked the running `valet-run` or node agent that has it (the admin
//! API's `GET /tenants/T/ls`, `/zones`, `/fsck`, `/tenants/T/cat`).

use std::io::Write;

use anyhow::Result;
use valet_vfs::{FileKind, FsckReport, Ino, OpenOptions, Store};

use crate::remove::relative;

/// Most bytes one `cat` request of the admin API answers; the client asks again from where
/// it ended.
pub const CAT_CHUNK: u64 = 4 << 20;

fn kind_char(kind: FileKind) -> char {
    match kind {
        FileKind::Dir => 'd',
        FileKind::File => '-',
        FileKind::Symlink => 'l',
    }
}

/// ` -> target` for a link named `name` in `dir`, nothing for anything else.
fn arrow(store: &Store, dir: Ino, name: &str, kind: FileKind) -> Result<String> {
    Ok(match kind {
        FileKind::Symlink => format!(" -> {}", store.read_link(dir, name)?),
        _ => String::new(),
    })
}

/// `ls -l` of a directory (or of one file), optionally recursive.
pub fn ls(
    store: &Store,
    root: Ino,
    path: &str,
    recursive: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let rel = relative(path);
    // As `ls -l`: a link is shown, not followed, unless the path ends in `/`.
    let ino = store.lookup_at(root, rel, false)?;
    let meta = store.metadata(ino)?;
    if meta.kind != FileKind::Dir {
        let to = arrow(store, root, rel, meta.kind)?;
        writeln!(out, "{} {:>12} {path}{to}", kind_char(meta.kind), meta.size)?;
        return Ok(());
    }
    ls_dir(store, ino, "", recursive, out)
}

fn ls_dir(
    store: &Store,
    dir: Ino,
    prefix: &str,
    recursive: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let mut entries = store.read_dir(dir)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in &entries {
        let meta = store.metadata(e.ino)?;
        let to = arrow(store, dir, &e.name, meta.kind)?;
        writeln!(
            out,
            "{} {:>12} {prefix}{}{to}",
            kind_char(meta.kind),
            meta.size,
            e.name
        )?;
    }
    if recursive {
        for e in entries.iter().filter(|e| e.kind == FileKind::Dir) {
            ls_dir(store, e.ino, &format!("{prefix}{}/", e.name), true, out)?;
        }
    }
    Ok(())
}

/// `zone state write_pointer owner [placement]`, one line per zone that is not empty.
pub fn zones(store: &Store, out: &mut dyn Write) -> Result<()> {
    let device = store.device();
    let owners: std::collections::HashMap<_, _> = store
        .zone_owners()
        .into_iter()
        .map(|(zone, tenant, stream)| (zone, format!("{tenant}/{stream}")))
        .collect();
    writeln!(out, "zone state write_pointer owner placement")?;
    for z in device.report_zones() {
        if z.write_pointer == 0 && !owners.contains_key(&z.id) {
            continue;
        }
        let owner = owners.get(&z.id).map_or("-", String::as_str);
        let placement = device
            .zone_placement(z.id)
            .map_or("-".to_string(), |p| p.to_string());
        writeln!(
            out,
            "{} {:?} {} {owner} {placement}",
            z.id, z.state, z.write_pointer
        )?;
    }
    Ok(())
}

/// Up to `len` bytes of the file at `path` from `offset` (fewer at its end).
pub fn read_range(store: &Store, root: Ino, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
    let file = store.open_file(root, relative(path), OpenOptions::read())?;
    let mut buf = vec![0u8; len.min(CAT_CHUNK) as usize];
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read_at(&mut buf[filled..], offset + filled as u64)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    file.close()?;
    Ok(buf)
}

/// fsck's report as `fs fsck` prints it; returns whether the store is clean.
pub fn print_fsck(report: &FsckReport, deep: bool, out: &mut dyn Write) -> Result<bool> {
    writeln!(
        out,
        "fsck: {} files, {} directories, {} symlinks, {} extents, {} valid blocks",
        report.files, report.dirs, report.symlinks, report.extents, report.valid_blocks
    )?;
    if deep {
        writeln!(
            out,
            "fsck: {} blocks read and verified, {} without a checksum",
            report.verified_blocks, report.unverified_blocks
        )?;
    }
    for problem in &report.problems {
        writeln!(out, "problem: {problem}")?;
    }
    for damage in &report.damaged {
        writeln!(out, "damaged: {damage}")?;
    }
    if report.is_clean() {
        writeln!(out, "fsck: clean")?;
    }
    Ok(report.is_clean())
}
