//! Failure detection and the shrink agreement at scale, in simulated time (no sockets; see
//! `hccn_runtime::comm::sim`): for a crash and a freeze of one rank, each also with the
//! coordinator failing half-way through its ACCEPTs, under today's protocol (notices to every
//! member, agreement point to point, O(n) state-machine steps) and the scalable one (notices and
//! votes along trees, O(1) steps): simulated time to detection, to every survivor knowing, to
//! every survivor deciding; messages per rank; steady heartbeat load per rank.
//!
//! Usage: hccn-agree-sim [RANKS...] [--protocol today|today-o1|scalable]... [--seed N] [--jobs N]
//! (default: 1024 4096 16384, today and scalable, seed 1, 2 jobs). `today-o1`: today's
//! messages with O(1) steps, to tell the message pattern's cost from the state machine's.

use std::time::Duration;

use hccn_runtime::comm::sim::{measure_step, run, Config, FaultKind, Protocol, Report};

struct Args {
    sizes: Vec<u32>,
    protocols: Vec<(&'static str, Protocol)>,
    seed: u64,
    jobs: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args { sizes: Vec::new(), protocols: Vec::new(), seed: 1, jobs: 2 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--protocol" => match value("--protocol")?.as_str() {
                "today" => a.protocols.push(("today", Protocol::TODAY)),
                "today-o1" => a.protocols.push(("today, O(1) steps", Protocol::TODAY_CONSTANT_STEP)),
                "scalable" => a.protocols.push(("scalable", Protocol::SCALABLE)),
                p => return Err(format!("unknown protocol {p:?} (today, today-o1, scalable)")),
            },
            "--seed" => a.seed = value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--jobs" => a.jobs = value("--jobs")?.parse::<usize>().map_err(|e| format!("--jobs: {e}"))?.max(1),
            n => a.sizes.push(n.parse().ok().filter(|&n| n >= 2).ok_or(format!("not a number of ranks (≥ 2): {n:?}"))?),
        }
    }
    if a.sizes.is_empty() {
        a.sizes = vec![1024, 4096, 16384];
    }
    if a.protocols.is_empty() {
        a.protocols = vec![("today", Protocol::TODAY), ("scalable", Protocol::SCALABLE)];
    }
    Ok(a)
}

fn ms(d: Option<Duration>, limit: Duration) -> String {
    d.map_or(format!("> {}", limit.as_millis()), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

fn row(n: u32, scenario: &str, protocol: &str, cfg: &Config, r: &Report) -> String {
    let limit = cfg.give_up_after;
    let ok = r.undecided == 0 && r.wrongly_excluded.is_empty() && r.agreed.is_some();
    format!(
        "| {n} | {scenario} | {protocol} | {} | {} | {} | {} | {} (r{}) | {} (r{}) | {:.1} | {:.0} | {} | {} | {:.1} |",
        ms(r.detected, limit),
        ms(r.all_know, limit),
        ms(r.all_decided, limit),
        r.news_messages + r.agreement_messages,
        r.sent.max,
        r.sent.busiest,
        r.received.max,
        r.received.busiest,
        (r.sent.mean + r.received.mean) / 2.0,
        r.beats_per_second.max,
        if ok { format!("{:?}", r.agreed.as_deref().unwrap_or_default()) } else { "NO".into() },
        r.steps,
        r.wall.as_secs_f64(),
    )
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hccn-agree-sim: {e}");
            std::process::exit(2);
        }
    };
    let scenarios = [
        ("crash", FaultKind::Crash, false),
        ("freeze", FaultKind::Freeze, false),
        ("crash + coordinator", FaultKind::Crash, true),
        ("freeze + coordinator", FaultKind::Freeze, true),
    ];
    let mut runs = Vec::new();
    for &n in &args.sizes {
        for (name, fault, coordinator_fails) in scenarios {
            for &(pname, protocol) in &args.protocols {
                let mut cfg = Config::new(n, fault, protocol);
                cfg.coordinator_fails = coordinator_fails;
                cfg.seed = args.seed;
                runs.push((n, name, pname, cfg));
            }
        }
    }
    let model = Config::new(2, FaultKind::Crash, Protocol::TODAY);
    println!(
        "Network: {:?} ± {:?} a message, {:?} CPU to send or read one; heartbeat {:?}, dead after {:?}, {} watched \
         each side.",
        model.net.latency, model.net.jitter, model.net.overhead, model.heartbeat, model.dead_after, model.watched
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
        "| ranks | scenario | protocol | detected (ms) | all know (ms) | all decided (ms) | messages | max sent | max read \
         | mean per rank | heartbeats/s per rank | agreed | steps | wall (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // Runs are independent and deterministic: a few at once, printed in order.
    for batch in runs.chunks(args.jobs) {
        let reports: Vec<Report> = std::thread::scope(|s| {
            let handles: Vec<_> = batch.iter().map(|(_, _, _, cfg)| s.spawn(move || run(cfg))).collect();
            handles.into_iter().map(|h| h.join().expect("a simulation panicked")).collect()
        });
        for ((n, name, pname, cfg), rep) in batch.iter().zip(&reports) {
            println!("{}", row(*n, name, pname, cfg, rep));
        }
    }
}
