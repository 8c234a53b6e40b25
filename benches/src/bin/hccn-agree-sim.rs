//! Cost of the shrink agreement at scale, simulated (no sockets): messages, rounds (longest
//! causal chain of messages) and wall time, with and without a coordinator crash.
//! Usage: hccn-agree-sim [RANKS...]   (default 64 1024 4096)

use hccn_runtime::comm::agree_sim::{simulate, SimConfig};

fn main() {
    let sizes: Vec<u32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![64, 1024, 4096] } else { sizes };
    println!("{:>7} {:>22} {:>10} {:>7} {:>10} {:>9}", "ranks", "scenario", "messages", "rounds", "time(ms)", "agreed");
    for n in sizes {
        let scenarios = [
            ("2 dead", SimConfig { ranks: n, failed: vec![1, n / 2], coordinator_crash_after: None, seed: 7 }),
            (
                "2 dead + coord crash",
                SimConfig {
                    ranks: n,
                    failed: vec![1, n / 2],
                    coordinator_crash_after: Some(n as usize + n as usize / 2),
                    seed: 7,
                },
            ),
        ];
        for (name, cfg) in scenarios {
            let rep = simulate(&cfg);
            println!(
                "{n:>7} {name:>22} {:>10} {:>7} {:>10.1} {:>9}",
                rep.messages,
                rep.depth,
                rep.elapsed.as_secs_f64() * 1e3,
                if rep.agreed.is_some() && rep.undecided == 0 { "yes" } else { "NO" }
            );
        }
    }
}
