//! Deterministic contents shared by guests and the tests that check them. A guest includes
//! this file (`#[path = "../content.rs"] mod content;`) and `valet-guests` exports it to the
//! host side, so writer and checker compute the same bytes from one definition.

/// splitmix64's finalizer.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` bytes made of the words `word(0)`, `word(1)`, ...
fn fill(len: usize, word: impl Fn(u64) -> u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut n = 0u64;
    while out.len() < len {
        out.extend_from_slice(&word(n).to_le_bytes());
        n += 1;
    }
    out.truncate(len);
    out
}

/// The name of steady_writer's file `i`.
pub fn steady_name(i: u64) -> String {
    format!("f{i:06}.dat")
}

/// The `i` of a steady_writer file name, if it is one.
pub fn steady_index(name: &str) -> Option<u64> {
    name.strip_prefix('f')?.strip_suffix(".dat")?.parse().ok()
}

/// The bytes of steady_writer's file `i`: 1–12 KiB, not block aligned.
pub fn steady_file(i: u64) -> Vec<u8> {
    let len = 1024 + (mix(i) % (11 * 1024)) as usize;
    fill(len, |w| mix(i.wrapping_mul(0x1_0000_0001) ^ w))
}

/// The bytes durable_writer's operation `seq` writes.
pub fn durable_record(seed: u64, seq: u64, len: usize) -> Vec<u8> {
    let key = mix(seed ^ mix(seq));
    fill(len, |w| mix(key.wrapping_add(w)))
}

/// Record `seq` of pod_writer's log `name`: `len` bytes.
pub fn pod_record(name: &str, seq: u64, len: usize) -> Vec<u8> {
    let key = name
        .bytes()
        .fold(0x51_7cc1_b727_220a, |h, b| mix(h ^ b as u64));
    fill(len, |w| mix(key ^ mix(seq).wrapping_add(w)))
}

/// The bytes write_then_wait writes to its file `i` and never syncs: 1.2 MiB (buffers
/// flushed while writing, and a window still open), 300,000 bytes, then 3,000 (a window
/// only).
pub fn unsynced_file(i: u64) -> Vec<u8> {
    let len = [1_200_000, 300_000, 3_000][i as usize % 3];
    fill(len, |w| {
        mix(0x0a15_c0de ^ i.wrapping_mul(0x1_0000_0001) ^ w)
    })
}

/// Length of write_then_wait's records.
pub const RECORD_LEN: usize = 100;

/// Record `n` of write_then_wait's `append` mode: RECORD_LEN bytes.
pub fn record(n: u64) -> Vec<u8> {
    fill(RECORD_LEN, |w| mix(0x0ec0_4d5e ^ mix(n).wrapping_add(w)))
}
