//! hccnrun end to end: real ranks (small shell programs and hccn-perf), real signals. Every test
//! has a hard time limit, after which hccnrun is stopped (and with it its ranks) before failing.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const HCCNRUN: &str = env!("CARGO_BIN_EXE_hccnrun");
const PERF: &str = env!("CARGO_BIN_EXE_hccn-perf");

/// A running hccnrun whose stdout arrives line by line.
struct Job {
    child: Child,
    started: Instant,
    lines: Receiver<String>,
    stdout: Vec<String>,
    out_thread: Option<JoinHandle<()>>,
    err_thread: Option<JoinHandle<String>>,
}

/// How a job ended.
#[derive(Debug)]
struct Finished {
    status: ExitStatus,
    elapsed: Duration,
    stdout: String,
    stderr: String,
}

impl Job {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Job {
        let mut cmd = Command::new(HCCNRUN);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // The outer environment must not leak into what the tests expect.
        for var in ["HCCN_JOB_ID", "HCCN_BIND_ADDR", "HCCN_RANK", "HCCN_STORE"] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("start hccnrun");
        let out = child.stdout.take().expect("stdout pipe");
        let mut err = child.stderr.take().expect("stderr pipe");
        let (tx, lines) = mpsc::channel();
        let out_thread = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let err_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Job {
            child,
            started: Instant::now(),
            lines,
            stdout: Vec::new(),
            out_thread: Some(out_thread),
            err_thread: Some(err_thread),
        }
    }

    /// Collects stdout until `enough` holds for the lines so far; false on timeout.
    fn wait_for(&mut self, limit: Duration, enough: impl Fn(&[String]) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while !enough(&self.stdout) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.stdout.push(line),
                Err(_) => return false,
            }
        }
        true
    }

    fn signal(&self, sig: i32) {
        // SAFETY: a plain kill(2) of our own, not yet reaped, child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for hccnrun to exit, at most `limit` from its start; past that it is stopped (its
    /// ranks with it) and the test fails.
    fn finish(mut self, limit: Duration) -> Finished {
        let deadline = self.started + limit;
        let mut timed_out = false;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("poll hccnrun") {
                break s;
            }
            if Instant::now() >= deadline && !timed_out {
                timed_out = true;
                self.signal(libc::SIGTERM);
            }
            if Instant::now() >= deadline + Duration::from_secs(5) {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        if let Some(t) = self.out_thread.take() {
            let _ = t.join();
        }
        self.stdout.extend(self.lines.try_iter());
        let stderr = self.err_thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        let stdout = self.stdout.iter().map(|l| format!("{l}\n")).collect();
        let f = Finished { status, elapsed, stdout, stderr };
        assert!(!timed_out, "hccnrun ran past the test's limit of {limit:?}: {f:#?}");
        f
    }
}

fn run(args: &[&str], limit: Duration) -> Finished {
    Job::start(args, &[]).finish(limit)
}

/// True while `pid` names a live (not zombie) process.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the parenthesised command name, which may itself contain spaces.
    let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Pids that ranks printed as `[r] pid N`.
fn printed_pids(stdout: &str) -> Vec<u32> {
    stdout.lines().filter_map(|l| l.split_once("] pid ").and_then(|(_, p)| p.trim().parse().ok())).collect()
}

/// Waits up to a few seconds for processes to vanish (init reaps re-parented ones).
fn all_gone(pids: &[u32]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    while pids.iter().any(|&p| alive(p)) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn prefixes_output_and_gives_each_rank_its_environment() {
    let script = r#"echo hello $HCCN_RANK
echo "env $HCCN_RANK $HCCN_WORLD_SIZE $HCCN_LOCAL_RANK $HCCN_LOCAL_WORLD_SIZE $HCCN_STORE $HCCN_JOB_ID $HCCN_JOB_TOKEN"
echo "oops $HCCN_RANK" >&2
printf "partial $HCCN_RANK""#;
    let f = run(&["-n", "3", "sh", "-c", script], Duration::from_secs(30));
    assert!(f.status.success(), "{f:#?}");
    let mut stores = HashSet::new();
    let mut jobs = HashSet::new();
    let mut tokens = HashSet::new();
    for r in 0..3 {
        for want in [format!("[{r}] hello {r}"), format!("[{r}] partial {r}")] {
            assert!(f.stdout.lines().any(|l| l == want), "no {want:?} in {f:#?}");
        }
        assert!(f.stderr.lines().any(|l| l == format!("[{r}] oops {r}")), "{f:#?}");
        let env = f.stdout.lines().find_map(|l| l.strip_prefix(&format!("[{r}] env "))).expect("env line");
        let v: Vec<&str> = env.split(' ').collect();
        assert_eq!(v.len(), 7, "{env}");
        assert_eq!(&v[..4], &[r.to_string().as_str(), "3", r.to_string().as_str(), "3"], "{env}");
        assert!(v[4].starts_with("tcp://127.0.0.1:"), "{env}");
        assert!(v[5].starts_with("job-") && v[5].len() == 12, "{env}");
        assert!(v[6].len() == 64 && v[6].chars().all(|c| c.is_ascii_hexdigit()), "{env}");
        stores.insert(v[4].to_owned());
        jobs.insert(v[5].to_owned());
        tokens.insert(v[6].to_owned());
    }
    assert_eq!((stores.len(), jobs.len(), tokens.len()), (1, 1, 1), "one store, job and token per job");

    let f = Job::start(&["-n", "2", "sh", "-c", "echo id $HCCN_JOB_ID"], &[("HCCN_JOB_ID", "mine")])
        .finish(Duration::from_secs(30));
    assert!(f.stdout.contains("[0] id mine") && f.stdout.contains("[1] id mine"), "{f:#?}");
}

/// The CPUs in a `Cpus_allowed_list` value (`0-3,6`).
fn cpu_list(v: &str) -> Vec<usize> {
    let range = |r: &str| -> Vec<usize> {
        let (a, b) = r.split_once('-').unwrap_or((r, r));
        let (a, b): (usize, usize) = (a.trim().parse().expect("cpu"), b.trim().parse().expect("cpu"));
        (a..=b).collect()
    };
    v.split(',').flat_map(range).collect()
}

fn allowed_cpus_line(status: &str) -> &str {
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list").trim()
}

#[test]
fn bind_to_core_puts_each_local_rank_on_one_cpu_in_turn() {
    let own = std::fs::read_to_string("/proc/self/status").expect("status");
    let cpus = cpu_list(allowed_cpus_line(&own));
    let script = "grep Cpus_allowed_list: /proc/self/status";
    let f = run(&["-n", "3", "--bind-to", "core", "sh", "-c", script], Duration::from_secs(30));
    assert!(f.status.success(), "{f:#?}");
    for r in 0..3usize {
        let line = f.stdout.lines().find_map(|l| l.strip_prefix(&format!("[{r}] "))).expect("rank's line");
        assert_eq!(cpu_list(allowed_cpus_line(line)), vec![cpus[r % cpus.len()]], "rank {r}: {f:#?}");
    }
    let f = run(&["-n", "2", "--bind-to", "none", "sh", "-c", script], Duration::from_secs(30));
    assert!(f.status.success(), "{f:#?}");
    for r in 0..2 {
        let line = f.stdout.lines().find_map(|l| l.strip_prefix(&format!("[{r}] "))).expect("rank's line");
        assert_eq!(cpu_list(allowed_cpus_line(line)), cpus, "unbound rank {r}: {f:#?}");
    }
}

#[test]
fn a_failing_rank_stops_the_others_after_the_grace_period() {
    let script = r#"if [ "$HCCN_RANK" = 1 ]; then sleep 1; exit 3; fi
echo pid $$
exec sleep 30"#;
    let f = run(&["-n", "3", "--grace", "1", "sh", "-c", script], Duration::from_secs(20));
    assert_eq!(f.status.code(), Some(3), "{f:#?}");
    assert!(f.stderr.contains("rank 1 (pid") && f.stderr.contains("exited with code 3"), "{f:#?}");
    assert!(f.elapsed >= Duration::from_millis(1900), "the others got their grace period: {f:#?}");
    assert!(f.elapsed < Duration::from_secs(9), "{f:#?}");
    let pids = printed_pids(&f.stdout);
    assert_eq!(pids.len(), 2, "{f:#?}");
    assert!(all_gone(&pids), "sleepers {pids:?} survived: {f:#?}");
}

#[test]
fn a_rank_killed_by_a_signal_sets_128_plus_the_signal() {
    let script = r#"if [ "$HCCN_RANK" = 0 ]; then kill -9 $$; fi; exit 0"#;
    let f = run(&["-n", "2", "sh", "-c", script], Duration::from_secs(20));
    assert_eq!(f.status.code(), Some(137), "{f:#?}");
    assert!(f.stderr.contains("rank 0 (pid") && f.stderr.contains("killed by signal 9 (SIGKILL)"), "{f:#?}");
}

#[test]
fn the_job_time_limit_stops_everything() {
    let f = run(&["-n", "2", "--timeout", "1", "sh", "-c", "echo pid $$; exec sleep 30"], Duration::from_secs(20));
    assert_eq!(f.status.code(), Some(124), "{f:#?}");
    assert!(f.stderr.contains("hccnrun: timeout after 1 s, stopping ranks"), "{f:#?}");
    assert!(f.elapsed < Duration::from_secs(6), "{f:#?}");
    assert!(all_gone(&printed_pids(&f.stdout)), "{f:#?}");
}

#[test]
fn sigterm_to_hccnrun_reaches_the_ranks() {
    let mut job = Job::start(&["-n", "2", "sh", "-c", "echo pid $$; exec sleep 30"], &[]);
    let both = job.wait_for(Duration::from_secs(15), |l| l.iter().filter(|l| l.contains("] pid ")).count() == 2);
    job.signal(libc::SIGTERM);
    let f = job.finish(Duration::from_secs(25));
    assert!(both, "ranks did not start: {f:#?}");
    assert_eq!(f.status.code(), Some(128 + libc::SIGTERM), "{f:#?}");
    assert!(f.stderr.contains("received SIGTERM"), "{f:#?}");
    assert!(all_gone(&printed_pids(&f.stdout)), "{f:#?}");
}

#[test]
fn what_a_rank_leaves_running_does_not_outlive_it() {
    // The background sleep holds the rank's stdout open: without the clean-up hccnrun would wait.
    let f = run(&["-n", "2", "sh", "-c", "sleep 30 & echo pid $!"], Duration::from_secs(20));
    assert!(f.status.success(), "{f:#?}");
    assert!(f.elapsed < Duration::from_secs(5), "{f:#?}");
    let pids = printed_pids(&f.stdout);
    assert_eq!(pids.len(), 2, "{f:#?}");
    assert!(all_gone(&pids), "{f:#?}");
}

#[test]
fn usage_help_and_missing_programs() {
    let f = run(&["--help"], Duration::from_secs(10));
    assert!(f.status.success() && f.stdout.contains("usage: hccnrun -n N"), "{f:#?}");
    for bad in [&["sh"][..], &["-n", "0", "sh"], &["-n", "2"], &["-n", "2", "--frobnicate", "sh"]] {
        let f = run(bad, Duration::from_secs(10));
        assert_eq!(f.status.code(), Some(2), "{bad:?}: {f:#?}");
        assert!(f.stderr.contains("usage: hccnrun"), "{f:#?}");
    }
    let f = run(&["-n", "2", "/nonexistent/program"], Duration::from_secs(10));
    assert_eq!(f.status.code(), Some(127), "{f:#?}");
    assert!(f.stderr.contains("cannot start rank 0"), "{f:#?}");
}

/// Checks an hccn-perf table: header present, at least `min_rows` rows, `#wrong` 0 in both
/// columns (out of place, in place), or N/A where the operation has no such form.
fn assert_clean_table(f: &Finished, min_rows: usize) {
    assert!(f.status.success(), "{f:#?}");
    let table: Vec<&str> = f.stdout.lines().filter_map(|l| l.strip_prefix("[0] ")).collect();
    assert!(table.iter().any(|l| l.starts_with('#') && l.contains("busbw") && l.contains("#wrong")), "{f:#?}");
    assert!(table.iter().any(|l| l.starts_with("# Avg bus bandwidth")), "{f:#?}");
    let rows: Vec<&str> = table.iter().copied().filter(|l| !l.starts_with('#')).collect();
    assert!(rows.len() >= min_rows, "{f:#?}");
    for row in rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols.len(), 13, "{row}");
        let wrong = [cols[8], cols[12]];
        assert!(
            wrong.iter().all(|w| ["0", "N/A"].contains(w)) && wrong.contains(&"0"),
            "wrong elements in {row:?}: {f:#?}"
        );
    }
    assert!(!f.stdout.lines().any(|l| l.starts_with("[1] ")), "only rank 0 prints: {f:#?}");
}

/// `hccnrun -n RANKS --timeout 100 hccn-perf ARGS...`, within two minutes.
fn perf(ranks: &str, args: &[&str]) -> Finished {
    run(&[&["-n", ranks, "--timeout", "100", PERF], args].concat(), Duration::from_secs(120))
}

#[test]
fn perf_allreduce_checks_clean() {
    let f = perf("2", &["--op", "allreduce", "-b", "8", "-e", "1M", "-f", "4", "-c", "-w", "1", "-n", "2"]);
    // 8, 32, ... 512K bytes: nine sizes.
    assert_clean_table(&f, 9);
}

#[test]
fn perf_every_collective_checks_clean_on_three_ranks() {
    for (op, dtype, redop) in [
        ("allgather", "fp16", "sum"),
        ("reduce_scatter", "bf16", "max"),
        ("broadcast", "int8", "sum"),
        ("reduce", "fp64", "prod"),
        ("alltoall", "int32", "sum"),
        ("allreduce", "uint8", "avg"),
    ] {
        let args = ["--op", op, "--dtype", dtype, "--redop", redop, "--root", "2", "-b", "8", "-e", "256K", "-f", "8"];
        let f = perf("3", &[&args[..], &["-c", "-w", "1", "-n", "2"]].concat());
        assert_clean_table(&f, 4);
    }
}

#[test]
fn elastic_restarts_a_failed_rank_and_ends_well_when_the_replacement_does() {
    let dir = std::env::temp_dir().join(format!("hccnrun-elastic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let marker = dir.join("failed-once");
    let _ = std::fs::remove_file(&marker);
    // Rank 1 fails the first time only; its replacement finds the marker and succeeds.
    let script = format!(
        r#"if [ "$HCCN_RANK" = 1 ] && [ ! -e {m} ]; then touch {m}; exit 5; fi
sleep 1; echo done $HCCN_RANK"#,
        m = marker.display()
    );
    let f = run(&["--elastic", "--max-restarts", "2", "-n", "3", "sh", "-c", &script], Duration::from_secs(20));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(f.status.code(), Some(0), "{f:#?}");
    assert!(f.stderr.contains("starting a replacement for rank 1 (restart 1 of 2)"), "{f:#?}");
    assert_eq!(f.stdout.matches("done ").count(), 3, "{f:#?}");
}

#[test]
fn elastic_gives_up_when_restarts_run_out_or_too_few_ranks_remain() {
    let always_fails = r#"if [ "$HCCN_RANK" = 1 ]; then exit 5; fi; exec sleep 30"#;
    let f = run(
        &["--elastic", "--max-restarts", "1", "--grace", "1", "-n", "3", "sh", "-c", always_fails],
        Duration::from_secs(20),
    );
    assert_eq!(f.status.code(), Some(5), "{f:#?}");
    assert!(f.stderr.contains("no restarts left (--max-restarts 1); giving up"), "{f:#?}");
    let f = run(
        &["--elastic", "--min-ranks", "3", "--grace", "1", "-n", "3", "sh", "-c", always_fails],
        Duration::from_secs(20),
    );
    assert_eq!(f.status.code(), Some(5), "{f:#?}");
    assert!(f.stderr.contains("only 2 rank(s) left, fewer than --min-ranks 3; giving up"), "{f:#?}");
    let bad = run(&["--min-ranks", "2", "-n", "2", "true"], Duration::from_secs(10));
    assert_eq!(bad.status.code(), Some(2), "--min-ranks without --elastic is a usage error: {bad:#?}");
}

/// Entries of a /proc directory (threads in `task`, descriptors in `fd`) of process `pid`.
fn proc_count(pid: u32, what: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/{what}")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_flood_of_connections_costs_the_store_a_bounded_number_of_threads() {
    use hccn_runtime::rendezvous::{Store, TcpStore};
    let mut job = Job::start(&["-n", "1", "sh", "-c", "echo STORE $HCCN_STORE $HCCN_JOB_TOKEN; exec sleep 60"], &[]);
    let up = job.wait_for(Duration::from_secs(15), |l| l.iter().any(|l| l.contains("] STORE tcp://")));
    let line = job.stdout.iter().find(|l| l.contains("] STORE tcp://")).cloned().unwrap_or_default();
    let hccnrun = job.child.id();
    let (before_threads, before_fds) = (proc_count(hccnrun, "task"), proc_count(hccnrun, "fd"));
    let mut words = line.split_whitespace().skip(2);
    let addr: std::net::SocketAddr =
        words.next().and_then(|u| u.strip_prefix("tcp://")).and_then(|a| a.parse().ok()).expect("store address");
    let token = words.next().unwrap_or_default().to_owned();
    // 500 connections that never say a word, as a flood from someone without the token would.
    let silent: Vec<std::net::TcpStream> = (0..500).filter_map(|_| std::net::TcpStream::connect(addr).ok()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let (threads, fds) = (proc_count(hccnrun, "task"), proc_count(hccnrun, "fd"));
    // A member still gets in and is served.
    let started = Instant::now();
    let member = TcpStore::connect(addr, token.as_bytes(), Duration::from_secs(10)).map_err(|e| e.to_string());
    let served = member.and_then(|m| {
        m.set("flood/k", b"v").and_then(|()| m.get("flood/k", Duration::from_secs(5))).map_err(|e| e.to_string())
    });
    let waited = started.elapsed();
    drop(silent);
    job.signal(libc::SIGTERM);
    let f = job.finish(Duration::from_secs(30));
    assert!(up, "the rank did not start: {f:#?}");
    assert_eq!(served.as_deref().ok(), Some(&b"v"[..]), "the member was not served: {served:?}");
    assert!(waited < Duration::from_secs(5), "the member waited {waited:?}");
    // At most 64 handshakes at once: a thread and two descriptors each, beyond the job's own
    // (and a few more for a connection thread that is just ending).
    eprintln!("hccnrun before the flood: {before_threads} threads, {before_fds} fds; during: {threads}, {fds}");
    assert!(threads <= before_threads + 64 + 4, "{threads} threads during the flood ({before_threads} before)");
    assert!(fds <= before_fds + 2 * 64 + 4, "{fds} descriptors during the flood ({before_fds} before)");
    assert!(f.stderr.contains("still in their handshake"), "the refusals are logged: {f:#?}");
}

/// Live processes whose command line starts with `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).starts_with(needle) && alive(pid)
        })
        .collect()
}

#[test]
fn a_sigkilled_hccnrun_leaves_no_etcd_and_no_data_directory() {
    let mut job = Job::start(&["--etcd-local", "-n", "2", "sh", "-c", "echo pid $$; exec sleep 60"], &[]);
    let up = job.wait_for(Duration::from_secs(40), |l| l.iter().filter(|l| l.contains("] pid ")).count() == 2);
    let prefix = format!("hccn-etcd-{}-", job.child.id());
    let dirs: Vec<std::path::PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .map(|d| {
            d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).map(|e| e.path()).collect()
        })
        .unwrap_or_default();
    let dir = dirs.first().map(|d| d.to_string_lossy().into_owned()).unwrap_or_default();
    let etcd =
        if dir.is_empty() { Vec::new() } else { processes_with(&format!("etcd\0--name\0m0\0--data-dir\0{dir}\0")) };
    job.signal(libc::SIGKILL);
    let f = job.finish(Duration::from_secs(50));
    assert!(up, "the ranks did not start: {f:#?}");
    assert_eq!(dirs.len(), 1, "one data directory {prefix}*: {dirs:?}");
    assert_eq!(etcd.len(), 1, "one etcd process with --data-dir {dir}: {etcd:?}");
    let ranks = printed_pids(&f.stdout);
    let deadline = Instant::now() + Duration::from_secs(10);
    while (alive(etcd[0]) || std::path::Path::new(&dir).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(etcd[0]), "etcd (pid {}) outlived the SIGKILLed hccnrun", etcd[0]);
    assert!(!std::path::Path::new(&dir).exists(), "{dir} is still there 10 s after hccnrun died");
    assert!(all_gone(&ranks), "ranks {ranks:?} outlived hccnrun");
}

#[test]
fn a_rank_that_exits_before_the_world_forms_ends_the_job_at_once() {
    // Rank 1 never joins; the others call hccn_init_from_env and would wait 60 s for it.
    for (code, want) in [("3", 3), ("0", 1)] {
        let script = format!(r#"if [ "$HCCN_RANK" = 1 ]; then exit {code}; fi; exec "{PERF}" -b 8 -e 8 -n 1 -w 0"#);
        let job = Job::start(&["-n", "3", "--grace", "30", "sh", "-c", &script], &[("HCCN_TIMEOUT_MS", "60000")]);
        let f = job.finish(Duration::from_secs(40));
        assert_eq!(f.status.code(), Some(want), "{f:#?}");
        assert!(
            f.stderr.contains("rank 1 (pid")
                && f.stderr.contains(&format!("exited with code {code} before the job's world formed")),
            "hccnrun names the rank and its exit code: {f:#?}"
        );
        assert!(f.elapsed < Duration::from_secs(15), "the job ended only after {:?}: {f:#?}", f.elapsed);
    }
}

#[test]
fn perf_every_op_type_and_reduce_op_checks_clean_in_both_placements_with_json_and_csv() {
    let dir = std::env::temp_dir().join(format!("hccnrun-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for op in
        ["allreduce", "reduce", "reduce_scatter", "allgather", "gather", "scatter", "broadcast", "alltoall", "sendrecv"]
    {
        let (json, csv) = (dir.join(format!("{op}.json")), dir.join(format!("{op}.csv")));
        for (file, per_iter) in [(&json, "1"), (&csv, "0")] {
            let file = file.to_string_lossy().into_owned();
            let sweep = ["--op", op, "-d", "all", "-o", "all", "-r", "all", "-b", "64", "-e", "4K", "-f", "64"];
            let f = perf("2", &[&sweep[..], &["-c", "-w", "1", "-n", "2", "-I", per_iter, "-J", &file]].concat());
            assert!(f.stdout.contains("# Wrong elements       : 0 OK"), "{op}: {f:#?}");
            let table: Vec<&str> = f.stdout.lines().filter_map(|l| l.strip_prefix("[0] ")).collect();
            let rows = table.iter().filter(|l| !l.starts_with('#')).count();
            // Two sizes for each data type (12), reduce op (5 where the op reduces) and root (2
            // where it has one).
            let reduces = ["allreduce", "reduce", "reduce_scatter"].contains(&op);
            let rooted = ["reduce", "gather", "scatter", "broadcast"].contains(&op);
            let want = 2 * 12 * if reduces { 5 } else { 1 } * if rooted { 2 } else { 1 };
            assert_eq!(rows, want, "{op}: {f:#?}");
            if per_iter == "1" {
                assert!(table.iter().any(|l| l.contains("i_p99")), "{op}: per-iteration columns: {f:#?}");
            }
        }
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file")).expect("valid JSON");
        let results = j["results"].as_array().expect("results");
        assert!(!results.is_empty() && j["wrong_elements"]["okay"] == true, "{op}: {j}");
        for r in results {
            let measured = [&r["out_of_place"], &r["in_place"]].into_iter().filter(|c| !c.is_null()).count();
            assert!(measured >= 1, "{op}: {r}");
            for c in [&r["out_of_place"], &r["in_place"]].into_iter().filter(|c| !c.is_null()) {
                assert_eq!(c["nwrong"], 0, "{op}: {r}");
                assert!(c["per_iter"]["p99_us"].as_f64().is_some_and(|p| p > 0.0), "{op}: {r}");
            }
        }
        let csv = std::fs::read_to_string(&csv).expect("the CSV file");
        let lines: Vec<&str> = csv.lines().collect();
        assert!(lines[0].starts_with("op,size,count,type,redop,root,oop_time_us"), "{op}: {csv}");
        assert_eq!(lines.len() - 1, results.len(), "{op}: the same rows as the JSON");
        assert!(lines[1..].iter().all(|l| l.split(',').count() == lines[0].split(',').count()), "{op}: {csv}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
