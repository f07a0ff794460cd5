//! Write a Valet placement policy in Rust.
//!
//! Implement [`Policy`] and export it with [`export_policy!`]; build the crate as a
//! `cdylib` for `wasm32-unknown-unknown` (a target with no WASI, so the policy cannot reach
//! the host even by accident). The ABI it speaks is described in `policies/ABI.md`.
//!
//! ```ignore
//! use valet_policy_sdk::{export_policy, Decision, Policy, Request};
//!
//! #[derive(Default)]
//! struct LogsApart;
//!
//! impl Policy for LogsApart {
//!     fn place(&mut self, req: &Request) -> Option<Decision> {
//!         Some(if req.path.ends_with(".log") { Decision::zoned(1) } else { Decision::zoned(0) })
//!     }
//! }
//!
//! export_policy!(LogsApart, LogsApart::default());
//! ```
//!
//! The codec functions ([`Request::decode`], [`Decision::encode`], ...) are plain Rust, so
//! a policy's logic can be unit-tested natively.

/// The ABI version this SDK speaks.
pub const ABI_VERSION: i32 = 1;
/// Size of the exchange buffer.
pub const BUFFER_LEN: usize = 4096;
/// Bytes before the path in a request.
pub const REQUEST_HEADER: usize = 16;
/// Bytes before the path in an event.
pub const EVENT_HEADER: usize = 32;
/// Bytes of an encoded decision.
pub const DECISION_LEN: usize = 24;

/// Why the host asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Create,
    OpenForWrite,
    Rename,
}

/// A placement request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request<'a> {
    pub tenant: u32,
    pub reason: Reason,
    /// File size at open (0 for a create).
    pub size: u64,
    /// Path from the tenant's root, without a leading `/`.
    pub path: &'a str,
}

/// Where a file's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Zoned,
    Conventional,
}

/// A placement decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub class: Class,
    pub stream: u32,
    pub group: u32,
    /// When the stream moves on to a new lifetime group, start it in a fresh zone.
    pub group_starts_zone: bool,
    /// Start a new lifetime group every this many MiB written to the stream (0 = never).
    pub rotate_mib: u32,
    /// Start a new lifetime group every this many seconds (0 = never).
    pub rotate_secs: u32,
}

impl Decision {
    /// Zoned data in `stream`, group 0.
    pub const fn zoned(stream: u32) -> Self {
        Decision {
            class: Class::Zoned,
            stream,
            group: 0,
            group_starts_zone: false,
            rotate_mib: 0,
            rotate_secs: 0,
        }
    }

    /// A file updated in place, in the conventional area.
    pub const fn conventional() -> Self {
        Decision {
            class: Class::Conventional,
            ..Decision::zoned(0)
        }
    }

    pub const fn group(mut self, group: u32) -> Self {
        self.group = group;
        self
    }

    /// New lifetime groups start new zones.
    pub const fn group_starts_zone(mut self) -> Self {
        self.group_starts_zone = true;
        self
    }

    pub const fn rotate_every_mib(mut self, mib: u32) -> Self {
        self.rotate_mib = mib;
        self
    }

    pub const fn rotate_every_secs(mut self, secs: u32) -> Self {
        self.rotate_secs = secs;
        self
    }

    /// The 24-byte wire form.
    pub fn encode(&self, out: &mut [u8]) {
        out[..DECISION_LEN].fill(0);
        out[0] = match self.class {
            Class::Zoned => 0,
            Class::Conventional => 1,
        };
        out[1] = self.group_starts_zone as u8;
        out[4..8].copy_from_slice(&self.stream.to_le_bytes());
        out[8..12].copy_from_slice(&self.group.to_le_bytes());
        out[12..16].copy_from_slice(&self.rotate_mib.to_le_bytes());
        out[16..20].copy_from_slice(&self.rotate_secs.to_le_bytes());
    }
}

/// What a policy may learn from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event<'a> {
    Written {
        tenant: u32,
        path: &'a str,
        bytes: u64,
    },
    Synced {
        tenant: u32,
        path: &'a str,
    },
    Closed {
        tenant: u32,
        path: &'a str,
        size: u64,
    },
    Deleted {
        tenant: u32,
        path: &'a str,
        /// Bytes the tenant wrote while the file lived.
        lifetime_bytes: u64,
        lifetime_secs: f64,
        stream: u32,
        group: u32,
    },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The bytes of `path` that fit in `max`, cut at a character boundary: a path cut inside a
/// character would not decode, and the policy would get no request at all.
fn cut(path: &str, max: usize) -> &[u8] {
    let mut n = path.len().min(max);
    while !path.is_char_boundary(n) {
        n -= 1;
    }
    &path.as_bytes()[..n]
}

fn path_at(b: &[u8], at: usize, len: usize) -> Option<&str> {
    std::str::from_utf8(b.get(at..at + len)?).ok()
}

impl<'a> Request<'a> {
    /// Reads a request the host wrote; None if it is malformed.
    pub fn decode(b: &'a [u8]) -> Option<Self> {
        if b.len() < REQUEST_HEADER {
            return None;
        }
        let reason = match b[4] {
            0 => Reason::Create,
            1 => Reason::OpenForWrite,
            2 => Reason::Rename,
            _ => return None,
        };
        Some(Request {
            tenant: u32_at(b, 0),
            reason,
            size: u64_at(b, 8),
            path: path_at(b, REQUEST_HEADER, u16_at(b, 6) as usize)?,
        })
    }

    /// The wire form (used by hosts and tests); returns the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        let path = cut(
            self.path,
            (out.len() - REQUEST_HEADER).min(u16::MAX as usize),
        );
        let n = path.len();
        out[..REQUEST_HEADER].fill(0);
        out[0..4].copy_from_slice(&self.tenant.to_le_bytes());
        out[4] = match self.reason {
            Reason::Create => 0,
            Reason::OpenForWrite => 1,
            Reason::Rename => 2,
        };
        out[6..8].copy_from_slice(&(n as u16).to_le_bytes());
        out[8..16].copy_from_slice(&self.size.to_le_bytes());
        out[REQUEST_HEADER..REQUEST_HEADER + n].copy_from_slice(&path[..n]);
        REQUEST_HEADER + n
    }
}

impl<'a> Event<'a> {
    /// Reads an event the host wrote; None if it is malformed.
    pub fn decode(b: &'a [u8]) -> Option<Self> {
        if b.len() < EVENT_HEADER {
            return None;
        }
        let tenant = u32_at(b, 4);
        let path = path_at(b, EVENT_HEADER, u16_at(b, 2) as usize)?;
        let n = u64_at(b, 8);
        Some(match b[0] {
            0 => Event::Written {
                tenant,
                path,
                bytes: n,
            },
            1 => Event::Synced { tenant, path },
            2 => Event::Closed {
                tenant,
                path,
                size: n,
            },
            3 => Event::Deleted {
                tenant,
                path,
                lifetime_bytes: n,
                lifetime_secs: f64::from_le_bytes(b[16..24].try_into().unwrap()),
                stream: u32_at(b, 24),
                group: u32_at(b, 28),
            },
            _ => return None,
        })
    }

    /// The wire form (used by hosts and tests); returns the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        out[..EVENT_HEADER].fill(0);
        let (kind, tenant, path, n) = match *self {
            Event::Written {
                tenant,
                path,
                bytes,
            } => (0, tenant, path, bytes),
            Event::Synced { tenant, path } => (1, tenant, path, 0),
            Event::Closed { tenant, path, size } => (2, tenant, path, size),
            Event::Deleted {
                tenant,
                path,
                lifetime_bytes,
                lifetime_secs,
                stream,
                group,
            } => {
                out[16..24].copy_from_slice(&lifetime_secs.to_le_bytes());
                out[24..28].copy_from_slice(&stream.to_le_bytes());
                out[28..32].copy_from_slice(&group.to_le_bytes());
                (3, tenant, path, lifetime_bytes)
            }
        };
        let path = cut(path, (out.len() - EVENT_HEADER).min(u16::MAX as usize));
        let len = path.len();
        out[0] = kind;
        out[2..4].copy_from_slice(&(len as u16).to_le_bytes());
        out[4..8].copy_from_slice(&tenant.to_le_bytes());
        out[8..16].copy_from_slice(&n.to_le_bytes());
        out[EVENT_HEADER..EVENT_HEADER + len].copy_from_slice(&path[..len]);
        EVENT_HEADER + len
    }
}

impl Decision {
    /// Reads a decision a policy wrote; None if it is nonsense for `max_streams`.
    pub fn decode(b: &[u8], max_streams: u32) -> Option<Self> {
        if b.len() < DECISION_LEN || b[1] & !1 != 0 || b[2] != 0 || b[3] != 0 {
            return None;
        }
        if u32_at(b, 20) != 0 {
            return None;
        }
        let class = match b[0] {
            0 => Class::Zoned,
            1 => Class::Conventional,
            _ => return None,
        };
        let stream = u32_at(b, 4);
        if stream >= max_streams {
            return None;
        }
        Some(Decision {
            class,
            stream,
            group: u32_at(b, 8),
            group_starts_zone: b[1] & 1 != 0,
            rotate_mib: u32_at(b, 12),
            rotate_secs: u32_at(b, 16),
        })
    }
}

/// 32-bit FNV-1a: a stable hash for turning names into groups or streams.
pub fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A placement policy.
pub trait Policy {
    /// How many streams the device can keep apart; called once before any decision.
    fn init(&mut self, _max_streams: u32) {}

    /// The decision for a file, or None to leave it to the host's default.
    fn place(&mut self, request: &Request) -> Option<Decision>;

    /// Feedback about files.
    fn event(&mut self, _event: &Event) {}
}

/// The exchange buffer a policy exports (8-byte aligned).
#[repr(C, align(8))]
pub struct Buffer(pub [u8; BUFFER_LEN]);

/// Exports a [`Policy`] under the ABI: `export_policy!(Type, constructor_expression);`.
#[macro_export]
macro_rules! export_policy {
    ($ty:ty, $make:expr) => {
        #[cfg(target_arch = "wasm32")]
        mod __valet_policy_exports {
            use super::*;
            use $crate::Policy as _;

            static mut BUFFER: $crate::Buffer = $crate::Buffer([0; $crate::BUFFER_LEN]);
            static mut POLICY: Option<$ty> = None;

            // SAFETY (for the statics below): a wasm32 policy instance is single-threaded
            // and the host never re-enters it, so no two references to them coexist.
            fn state() -> (&'static mut $ty, &'static mut [u8; $crate::BUFFER_LEN]) {
                #[allow(static_mut_refs)]
                unsafe {
                    let policy = POLICY.get_or_insert_with(|| $make);
                    (policy, &mut BUFFER.0)
                }
            }

            #[no_mangle]
            pub extern "C" fn valet_abi_version() -> i32 {
                $crate::ABI_VERSION
            }

            #[no_mangle]
            pub extern "C" fn valet_buffer() -> i32 {
                state().1.as_ptr() as i32
            }

            #[no_mangle]
            pub extern "C" fn valet_init(max_streams: i32) {
                state().0.init(max_streams.max(0) as u32);
            }

            #[no_mangle]
            pub extern "C" fn valet_place(len: i32) -> i32 {
                let (policy, buf) = state();
                let len = (len.max(0) as usize).min(buf.len());
                let decision = match $crate::Request::decode(&buf[..len]) {
                    Some(request) => policy.place(&request),
                    None => None,
                };
                match decision {
                    Some(d) => {
                        d.encode(&mut buf[..]);
                        0
                    }
                    None => 1,
                }
            }

            #[no_mangle]
            pub extern "C" fn valet_event(len: i32) {
                let (policy, buf) = state();
                let len = (len.max(0) as usize).min(buf.len());
                if let Some(event) = $crate::Event::decode(&buf[..len]) {
                    policy.event(&event);
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_event_and_decision_round_trip() {
        let mut buf = [0u8; BUFFER_LEN];
        let req = Request {
            tenant: 3,
            reason: Reason::Rename,
            size: 1 << 40,
            path: "db/000012.log",
        };
        let n = req.encode(&mut buf);
        assert_eq!(Request::decode(&buf[..n]), Some(req));

        let ev = Event::Deleted {
            tenant: 1,
            path: "x.sst",
            lifetime_bytes: 77,
            lifetime_secs: 1.5,
            stream: 2,
            group: 9,
        };
        let n = ev.encode(&mut buf);
        assert_eq!(Event::decode(&buf[..n]), Some(ev));

        let d = Decision::zoned(5)
            .group(7)
            .group_starts_zone()
            .rotate_every_mib(64);
        d.encode(&mut buf);
        assert_eq!(Decision::decode(&buf, 8), Some(d));
        assert_eq!(
            Decision::decode(&buf, 5),
            None,
            "stream beyond the device's"
        );
        buf[2] = 1;
        assert_eq!(Decision::decode(&buf, 8), None, "reserved bits set");
    }

    #[test]
    fn a_long_path_is_cut_at_a_character_boundary() {
        let mut buf = [0u8; BUFFER_LEN];
        // 'é' is two bytes: 4095 of them in a row put the cut inside one at every offset.
        let long = format!("x{}", "é".repeat(BUFFER_LEN));
        let req = Request {
            tenant: 1,
            reason: Reason::Create,
            size: 0,
            path: &long,
        };
        let n = req.encode(&mut buf);
        let got = Request::decode(&buf[..n]).expect("a cut path still decodes");
        assert!(long.starts_with(got.path));
        assert!(got.path.len() + 1 >= BUFFER_LEN - REQUEST_HEADER);

        let ev = Event::Closed {
            tenant: 1,
            path: &long,
            size: 5,
        };
        let n = ev.encode(&mut buf);
        match Event::decode(&buf[..n]).expect("a cut path still decodes") {
            Event::Closed { path, .. } => assert!(long.starts_with(path)),
            other => panic!("{other:?}"),
        }
    }
}
