//! MindSpore, for real (mindspore 2.10.0 in /opt/hccn/venvs/mindspore, CPU): hccn as MindSpore's
//! own collective library. bindings/mindspore/build.sh compiles libhccn_ms.so against the wheel's
//! headers; then, under hccnrun, on 2 and 4 ranks:
//! - tests/native.py, PyNative and graph mode: MindSpore's own API (init, get_rank, create_group
//!   on a subset, ops.AllReduce/AllGather/Broadcast, mint.distributed) with exact values, and
//!   DATA_PARALLEL training with nn.TrainOneStepCell within 1e-5 of one process; hccn's traces
//!   (HCCN_TRACE) must hold the gradient allreduces;
//! - tests/interface.py (tests/interface.cc): every CollectiveCommunicationLib method as MindSpore
//!   calls it, including what no CPU kernel of MindSpore reaches (ReduceScatter, Gather, Scatter,
//!   Send/Recv, every TypeId and reduce op);
//! - tests/cells.py: the ops.Custom cells, in both modes;
//! - tests/kill_step.py (2 and 4 ranks): a rank SIGKILLed mid-training; the survivors' steps
//!   raise hccn's RANK_FAILED message;
//! - tests/version_guard.py: a library recorded for another MindSpore is refused;
//! - examples/data_parallel.py: the tutorial's data-parallel script with `import hccn_ms` added,
//!   its loop in PyNative and Model.train with dataset sinking in graph mode.
//!
//! Needs the release build and the venv (`bash scripts/setup-frameworks.sh mindspore`, which
//! scripts/test.sh runs). The tests of this file run one at a time: each rank is a whole
//! MindSpore process, and 4 ranks of it already fill the 2 cores.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use hccn_tests::framework::Framework;
use hccn_tests::launch::{self, Outcome};

const MINDSPORE: Framework = Framework {
    python: "/opt/hccn/venvs/mindspore/bin/python",
    dir: "mindspore",
    build_args: &["--interface-test"],
    build_timeout: Duration::from_secs(300),
    env: &[],
};

/// A job of 4 MindSpore ranks in graph mode takes about 45 s on a quiet 2-core machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(400);
/// Training steps in native.py, each allreducing every parameter's gradient once.
const STEPS: usize = 8;
/// The sizes of native.py's parameters (Dense(8, 16) and Dense(16, 4): weights and biases).
const PARAMETER_SIZES: [u64; 4] = [128, 16, 64, 4];
/// MindSpore's graph runner waits this long after any failed kernel before it raises
/// (GraphScheduler::Run in libmindspore_ms_backend.so; see bindings/mindspore/README.md).
const MINDSPORE_FAILURE_WAIT_S: f64 = 3.0;

static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// `name` in bindings/mindspore/tests, or `name` itself when it is a path.
fn script(name: &str) -> PathBuf {
    if name.contains('/') {
        return PathBuf::from(name);
    }
    root().join("bindings/mindspore/tests").join(name)
}

/// A fresh scratch directory (graph mode writes rank_N/ into its working directory on errors).
fn scratch(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hccn-ms-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `hccnrun -n N [hccnrun_args] -- python SCRIPT args` from `cwd`, with the built package on
/// PYTHONPATH.
fn run(n: u32, hccnrun_args: &[&str], script_name: &str, args: &[&str], env: &[(&str, &str)], cwd: &Path) -> Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.arg("-n").arg(n.to_string()).args(hccnrun_args).arg("--").arg(MINDSPORE.python);
    cmd.arg(script(script_name)).args(args).current_dir(cwd);
    cmd.env("PYTHONPATH", MINDSPORE.built())
        // MindSpore's import and graph compilation can keep one rank many seconds behind another
        // on a loaded machine; the run's own hard timeout still applies.
        .env("HCCN_TIMEOUT_MS", "120000")
        .env("GLOG_v", "3") // MindSpore's own log: errors only
        .envs(env.iter().copied())
        // The library finds libhccn.so and MindSpore's libraries through its rpath, as a user's would.
        .env_remove("LD_LIBRARY_PATH");
    let out = launch::run(cmd, RUN_TIMEOUT);
    eprintln!("{script_name} {args:?} on {n} ranks: {:.1} s", out.elapsed.as_secs_f64());
    out
}

/// Asserts exit 0, no FAIL, and a line of every rank that contains `[tag] rank r of n` and ends
/// with `ending`.
fn expect_every_rank(out: &Outcome, n: u32, tag: &str, ending: &str) {
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
    for r in 0..n {
        let prefix = format!("[{tag}] rank {r} of {n}");
        let line = out.stdout.lines().find(|l| l.contains(&prefix));
        assert!(line.is_some_and(|l| l.ends_with(ending)), "rank {r}: no {prefix}...{ending}: {}", out.describe());
    }
}

/// MindSpore's own API and data-parallel training in `mode` on `n` ranks, and hccn's traces.
fn native(mode: &str, n: u32) {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(&format!("native-{mode}-{n}"));
    let traces = dir.join("traces");
    let trace_env = traces.to_str().expect("utf-8 temp dir");
    let out = run(n, &[], "native.py", &[mode], &[("HCCN_TRACE", trace_env)], &dir);
    expect_every_rank(&out, n, "mindspore-native", "checks ok");
    let log: Vec<&str> = out.stdout.lines().filter(|l| l.contains("step ") || l.contains("difference")).collect();
    eprintln!("{}", log.join("\n"));
    for r in 0..n {
        let trace = trace_of_rank(&traces, r);
        for size in PARAMETER_SIZES {
            let count = fp32_allreduces(&trace, size);
            assert!(
                count >= STEPS,
                "rank {r}: {count} fp32 allreduces of {size} elements in hccn's trace, expected the gradient \
                 reducer's {STEPS} at least"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The trace file hccn wrote for world rank `r` (hccn-trace-<job>-<r>.json).
fn trace_of_rank(dir: &Path, r: u32) -> String {
    let suffix = format!("-{r}.json");
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("no trace directory {}: {e}", dir.display()));
    let path = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(|f| f.ends_with(&suffix)))
        .unwrap_or_else(|| panic!("no trace of rank {r} in {}", dir.display()));
    std::fs::read_to_string(&path).expect("trace file")
}

/// How many allreduce operations of `count` fp32 elements a trace records.
fn fp32_allreduces(trace: &str, count: u64) -> usize {
    let json: serde_json::Value = serde_json::from_str(trace).expect("trace is JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    events
        .iter()
        .filter(|e| e["cat"] == "op")
        .filter(|e| e["args"]["op"] == "allreduce" && e["args"]["dtype"] == "fp32" && e["args"]["count"] == count)
        .count()
}

#[test]
fn mindspore_api_over_hccn_pynative_2_ranks() {
    native("pynative", 2);
}

#[test]
fn mindspore_api_over_hccn_graph_2_ranks() {
    native("graph", 2);
}

#[test]
fn mindspore_api_over_hccn_pynative_4_ranks() {
    native("pynative", 4);
}

#[test]
fn mindspore_api_over_hccn_graph_4_ranks() {
    native("graph", 4);
}

/// The checksum `rank r of n: weights checksum X` of every rank of examples/data_parallel.py, all
/// equal; asserts that hccn's traces hold the gradient reducer's allreduces.
fn tutorial_run(mode: &str, style: &str) -> f64 {
    let dir = scratch(&format!("tutorial-{mode}-{style}"));
    let traces = dir.join("traces");
    let trace_env = traces.to_str().expect("utf-8 temp dir");
    let example = root().join("bindings/mindspore/examples/data_parallel.py");
    let example = example.to_str().expect("utf-8 path");
    let out = run(2, &[], example, &[mode, style], &[("HCCN_TRACE", trace_env)], &dir);
    assert_eq!(out.code, Some(0), "{mode} {style}: {}", out.describe());
    let sums: Vec<f64> = (0..2)
        .map(|r| {
            let tag = format!("rank {r} of 2: weights checksum ");
            let line = out.stdout.lines().find(|l| l.contains(&tag));
            let line = line.unwrap_or_else(|| panic!("{mode} {style}: no {tag:?}: {}", out.describe()));
            line.rsplit(' ').next().and_then(|x| x.parse().ok()).expect("a checksum")
        })
        .collect();
    assert_eq!(sums[0], sums[1], "{mode} {style}: the replicas differ: {}", out.describe());
    // 256 samples, 2 shards of 8 batches, 2 epochs: 16 steps, one allreduce per parameter each.
    for r in 0..2 {
        let trace = trace_of_rank(&traces, r);
        for size in [32 * 64, 64, 64 * 10, 10] {
            let count = fp32_allreduces(&trace, size);
            assert!(count >= 16, "{mode} {style}, rank {r}: {count} allreduces of {size} gradients in hccn's trace");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    sums[0]
}

#[test]
fn mindspore_tutorial_data_parallel_script_runs_with_only_the_import_added() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let loop_sum = tutorial_run("pynative", "loop");
    let model_sum = tutorial_run("graph", "sink");
    assert!(
        (loop_sum - model_sum).abs() <= 1e-5 * loop_sum.abs().max(1.0),
        "the tutorial's loop in PyNative ({loop_sum}) and Model.train in graph mode ({model_sum}) trained apart"
    );
}

#[test]
fn mindspore_library_interface_on_2_and_4_ranks() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let built = MINDSPORE.built().to_str().expect("utf-8 path");
    let dir = scratch("interface");
    for n in [2, 4] {
        let out = run(n, &[], "interface.py", &[built], &[], &dir);
        expect_every_rank(&out, n, "ms-interface", "checks ok");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mindspore_custom_cells_in_both_modes() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("cells");
    for mode in ["pynative", "graph"] {
        let out = run(2, &[], "cells.py", &[mode], &[], &dir);
        expect_every_rank(&out, 2, "mindspore-cells", "checks ok");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// hccn's text for RANK_FAILED, as its C ABI gives it.
fn rank_failed_text() -> String {
    // SAFETY: hccn_get_error_string returns a static, NUL-terminated string for every code.
    let s = unsafe { CStr::from_ptr(hccn::hccn_get_error_string(100)) };
    format!("{} (100)", s.to_string_lossy())
}

/// The time a `[killed] rank R at T` or `[raised] rank R step S at T: ...` line reports.
fn time_of(line: &str) -> f64 {
    let at = line.split(" at ").nth(1).expect("an ' at T' field");
    let t = at.split(':').next().expect("T").trim();
    t.parse().unwrap_or_else(|_| panic!("bad time in {line:?}"))
}

/// Kills the last of `n` ranks at step 3 of `style`'s training; every survivor's step must raise
/// with hccn's RANK_FAILED message within `1 s + allowance` of the kill. Returns the longest delay.
fn killed_mid_training(style: &str, n: u32, allowance_s: f64) -> f64 {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(&format!("kill-{style}-{n}"));
    // --grace: room for the survivors to report; hccnrun would SIGTERM them 3 s after the kill.
    let out = run(n, &["--grace", "30"], "kill_step.py", &[style], &[], &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let victim = n - 1;
    let Some(killed) = out.stdout.lines().find(|l| l.contains(&format!("[killed] rank {victim} at "))) else {
        panic!("{style}: no [killed] line: {}", out.describe());
    };
    let want = rank_failed_text();
    let mut longest: f64 = 0.0;
    for r in 0..victim {
        let Some(raised) = out.stdout.lines().find(|l| l.contains(&format!("[raised] rank {r} "))) else {
            panic!("{style}, {n} ranks: rank {r}'s step did not raise: {}", out.describe());
        };
        assert!(raised.contains(&want), "{style}: rank {r}'s step raised without hccn's {want:?}: {raised}");
        let delay = time_of(raised) - time_of(killed);
        eprintln!("{style}, {n} ranks: rank {r}'s step raised {delay:.3} s after the kill");
        assert!(
            delay < 1.0 + allowance_s,
            "{style}: rank {r} raised {delay:.3} s after the kill (limit 1 s + {allowance_s} s): {}",
            out.describe()
        );
        longest = longest.max(delay);
    }
    longest
}

#[test]
fn mindspore_rank_killed_mid_training_op_by_op_raises_within_a_second() {
    for n in [2, 4] {
        killed_mid_training("ops", n, 0.0);
    }
}

#[test]
fn mindspore_rank_killed_mid_training_in_a_graph_raises_after_mindspores_wait() {
    for n in [2, 4] {
        let delay = killed_mid_training("graph", n, MINDSPORE_FAILURE_WAIT_S);
        assert!(
            delay >= MINDSPORE_FAILURE_WAIT_S,
            "MindSpore no longer waits {MINDSPORE_FAILURE_WAIT_S} s after a failed kernel: update the README"
        );
    }
}

#[test]
fn mindspore_version_guard_refuses_another_release() {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("guard");
    let mut build = Command::new("bash");
    build.arg(root().join("bindings/mindspore/build.sh"));
    build.arg("--lib").arg(launch::bin_dir()).arg("--out").arg(&dir).args(["--built-for", "2.9.99"]);
    let built = launch::run(build, MINDSPORE.build_timeout);
    assert_eq!(built.code, Some(0), "build.sh --built-for: {}", built.describe());
    let mut cmd = Command::new(MINDSPORE.python);
    cmd.arg(script("version_guard.py")).arg("2.9.99").current_dir(&dir);
    cmd.env("PYTHONPATH", &dir).env("GLOG_v", "3").env_remove("LD_LIBRARY_PATH");
    let out = launch::run(cmd, RUN_TIMEOUT);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("[mindspore-guard] ok"), "{}", out.describe());
}
