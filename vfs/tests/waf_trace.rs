//! The WAF command's claims, at a smaller scale: with WAL and tables in separate streams the
//! LSM-shaped trace at 80 % utilization writes almost nothing twice; in one stream GC has to
//! move data; an FDP SSD given the same hints stops moving data too.

#[allow(dead_code)]
#[path = "../examples/waf.rs"]
mod waf;

fn run(args: waf::Args) -> serde_json::Value {
    let line = waf::run(&args).expect("trace runs");
    serde_json::from_str(&line).expect("one JSON line")
}

fn small(single_stream: bool, fdp_ruhs: u32) -> waf::Args {
    waf::Args {
        single_stream,
        fdp_ruhs,
        passes: 3.0,
        data_zones: 48,
        ..Default::default()
    }
}

#[test]
fn separate_streams_keep_waf_at_one_and_a_single_stream_does_not() {
    let apart = run(small(false, 1));
    assert!(apart["utilization"].as_f64().unwrap() >= 0.79, "{apart}");
    assert!(apart["waf"].as_f64().unwrap() <= 1.05, "{apart}");
    assert_eq!(apart["gc_bytes_moved"].as_u64().unwrap(), 0, "{apart}");
    assert!(apart["zone_resets"].as_u64().unwrap() > 0, "{apart}");

    let mixed = run(small(true, 1));
    assert!(mixed["gc_bytes_moved"].as_u64().unwrap() > 0, "{mixed}");
    assert!(mixed["waf"].as_f64().unwrap() > 1.1, "{mixed}");
    assert_eq!(apart["host_bytes"], mixed["host_bytes"], "same trace");

    // The block-interface SSD model moves data for the same trace, unless FDP separates it.
    assert!(apart["ftl_waf"].as_f64().unwrap() > 1.05, "{apart}");
    let fdp = run(small(false, 2));
    assert!(
        fdp["ftl_waf"].as_f64().unwrap() < apart["ftl_waf"].as_f64().unwrap(),
        "{fdp}"
    );
}
