//! The per-rank resource part of `hccn-info`: connections open, threads, shared memory mapped,
//! peak resident memory and heartbeat messages per second, measured on every rank over the same
//! second and printed by rank 0 — what decides whether a job of thousands of ranks fits.

use std::time::{Duration, Instant};

use hccn_runtime::{Communicator, ReduceOp};

/// How long heartbeats are counted for their rate.
const WINDOW: Duration = Duration::from_secs(1);
/// Figures per rank, in the order of [`HEADER`].
const FIGURES: usize = 5;
const HEADER: [&str; FIGURES] = ["connections", "threads", "shm_MiB", "peak_rss_MiB", "heartbeats/s"];

fn threads() -> u64 {
    std::fs::read_dir("/proc/self/task").map(|d| d.count() as u64).unwrap_or(0)
}

/// Peak resident memory of this process in KiB (VmHWM), 0 when /proc does not say.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = status.lines().find_map(|l| l.strip_prefix("VmHWM:"));
    field.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

/// This rank's figures, heartbeats counted over [`WINDOW`] (every rank counts the same second:
/// a barrier starts it).
fn mine(comm: &Communicator) -> hccn_runtime::Result<[f64; FIGURES]> {
    comm.barrier()?;
    let (t0, before) = (Instant::now(), comm.usage());
    std::thread::sleep(WINDOW);
    let after = comm.usage();
    let beats = (after.heartbeats_sent - before.heartbeats_sent) as f64 / t0.elapsed().as_secs_f64();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    Ok([after.connections as f64, threads() as f64, mib(after.shm_mapped), peak_rss_kib() as f64 / 1024.0, beats])
}

/// Every rank's figures, rank by rank.
pub fn measure(comm: &Communicator) -> hccn_runtime::Result<Vec<[f64; FIGURES]>> {
    let n = comm.size() as usize;
    let mut local = vec![0f64; n * FIGURES];
    let me = comm.rank() as usize;
    local[me * FIGURES..(me + 1) * FIGURES].copy_from_slice(&mine(comm)?);
    let mut all = vec![0f64; local.len()];
    comm.all_reduce(&local, &mut all, ReduceOp::Sum)?;
    Ok(all.chunks(FIGURES).map(|c| [c[0], c[1], c[2], c[3], c[4]]).collect())
}

/// The report's lines: a row per rank.
pub fn report(per_rank: &[[f64; FIGURES]]) -> Vec<String> {
    let mut out = vec![format!(
        "# resources per rank (shared memory as mapped, not as touched; heartbeats and pulses sent over {} s)",
        WINDOW.as_secs()
    )];
    let mut head = format!("{:<6}", "rank");
    HEADER.iter().for_each(|h| head.push_str(&format!(" {h:>13}")));
    out.push(head);
    for (r, f) in per_rank.iter().enumerate() {
        out.push(format!("{r:<6} {:>13} {:>13} {:>13.1} {:>13.1} {:>13.1}", f[0], f[1], f[2], f[3], f[4]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_per_rank_under_the_header() {
        let r = report(&[[1.0, 3.0, 2.0, 6.5, 8.0], [1.0, 3.0, 2.0, 6.0, 7.9]]);
        assert_eq!(r.len(), 4);
        assert!(r[1].contains("connections") && r[1].contains("heartbeats/s"), "{r:#?}");
        assert!(r[2].starts_with("0 ") && r[2].trim_end().ends_with("8.0"), "{r:#?}");
    }
}
