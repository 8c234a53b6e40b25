//! Failure detection and the shrink agreement at scale, in simulated time (no sockets; see
//! `hccn_runtime::comm::sim`): one rank crashes or freezes among 1,024 to 16,384, its watchers
//! find it (heartbeat 100 ms, dead after 800 ms, 3 watched each side), the news spreads and the
//! survivors run the runtime's own agreement state machine. Per run: simulated time to the first
//! watcher's detection, to every survivor knowing, to every survivor deciding; messages in all,
//! and per rank (sent and read, heartbeats apart); the steady heartbeat load per rank.
//!
//! Protocols: `scalable` (notices and votes along trees, O(1) state-machine steps), `today`
//! (notices to every member, agreement point to point, today's O(n) steps), `today-o1` (today's
//! messages, O(1) steps: the message pattern's cost alone), `trees` (trees, today's O(n) steps).
//!
//! Usage: hccn-agree-sim [RANKS...] [--protocol P]... [--coordinator] [--seed N] [--jobs N]
//! Default: 1024 4096 16384 with `scalable`, and `today` up to 4,096 ranks (at 16,384 it takes
//! minutes of wall time: ask for it with `--protocol today`); crash and freeze; seed 1; 2 jobs.
//! `--coordinator`: also each fault with the coordinator failing half-way through its ACCEPTs.
//! Exits 1 when any run ends without every survivor deciding the same set, which holds the victim
//! and no survivor.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hccn_runtime::comm::sim::{measure_step, run, Config, FaultKind, Protocol, Report};

/// Where `today` stops by default: above it one run takes minutes of wall time, since every
/// rank's step into today's state machine is O(n) on this machine too.
const TODAY_UP_TO: u32 = 4096;

struct Args {
    sizes: Vec<u32>,
    protocols: Vec<(&'static str, Protocol)>,
    coordinator: bool,
    seed: u64,
    jobs: usize,
}

fn protocol(name: &str) -> Result<(&'static str, Protocol), String> {
    Ok(match name {
        "scalable" => ("scalable", Protocol::SCALABLE),
        "today" => ("today", Protocol::TODAY),
        "today-o1" => ("today, O(1) steps", Protocol::TODAY_CONSTANT_STEP),
        "trees" => ("trees, O(n) steps", Protocol::TREES_LINEAR_STEP),
        p => return Err(format!("unknown protocol {p:?} (scalable, today, today-o1, trees)")),
    })
}

fn parse() -> Result<Args, String> {
    let mut a = Args { sizes: Vec::new(), protocols: Vec::new(), coordinator: false, seed: 1, jobs: 2 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--protocol" => a.protocols.push(protocol(&value("--protocol")?)?),
            "--coordinator" => a.coordinator = true,
            "--seed" => a.seed = value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--jobs" => a.jobs = value("--jobs")?.parse::<usize>().map_err(|e| format!("--jobs: {e}"))?.max(1),
            n => a.sizes.push(n.parse().ok().filter(|&n| n >= 2).ok_or(format!("not a number of ranks (≥ 2): {n:?}"))?),
        }
    }
    if a.sizes.is_empty() {
        a.sizes = vec![1024, 4096, 16384];
    }
    Ok(a)
}

/// The runs to make, in the order printed.
fn plan(args: &Args) -> Vec<(&'static str, &'static str, Config)> {
    let mut faults = vec![("crash", FaultKind::Crash, false), ("freeze", FaultKind::Freeze, false)];
    if args.coordinator {
        faults.extend([
            ("crash + coordinator", FaultKind::Crash, true),
            ("freeze + coordinator", FaultKind::Freeze, true),
        ]);
    }
    let chosen = !args.protocols.is_empty();
    let protocols = if chosen {
        args.protocols.clone()
    } else {
        vec![("scalable", Protocol::SCALABLE), ("today", Protocol::TODAY)]
    };
    let mut runs = Vec::new();
    for &(pname, protocol) in &protocols {
        for &n in &args.sizes {
            if !chosen && protocol == Protocol::TODAY && n > TODAY_UP_TO {
                continue;
            }
            for &(fname, fault, coordinator_fails) in &faults {
                let mut cfg = Config::new(n, fault, protocol);
                cfg.coordinator_fails = coordinator_fails;
                cfg.seed = args.seed;
                runs.push((fname, pname, cfg));
            }
        }
    }
    runs
}

fn ms(d: Option<Duration>, limit: Duration) -> String {
    d.map_or(format!("> {}", limit.as_millis()), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

/// Every survivor decided the same set, holding the victim and no survivor. A coordinator that
/// failed after some ranks accepted a value may be missing from it: its successor must propose
/// that value again, and the next shrink removes it.
fn agreed_right(cfg: &Config, r: &Report) -> bool {
    let right = |set: &Vec<u32>| set.contains(&cfg.victim) && set.iter().all(|x| r.failed.contains(x));
    r.undecided == 0 && r.wrongly_excluded.is_empty() && r.agreed.as_ref().is_some_and(right)
}

fn row(fault: &str, protocol: &str, cfg: &Config, r: &Report) -> String {
    let limit = cfg.give_up_after;
    format!(
        "| {} | {fault} | {protocol} | {} | {} | {} | {} | {} (r{}) | {:.1} | {:.0} | {} | {:.1} |",
        cfg.ranks,
        ms(r.detected, limit),
        ms(r.all_know, limit),
        ms(r.all_decided, limit),
        r.news_messages + r.agreement_messages,
        r.load.max,
        r.load.busiest,
        r.load.mean,
        r.beats_per_second.max,
        if agreed_right(cfg, r) { format!("{:?}", r.agreed.as_deref().unwrap_or_default()) } else { "NO".into() },
        r.wall.as_secs_f64(),
    )
}

fn header(args: &Args) {
    let model = Config::new(2, FaultKind::Crash, Protocol::TODAY);
    println!(
        "Network: {:?} ± {:?} a message, {:?} CPU to send or read one, {:?} to wake a waiting thread; heartbeat {:?}, \
         dead after {:?}, {} watched each side; seed {}.",
        model.net.latency,
        model.net.jitter,
        model.net.overhead,
        model.net.wakeup,
        model.heartbeat,
        model.dead_after,
        model.watched,
        args.seed
    );
    for &n in &args.sizes {
        println!(
            "Today's state-machine step at {n} ranks, measured here: {:.1} µs (modelled: {:.1} µs).",
            measure_step(n).as_secs_f64() * 1e6,
            (Protocol::TODAY.step.fixed + Protocol::TODAY.step.per_rank * n).as_secs_f64() * 1e6
        );
    }
    println!();
    println!(
        "| ranks | fault | protocol | first watcher (ms) | all informed (ms) | all decided (ms) | messages | max per rank \
         | mean per rank | heartbeats/s per rank | agreed | wall (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
}

/// Per protocol and fault, the busiest rank's messages at the largest size against the smallest:
/// what "per-rank load independent of n" comes to.
fn growth(runs: &[(&str, &str, Config)], reports: &[Report]) {
    let all: Vec<_> = runs.iter().zip(reports).collect();
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for ((fault, protocol, _), _) in &all {
        if seen.contains(&(fault, protocol)) {
            continue;
        }
        seen.push((fault, protocol));
        let same: Vec<_> = all.iter().filter(|((f, p, _), _)| f == fault && p == protocol).collect();
        let (Some(((_, _, small), rs)), Some(((_, _, large), rl))) = (same.first(), same.last()) else { continue };
        if small.ranks == large.ranks {
            continue;
        }
        println!(
            "{protocol}, {fault}: busiest rank {} messages at {} ranks, {} at {} (×{:.2}); mean {:.1} and {:.1}.",
            rs.load.max,
            small.ranks,
            rl.load.max,
            large.ranks,
            rl.load.max as f64 / rs.load.max.max(1) as f64,
            rs.load.mean,
            rl.load.mean
        );
    }
}

/// Runs are independent and deterministic: `jobs` threads take them largest first (a run's
/// wall time grows as n², so the largest decides when all end), reports in `runs`' order.
fn run_all(runs: &[(&str, &str, Config)], jobs: usize) -> Vec<Report> {
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(runs[i].2.ranks));
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Report>>> = Mutex::new(vec![None; runs.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let rep = run(&runs[i].2);
                    done.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(rep);
                }
            });
        }
    });
    let done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.into_iter().map(|r| r.expect("every run ends")).collect()
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hccn-agree-sim: {e}");
            std::process::exit(2);
        }
    };
    let runs = plan(&args);
    header(&args);
    let reports = run_all(&runs, args.jobs);
    for ((fault, protocol, cfg), rep) in runs.iter().zip(&reports) {
        println!("{}", row(fault, protocol, cfg, rep));
    }
    println!();
    growth(&runs, &reports);
    if !runs.iter().zip(&reports).all(|((_, _, cfg), r)| agreed_right(cfg, r)) {
        std::process::exit(1);
    }
}
