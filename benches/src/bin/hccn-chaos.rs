//! A long randomized chaos run: ROUNDS jobs of 4 ranks under hccnrun (an etcd store), each
//! training with checked allreduces and shrinking on errors (tests' hccn-netfault), each hit by
//! one random fault while it trains: a rank killed, frozen for two seconds and resumed, exiting
//! without destroy, calling one collective differently, or the store frozen for three seconds.
//! Every job must end: no hang (a job past its deadline is one), no wrong element, and the ranks
//! that go on agree on one membership (same size and epoch, as many as that size: otherwise a
//! split decision).
//! Usage: hccn-chaos [ROUNDS] [SEED]   (bash benches/chaos.sh)

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hccn_tests::launch;
use hccn_tools::etcd_local::LocalEtcd;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

const FAULTS: [&str; 5] = ["kill", "stop-cont", "exit", "mismatch", "store-loss"];
const RANKS: u32 = 4;

#[derive(Default)]
struct Tally {
    rounds: u32,
    per_fault: [u32; 5],
    hangs: u32,
    wrong: u32,
    splits: u32,
    /// Rounds whose survivors never went on (everyone left out): not an error, but counted.
    nobody: u32,
    /// From the fault to the first rank's error, ms.
    detect_ms: Vec<u128>,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(&format!("{key}=")).nth(1)?.split(' ').next()
}

fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

/// Pids of the ranks, from their START lines as they appear.
fn pids(out: &str) -> Vec<(u32, i32)> {
    out.lines()
        .filter_map(|l| {
            let (r, rest) = l.strip_prefix('[')?.split_once("] ")?;
            rest.starts_with("START ").then(|| Some((r.parse().ok()?, field(rest, "pid")?.parse().ok()?)))?
        })
        .collect()
}

/// Hits `pid` (a rank) or the store's process group with `fault`.
fn inject(fault: &str, pid: i32, etcd_group: i32) {
    let signal = |who: i32, sig: i32| {
        // SAFETY: a signal to a process (or group) of this bench's own job or store.
        unsafe { libc::kill(who, sig) };
    };
    match fault {
        "kill" => signal(pid, libc::SIGKILL),
        "stop-cont" => {
            signal(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_secs(2));
            signal(pid, libc::SIGCONT);
        }
        "exit" => signal(pid, libc::SIGUSR1),
        "mismatch" => signal(pid, libc::SIGUSR2),
        _ => {
            signal(-etcd_group, libc::SIGSTOP);
            std::thread::sleep(Duration::from_secs(3));
            signal(-etcd_group, libc::SIGCONT);
        }
    }
}

/// One job with one fault: its output, whether it ended in time, and when the fault hit.
fn round(
    round: u32,
    fault: &str,
    victim: u32,
    delay: Duration,
    etcd: &LocalEtcd,
    etcd_group: i32,
) -> (String, bool, Option<u128>) {
    let child = Command::new(launch::bin("hccnrun"))
        .args(["-n", &RANKS.to_string(), "--grace", "30", "--store", &etcd.url(), "--"])
        .arg(launch::bin("hccn-netfault"))
        .arg("3")
        .env("HCCN_JOB_ID", format!("chaos-{round}"))
        .env("HCCN_TIMEOUT_MS", "6000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return (String::new(), false, None) };
    let Some(mut stdout) = child.stdout.take() else { return (String::new(), false, None) };
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(String::from_utf8_lossy(&buf[..n]).into_owned()).is_err() {
                break;
            }
        }
    });
    let mut out = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut fault_at = None;
    let mut ended = false;
    while !ended && Instant::now() < deadline {
        while let Ok(piece) = rx.try_recv() {
            out.push_str(&piece);
        }
        let ready = pids(&out);
        if fault_at.is_none() && ready.len() == RANKS as usize {
            std::thread::sleep(delay);
            let pid = ready.iter().find(|(r, _)| *r == victim).map_or(0, |p| p.1);
            fault_at = Some(now_ms());
            inject(fault, pid, etcd_group);
        }
        ended = child.try_wait().ok().flatten().is_some();
        std::thread::sleep(Duration::from_millis(20));
    }
    if !ended {
        let _ = child.kill();
    }
    let _ = child.wait();
    let _ = reader.join();
    while let Ok(piece) = rx.try_recv() {
        out.push_str(&piece);
    }
    (out, ended, fault_at)
}

/// Counts what a finished round shows in the tally.
fn judge(t: &mut Tally, out: &str, ended: bool, fault_at: Option<u128>) -> bool {
    let rest = |l: &str| l.split_once("] ").map(|(_, r)| r.to_owned());
    let done: Vec<String> = out.lines().filter_map(rest).filter(|l| l.starts_with("DONE ")).collect();
    t.hangs += u32::from(!ended);
    t.wrong += done.iter().filter(|l| field(l, "wrong") != Some("0")).count() as u32;
    let ends: std::collections::BTreeSet<(String, String)> = done
        .iter()
        .map(|l| (field(l, "size").unwrap_or("").to_owned(), field(l, "epoch").unwrap_or("").to_owned()))
        .collect();
    let split = ends.len() > 1 || ends.iter().any(|(size, _)| size.parse::<usize>().ok() != Some(done.len()));
    t.splits += u32::from(split && ended);
    t.nobody += u32::from(done.is_empty());
    let errors = out.lines().filter_map(rest).filter(|l| l.starts_with("ERROR "));
    let first_error = errors.filter_map(|l| field(&l, "at")?.parse::<u128>().ok()).min();
    if let (Some(at), Some(e)) = (fault_at, first_error) {
        t.detect_ms.push(e.saturating_sub(at));
    }
    split
}

fn main() {
    let rounds: u32 = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(500);
    let mut rng = Rng(std::env::args().nth(2).and_then(|v| v.parse().ok()).unwrap_or(7).max(1));
    let Ok(etcd) = LocalEtcd::start() else {
        eprintln!("no local etcd (scripts/setup.sh installs it)");
        std::process::exit(2);
    };
    let Some(etcd_group) = etcd.process_group() else {
        eprintln!("the local etcd has no process group");
        std::process::exit(2);
    };
    let mut t = Tally::default();
    let started = Instant::now();
    for r in 0..rounds {
        let fault = rng.below(FAULTS.len() as u64) as usize;
        let victim = 1 + rng.below(u64::from(RANKS) - 1) as u32;
        let delay = Duration::from_millis(300 + rng.below(700));
        let (out, ended, fault_at) = round(r, FAULTS[fault], victim, delay, &etcd, etcd_group);
        t.rounds += 1;
        t.per_fault[fault] += 1;
        if judge(&mut t, &out, ended, fault_at) || !ended {
            eprintln!("round {r} ({}): {}\n{out}", FAULTS[fault], if ended { "split" } else { "hang" });
        }
    }
    t.detect_ms.sort_unstable();
    let median = t.detect_ms.get(t.detect_ms.len() / 2).copied().unwrap_or(0);
    let p99 = t.detect_ms.get(t.detect_ms.len() * 99 / 100).copied().unwrap_or(0);
    let faults: Vec<String> = FAULTS.iter().zip(t.per_fault).map(|(f, n)| format!("{f} {n}")).collect();
    println!("chaos: {} rounds in {:.0} s, faults {}", t.rounds, started.elapsed().as_secs_f64(), faults.join(", "));
    println!(
        "hangs {}  silent wrong results {}  split decisions {}  (jobs where nobody went on: {})",
        t.hangs, t.wrong, t.splits, t.nobody
    );
    println!("first error after the fault: median {median} ms, p99 {p99} ms");
}
