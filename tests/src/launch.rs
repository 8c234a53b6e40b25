//! Running programs under hccnrun from tests: a hard timeout, the whole process group killed on
//! expiry, and the output kept for the failure message.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The directory of this build's binaries (target/<profile>), from the test executable's path.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir");
    let dir = if deps.ends_with("deps") { deps.parent().expect("profile dir") } else { deps };
    dir.to_path_buf()
}

/// A workspace binary built in this profile (hccnrun, hccn-perf, ...).
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace binaries first (cargo build --workspace --bins)",
        p.display()
    );
    p
}

#[derive(Debug)]
pub struct Outcome {
    /// Exit code, or None when killed on timeout.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn describe(&self) -> String {
        format!(
            "exit {:?} after {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Runs `hccnrun -n N -- program args...` with extra environment, killing everything after
/// `timeout`.
pub fn hccnrun(n: u32, program: &std::path::Path, args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Outcome {
    let mut cmd = Command::new(bin("hccnrun"));
    cmd.arg("-n").arg(n.to_string()).arg("--").arg(program).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(cmd, timeout)
}

/// Runs a checking worker (`program`) on `n` ranks with 4 KiB pipeline chunks (so that larger
/// counts cross many chunks) and asserts that it succeeded: exit 0, a `[r] rank r of n: ...`
/// report from every rank, and no `FAIL` line.
pub fn expect_clean_run(n: u32, program: &std::path::Path, what: &str) {
    expect_clean_run_with(n, program, &[], &[], what)
}

/// [`expect_clean_run`] with program arguments and more environment (e.g. `HCCN_ALGO`).
pub fn expect_clean_run_with(n: u32, program: &std::path::Path, args: &[&str], env: &[(&str, &str)], what: &str) {
    let mut all_env = vec![("HCCN_CHUNK_BYTES", "4096")];
    all_env.extend_from_slice(env);
    let out = hccnrun(n, program, args, &all_env, Duration::from_secs(600));
    assert_eq!(out.code, Some(0), "{what} with {n} ranks failed: {}", out.describe());
    for r in 0..n {
        assert!(
            out.stdout.contains(&format!("[{r}] rank {r} of {n}: ")),
            "rank {r} did not report: {}",
            out.describe()
        );
    }
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
}

/// Asserts that a `hccn-faults grow` job of 4 ranks recovered: exit 0, the replacement joined as
/// rank 3, and every rank reduced exactly at epoch 1. (Lines are found by what they say: with a
/// store elsewhere, hccnrun may label a joiner's first lines before it has read its admission.)
pub fn expect_grown(out: &Outcome) {
    assert_eq!(out.code, Some(0), "a recovered job ends well: {}", out.describe());
    assert!(out.stdout.contains("] JOINED rank=3 size=4 epoch=1"), "{}", out.describe());
    for r in 0..4 {
        let want = format!("] GROWN rank={r} size=4 epoch=1 result=Ok(())");
        assert!(out.stdout.contains(&want), "no {want:?}: {}", out.describe());
    }
}

/// Runs `cmd` in its own process group with a hard timeout.
pub fn run(cmd: Command, timeout: Duration) -> Outcome {
    run_watching(cmd, timeout, |_| {})
}

/// What a running job has printed so far (see [`run_watching`]).
#[derive(Debug, Clone, Default)]
pub struct Progress(std::sync::Arc<std::sync::Mutex<String>>);

impl Progress {
    pub fn stdout(&self) -> String {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits up to `limit` for a line for which `want` holds; returns it.
    pub fn wait_line(&self, limit: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        let end = Instant::now() + limit;
        loop {
            if let Some(l) = self.stdout().lines().find(|l| want(l)) {
                return Some(l.to_owned());
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// [`run`], calling `meanwhile` (on this thread) with the job's output as it comes.
pub fn run_watching(mut cmd: Command, timeout: Duration, meanwhile: impl FnOnce(&Progress)) -> Outcome {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn");
    let pgid = child.id() as i32;
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let progress = Progress::default();
    let shared = progress.clone();
    let t_out = std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut s) = shared.0.lock() {
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    meanwhile(&progress);
    let code = loop {
        match child.try_wait().expect("wait") {
            Some(st) => {
                break st.code().or_else(|| std::os::unix::process::ExitStatusExt::signal(&st).map(|s| 128 + s))
            }
            None if start.elapsed() > timeout => {
                // hccnrun forwards SIGTERM to its ranks' groups; SIGKILL follows for whatever stays.
                // SAFETY: signalling the process and group we created; harmless if already gone.
                unsafe { libc::kill(pgid, libc::SIGTERM) };
                std::thread::sleep(Duration::from_secs(2));
                // SAFETY: as above.
                unsafe { libc::killpg(pgid, libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // hccnrun has stopped its ranks (each in its own group, with a parent-death signal); this
    // also ends anything else left in the launcher's group.
    // SAFETY: as above.
    unsafe { libc::killpg(pgid, libc::SIGKILL) };
    let _ = t_out.join();
    Outcome { code, stdout: progress.stdout(), stderr: t_err.join().unwrap_or_default(), elapsed: start.elapsed() }
}

/// The rank that launch rank `r` holds after `victims` are dropped (dense, in old-rank order).
pub fn rank_after(r: u32, victims: &[u32]) -> u32 {
    r - victims.iter().filter(|&&v| v < r).count() as u32
}

/// Checks a `hccn-faults shrink VICTIMS` run of `n` ranks: every survivor reports its dense new
/// rank, the shrunk size and a correct reduction afterwards; hccnrun (its embedded store) labels
/// the line with that rank, as it is after the shrink.
pub fn expect_shrunk(out: &Outcome, n: u32, victims: &[u32]) {
    for r in (0..n).filter(|r| !victims.contains(r)) {
        let new_rank = rank_after(r, victims);
        let want = format!("[{new_rank}] SHRUNK rank={new_rank} size={} epoch=", n - victims.len() as u32);
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&want))
            .unwrap_or_else(|| panic!("rank {r}: no {want:?}: {}", out.describe()));
        assert!(line.ends_with("result=Ok(())"), "rank {r}: {line}");
    }
}
