//! The Navy-shaped cache guest (`cache`) under `valet-run --policy cachelib`: a small flash
//! budget so regions and bucket objects get evicted, cachebench-style output, the index
//! persisted at shutdown and verified by a second run, and the cachelib placement visible
//! in the store's accounting (regions in their own stream, buckets in the conventional
//! area).

use valet_tests::{run_ok, valet_run};

/// Geometry and workload shared by the runs on one device: 8 MiB of flash (204 buckets,
/// seven 1 MiB regions), objects up to 16 KiB, 4000 keys.
const GEOMETRY: &[&str] = &[
    "--flash-mib",
    "8",
    "--region-mib",
    "1",
    "--small-max",
    "1024",
    "--large-min",
    "4096",
    "--large-max",
    "16384",
    "--keys",
    "4000",
];

/// The numbers after `prefix` on the line starting with it, in order: "written: regions 1
/// buckets 2 index 3" gives [1, 2, 3].
fn numbers(out: &str, prefix: &str) -> Vec<f64> {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{out}"));
    line[prefix.len()..]
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '(' || c == ')')
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// One `name : X micros/op; Y ops/sec; ...` line and the percentile line after it:
/// (micros/op, ops/sec, [P50, P99, P99.9, P99.99]).
fn bench_line(out: &str, name: &str) -> (f64, f64, Vec<f64>) {
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.split(" : ").next().map(str::trim_end) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{out}"));
    let line = lines[i];
    assert_eq!(&line[..12].trim_end(), &name, "name padded to 12: {line:?}");
    let rest = &line[15..];
    let (micros, rest) = rest.split_once(" micros/op;").expect("micros/op");
    let (ops, _) = rest.split_once(" ops/sec;").expect("ops/sec");
    let micros: f64 = micros.trim().parse().expect("micros/op number");
    let ops: f64 = ops.trim().parse().expect("ops/sec number");
    let pct = lines.get(i + 1).copied().unwrap_or_default();
    let p = pct
        .strip_prefix("Percentiles (micros): ")
        .unwrap_or_else(|| panic!("no percentiles after {name}: {pct:?}"));
    let words: Vec<&str> = p.split_whitespace().collect();
    assert_eq!(
        words.iter().step_by(2).copied().collect::<Vec<_>>(),
        ["P50:", "P99:", "P99.9:", "P99.99:"]
    );
    let values: Vec<f64> = words
        .iter()
        .skip(1)
        .step_by(2)
        .map(|w| w.parse().expect("percentile"))
        .collect();
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{pct}");
    (micros, ops, values)
}

/// The value of the first `"name": N` at or after the start of `json`.
fn json_u64(json: &str, name: &str) -> u64 {
    let key = format!("\"{name}\"");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + key.len();
    let digits: String = json[at..]
        .trim_start_matches(|c: char| c == ':' || c.is_whitespace())
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number"))
}

/// (stream, host_bytes) of each entry of the stats' `streams` array.
fn streams(json: &str) -> Vec<(u64, u64)> {
    let start = json.find("\"streams\"").expect("streams");
    let end = start + json[start..].find(']').expect("end of streams");
    json[start..end]
        .split('}')
        .filter(|s| s.contains("\"stream\""))
        .map(|s| (json_u64(s, "stream"), json_u64(s, "host_bytes")))
        .collect()
}

#[test]
fn navy_cache_evicts_persists_and_verifies_under_cachelib() {
    let device = tempfile::tempdir().unwrap();
    let dev = device.path().join("dev");
    let stats = device.path().join("stats.json");
    let stats_arg = stats.to_str().unwrap();
    let mut args = GEOMETRY.to_vec();
    args.extend(["--ops", "12000", "--seed", "7"]);
    let out = run_ok(
        &dev,
        valet_guests::CACHE,
        &["--policy", "cachelib", "--stats-json", stats_arg],
        &args,
    );

    // cachebench-shaped report.
    let hit = numbers(&out, "cache        :");
    let hit_ratio = *hit.last().unwrap();
    assert!(
        0.0 < hit_ratio && hit_ratio < 1.0,
        "hit ratio {hit_ratio}:\n{out}"
    );
    assert!(
        out.contains(&format!("ops/sec; hit_ratio {hit_ratio:.4}")),
        "{out}"
    );
    for name in ["cache", "get", "set"] {
        let (micros, ops, p) = bench_line(&out, name);
        assert!(micros > 0.0 && ops > 0.0 && p[0] > 0.0, "{name}:\n{out}");
    }
    let written = numbers(&out, "written:");
    let [regions, buckets, index] = written[..] else {
        panic!("written line: {written:?}")
    };
    assert_eq!(numbers(&out, "bytes_written "), [regions + buckets + index]);
    // The budget is 7 regions: a run writing ~15 MiB of large objects evicted some, and
    // small objects fell out of full buckets.
    let layout = numbers(&out, "layout:");
    let [nbuckets, budget, _, live, indexed, evicted, large_gone, small_gone, _] = layout[..]
    else {
        panic!("layout line: {layout:?}")
    };
    assert_eq!((nbuckets, budget, live), (204.0, 7.0, 7.0), "{out}");
    assert!(
        evicted > 0.0 && large_gone > 0.0 && small_gone > 0.0,
        "{out}"
    );
    assert!(indexed > 0.0);

    // cachelib placed the regions in a stream of their own and the bucket file, rewritten
    // in place, in the conventional area; the index went to the default stream.
    let json = std::fs::read_to_string(&stats).unwrap();
    assert_eq!(
        json_u64(&json, "conventional_bytes"),
        buckets as u64,
        "{json}"
    );
    let streams = streams(&json);
    let region_stream = streams
        .iter()
        .find(|s| s.1 == regions as u64)
        .unwrap_or_else(|| panic!("no stream holds exactly the region bytes: {streams:?}"));
    assert_ne!(region_stream.0, 0, "regions share stream 0: {streams:?}");
    assert!(
        streams.contains(&(0, index as u64)),
        "index in stream 0: {streams:?}"
    );

    // A second run on the same device loads the index and reads every object back.
    let mut args = GEOMETRY.to_vec();
    args.extend(["--ops", "0", "--verify=1"]);
    let again = run_ok(&dev, valet_guests::CACHE, &["--policy", "cachelib"], &args);
    assert_eq!(numbers(&again, "loaded index:"), [indexed, live], "{again}");
    let verified = numbers(&again, "verify:");
    assert!(
        verified.len() == 1 && verified[0] > indexed,
        "large and small objects verified:\n{again}"
    );
    assert!(again.contains(&format!("verify: {} objects ok", verified[0])));

    // The bucket file is the conventional area's only file (a host file): one flipped byte
    // in a used bucket fails verification with exit code 2.
    let files: Vec<_> = std::fs::read_dir(dev.join("conventional"))
        .expect("conventional area")
        .map(|e| e.unwrap().path())
        .collect();
    let [bighash] = &files[..] else {
        panic!("one conventional file expected: {files:?}")
    };
    let mut bytes = std::fs::read(bighash).unwrap();
    assert_eq!(bytes.len(), 204 * 4096);
    let used = (0..204)
        .map(|b| b * 4096)
        .find(|&at| bytes[at..at + 8] != [0; 8])
        .expect("a used bucket");
    bytes[used + 100] ^= 0x40;
    std::fs::write(bighash, &bytes).unwrap();
    let out = valet_run(&dev)
        .args(["--policy", "cachelib", valet_guests::CACHE, "--"])
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("verify failed"), "{stderr}");
}

#[test]
fn cache_is_deterministic_and_rejects_bad_arguments() {
    let layout = |seed: &str| {
        let device = tempfile::tempdir().unwrap();
        let mut args = GEOMETRY.to_vec();
        args.extend(["--ops", "3000", "--seed", seed]);
        let out = run_ok(&device.path().join("dev"), valet_guests::CACHE, &[], &args);
        let keep = ["cache        :", "layout:", "written:"];
        let hit = numbers(&out, keep[0]).pop().unwrap();
        (hit, numbers(&out, keep[1]), numbers(&out, keep[2]))
    };
    let a = layout("3");
    assert_eq!(a, layout("3"));
    assert_ne!(a, layout("4"));

    let device = tempfile::tempdir().unwrap();
    let out = valet_run(&device.path().join("dev"))
        .arg(valet_guests::CACHE)
        .args(["--", "--get-pct", "60"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must add up to 100"),
        "{out:?}"
    );
}
