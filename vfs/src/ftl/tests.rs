use super::*;

const PAGE: u64 = 4096;

/// Small deterministic PRNG (SplitMix64) so the tests need no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

fn config(logical_pages: u64, pages_per_block: u32, op: f64, ruhs: u32) -> FtlConfig {
    FtlConfig {
        pages_per_block,
        ..FtlConfig::fdp(logical_pages * PAGE, op, ruhs)
    }
}

/// Checks every internal structure against every other.
fn check_invariants(ftl: &Ftl) {
    let ppb = ftl.ppb as usize;
    let blocks = ftl.geometry.blocks as usize;
    let mut mapped = 0u64;
    for (lpn, &ppn) in ftl.l2p.iter().enumerate() {
        if ppn != UNMAPPED {
            assert_eq!(ftl.p2l[ppn as usize], lpn as u32, "p2l disagrees with l2p");
            mapped += 1;
        }
    }
    for b in 0..blocks {
        let pages = &ftl.p2l[b * ppb..(b + 1) * ppb];
        let live = pages.iter().filter(|&&l| l != UNMAPPED).count() as u32;
        assert_eq!(ftl.valid[b], live, "valid count of block {b}");
    }
    assert_eq!(ftl.valid_pages(), mapped);
    for &b in &ftl.free {
        assert_eq!(ftl.state[b as usize], BLOCK_FREE);
        assert_eq!(ftl.valid[b as usize], 0);
    }
    let open: Vec<u32> = ftl
        .host_open
        .iter()
        .chain(std::iter::once(&ftl.gc_open))
        .filter(|f| f.block != NIL)
        .map(|f| f.block)
        .collect();
    for &b in &open {
        assert_eq!(ftl.state[b as usize], BLOCK_OPEN);
    }
    let open_count = ftl.state.iter().filter(|&&s| s == BLOCK_OPEN).count();
    assert_eq!(open_count, open.len(), "an open block is not a frontier");
    let closed = ftl.state.iter().filter(|&&s| s == BLOCK_CLOSED).count();
    assert_eq!(ftl.free.len() + open_count + closed, blocks);
    let mut in_buckets = 0;
    for v in 0..=ppb {
        let mut b = ftl.bucket_head[v];
        let mut prev = NIL;
        while b != NIL {
            assert_eq!(ftl.state[b as usize], BLOCK_CLOSED);
            assert_eq!(ftl.valid[b as usize] as usize, v);
            assert_eq!(ftl.prev[b as usize], prev);
            assert!(
                (v as u32) >= ftl.min_bucket,
                "min_bucket above a non-empty bucket"
            );
            in_buckets += 1;
            prev = b;
            b = ftl.next[b as usize];
        }
    }
    assert_eq!(
        in_buckets, closed,
        "every closed block sits in exactly one bucket"
    );
}

/// Fills the logical space once sequentially, overwrites uniformly random pages for `warm`
/// device writes, resets the counters and measures `measure` more device writes.
fn random_overwrite_waf(cfg: FtlConfig, warm: u64, measure: u64) -> FtlStats {
    let logical_pages = cfg.logical_bytes / PAGE;
    let mut ftl = Ftl::new(cfg).unwrap();
    ftl.write(0, logical_pages * PAGE, 0).unwrap();
    let mut rng = Rng(42);
    for _ in 0..warm * logical_pages {
        ftl.write(rng.below(logical_pages) * PAGE, PAGE, 0).unwrap();
    }
    ftl.reset_stats();
    for _ in 0..measure * logical_pages {
        ftl.write(rng.below(logical_pages) * PAGE, PAGE, 0).unwrap();
    }
    check_invariants(&ftl);
    ftl.stats()
}

fn assert_near(measured: f64, expected: f64, tolerance: f64) {
    assert!(
        (measured - expected).abs() <= expected * tolerance,
        "WAF {measured:.3} is not within {:.0} % of {expected}",
        tolerance * 100.0
    );
}

// 256 MiB logical, 512 KiB erase blocks: about 0.3 s in a debug build.
#[test]
fn greedy_random_overwrite_waf_7_percent_op() {
    let stats = random_overwrite_waf(config(65536, 128, 0.07, 1), 3, 3);
    eprintln!("random 4 KiB overwrites, 7 % OP: WAF {:.3}", stats.waf());
    assert_near(stats.waf(), 7.6, 0.15);
}

#[test]
fn greedy_random_overwrite_waf_28_percent_op() {
    let stats = random_overwrite_waf(config(65536, 128, 0.28, 1), 3, 3);
    eprintln!("random 4 KiB overwrites, 28 % OP: WAF {:.3}", stats.waf());
    assert_near(stats.waf(), 2.4, 0.15);
}

/// The same at full size: 1 GiB logical, 1 MiB erase blocks, 10 M page writes after the fill.
/// `cargo test --release -p valet-vfs ftl -- --ignored --nocapture` (about 1–2 s each).
#[test]
#[ignore = "large; run in release"]
fn greedy_random_overwrite_waf_1gib() {
    for (op, expected) in [(0.07, 7.6), (0.28, 2.4)] {
        let started = std::time::Instant::now();
        // 1 + 4 + 34 device writes of 262144 pages ≈ 10.2 M host page writes.
        let stats = random_overwrite_waf(FtlConfig::new(1 << 30, op), 4, 34);
        eprintln!(
            "1 GiB, {:.0} % OP: WAF {:.3}, {} device pages, {:?}",
            op * 100.0,
            stats.waf(),
            stats.device_pages,
            started.elapsed()
        );
        assert_near(stats.waf(), expected, 0.15);
    }
}

#[test]
fn sequential_overwrites_have_waf_one() {
    let logical_pages = 8192;
    let mut ftl = Ftl::new(config(logical_pages, 64, 0.07, 1)).unwrap();
    let chunk = 32 * PAGE;
    for _ in 0..5 {
        for offset in (0..logical_pages * PAGE).step_by(chunk as usize) {
            ftl.write(offset, chunk, 0).unwrap();
        }
    }
    let stats = ftl.stats();
    assert_eq!(stats.host_pages, 5 * logical_pages);
    assert_eq!(stats.gc_pages_moved, 0);
    assert_eq!(stats.device_pages, stats.host_pages);
    assert!(stats.erases > 0, "the test must have run GC");
    assert_eq!(stats.waf(), 1.0);
    check_invariants(&ftl);
}

#[test]
fn whole_file_trims_have_waf_one() {
    let logical_pages = 8192u64;
    let mut ftl = Ftl::new(config(logical_pages, 64, 0.07, 1)).unwrap();
    let mut rng = Rng(7);
    let mut live: std::collections::VecDeque<(u64, u64)> = Default::default();
    let mut cursor = 0u64; // next free page, allocated round robin like a log-structured FS
    while ftl.stats().host_pages < 20 * logical_pages {
        let pages = 1 + rng.below(200);
        if cursor + pages > logical_pages {
            cursor = 0;
        }
        // A file of `pages` pages whose last page is partly filled.
        let bytes = pages * PAGE - rng.below(PAGE);
        ftl.write(cursor * PAGE, bytes, 0).unwrap();
        live.push_back((cursor, pages));
        cursor += pages;
        if live.len() > 4 {
            // Deleting the file frees its whole blocks, as a filesystem would.
            let (start, pages) = live.pop_front().unwrap();
            ftl.trim(start * PAGE, pages * PAGE).unwrap();
        }
    }
    let stats = ftl.stats();
    assert!(stats.erases > 0, "the test must have run GC");
    assert_eq!(stats.gc_pages_moved, 0);
    assert_eq!(stats.waf(), 1.0);
    check_invariants(&ftl);
}

/// Interleaves a short-lived stream (files trimmed soon after they are written) with a
/// long-lived one (random overwrites over most of the space) and returns the WAF.
fn two_stream_waf(ruhs: u32) -> f64 {
    let logical_pages = 32768u64;
    let long_pages = 24576u64; // pages 0.. hold long-lived data
    let file_pages = 32u64; // short-lived files in the rest, as a ring of slots
    let slots = (logical_pages - long_pages) / file_pages;
    let lifetime = 16u64; // a file is trimmed after this many newer files
    let mut ftl = Ftl::new(config(logical_pages, 64, 0.07, ruhs)).unwrap();
    ftl.write(0, long_pages * PAGE, 0).unwrap();
    let mut rng = Rng(3);
    let mut measure_from = None;
    for file in 0u64.. {
        let slot = long_pages + (file % slots) * file_pages;
        for page in 0..file_pages {
            ftl.write((slot + page) * PAGE, PAGE, 1).unwrap();
            if page % 4 == 0 {
                ftl.write(rng.below(long_pages) * PAGE, PAGE, 0).unwrap();
            }
        }
        if file >= lifetime {
            let old = long_pages + ((file - lifetime) % slots) * file_pages;
            ftl.trim(old * PAGE, file_pages * PAGE).unwrap();
        }
        let written = ftl.stats().host_pages;
        match measure_from {
            None if written > 4 * logical_pages => {
                ftl.reset_stats();
                measure_from = Some(file);
            }
            Some(_) if written > 4 * logical_pages => break,
            _ => {}
        }
    }
    check_invariants(&ftl);
    ftl.stats().waf()
}

#[test]
fn fdp_separating_short_lived_data_lowers_waf() {
    let plain = two_stream_waf(1);
    let fdp = two_stream_waf(2);
    eprintln!("two streams: WAF {plain:.3} with 1 RUH, {fdp:.3} with 2 RUHs");
    assert!(
        fdp < plain * 0.8,
        "FDP WAF {fdp:.3} is not clearly below plain WAF {plain:.3}"
    );
}

#[test]
fn writes_round_out_and_trims_round_in() {
    let mut ftl = Ftl::new(config(1024, 16, 0.25, 1)).unwrap();
    ftl.write(PAGE - 1, 2, 0).unwrap(); // touches pages 0 and 1
    let stats = ftl.stats();
    assert_eq!(stats.host_pages, 2);
    assert_eq!(stats.host_bytes, 2 * PAGE);
    assert_eq!(stats.host_bytes_requested, 2);
    assert_eq!(ftl.valid_pages(), 2);
    ftl.trim(1, 2 * PAGE - 2).unwrap(); // covers neither page wholly
    assert_eq!(ftl.valid_pages(), 2);
    ftl.trim(PAGE, PAGE).unwrap(); // page 1 exactly
    assert_eq!(ftl.valid_pages(), 1);
    ftl.trim(0, 3 * PAGE).unwrap(); // page 0, and unmapped page 2 counts for nothing
    assert_eq!(ftl.valid_pages(), 0);
    assert_eq!(ftl.stats().trimmed_pages, 2);
    ftl.write(5 * PAGE, 0, 0).unwrap();
    assert_eq!(ftl.stats().host_pages, 2, "an empty write writes nothing");
    check_invariants(&ftl);
}

#[test]
fn commands_past_the_logical_space_fail() {
    let logical = 1024 * PAGE;
    let mut ftl = Ftl::new(config(1024, 16, 0.25, 1)).unwrap();
    ftl.write(logical - PAGE, PAGE, 0).unwrap();
    let err = ftl.write(logical - PAGE, PAGE + 1, 0).unwrap_err();
    assert!(matches!(err, FtlError::OutOfRange { .. }), "{err}");
    assert!(ftl.write(logical, 1, 0).is_err());
    assert!(ftl.write(u64::MAX, 2, 0).is_err());
    assert!(ftl.trim(logical - PAGE, 2 * PAGE).is_err());
    assert_eq!(ftl.stats().host_pages, 1, "a failed write writes nothing");
}

#[test]
fn placement_ids_wrap_around_the_handles() {
    let mut ftl = Ftl::new(config(1024, 16, 0.25, 3)).unwrap();
    ftl.write(0, PAGE, 4).unwrap(); // RUH 1
    assert_eq!(ftl.host_open[0].block, NIL);
    assert_ne!(ftl.host_open[1].block, NIL);
    let mut plain = Ftl::new(config(1024, 16, 0.25, 1)).unwrap();
    plain.write(0, PAGE, 7).unwrap(); // a plain SSD ignores the id
    assert_ne!(plain.host_open[0].block, NIL);
}

#[test]
fn impossible_configs_are_refused() {
    let ok = config(1024, 16, 0.25, 1);
    assert!(ok.validate().is_ok());
    assert!(FtlConfig::default().validate().is_ok());
    let cases = [
        FtlConfig {
            over_provisioning: 0.0,
            ..ok.clone()
        },
        FtlConfig {
            over_provisioning: -0.1,
            ..ok.clone()
        },
        FtlConfig {
            over_provisioning: f64::NAN,
            ..ok.clone()
        },
        FtlConfig {
            over_provisioning: f64::INFINITY,
            ..ok.clone()
        },
        FtlConfig {
            logical_bytes: 0,
            ..ok.clone()
        },
        FtlConfig {
            logical_bytes: 1024 * PAGE + 1,
            ..ok.clone()
        },
        FtlConfig {
            page_size: 0,
            ..ok.clone()
        },
        FtlConfig {
            pages_per_block: 0,
            ..ok.clone()
        },
        FtlConfig {
            reclaim_unit_handles: 0,
            ..ok.clone()
        },
        FtlConfig {
            gc_low_watermark_blocks: 0,
            ..ok.clone()
        },
        // 64 blocks of data + 2 spare cannot hold 2 open blocks and a 2-block reserve.
        FtlConfig {
            over_provisioning: 0.03,
            ..ok.clone()
        },
        // Enough spare for a plain SSD, not for 16 open reclaim units.
        FtlConfig {
            reclaim_unit_handles: 16,
            ..ok.clone()
        },
        // More pages than a 32-bit map addresses.
        FtlConfig::new(1 << 44, 0.07),
    ];
    for cfg in cases {
        let err = Ftl::new(cfg.clone()).unwrap_err();
        assert!(matches!(err, FtlError::InvalidConfig(_)), "{cfg:?}: {err}");
    }
}

/// Configurations that only just validate must still never stall GC, with any mix of
/// handles, unaligned writes and trims.
#[test]
fn barely_valid_configs_never_stall() {
    let logical_pages = 512u64;
    let ppb = 16;
    let mut tried = 0;
    for ruhs in [1u32, 2, 4] {
        for watermark in [1u32, 3] {
            // The smallest over-provisioning (in steps of one block) the validation accepts.
            let accepted = (1..64)
                .map(|extra| extra as f64 * ppb as f64 / 512.0)
                .find_map(|op| {
                    let cfg = FtlConfig {
                        gc_low_watermark_blocks: watermark,
                        ..config(logical_pages, ppb, op, ruhs)
                    };
                    cfg.validate().is_ok().then_some(cfg)
                });
            let cfg = accepted.expect("some over-provisioning is enough");
            let mut ftl = Ftl::new(cfg).unwrap();
            let mut rng = Rng(ruhs as u64 * 10 + watermark as u64);
            ftl.write(0, logical_pages * PAGE, 0).unwrap();
            for step in 0..20_000u32 {
                let offset = rng.below(logical_pages * PAGE);
                let len = 1 + rng.below((logical_pages * PAGE - offset).min(8 * PAGE));
                if rng.below(8) == 0 {
                    ftl.trim(offset, len).unwrap();
                } else {
                    ftl.write(offset, len, rng.next() as u32).unwrap();
                }
                if step % 1000 == 0 {
                    check_invariants(&ftl);
                }
            }
            check_invariants(&ftl);
            assert!(ftl.stats().erases > 0);
            tried += 1;
        }
    }
    assert_eq!(tried, 6);
}

#[test]
fn stats_round_trip_through_serde() {
    let mut ftl = Ftl::new(config(1024, 16, 0.25, 1)).unwrap();
    ftl.write(0, 10 * PAGE, 0).unwrap();
    let stats = ftl.stats();
    let json = serde_json::to_string(&stats).unwrap();
    let back: FtlStats = serde_json::from_str(&json).unwrap();
    assert_eq!(back, stats);
    assert_eq!(FtlStats::default().waf(), 1.0);
}
