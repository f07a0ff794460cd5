//! `one-stream`: every file in zoned stream 0, lifetime group 0.
//!
//! The baseline of the comparison report: the same store, with placement switched off.
//! Logs, tables, in-place files and everything else share one stream, so one zone mixes
//! data of every lifetime, as on a device that cannot tell them apart. Nothing goes to the
//! conventional area either: files rewritten in place are remapped out of place like any
//! other.

use valet_policy_sdk::{export_policy, Decision, Policy, Request};

/// The policy: no state.
#[derive(Clone, Copy, Debug, Default)]
pub struct OneStream;

impl Policy for OneStream {
    fn init(&mut self, _max_streams: u32) {}

    fn place(&mut self, _request: &Request) -> Option<Decision> {
        Some(Decision::zoned(0))
    }
}

export_policy!(OneStream, OneStream);

#[cfg(test)]
mod tests {
    use super::*;
    use valet_policy_sdk::Reason;

    #[test]
    fn every_path_gets_stream_0_group_0() {
        let mut p = OneStream;
        p.init(14);
        for path in [
            "db/000001.log",
            "db/000005.ldb",
            "LOCK",
            "cache/small/bighash.dat",
        ] {
            let d = p
                .place(&Request {
                    tenant: 3,
                    reason: Reason::Create,
                    size: 0,
                    path,
                })
                .expect("always decides");
            assert_eq!(d, Decision::zoned(0), "{path}");
        }
    }
}
