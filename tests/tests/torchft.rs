//! torchft over hccn (`hccn.torchft`, pinned torchft 0.2.0 from /opt/hccn/venvs/torch): real
//! Lighthouses, replica groups as real processes, faults by real signals. Replica groups on one
//! machine, two and three of them: a kill and a restart that heals from the survivor over the
//! process group itself, a freeze found before the frozen group resumes, the same training
//! ending with the weights of torchft's own Gloo group, every operation the Manager uses, an
//! abort in the middle of an allreduce, a peer stuck in user code, 200 quorum changes with
//! descriptors and threads flat, the HCCL backend (through the emulation library), the example
//! as the README runs it, and the pinned version checked at import. Every run has a hard
//! timeout and ends all its processes, the Lighthouse included.
//!
//! Times are not targets here (benches/torchft.py measures them): a test asserts an order of
//! events, e.g. that the survivor's error came before the frozen group was resumed.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hccn_tests::launch::{self, Outcome};
use hccn_tests::torch;
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(300);

fn script(name: &str) -> PathBuf {
    torch::root().join("bindings/python/tests").join(name)
}

fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hccn-torchft-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The last lines of every log a scenario kept, for a failure message.
fn logs(dir: &Path) -> String {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.sort();
    let mut text = String::new();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "log" || e == "events")) {
        let body = std::fs::read_to_string(f).unwrap_or_default();
        let lines: Vec<&str> = body.lines().collect();
        let tail = lines[lines.len().saturating_sub(25)..].join("\n");
        text.push_str(&format!("\n--- {} ---\n{tail}", f.display()));
    }
    text
}

/// Runs torchft_scenario.py with `args` (split at spaces); returns its JSON summary and where
/// its logs are.
fn scenario(what: &str, args: &str) -> (Value, PathBuf) {
    let dir = scratch(what);
    let mut cmd = Command::new(torch::python());
    cmd.arg(script("torchft_scenario.py")).args(args.split_whitespace()).arg("--out").arg(&dir);
    torch::use_source_tree(&mut cmd);
    let out = launch::run(cmd, TIMEOUT);
    let summary = out.stdout.lines().last().and_then(|l| serde_json::from_str::<Value>(l).ok());
    let Some(summary) = summary.filter(|_| out.code == Some(0)) else {
        panic!("{what}: the scenario failed: {}{}", out.describe(), logs(&dir));
    };
    (summary, dir)
}

fn expect(summary: &Value, dir: &Path, key: &str, want: &Value, what: &str) {
    assert_eq!(&summary[key], want, "{what}: {key} in {summary}{}", logs(dir));
}

fn secs(summary: &Value, dir: &Path, key: &str, what: &str) -> f64 {
    summary[key].as_f64().unwrap_or_else(|| panic!("{what}: no {key} in {summary}{}", logs(dir)))
}

/// Every group finished, the victim came back by healing from a live group, and all of them
/// ended with the same parameters.
fn expect_recovered(summary: &Value, dir: &Path, replicas: u64, what: &str) {
    expect(summary, dir, "ok", &Value::Bool(true), what);
    expect(summary, dir, "timed_out", &Value::Bool(false), what);
    expect(summary, dir, "healed", &Value::Bool(true), what);
    expect(summary, dir, "equal_weights", &Value::Bool(true), what);
    expect(summary, dir, "replicas", &Value::from(replicas), what);
    secs(summary, dir, "error_s", what);
    secs(summary, dir, "next_commit_s", what);
    assert!(
        summary["survivor_steps_after_fault"].as_u64().unwrap_or(0) > 0,
        "{what}: the survivor committed nothing after the fault: {summary}{}",
        logs(dir)
    );
}

#[test]
fn a_killed_replica_group_restarts_and_heals_over_the_process_group_from_the_survivor() {
    // 2 groups; the second is SIGKILLed while the first waits in the allreduce of step 4 and
    // restarted a second later. It heals through torchft's PGTransport: the survivor's state
    // crosses ProcessGroupHccn's send and recv.
    let what = "kill and restart of 1 of 2 groups";
    let (s, dir) = scenario("kill", "--pg hccn --replicas 2 --fault kill --fault-step 4 --steps 12 --transport pg");
    expect_recovered(&s, &dir, 2, what);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_frozen_replica_group_of_three_is_an_error_before_it_resumes_and_then_heals() {
    // SIGSTOP for 6 s with a process-group timeout of 60 s: the survivors' step fails (hccn's
    // silence detection) before the frozen group is resumed, and they commit again meanwhile;
    // the resumed group, evicted, rejoins and heals.
    let what = "freeze and resume of 1 of 3 groups";
    let (s, dir) = scenario(
        "freeze",
        "--pg hccn --replicas 3 --fault freeze --freeze-s 6 --then resume --fault-step 4 --steps 12 --timeout-s 60",
    );
    expect_recovered(&s, &dir, 3, what);
    let error = secs(&s, &dir, "error_s", what);
    let commit = secs(&s, &dir, "next_commit_s", what);
    assert!(error < 6.0 && commit < 6.0, "{what}: the survivor waited for the frozen group: {s}{}", logs(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn training_on_hccn_ends_with_the_weights_of_the_same_training_on_torchfts_gloo_group() {
    // Without faults and with --min-replicas 2 every step has both groups: the same steps,
    // the same averages (a sum of two is exact in any order), the same weights, bit for bit.
    let mut params = Vec::new();
    for pg in ["gloo", "hccn"] {
        let (s, dir) = scenario(&format!("equal-{pg}"), &format!("--pg {pg} --replicas 2 --min-replicas 2 --steps 10"));
        let what = format!("fault-free training on {pg}");
        expect(&s, &dir, "ok", &Value::Bool(true), &what);
        expect(&s, &dir, "equal_weights", &Value::Bool(true), &what);
        params.push(std::fs::read(dir.join("params-0.f64")).expect("params"));
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(params[0].len() > 1000, "{} bytes of parameters", params[0].len());
    assert!(params[0] == params[1], "the hccn run ended with other weights than the Gloo run");
}

/// `python -m torch.distributed.run --standalone --nproc-per-node N script args` with `env`.
fn torchrun_with(n: u32, script: &Path, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(torch::python());
    cmd.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"])
        .arg(n.to_string())
        .arg(script)
        .args(args)
        .envs(env.iter().copied());
    torch::use_source_tree(&mut cmd);
    launch::run(cmd, TIMEOUT)
}

#[test]
fn every_operation_abort_in_flight_a_stuck_peer_and_200_quorum_changes_without_leaks() {
    let out = torchrun_with(3, &script("torchft_pg.py"), &["200"], &[]);
    torch::expect_ok(&out, 3, "torchft_pg.py on 3 ranks");
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("rank {r}: fds, threads after 12 quorum changes")), "{}", out.describe());
    }
    for r in 0..2 {
        assert!(out.stdout.contains(&format!("rank {r}: wait ended")), "no abort report: {}", out.describe());
        assert!(out.stdout.contains(&format!("rank {r}: stuck peer: wait ended")), "{}", out.describe());
    }
    assert!(
        out.stdout.contains("rank 0: wait ended") && out.stdout.contains("errored: AbortedError"),
        "{}",
        out.describe()
    );
}

#[test]
fn with_hccn_backend_hccl_the_same_class_moves_its_data_through_hccl() {
    let emu = launch::bin_dir().join("libhccl_emu.so");
    assert!(emu.exists(), "{} is missing: cargo build --release", emu.display());
    let emu = emu.to_str().expect("utf-8 path");
    let env = [("HCCN_BACKEND", "hccl"), ("HCCN_HCCL_LIB", emu), ("HCCN_ACL_LIB", emu), ("HCCN_LOG", "info")];
    let out = torchrun_with(3, &script("torchft_pg.py"), &["20"], &env);
    torch::expect_ok(&out, 3, "torchft_pg.py on the HCCL backend");
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("HCCL backend loaded"), "the HCCL backend was not used: {}", out.describe());
    for op in
        ["HcclAllReduce", "HcclAllGather", "HcclBroadcast", "HcclBarrier", "HcclReduceScatter", "HcclSend", "HcclRecv"]
    {
        assert!(all.contains(&format!("hccl-emu: first {op}")), "{op} was never called: {}", out.describe());
    }
}

/// Kills the Lighthouse however the test ends.
struct Lighthouse(Child);

impl Drop for Lighthouse {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lighthouse(min_replicas: u32) -> (Lighthouse, String) {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let exe = torch::python().with_file_name("torchft_lighthouse");
    let child = Command::new(&exe)
        .args(["--min_replicas", &min_replicas.to_string(), "--quorum_tick_ms", "100", "--join_timeout_ms", "10000"])
        .args(["--heartbeat_timeout_ms", "1000", "--bind", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup-python.sh torch installs torchft)", exe.display()));
    (Lighthouse(child), format!("http://127.0.0.1:{port}"))
}

#[test]
fn the_example_trains_one_group_under_hccnrun_and_one_under_torchrun_as_the_readme_shows() {
    // The README's commands, with a Lighthouse of --min_replicas 2 so that both groups train
    // every step together and must end with the same parameters.
    let (_guard, addr) = lighthouse(2);
    let example = torch::root().join("examples/torchft/train_ddp.py");
    let env = |group: &str, cmd: &mut Command| {
        cmd.env("TORCHFT_LIGHTHOUSE", &addr).env("REPLICA_GROUP_ID", group).env("STEPS", "20");
        torch::use_source_tree(cmd);
    };
    let mut under_hccnrun = Command::new(launch::bin("hccnrun"));
    under_hccnrun.args(["-n", "1", "--"]).arg(torch::python()).arg(&example);
    env("0", &mut under_hccnrun);
    let mut under_torchrun = Command::new(torch::python());
    under_torchrun.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]).arg(&example);
    env("1", &mut under_torchrun);
    let first = std::thread::spawn(move || launch::run(under_hccnrun, TIMEOUT));
    let second = launch::run(under_torchrun, TIMEOUT);
    let first = first.join().expect("the hccnrun group's thread");
    let done = |out: &Outcome, group: u32| -> String {
        assert_eq!(out.code, Some(0), "replica group {group}: {}", out.describe());
        let prefix = format!("replica group {group} rank 0: done at step 20, params ");
        let line = out.stdout.lines().find_map(|l| l.split_once(&prefix).map(|(_, sum)| sum.to_owned()));
        line.unwrap_or_else(|| panic!("replica group {group} did not finish: {}", out.describe()))
    };
    assert_eq!(done(&first, 0), done(&second, 1), "the two groups ended with different parameters");
}

#[test]
fn importing_hccn_torchft_names_the_pinned_torchft_version_when_it_is_absent_or_another() {
    torch::extension();
    let run = |args: &[&str], path: &str| {
        let mut cmd = Command::new(torch::python());
        cmd.args(args).env("PYTHONPATH", path).env("HCCN_LIB", launch::bin_dir().join("libhccn.so"));
        launch::run(cmd, Duration::from_secs(120))
    };
    let package = torch::root().join("bindings/python");
    let package = package.to_str().expect("utf-8 path");
    // Absent: without site-packages (-S) the interpreter sees no torchft at all.
    let absent = run(&["-S", "-c", "import hccn.torchft"], package);
    assert_ne!(absent.code, Some(0), "{}", absent.describe());
    assert!(
        absent.stderr.contains("hccn.torchft needs torchft==0.2.0, which is not installed"),
        "{}",
        absent.describe()
    );
    // Another version: its metadata first on the path.
    let dir = scratch("version");
    let dist = dir.join("torchft-0.1.0.dist-info");
    std::fs::create_dir_all(&dist).expect("dist-info");
    std::fs::write(dist.join("METADATA"), "Metadata-Version: 2.1\nName: torchft\nVersion: 0.1.0\n").expect("METADATA");
    let other = run(&["-c", "import hccn.torchft"], &format!("{}:{package}", dir.display()));
    assert_ne!(other.code, Some(0), "{}", other.describe());
    assert!(
        other.stderr.contains("hccn.torchft is built for torchft==0.2.0")
            && other.stderr.contains("found torchft 0.1.0"),
        "{}",
        other.describe()
    );
    // The pinned one.
    let pinned = run(&["-c", "import hccn.torchft; print('imported', hccn.torchft.TORCHFT_VERSION)"], package);
    assert!(pinned.code == Some(0) && pinned.stdout.contains("imported 0.2.0"), "{}", pinned.describe());
    let _ = std::fs::remove_dir_all(&dir);
}
