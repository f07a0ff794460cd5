//! Every built-in policy on a trace recorded from a real guest run: the LSM guest runs under
//! `valet-run --record-trace`, then each policy's decisions for that trace are checked, and
//! its file lifecycle is replayed on a store at about 80 % use to compare the write
//! amplification the decisions lead to. `learn`, which has no rules about LSMs, must come
//! within 5 % of `rocks`.

use std::process::Command;

fn valet_run() -> Command {
    Command::new(env!("CARGO_BIN_EXE_valet-run"))
}

fn record_lsm_trace(dir: &std::path::Path) -> std::path::PathBuf {
    let trace = dir.join("lsm.jsonl");
    let out = valet_run()
        .arg("--device")
        .arg(dir.join("dev"))
        .args(["--zone-size", "16", "--zones", "48", "--record-trace"])
        .arg(&trace)
        .arg(valet_guests::LSM_SIM)
        .args(["--num", "40000"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("verified"), "{stdout}");
    trace
}

/// `policy check NAME --trace T [--replay --zone-mib 4]`: decision lines and, with replay,
/// the accounting as the last line.
fn check(
    policy: &str,
    trace: &std::path::Path,
    replay: bool,
) -> (Vec<(String, String)>, Option<serde_json::Value>) {
    let mut cmd = valet_run();
    cmd.args(["policy", "check", policy, "--trace"]).arg(trace);
    if replay {
        cmd.args(["--replay", "--zone-mib", "4"]);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{policy}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut decisions = Vec::new();
    let mut stats = None;
    // The built-ins stay far inside the fuel budget (see `policy::Limits`).
    let fuel = stdout
        .lines()
        .find_map(|l| l.strip_prefix("# fuel per call: "))
        .unwrap_or_else(|| panic!("{policy}: no fuel line in {stdout}"));
    let numbers: Vec<u64> = fuel
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [place, event, budget] = numbers[..] else {
        panic!("{policy}: fuel line {fuel}");
    };
    assert!(
        place > 0 && place.max(event) * 20 <= budget,
        "{policy}: fuel per call {fuel}"
    );
    for line in stdout.lines() {
        if line.starts_with('{') {
            stats = Some(serde_json::from_str(line).unwrap());
        } else if let Some((path, decision)) = line.split_once('\t') {
            decisions.push((path.to_string(), decision.to_string()));
        }
    }
    (decisions, stats)
}

fn decision_of<'a>(decisions: &'a [(String, String)], suffix: &str) -> &'a str {
    &decisions
        .iter()
        .find(|(p, _)| p.ends_with(suffix))
        .unwrap_or_else(|| panic!("no decision for *{suffix}"))
        .1
}

#[test]
fn builtins_on_a_recorded_lsm_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record_lsm_trace(dir.path());

    let (rocks, rocks_stats) = check("rocks", &trace, true);
    assert!(
        decision_of(&rocks, ".log").starts_with("stream 1"),
        "{rocks:?}"
    );
    assert!(
        decision_of(&rocks, ".ldb").starts_with("stream 2"),
        "{rocks:?}"
    );
    assert!(decision_of(&rocks, "MANIFEST-000001").starts_with("stream 3"));
    assert_eq!(decision_of(&rocks, "CURRENT.dbtmp"), "conventional");

    let (default, _) = check("default", &trace, false);
    assert!(decision_of(&default, ".log").starts_with("stream 1"));
    assert!(decision_of(&default, ".ldb").starts_with("stream 2"));

    let (fdp, _) = check("fdp-dirs", &trace, false);
    let streams: std::collections::BTreeSet<_> = fdp.iter().map(|(_, d)| d.clone()).collect();
    assert_eq!(
        streams.len(),
        1,
        "one top directory, one placement id: {streams:?}"
    );

    // learn starts with everything in one stream and separates what dies at different ages
    // once it has seen deletes.
    let (learn, learn_stats) = check("learn", &trace, true);
    let late_log = learn
        .iter()
        .rev()
        .find(|(p, _)| p.ends_with(".log"))
        .unwrap();
    let late_table = learn
        .iter()
        .rev()
        .find(|(p, _)| p.ends_with(".ldb"))
        .unwrap();
    assert_ne!(
        late_log.1, late_table.1,
        "learn kept logs and tables together"
    );

    let waf = |s: &Option<serde_json::Value>| s.as_ref().unwrap()["waf"].as_f64().unwrap();
    let (rocks_waf, learn_waf) = (waf(&rocks_stats), waf(&learn_stats));
    assert!(
        learn_waf <= rocks_waf * 1.05,
        "learn WAF {learn_waf} vs rocks {rocks_waf}"
    );
    // The replay device really is nearly full: data moved for someone.
    // (Full buffers reach the device from the store's background writer, so the order of
    // allocations, and the WAF, varies by about a percent between replays.)
    let one_stream = check("fdp-dirs", &trace, true).1;
    assert!(
        waf(&one_stream) >= rocks_waf * 0.98,
        "one stream should not beat rocks: {} vs {rocks_waf}",
        waf(&one_stream)
    );
}

#[test]
fn builtins_on_a_recorded_cache_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("cache.jsonl");
    let out = valet_run()
        .arg("--device")
        .arg(dir.path().join("dev"))
        .args([
            "--zone-size",
            "16",
            "--zones",
            "32",
            "--policy",
            "cachelib",
            "--stats",
            "--record-trace",
        ])
        .arg(&trace)
        .arg(valet_guests::CACHE_SIM)
        .args(["--", "--dir", "/data", "--ops", "10000"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("verified"), "{stdout}");
    // The in-place bucket file went to the conventional area, and the regions wrote once.
    assert!(!stderr.contains(" 0.0 MiB conventional"), "{stderr}");

    let (cachelib, _) = check("cachelib", &trace, false);
    assert_eq!(decision_of(&cachelib, "small/bighash.dat"), "conventional");
    let regions: Vec<&(String, String)> = cachelib
        .iter()
        .filter(|(p, _)| p.contains("large/region-"))
        .collect();
    assert!(regions.len() >= 3, "{cachelib:?}");
    for (path, decision) in &regions {
        let n: u32 = path.rsplit('-').next().unwrap().parse().unwrap();
        assert_eq!(decision, &format!("stream 1 group {n}"), "{path}");
    }

    let (fdp, _) = check("fdp-dirs", &trace, false);
    let group = |d: &str| d.split(" group ").nth(1).unwrap().to_string();
    assert_ne!(
        group(decision_of(&fdp, "small/bighash.dat")),
        group(decision_of(&fdp, "large/region-0000")),
        "top directories name different placement ids"
    );
}

#[test]
fn a_malformed_trace_is_one_line_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 3] = [
        ("binary.trace", b"\xff\xfe\x00garbage", ":1: not a trace"),
        ("json.trace", b"{\"t\":1}\n", ":1: not a trace record"),
        ("torn.trace", b"\n\n{\"op\":", ":3: not a trace record"),
    ];
    for (name, bytes, want) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        for replay in [false, true] {
            let out = valet_run()
                .args(["policy", "check", "rocks", "--trace"])
                .arg(&path)
                .args(replay.then_some("--replay"))
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(125), "{name}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
            assert!(
                stderr.contains(&format!("{name}{want}")),
                "{name}: {stderr}"
            );
        }
    }
}
