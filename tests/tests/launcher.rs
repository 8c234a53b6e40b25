//! hccnrun as torchrun and mpirun users run it, and its lifecycle under failures: the variables
//! a C and a Python rank get, `*.py` programs, per-rank output files, `--version` on every tool,
//! the exit code of the first failure by time, elastic jobs with nobody left to admit a
//! replacement, labels that follow a rank through a rebuild, ranks under a wrapper killed with
//! a SIGKILLed hccnrun, a job under `ulimit -Sn 64`, and hccnrun's memory over hundreds of
//! elastic rebuilds. The C rank is tests/c/launcher_rank.c.
//!
//! Needs the release build (`cargo build --release`) and gcc; about half a minute.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hccn_tests::launch::{self, Outcome};
use hccn_tests::scratch::{root, workspace_version, TempDir};

const TIMEOUT: Duration = Duration::from_secs(120);

/// tests/c/launcher_rank.c, built once per run of this test binary.
fn rank_program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lib = launch::bin_dir();
        let out = lib.join("hccn-launcher-rank");
        let status = Command::new("gcc")
            .args(["-std=c99", "-D_DEFAULT_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(root().join("include"))
            .arg(root().join("tests/c/launcher_rank.c"))
            .arg("-L")
            .arg(&lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .args(["-lhccn", "-o"])
            .arg(&out)
            .status()
            .expect("run gcc");
        assert!(status.success(), "gcc failed on tests/c/launcher_rank.c");
        out
    })
}

fn hccnrun(args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(args).envs(env.iter().copied()).env_remove("OMP_NUM_THREADS");
    launch::run(cmd, TIMEOUT)
}

/// `hccnrun ARGS... launcher_rank MODE...`.
fn with_rank(args: &[&str], mode: &[&str]) -> Outcome {
    let program = rank_program().to_string_lossy().into_owned();
    hccnrun(&[args, &[program.as_str()], mode].concat(), &[])
}

/// `NAME=value` fields of a line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

#[test]
fn a_c_rank_gets_torchrun_and_mpirun_variables_beside_hccns() {
    let program = rank_program().to_string_lossy().into_owned();
    let args = ["--nproc-per-node", "2", "--oversubscribe", "-x", "EXTRA=from-x", &program, "env"];
    let out = hccnrun(&args, &[]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.contains("setting OMP_NUM_THREADS=1 for every rank"), "the notice: {}", out.describe());
    for r in 0..2 {
        let env = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}] ENV "))).expect("an ENV line");
        let want = [
            ("RANK", r.to_string()),
            ("HCCN_RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("LOCAL_RANK", r.to_string()),
            ("LOCAL_WORLD_SIZE", "2".into()),
            ("GROUP_RANK", "0".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("OMP_NUM_THREADS", "1".into()),
            ("EXTRA", "from-x".into()),
        ];
        for (k, v) in want {
            assert_eq!(field(env, k), Some(v.as_str()), "{k} in {env}");
        }
        let port: u16 = field(env, "MASTER_PORT").and_then(|p| p.parse().ok()).expect("a MASTER_PORT");
        assert!(port > 0, "{env}");
        assert!(out.stdout.contains(&format!("[{r}] WORLD rank={r} size=2 reduce=ok")), "{}", out.describe());
    }
    // A value the user set is kept, without the notice.
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(["-n", "1", &program, "env"]).env("OMP_NUM_THREADS", "3");
    let out = launch::run(cmd, TIMEOUT);
    assert!(
        out.stdout.contains("OMP_NUM_THREADS=3") && !out.stderr.contains("OMP_NUM_THREADS=1"),
        "{}",
        out.describe()
    );
}

/// A script that prints what a torch program would read, and binds MASTER_PORT on rank 0 (as
/// torch's own store does): it must be free.
const SCRIPT: &str = r#"import os, socket, sys
e = os.environ
if e["RANK"] == "0":
    socket.create_server((e["MASTER_ADDR"], int(e["MASTER_PORT"]))).close()
    print("BOUND", e["MASTER_PORT"], "store", e["HCCN_STORE"])
print("PY", e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"],
      e["OMP_NUM_THREADS"], e.get("LAUNCHER_TEST_PYTHON", "-"), " ".join(sys.argv[1:]))
"#;

#[test]
fn a_py_program_runs_with_the_python3_on_path_or_the_one_given() {
    let tmp = TempDir::new("launcher-py");
    std::fs::write(tmp.path().join("s.py"), SCRIPT).expect("script");
    // python3 on PATH is this wrapper, which marks what it runs.
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let wrapper = bin.join("python3");
    std::fs::write(&wrapper, "#!/bin/sh\nLAUNCHER_TEST_PYTHON=path exec /usr/bin/python3 \"$@\"\n").expect("wrapper");
    std::fs::write(bin.join("other-python"), "#!/bin/sh\nLAUNCHER_TEST_PYTHON=given exec /usr/bin/python3 \"$@\"\n")
        .expect("other");
    for p in [&wrapper, &bin.join("other-python")] {
        Command::new("chmod").arg("+x").arg(p).status().expect("chmod");
    }
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let script = tmp.path().join("s.py").to_string_lossy().into_owned();
    let other = bin.join("other-python").to_string_lossy().into_owned();
    for (args, marker) in [
        (vec!["--nproc-per-node", "2", &script, "a", "b"], "path"),
        (vec!["-n", "2", "--python", &other, &script, "a", "b"], "given"),
    ] {
        let out = hccnrun(&args, &[("PATH", &path)]);
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.describe());
        for r in 0..2 {
            let want = format!("[{r}] PY {r} 2 {r} 2 0 1 {marker} a b");
            assert!(out.stdout.contains(&want), "no {want:?}: {}", out.describe());
        }
        let bound = out.stdout.lines().find_map(|l| l.strip_prefix("[0] BOUND ")).expect("rank 0 bound MASTER_PORT");
        let (port, store) = bound.split_once(" store ").expect("port and store");
        assert!(!store.ends_with(&format!(":{port}")), "MASTER_PORT is not hccn's store port: {bound}");
    }
}

#[test]
fn every_tool_says_its_version() {
    let version = workspace_version();
    for tool in ["hccnrun", "hccn-perf", "hccn-info", "hccn-trace"] {
        let mut c = Command::new(launch::bin(tool));
        c.arg("--version");
        let out = launch::run(c, TIMEOUT);
        assert_eq!(out.code, Some(0), "{tool}: {}", out.describe());
        assert_eq!(out.stdout.trim(), format!("{tool} {version}"), "{tool}");
    }
}

#[test]
fn output_dir_holds_each_ranks_streams_unprefixed() {
    let tmp = TempDir::new("launcher-out");
    let dir = tmp.path().join("logs").to_string_lossy().into_owned();
    let out = hccnrun(&["-n", "2", "--output-dir", &dir, "sh", "-c", "echo out $RANK; echo err $RANK >&2"], &[]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for r in 0..2 {
        let read = |s: &str| std::fs::read_to_string(format!("{dir}/rank.{r}/{s}")).unwrap_or_default();
        assert_eq!((read("stdout"), read("stderr")), (format!("out {r}\n"), format!("err {r}\n")));
        assert!(out.stdout.contains(&format!("[{r}] out {r}")), "and on hccnrun's own output: {}", out.describe());
    }
}

#[test]
fn the_first_failure_by_time_sets_the_exit_code() {
    // Rank 2 exits 3; the survivors see it within a millisecond and exit 10.
    for run in 0..5 {
        let out = with_rank(&["-n", "4"], &["first"]);
        assert_eq!(out.code, Some(3), "run {run}: {}", out.describe());
        assert!(out.stderr.contains("rank 2 (pid") && out.stderr.contains("exited with code 3"), "{}", out.describe());
    }
    for run in 0..2 {
        let out = with_rank(&["-n", "4"], &["first", "segv"]);
        assert_eq!(out.code, Some(139), "run {run}: a segmentation fault is 128+11: {}", out.describe());
        assert!(out.stderr.contains("killed by signal 11 (SIGSEGV)"), "{}", out.describe());
    }
}

#[test]
fn elastic_starts_no_replacement_once_no_member_is_left() {
    // Rank 2 exits 3 (a replacement is started: the others still run), then every member fails:
    // nobody is left to admit the replacement, which is stopped after the grace period.
    let started = Instant::now();
    let out = with_rank(&["--elastic", "--max-restarts", "5", "--grace", "1", "-n", "4"], &["first"]);
    assert_eq!(out.code, Some(3), "the original failure's code: {}", out.describe());
    assert!(out.stderr.contains("no member of the world is left"), "{}", out.describe());
    let replacements = out.stderr.matches("starting a replacement").count();
    assert!(replacements <= 3, "{replacements} replacements for a job with nobody to admit them: {}", out.describe());
    assert!(started.elapsed() < Duration::from_secs(20), "no replacement waited out its timeout: {}", out.describe());
}

#[test]
fn elastic_ends_well_when_the_members_outlive_a_late_failure() {
    // The last rank dies near the end; the others shrink, finish and exit 0.
    let out = with_rank(&["--elastic", "--grace", "1", "-n", "4"], &["shrink"]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("[{r}] FINISHED rank={r} size=3")), "{}", out.describe());
    }
    assert!(!out.stderr.contains("rank(s) left"), "{}", out.describe());
    // The last rank dies after the others ended well: the job had done its work.
    let out = with_rank(&["--elastic", "--grace", "1", "-n", "4"], &["straggler"]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.contains("rank 3 (pid") && !out.stderr.contains("rank(s) left"), "{}", out.describe());
    // Without --elastic every failure counts.
    assert_eq!(with_rank(&["-n", "4"], &["straggler"]).code, Some(137));
}

#[test]
fn output_labels_follow_the_ranks_through_a_rebuild() {
    // Launch rank 1 dies; launch rank 2 becomes rank 1, its replacement rank 2.
    let out = with_rank(&["--elastic", "--max-restarts", "1", "-n", "3"], &["rebuild"]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let after: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" AFTER ")).collect();
    assert_eq!(after.len(), 3, "{}", out.describe());
    for line in after {
        let rank = field(line, "rank").expect("rank");
        assert!(line.starts_with(&format!("[{rank}] AFTER ")), "labelled with the rank it holds: {line}");
        assert!(line.ends_with("size=3 epoch=1 reduce=ok"), "{line}");
    }
}

/// Live processes whose command line holds `marker`, with their first argument.
fn marked(marker: &str) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
            let args: Vec<String> = cmd.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            (args.iter().any(|a| a.contains(marker)) && !zombie).then(|| (pid, args[0].clone()))
        })
        .collect()
}

#[test]
fn ranks_under_a_wrapper_die_with_a_sigkilled_hccnrun() {
    let marker = format!("launcher-orphan-{}", std::process::id());
    // The real rank (python) is the wrapper shell's child: the parent-death signal of the shell
    // does not reach it.
    let rank = format!("python3 -c 'import time; print(\"up\", flush=True); time.sleep(300)' {marker}; echo done");
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(["-n", "2", "sh", "-c", &rank]);
    let mut seen = Vec::new();
    let out = launch::run_watching(cmd, TIMEOUT, |p| {
        let up = p.wait_line(Duration::from_secs(60), |l| l.starts_with("[1] up"));
        let _ = p.wait_line(Duration::from_secs(10), |l| l.starts_with("[0] up"));
        assert!(up.is_some(), "the ranks did not start: {}", p.stdout());
        seen = marked(&marker);
        for (pid, _) in seen.iter().filter(|(_, arg0)| arg0.ends_with("hccnrun")) {
            // SAFETY: SIGKILL to the hccnrun this test started (found by its marker).
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
    });
    let pythons = seen.iter().filter(|(_, arg0)| arg0.contains("python")).count();
    assert!(pythons >= 2, "the marked ranks were not found ({seen:?}): {}", out.describe());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = marked(&marker);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = marked(&marker);
    }
    for &(pid, _) in &left {
        // SAFETY: clean up what the test started before failing.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "processes {left:?} outlived the SIGKILLed hccnrun: {}", out.describe());
}

#[test]
fn a_soft_descriptor_limit_of_64_is_raised_for_the_job() {
    // 16 ranks that join their world: hccnrun holds their pipes and store connections at once.
    let hccnrun = launch::bin("hccnrun").to_string_lossy().into_owned();
    let rank = rank_program().to_string_lossy().into_owned();
    let sh = |script: String| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        launch::run(c, TIMEOUT)
    };
    let out = sh(format!("ulimit -Sn 64; exec {hccnrun} -n 16 {rank} env"));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(out.stdout.matches("reduce=ok").count(), 16, "{}", out.describe());
    let limits: Vec<u64> = out.stdout.lines().filter_map(|l| field(l, "NOFILE")?.parse().ok()).collect();
    assert!(limits.len() == 16 && limits.iter().all(|&l| l >= 384), "the ranks inherit the raised limit: {limits:?}");
    // A hard limit too low for the job is said once.
    let out = sh(format!("ulimit -n 100; exec {hccnrun} -n 16 sh -c 'echo ok'"));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(out.stderr.matches("the open-file limit is 100").count(), 1, "{}", out.describe());
}

/// Resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = status.lines().find_map(|l| l.strip_prefix("VmRSS:"));
    field.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

/// The epoch of rank 0's line `[0] EPOCH e FDS f THREADS t`.
fn epoch_of(line: &str) -> Option<u64> {
    line.strip_prefix("[0] EPOCH ")?.split_whitespace().next()?.parse().ok()
}

#[test]
fn hccnrun_stays_small_over_hundreds_of_elastic_rebuilds() {
    // Each cycle: a rank dies, hccnrun starts its replacement, the survivors rebuild. hccnrun
    // used to keep 17 KB per cycle (the stacks of the ended ranks' output threads), and the
    // survivors a socket per cycle (the dead replacement's link).
    // Measured at the 100th and the 380th rebuild, while the job still runs (it ends at 400).
    let (first, last, cycles) = (100u64, 380u64, 400u64);
    let program = rank_program().to_string_lossy().into_owned();
    let restarts = (cycles + 10).to_string();
    let cycles = cycles.to_string();
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(["--elastic", "--max-restarts", &restarts, "-n", "3", &program, "churn", &cycles]);
    let mut rss = Vec::new();
    let out = launch::run_watching(cmd, TIMEOUT, |p| {
        // Rank 0 prints most epochs (an allreduce that the dying rank cuts short prints nothing).
        let reached = |epoch: u64| move |l: &str| epoch_of(l).is_some_and(|e| e >= epoch);
        for epoch in [first, last] {
            let _ = p.wait_line(TIMEOUT, reached(epoch));
            // The only hccnrun of this test binary whose ranks churn.
            let hccnrun = marked("churn").into_iter().find(|(_, a)| a.ends_with("hccnrun")).map(|(p, _)| p);
            rss.push(hccnrun.map_or(0, rss_kib));
        }
    });
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(rss.len() == 2 && rss[0] > 0 && rss[1] > 0, "hccnrun's memory was not read: {rss:?}: {}", out.describe());
    let per_cycle = rss[1].saturating_sub(rss[0]) as f64 / (last - first) as f64;
    eprintln!(
        "hccnrun: {} KiB after {first} rebuilds, {} KiB after {last}: {per_cycle:.2} KiB per rebuild",
        rss[0], rss[1]
    );
    assert!(per_cycle < 4.0, "hccnrun grows {per_cycle:.2} KiB per rebuild ({rss:?} KiB)");
    // A survivor's descriptors and threads: each cycle admitted a replacement that later died,
    // and its link used to stay open (a socket per rebuild).
    let at = |epoch: u64, what: &str| -> u64 {
        let line = out.stdout.lines().find(|l| epoch_of(l).is_some_and(|e| e >= epoch));
        let field = line.and_then(|l| l.split_whitespace().skip_while(|w| *w != what).nth(1));
        field.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {what} at epoch {epoch}: {}", out.describe()))
    };
    let (fds, threads) = ((at(first, "FDS"), at(last, "FDS")), (at(first, "THREADS"), at(last, "THREADS")));
    eprintln!("rank 0: descriptors {fds:?}, threads {threads:?} after {first} and {last} rebuilds");
    assert!(fds.1 <= fds.0 + 2, "rank 0 holds more descriptors per rebuild: {fds:?}");
    assert!(threads.1 <= threads.0 + 2, "rank 0 runs more threads per rebuild: {threads:?}");
}
