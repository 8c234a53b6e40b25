//! HCCN_TRACE end to end: hccn-perf under hccnrun with 3 ranks writes one well-formed Chrome
//! trace-event file per rank, with every operation on every rank and the bytes the ring moves;
//! hccn-trace turns the files into PNGs and a summary that agrees with the events.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hccn_tests::launch;
use serde_json::Value;

const RANKS: u32 = 3;

/// A fresh, empty directory under the system temp dir.
fn temp_dir(label: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hccn-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

/// Runs the traced sweep into `dir`, with the ring forced (the byte counts below are its own).
fn traced_run(dir: &Path) {
    let perf = launch::bin("hccn-perf");
    // Out of place only: the counts below are those of one column.
    let args = ["--op", "allreduce", "--place", "out", "-b", "1K", "-e", "64K", "-f", "4", "-w", "1", "-n", "2"];
    let dir = dir.to_str().expect("utf-8 temp dir");
    let env = [("HCCN_TRACE", dir), ("HCCN_JOB_ID", "tracetest"), ("HCCN_ALGO", "ring")];
    let out = launch::hccnrun(RANKS, &perf, &args, &env, Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "traced hccn-perf failed: {}", out.describe());
}

fn num(e: &Value, path: &[&str]) -> f64 {
    let mut v = e;
    for k in path {
        v = &v[*k];
    }
    v.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number in {e}"))
}

/// Checks the file's shape and returns its events.
fn load(path: &Path, rank: u32) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read trace");
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    assert_eq!(doc["displayTimeUnit"], "ms");
    assert_eq!(num(&doc, &["otherData", "dropped"]), 0.0);
    let events = doc["traceEvents"].as_array().expect("traceEvents array").clone();
    assert!(!events.is_empty());
    let mut last_ts: BTreeMap<u64, f64> = BTreeMap::new();
    for e in &events {
        assert_eq!(e["ph"], "X", "{e}");
        assert!(e["name"].is_string(), "{e}");
        assert!(num(e, &["dur"]) >= 0.0);
        assert_eq!(num(e, &["pid"]), f64::from(rank), "{e}");
        let ts = num(e, &["ts"]);
        let tid = e["tid"].as_u64().expect("integer tid");
        let prev = last_ts.insert(tid, ts).unwrap_or(0.0);
        assert!(ts >= prev, "timestamps go back on thread {tid}: {e}");
        match e["cat"].as_str() {
            Some("op") => {
                for k in ["op", "dtype", "count", "bytes", "algorithm", "comm", "epoch", "rank", "size"] {
                    assert!(!e["args"][k].is_null(), "op event without {k}: {e}");
                }
                assert_eq!(num(e, &["args", "rank"]), f64::from(rank));
                assert_eq!(num(e, &["args", "size"]), f64::from(RANKS));
            }
            Some("transfer") => {
                assert!(num(e, &["args", "peer"]) < f64::from(RANKS));
                assert!(num(e, &["args", "bytes"]) >= 0.0);
                assert!(matches!(e["args"]["dir"].as_str(), Some("send" | "recv")), "{e}");
            }
            _ => panic!("unknown category: {e}"),
        }
    }
    events
}

/// Bytes this rank sent and received during the first allreduce of `bytes`.
fn first_allreduce_traffic(events: &[Value], bytes: f64) -> (f64, f64) {
    let op = events
        .iter()
        .find(|e| e["name"] == "allreduce" && num(e, &["args", "bytes"]) == bytes)
        .expect("an allreduce of that size");
    assert_eq!(op["args"]["algorithm"], "ring");
    let (start, end) = (num(op, &["ts"]), num(op, &["ts"]) + num(op, &["dur"]));
    let inside = |e: &&Value| {
        e["cat"] == "transfer" && e["tid"] == op["tid"] && num(e, &["ts"]) >= start && num(e, &["ts"]) <= end
    };
    let sum = |dir: &str| {
        events.iter().filter(inside).filter(|e| e["args"]["dir"] == dir).map(|e| num(e, &["args", "bytes"])).sum()
    };
    (sum("send"), sum("recv"))
}

#[test]
fn every_rank_writes_a_complete_trace() {
    let dir = temp_dir("trace");
    traced_run(&dir);
    let mut per_rank = Vec::new();
    for r in 0..RANKS {
        let path = dir.join(format!("hccn-trace-tracetest-{r}.json"));
        assert!(path.exists(), "{} is missing", path.display());
        per_rank.push(load(&path, r));
    }
    assert_eq!(std::fs::read_dir(&dir).expect("list").count(), RANKS as usize, "one file per rank, nothing else");

    // The same operations, in the same order, on every rank.
    let ops = |ev: &[Value]| -> Vec<(String, f64)> {
        let mut v: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "op").collect();
        v.sort_by(|a, b| num(a, &["ts"]).total_cmp(&num(b, &["ts"])));
        v.iter().map(|e| (e["name"].as_str().unwrap_or("").to_owned(), num(e, &["args", "bytes"]))).collect()
    };
    let first = ops(&per_rank[0]);
    for (r, ev) in per_rank.iter().enumerate() {
        assert_eq!(ops(ev), first, "rank {r} ran other operations than rank 0");
    }
    // 4 sizes x (1 warm-up + 2 timed) allreduces, each size's barrier, and the time reduction.
    for size in [1024.0, 4096.0, 16384.0, 65536.0] {
        assert_eq!(first.iter().filter(|(n, b)| n == "allreduce" && *b == size).count(), 3, "{first:?}");
    }
    assert_eq!(first.iter().filter(|(n, _)| n == "barrier").count(), 4, "{first:?}");

    // Ring allreduce: 2(n-1) steps of one segment each; the segments of 1 KiB of fp32 over 3
    // ranks are 340, 340 and 344 bytes, so all ranks together send exactly 2(n-1) * 1024.
    let n = f64::from(RANKS);
    let (mut sent, mut received) = (0.0, 0.0);
    for (r, ev) in per_rank.iter().enumerate() {
        let (s, rcv) = first_allreduce_traffic(ev, 1024.0);
        let ideal = 2.0 * (n - 1.0) / n * 1024.0;
        assert!((s - ideal).abs() <= 2.0 * (n - 1.0) * 4.0, "rank {r} sent {s} bytes, ideal {ideal}");
        sent += s;
        received += rcv;
    }
    assert_eq!(sent, 2.0 * (n - 1.0) * 1024.0);
    assert_eq!(received, sent);

    check_hccn_trace(&dir, &per_rank);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(b.starts_with(b"\x89PNG\r\n\x1a\n") && &b[12..16] == b"IHDR", "{} is not a PNG", path.display());
    // A blank picture compresses to well under a kilobyte; drawn cells and boxes do not.
    assert!(b.len() > 4000, "{} looks empty ({} bytes)", path.display(), b.len());
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

/// Runs hccn-trace on the directory and checks its pictures and its summary against the events.
fn check_hccn_trace(dir: &Path, per_rank: &[Vec<Value>]) {
    let heat = dir.join("heat.png");
    let heat_time = dir.join("heat-time.png");
    let timeline = dir.join("timeline.png");
    let mut cmd = std::process::Command::new(launch::bin("hccn-trace"));
    cmd.arg(dir).arg("--heatmap").arg(&heat).arg("--heatmap-time").arg(&heat_time);
    cmd.arg("--timeline").arg(&timeline).arg("--summary");
    let out = launch::run(cmd, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "hccn-trace failed: {}", out.describe());
    assert_eq!(png_size(&heat), (780, 700));
    assert_eq!(png_size(&heat_time), (780, 700));
    assert_eq!(png_size(&timeline), (1200, 50 + 30 * RANKS + 60));

    // Per operation: calls and bytes over all ranks, as in the events.
    let mut want: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut links: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for (r, ev) in per_rank.iter().enumerate() {
        for e in ev {
            let bytes = num(e, &["args", "bytes"]) as u64;
            if e["cat"] == "op" {
                let w = want.entry(e["name"].as_str().unwrap_or("").to_owned()).or_default();
                w.0 += 1;
                w.1 += bytes;
            } else if e["args"]["dir"] == "send" {
                *links.entry((r as u64, num(e, &["args", "peer_world"]) as u64)).or_default() += bytes;
            }
        }
    }
    let rows: BTreeMap<&str, Vec<&str>> = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first().map(|c| (*c, cols.clone()))
        })
        .collect();
    for (name, (calls, bytes)) in &want {
        let row = rows.get(name.as_str()).unwrap_or_else(|| panic!("no summary row for {name}: {}", out.stdout));
        assert_eq!(row[1..3], [calls.to_string().as_str(), bytes.to_string().as_str()], "{}", out.stdout);
    }
    // The busiest link comes first, with the bytes its sender recorded.
    let (&(src, dst), &top) = links.iter().max_by_key(|(_, b)| **b).expect("some sends");
    let first_link = out.stdout.lines().skip_while(|l| !l.starts_with("link")).nth(1).unwrap_or("");
    let cols: Vec<&str> = first_link.split_whitespace().collect();
    assert_eq!(cols.get(3), Some(&top.to_string().as_str()), "{}", out.stdout);
    assert!(links.get(&(src, dst)) == Some(&top) && cols.len() >= 4, "{}", out.stdout);
}

/// A rank killed mid-allreduce: the survivors' files are written when the operation fails and
/// record it as failed.
#[test]
fn survivors_write_the_failed_operation() {
    let dir = temp_dir("trace-kill");
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let env = [("HCCN_TRACE", dir.to_str().expect("utf-8 temp dir")), ("HCCN_JOB_ID", "killed")];
    let out = launch::hccnrun(RANKS, &faults, &["kill"], &env, Duration::from_secs(120));
    assert_eq!(out.code, Some(137), "the victim should die by SIGKILL: {}", out.describe());
    for r in 0..RANKS - 1 {
        let events = load(&dir.join(format!("hccn-trace-killed-{r}.json")), r);
        let failed = events.iter().filter(|e| e["cat"] == "op" && e["args"]["failed"] == true).count();
        assert!(failed >= 1, "rank {r} recorded no failed operation");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
